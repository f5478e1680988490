"""The GPU path, executed as far as a CPU can: the course trains through Unsloth's own patched
GRPO trainer (``UnslothGRPOTrainer``, generated from TRL's source at import on a GPU), for the
``colab-t4`` and ``gpu-large`` recipes (vLLM generation aside) on their own task and level (GSM8K, from the
course's sample), via ``tests/unsloth_cpu.py`` in the contract environment. See that script for how Unsloth is made
to patch TRL on a CPU. Its cases (these, the wrong order, notebook 07's tool step) run in one process, once per test
session, shared with tests/test_unsloth_tools.py.

The model is a stand-in: the bundled model's config with 2 of its 30 layers, random weights, the bundled tokenizer.
Which of the properties checked here depend on the model's size: none. The trainer and config classes, the config
values, the step count, the files a run writes, the rewards TRL logs and the dataset card are the same for any
model; the vocabulary, so the LM head's width, and the hidden size are the bundled model's. So no step on the
real-size model is kept here (the bundled model's real steps run in the notebooks and the CPU tests).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.profiles import PROFILES
from helpers.tasks.arithmetic import PRESETS

from .contract import unsloth_case

pytestmark = pytest.mark.contract


def test_the_stand_in_is_the_bundled_models_shape_with_two_layers(tmp_path_factory):
    out = unsloth_case("colab-t4", tmp_path_factory)
    assert out["stand_in"] == {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 576,
                               "num_attention_heads": 9, "vocab_size": 49152, "tie_word_embeddings": True}
    assert out["model_layers"] == 2  # the trainer trained the stand-in, not the 30-layer bundled model


@pytest.mark.parametrize("name", ["colab-t4", "gpu-large"])
def test_the_course_trains_through_unsloths_grpo_trainer(tmp_path_factory, name):
    out = unsloth_case(name, tmp_path_factory)
    run = Path(out["run"])
    assert out["trainer_class"] == "UnslothGRPOTrainer" and out["trl_GRPOTrainer"] == "UnslothGRPOTrainer"
    assert out["config_is_unsloths"]  # Unsloth's GRPOConfig keeps TRL's class name (for pickling): read its fields
    assert out["global_step"] == 1
    # the recipe both backends train: what the profile says, not what Unsloth would default to
    profile = PROFILES[name]
    assert out["config"]["mask_truncated_completions"] is profile.mask_truncated_completions is True
    assert out["config"]["epsilon_high"] == profile.epsilon_high and out["config"]["loss_type"] == "dapo"
    assert out["config"]["use_vllm"] is False  # vLLM is not installed here: the profile says so and drops it
    # the GSM8K level and its preset, logged by TRL under each reward's name, with their weights
    assert (out["profile"]["task"], out["profile"]["task_level"]) == ("arithmetic", "gsm8k") == (
        profile.task, profile.task_level)
    assert out["rewards_logged"] == sorted(f"rewards/{f.__name__}/{s}" for f, _ in PRESETS["gsm8k"]
                                           for s in ("mean", "std"))
    assert out["config"]["reward_weights"] == [w for _, w in PRESETS["gsm8k"]]
    files = set(out["files"])
    for needed in ("adapter/adapter_config.json", "adapter/chat_template.jinja", "metrics.jsonl",
                   "train_config.json", "grpo/checkpoint-1/trainer_state.json"):
        assert needed in files, f"{needed} missing from the run folder"
    assert any(f.startswith("grpo/completions/completions_") for f in files)
    record = json.loads((run / "train_config.json").read_text())
    config = record["grpo_config"]
    assert config["mask_truncated_completions"] is True and config["epsilon_high"] == profile.epsilon_high
    assert [r["name"] for r in record["rewards"]] == [f.__name__ for f, _ in PRESETS["gsm8k"]]
    card = json.loads((run / "dataset" / "card.json").read_text())
    assert card["source"] == {"task": "arithmetic", "level": "gsm8k"} and card["counts"]["train"] == 16


def test_a_config_built_before_unsloth_is_imported_breaks_its_trainer(tmp_path_factory):
    """The import-order defect is real, so the test above would catch it (unsloth issue 3931)."""
    out = unsloth_case("wrong-order", tmp_path_factory)
    assert out["trainer_class"] == "UnslothGRPOTrainer" and not out["config_is_unsloths"]
    assert out["error"] and "unsloth_num_chunks" in out["error"]

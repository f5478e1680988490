"""The GPU path, executed as far as a CPU can: the course trains through Unsloth's own patched
GRPO trainer (``UnslothGRPOTrainer``, generated from TRL's source at import on a GPU), for the
``colab-t4`` and ``gpu-large`` recipes (vLLM generation aside) on their own task and level (GSM8K, from the
course's sample), via ``tests/unsloth_cpu.py`` in the contract environment. See that script for how Unsloth is made to patch TRL on a CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from helpers.profiles import PROFILES
from helpers.tasks.arithmetic import PRESETS

from .contract import contract_python

pytestmark = pytest.mark.contract
SCRIPT = Path(__file__).with_name("unsloth_cpu.py")
ROOT = SCRIPT.parents[1]


def run_unsloth(profile: str, run: Path, *flags: str) -> dict:
    env = dict(os.environ, UNSLOTH_ALLOW_CPU="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT),
               PYTHONWARNINGS="ignore", COURSE_PROFILE=profile,
               UNSLOTH_COMPILE_DISABLE="1")  # Unsloth's compiled backward recompiles every step on a CPU
    proc = subprocess.run([contract_python(), str(SCRIPT), profile, str(run), *flags], capture_output=True,
                          text=True, env=env, timeout=900)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("UNSLOTH-CPU-JSON ")), None)
    assert proc.returncode == 0 and line is not None, (
        f"Unsloth's trainer did not run ({proc.returncode}). If Unsloth moved "
        f"`unsloth.models.rl._patch_trl_rl_trainers_impl`, update tests/unsloth_cpu.py.\n{proc.stderr[-4000:]}")
    return json.loads(line[len("UNSLOTH-CPU-JSON "):])


@pytest.mark.parametrize("name", ["colab-t4", "gpu-large"])
def test_the_course_trains_through_unsloths_grpo_trainer(tmp_path, name):
    out = run_unsloth(name, tmp_path, "--steps", "1")
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
    record = json.loads((tmp_path / "train_config.json").read_text())
    config = record["grpo_config"]
    assert config["mask_truncated_completions"] is True and config["epsilon_high"] == profile.epsilon_high
    assert [r["name"] for r in record["rewards"]] == [f.__name__ for f, _ in PRESETS["gsm8k"]]
    card = json.loads((tmp_path / "dataset" / "card.json").read_text())
    assert card["source"] == {"task": "arithmetic", "level": "gsm8k"} and card["counts"]["train"] == 16


def test_a_config_built_before_unsloth_is_imported_breaks_its_trainer(tmp_path):
    """The import-order defect is real, so the test above would catch it (unsloth issue 3931)."""
    out = run_unsloth("colab-t4", tmp_path, "--wrong-order", "--steps", "1")
    assert out["trainer_class"] == "UnslothGRPOTrainer" and not out["config_is_unsloths"]
    assert out["error"] and "unsloth_num_chunks" in out["error"]

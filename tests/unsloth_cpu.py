"""Run the course's GRPO training through Unsloth's own patched trainer, on a CPU: every case in one process.

    <contract-venv>/bin/python tests/unsloth_cpu.py <folder> [case ...]

Run once per test session by ``tests/test_unsloth_trainer.py`` and ``tests/test_unsloth_tools.py`` (through
``tests/shared.py``) in the contract environment (Unsloth installed without its GPU dependencies). On a GPU,
``import unsloth`` rewrites TRL's trainers (``UnslothGRPOTrainer``, generated from TRL's source). With
``UNSLOTH_ALLOW_CPU=1`` the import returns before that step, so this script does what the import would: it reports
a compute capability (7.5, a T4) and calls the same private entry Unsloth uses,
``unsloth.models.rl._patch_trl_rl_trainers_impl``. If that entry moves in a later Unsloth, the script fails loudly
(the tests do not skip).

The cases (:data:`CASES`), in this order, each in ``<folder>/<case>``, each printing one line
``UNSLOTH-CPU-JSON {"case": ..., ...}`` (or ``{"case": ..., "crash": <traceback>}``, and the next case runs):

* ``wrong-order``: a GRPOConfig built before Unsloth patched TRL, then Unsloth's trainer (the defect the course had).
  It must come first: it needs TRL unpatched, and every later case runs on the patched TRL, as on Colab after
  ``import unsloth``;
* ``colab-t4``, ``gpu-large``: ``helpers.training.train_grpo`` (the save point of notebook 03) with the GPU
  profile's recipe (its task, GSM8K, from the course's sample in ``data/gsm8k_sample``), one step, the model loaded
  *before* any TRL config is built. gpu-large carries ``chat_template_kwargs`` through Unsloth's trainer;
* ``tools``: notebook 07's trainer with ``tools=`` and one step whose scripted rollouts call the tool
  (``tests/unsloth_tools_cpu.py``).

Unsloth's ``FastLanguageModel`` needs a GPU, so the model is loaded with transformers + PEFT, in float32, and given
the no-op ``for_training``/``for_inference`` Unsloth's trainer calls. It is a **stand-in**: the bundled SmolLM2's
own config (llama, hidden size 576, 9 heads, its 49,152-token vocabulary and tied head) with 2 layers instead of 30,
random weights, and the bundled tokenizer (:func:`tiny_bundled_model`). Nothing these cases report depends on the
model's depth or weights: the trainer and config classes, the config values, the steps, the files written, the
rewards logged, the tool loop's turns and masks (scripted), and whether the adapter changed. Everything else is the
course's own code.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("UNSLOTH_ALLOW_CPU", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


_PATCHED: list[bool] = []


def import_unsloth_as_on_a_t4(profile=None) -> None:
    """What ``import unsloth`` does on a T4: rewrite TRL's GRPO and SFT trainers (and their configs)."""
    if _PATCHED or (profile is not None and profile.backend != "unsloth"):
        return
    import torch

    import unsloth  # noqa: F401  (with UNSLOTH_ALLOW_CPU=1 it returns before patching TRL)
    from unsloth.models import rl

    torch.cuda.get_device_capability = lambda *a, **k: (7, 5)
    for trainer in ("grpo_trainer", "sft_trainer"):
        rl._patch_trl_rl_trainers_impl(trainer)
    _PATCHED.append(True)


#: The stand-in's depth: the bundled model has 30 layers.
TINY_LAYERS = 2


def tiny_bundled_model(folder: Path) -> Path:
    """The bundled model's config and tokenizer with :data:`TINY_LAYERS` layers of random weights, saved in ``folder``.

    Its hidden size, heads, vocabulary (so the LM head's width) and tied head are the bundled SmolLM2's."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from helpers.models import bundled_model_path

    bundled = bundled_model_path()
    config = AutoConfig.from_pretrained(bundled)
    config.num_hidden_layers = TINY_LAYERS
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig.from_pretrained(bundled)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(bundled).save_pretrained(folder)
    return folder


def use_tiny_bundled_model(folder: Path) -> dict:
    """Make the course load :func:`tiny_bundled_model` wherever it loads the bundled model; what it is, for the report."""
    import helpers.models

    tiny = tiny_bundled_model(folder)
    real = helpers.models.model_source
    helpers.models.model_source = lambda spec: str(tiny) if spec.bundled else real(spec)
    config = json.loads((tiny / "config.json").read_text())
    return {k: config[k] for k in ("model_type", "num_hidden_layers", "hidden_size", "num_attention_heads",
                                   "vocab_size", "tie_word_embeddings")}


def cpu_stand_in_for_fast_language_model(profile, spec, adapter, lora, bf16=False):
    """helpers.models._load_unsloth on a CPU: the stand-in model with PEFT LoRA, after Unsloth's patch."""
    import types

    import helpers.models
    from helpers.models import _load_transformers
    from helpers.profiles import get_model_spec

    helpers.models.import_unsloth(profile)
    cpu = profile.with_overrides(model="smollm2-135m", backend="transformers", load_in_4bit=False)
    model, tok = _load_transformers(cpu, get_model_spec("smollm2-135m"), adapter, lora, False)  # float32 (bf16 is not Unsloth's choice here)
    model.for_training = types.MethodType(lambda self, *a, **k: self.train(), model)
    model.for_inference = types.MethodType(lambda self, *a, **k: self.eval(), model)
    return model, tok


def patch_unsloth_import(replacement) -> None:
    """Make every ``import_unsloth`` of the course's modules call ``replacement`` (each module binds the name)."""
    import helpers.models
    import helpers.training

    for module in (helpers.models, helpers.training):
        module.import_unsloth = replacement


def wrong_order(profile, run: Path) -> dict:
    """The defect the course had: a GRPOConfig built before Unsloth patched TRL, then Unsloth's trainer."""
    from helpers.data import ensure_prepared
    from helpers.models import load_model
    from helpers.tasks import get_task
    from helpers.training import grpo_config

    rewards = get_task(profile.task).rewards_for(profile.task_level)
    patch_unsloth_import(lambda profile: None)                    # the old helpers: no Unsloth import first
    config = grpo_config(profile, run)                            # so this is TRL's own GRPOConfig
    patch_unsloth_import(import_unsloth_as_on_a_t4)
    model, tok = load_model(profile)                              # imports and patches Unsloth
    import trl

    trainer = trl.GRPOTrainer(model=model, processing_class=tok, reward_funcs=[f for f, _ in rewards], args=config,
                              train_dataset=ensure_prepared(profile, run, tokenizer=tok, verbose=False)["train"])
    try:
        trainer.train()
        error = None
    except Exception as exc:  # noqa: BLE001 - reported, not hidden
        error = f"{type(exc).__name__}: {exc}"
    return {"trainer_class": type(trainer).__name__, "error": error,
            "config_is_unsloths": "unsloth_num_chunks" in {f.name for f in dataclasses.fields(config)}}


def cpu_profile(name: str, steps: int = 1):
    """The GPU profile's recipe (its task and level, GSM8K, so its rewards; its loss, clipping, masking, optimizer,
    LoRA) at CPU sizes: two short completions of 16 problems of the course's GSM8K sample."""
    from helpers.profiles import get_profile

    os.environ.setdefault("COURSE_GSM8K_DIR", str(ROOT / "data" / "gsm8k_sample"))
    return get_profile(name, max_steps=steps, save_steps=1, max_completion_length=32, num_generations=2,
                       per_device_train_batch_size=2, time_budget_minutes=None, train_rows=16, eval_rows=4,
                       eval_prompts=4)


def trains(name: str, run: Path) -> dict:
    """One step of ``helpers.training.train_grpo`` on profile ``name`` through Unsloth's trainer: what ran."""
    from helpers.training import train_grpo

    os.environ["COURSE_PROFILE"] = name  # as the notebook's machine would have it (the profile is passed anyway)
    profile = cpu_profile(name)
    out = train_grpo(profile, run, resume=False)

    import trl

    trainer, config = out["trainer"], out["trainer"].args
    return {
        "trainer_class": type(trainer).__name__, "trainer_mro": [c.__name__ for c in type(trainer).__mro__[:4]],
        "trl_GRPOTrainer": trl.GRPOTrainer.__name__, "config_class": type(config).__name__,
        "config_is_unsloths": "unsloth_num_chunks" in {f.name for f in dataclasses.fields(config)},
        "config": {k: getattr(config, k, None) for k in (
            "loss_type", "mask_truncated_completions", "epsilon", "epsilon_high", "beta", "num_generations",
            "max_completion_length", "optim", "use_vllm", "bf16", "fp16", "reward_weights", "unsloth_num_chunks",
            "chat_template_kwargs")},
        "profile": {k: getattr(profile, k) for k in ("name", "task", "task_level", "mask_truncated_completions",
                                                     "epsilon_high", "optim", "use_vllm")},
        "global_step": trainer.state.global_step,
        "files": sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file()),
        "rewards_logged": sorted(k for k in trainer.state.log_history[0] if k.startswith("rewards/")),
        "model_layers": out["model"].config.num_hidden_layers,
    }


def tools(run: Path) -> dict:
    sys.modules.setdefault("unsloth_cpu", sys.modules[__name__])  # one _PATCHED: TRL is patched once per process
    from unsloth_tools_cpu import tool_step  # tests/ is on sys.path: the script's folder

    return tool_step(run)


#: The cases in the order they run (see the module's docstring for why this order).
CASES = {"wrong-order": lambda run: wrong_order(cpu_profile("colab-t4"), run),  # TRL unpatched: first
         "colab-t4": lambda run: trains("colab-t4", run),
         "gpu-large": lambda run: trains("gpu-large", run),
         "tools": tools}


def main() -> int:
    import traceback

    import helpers.models

    folder = Path(sys.argv[1])
    asked = sys.argv[2:] or list(CASES)
    unknown = sorted(set(asked) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}: choose from {list(CASES)}")
    stand_in = use_tiny_bundled_model(folder / "stand-in-model")
    patch_unsloth_import(import_unsloth_as_on_a_t4)
    helpers.models._load_unsloth = cpu_stand_in_for_fast_language_model
    for case in [c for c in CASES if c in asked]:  # always in CASES' order
        run = folder / case
        run.mkdir(parents=True, exist_ok=True)
        try:
            result = {"case": case, "run": str(run), "stand_in": stand_in, **CASES[case](run)}
        except Exception:  # noqa: BLE001 - reported per case; the next case still runs
            result = {"case": case, "crash": traceback.format_exc()[-4000:]}
        print("UNSLOTH-CPU-JSON " + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    os.chdir(tempfile.mkdtemp(prefix="unsloth-cpu-"))  # Unsloth writes unsloth_compiled_cache/ into the cwd
    raise SystemExit(main())

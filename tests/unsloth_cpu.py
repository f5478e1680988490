"""Run the course's GRPO training through Unsloth's own patched trainer, on a CPU.

    <contract-venv>/bin/python tests/unsloth_cpu.py <profile> <run folder> [--steps N] [--wrong-order]

Run by ``tests/test_unsloth_trainer.py`` in the contract environment (Unsloth installed without its GPU
dependencies). On a GPU, ``import unsloth`` rewrites TRL's trainers (``UnslothGRPOTrainer``, generated
from TRL's source). With ``UNSLOTH_ALLOW_CPU=1`` the import returns before that step, so this script
does what the import would: it reports a compute capability (7.5, a T4) and calls the same private entry
Unsloth uses, ``unsloth.models.rl._patch_trl_rl_trainers_impl``. If that entry moves in a later Unsloth,
the script fails loudly (the test does not skip).

Unsloth's ``FastLanguageModel`` needs a GPU, so the model is the bundled SmolLM2 loaded with transformers
+ PEFT, in float32, given the no-op ``for_training``/``for_inference`` Unsloth's trainer calls. Everything
else is the course's own code: ``helpers.training.train_grpo`` (the save point of notebook 03) with the
GPU profile's recipe (its task, GSM8K, from the course's sample in ``data/gsm8k_sample``), the model loaded
*before* any TRL config is built, as on Colab.

Prints one line ``UNSLOTH-CPU-JSON {...}`` with what ran: the trainer and config classes, the effective
config, the steps, and the files the run wrote.
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


def cpu_stand_in_for_fast_language_model(profile, spec, adapter, lora, bf16=False):
    """helpers.models._load_unsloth on a CPU: the bundled model with PEFT LoRA, after Unsloth's patch."""
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


def wrong_order(profile, run: Path) -> int:
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
    print("UNSLOTH-CPU-JSON " + json.dumps({
        "trainer_class": type(trainer).__name__, "error": error,
        "config_is_unsloths": "unsloth_num_chunks" in {f.name for f in dataclasses.fields(config)}}))
    return 0


def main() -> int:
    name, run = sys.argv[1], Path(sys.argv[2])
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 1

    import helpers.models
    from helpers.profiles import get_profile
    from helpers.training import train_grpo

    # the GPU profile's recipe (its task and level, GSM8K, so its rewards; its loss, clipping, masking, optimizer,
    # LoRA) at CPU sizes: two short completions of 16 problems of the course's GSM8K sample (Unsloth's backward is
    # slow on a CPU: ~40 s a step even so)
    os.environ.setdefault("COURSE_GSM8K_DIR", str(ROOT / "data" / "gsm8k_sample"))
    profile = get_profile(name, max_steps=steps, save_steps=1, max_completion_length=32, num_generations=2,
                          per_device_train_batch_size=2, time_budget_minutes=None, train_rows=16, eval_rows=4,
                          eval_prompts=4)
    patch_unsloth_import(import_unsloth_as_on_a_t4)
    helpers.models._load_unsloth = cpu_stand_in_for_fast_language_model
    if "--wrong-order" in sys.argv:
        return wrong_order(profile, run)
    out = train_grpo(profile, run, resume=False)

    import trl

    trainer, config = out["trainer"], out["trainer"].args
    result = {
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
    }
    print("UNSLOTH-CPU-JSON " + json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    os.chdir(tempfile.mkdtemp(prefix="unsloth-cpu-"))  # Unsloth writes unsloth_compiled_cache/ into the cwd
    raise SystemExit(main())

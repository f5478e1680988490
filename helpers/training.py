"""GRPO training: the checks TRL does not make and the save point of notebook 03 (the precision: ``helpers.models``).

Each function takes a profile, or the :class:`helpers.models.Resolved` a run looks up once (task, model, GPU).
Unsloth rewrites TRL's classes when imported, so each one that builds a TRL object calls ``import_unsloth`` first.

Example:
    >>> explain_config_error(TypeError("__init__() got an unexpected keyword argument 'warmup_ratio'"))[:28]
    'transformers 5 removed `warm'
"""

from __future__ import annotations

import os
import platform
import re
import time
from pathlib import Path
from typing import Any, Sequence

from .callbacks import DashboardCallback, HeldOutCallback, RunLogCallback, TimeBudgetCallback, WatchCallback
from .curriculum import select_for_profile
from .data import ensure_prepared
from .machine import cpu_bf16, installed, native_bf16
from .models import Resolved, import_unsloth, load_model, precision, prepare_tokenizer, resolve  # noqa: F401
from .preflight import installed_versions
from .profiles import Profile
from .prompts import supports_system_role, build_prompt
from .runs import read_json, write_json
from .tasks import Task
from .tracking import tracker_last, tracking_kwargs, use_trackio
from .watch import watch_every

GRPO_DIR, ADAPTER_DIR, WARMUP_ADAPTER_DIR = "grpo", "adapter", "warmup-adapter"

#: Arguments tutorials still pass that the pinned TRL / transformers no longer accept, with the fix.
REMOVED_ARGS: dict[str, str] = {
    "max_prompt_length": "TRL 0.28 removed `max_prompt_length`: prompts are no longer truncated by the trainer. "
                         "Drop long prompts from the dataset instead (notebook 01, profile.max_prompt_tokens).",
    "warmup_ratio": "transformers 5 removed `warmup_ratio`: give `warmup_steps` (a number of steps) instead.",
    "max_length": "GRPO has no `max_length`: set `max_completion_length` (tokens the model may generate).",
    "vllm_device": "TRL chooses the vLLM device itself: remove `vllm_device` (vllm_mode='colocate' on one GPU).",
    "use_liger_loss": "Renamed: use `use_liger_kernel`.",
}


class TrainingConfigError(ValueError):
    """A training setting that would fail or silently teach nothing; the message says what to change."""


def explain_config_error(error: Exception) -> str:
    """The fix for a ``TypeError`` from ``GRPOConfig(...)``/``SFTConfig(...)`` naming a removed argument."""
    found = re.search(r"unexpected keyword argument '(\w+)'", str(error))
    return REMOVED_ARGS[found.group(1)] if found and found.group(1) in REMOVED_ARGS else str(error)


def torch_dtype(profile: Profile | Resolved, capability: tuple[int, int] | None) -> str:
    """The dtype of a merged copy of the model: float32 on a CPU (bf16 is autocast there), else the training's."""
    r = resolve(profile, capability=capability, probe=False)
    bits = r.precision if r.profile.backend == "unsloth" else {}
    return "bfloat16" if bits.get("bf16") else "float16" if bits.get("fp16") else "float32"


def check_config(config: Any, profile: Profile | Resolved, capability: tuple[int, int] | None = None,
                 vllm_installed: bool | None = None) -> None:
    """Raise :class:`TrainingConfigError` for a ``GRPOConfig`` TRL accepts but that fails or teaches nothing."""
    r = resolve(profile, capability=capability)
    profile, capability, on_gpu = r.profile, r.capability, r.profile.backend == "unsloth"
    bf16, fp16 = bool(getattr(config, "bf16", False)), bool(getattr(config, "fp16", False))
    fix = "helpers.training.precision(PROFILE, capability) gives the right pair"
    errors: list[str] = []
    if fp16 and (not on_gpu or capability is None):
        errors.append(f"fp16=True on a CPU: there is no fp16 autocast on a CPU, the run would be float32 anyway. Set "
                      f"fp16=False ({fix}).")
    elif bf16 and (capability is None if on_gpu else not r.precision["bf16"] and not cpu_bf16()):
        errors.append(f"bf16=True on a CPU where bf16 is not faster than float32 (helpers.machine.cpu_bf16() is False: "
                      f"no AVX512-BF16 or AMX, or its bf16 matmuls measured slower here). Set bf16=False ({fix}).")
    elif bf16 and on_gpu and not native_bf16(capability):
        errors.append(f"bf16=True on a GPU of compute capability {capability[0]}.{capability[1]} (a T4 is 7.5): bf16 "
                      f"needs 8.0 or newer (A100, L4, H100), even if torch.cuda.is_bf16_supported() says True. Use "
                      f"fp16 ({fix}).")
    elif fp16 and r.spec.fp32_on_t4:
        errors.append(f"fp16=True with {profile.model}: Gemma 3 overflows in fp16 (NaN losses). Below compute "
                      f"capability 8.0 it trains in float32: set fp16=False ({fix}).")
    length, floor = getattr(config, "max_completion_length", None), r.task.min_completion_tokens
    if length is None or length < floor:
        errors.append(f"max_completion_length={length} is too short for the {profile.task!r} task: a full answer "
                      f"needs at least {floor} tokens, and cut-off completions score 0 (watch "
                      "completions/clipped_ratio). Raise it.")
    elif length + profile.max_prompt_tokens > profile.max_seq_length:
        errors.append(f"max_completion_length={length} + max_prompt_tokens={profile.max_prompt_tokens} exceeds "
                      f"max_seq_length={profile.max_seq_length}: lower one of them or raise max_seq_length.")
    if getattr(config, "use_vllm", False):
        if not on_gpu:
            errors.append("use_vllm=True on a CPU profile: vLLM needs a CUDA GPU. Set use_vllm=False.")
        elif not (installed("vllm") if vllm_installed is None else vllm_installed):
            errors.append("use_vllm=True but vLLM is not installed. Set use_vllm=False (and fast_inference=False when "
                          "loading): slower generation, the same results. The Colab install leaves vLLM out (vllm "
                          "0.19.1 needs torch 2.10); on a workstation with torch 2.10, `pip install -e '.[gpu,vllm]'`.")
    if errors:
        raise TrainingConfigError(errors[0] if len(errors) == 1 else "Fix these settings:\n- " + "\n- ".join(errors))


def grpo_kwargs(profile: Profile | Resolved, run: str | Path,
                capability: tuple[int, int] | None = None) -> dict[str, Any]:
    """Every value notebook 03's ``GRPOConfig`` cell sets, as a dict (the recipe writes them as YAML).

    Example:
        >>> from helpers.profiles import get_profile
        >>> k = grpo_kwargs(get_profile("cpu-smoke"), "/tmp/run")
        >>> k["num_generations"], k["loss_type"], k["reward_weights"]
        (2, 'dapo', [1.0, 0.5, 0.5, 0.25])
    """
    r = resolve(profile, capability=capability, probe=False)
    profile, rewards = r.profile, r.task.rewards_for(r.profile.task_level)
    return dict(
        output_dir=str(Path(run) / GRPO_DIR), num_generations=profile.num_generations,
        per_device_train_batch_size=profile.per_device_train_batch_size,
        gradient_accumulation_steps=profile.gradient_accumulation_steps,
        max_completion_length=profile.max_completion_length, temperature=profile.temperature,
        chat_template_kwargs=r.spec.chat_template_kwargs or None,
        learning_rate=profile.learning_rate, lr_scheduler_type=profile.lr_scheduler_type, warmup_steps=0,
        optim=profile.optim, weight_decay=profile.weight_decay, max_grad_norm=profile.max_grad_norm, beta=profile.beta,
        loss_type=profile.loss_type, scale_rewards=profile.scale_rewards, num_iterations=profile.num_iterations,
        epsilon_high=profile.epsilon_high, mask_truncated_completions=profile.mask_truncated_completions,
        reward_weights=[w for _, w in rewards], max_steps=profile.max_steps, logging_steps=1,
        save_steps=profile.save_steps, save_total_limit=1, log_completions=True, num_completions_to_print=0,
        **tracking_kwargs(run, profile.task, profile.loss_type, profile.seed, Path(run) / GRPO_DIR),
        disable_tqdm=True, seed=profile.seed, use_cpu=profile.backend != "unsloth",
        gradient_checkpointing=profile.gradient_checkpointing, use_vllm=profile.use_vllm, vllm_mode="colocate",
        vllm_gpu_memory_utilization=profile.gpu_memory_utilization, **r.precision)


def grpo_config(profile: Profile | Resolved, run: str | Path, capability: tuple[int, int] | None = None,
                **overrides: Any) -> Any:
    """The ``GRPOConfig`` notebook 03 writes out (``overrides`` on top), checked."""
    r = resolve(profile, capability=capability)
    import_unsloth(r.profile)  # before TRL: Unsloth replaces its GRPOConfig
    from trl import GRPOConfig
    config = GRPOConfig(**{**grpo_kwargs(r, run), **overrides})
    check_config(config, r)
    return config


def sft_kwargs(profile: Profile | Resolved, run: str | Path,
               capability: tuple[int, int] | None = None) -> dict[str, Any]:
    """The warm-up's ``SFTConfig`` values, as a dict."""
    r = resolve(profile, capability=capability, probe=False)
    profile = r.profile
    return dict(output_dir=str(Path(run) / WARMUP_ADAPTER_DIR), num_train_epochs=profile.warmup_epochs,
                learning_rate=profile.warmup_learning_rate, lr_scheduler_type="constant",
                per_device_train_batch_size=profile.warmup_batch_size, completion_only_loss=True, logging_steps=1,
                save_strategy="no", report_to="none", disable_tqdm=True, seed=profile.seed,
                use_cpu=profile.backend != "unsloth", gradient_checkpointing=profile.gradient_checkpointing,
                **r.precision)


def warmup_dataset(profile: Profile | Resolved, tokenizer: Any) -> Any:
    """The format warm-up: ``warmup_examples`` rows of ``warmup_level`` as prompt-completion conversations.

    The completion is the task's reference; SFT learns only what follows the prompt's prefill, as GRPO will ask."""
    from datasets import Dataset
    r, role = resolve(profile, probe=False), supports_system_role(tokenizer)
    profile, task, kwargs = r.profile, r.task, r.spec.chat_template_kwargs
    rows = task.make_rows(profile.warmup_level, profile.warmup_examples, profile.seed + 1)
    return Dataset.from_list([{"prompt": build_prompt(str(row["question"]), task.system_prompt_for(row), role),
                               "completion": [{"role": "assistant", "content": task.reference(row)}],
                               **({"chat_template_kwargs": dict(kwargs)} if kwargs else {})} for row in rows])


def run_warmup(model: Any, tokenizer: Any, profile: Profile | Resolved, run: str | Path,
               capability: tuple[int, int] | None = None) -> dict[str, Any]:
    """Notebook 03's warm-up: ``SFTTrainer`` on :func:`warmup_dataset`, saved to ``RUN/warmup-adapter``; a summary."""
    r = resolve(profile, capability=capability)
    import_unsloth(r.profile)
    from transformers import PrinterCallback
    from trl import SFTConfig, SFTTrainer
    start, rows = time.time(), warmup_dataset(r, tokenizer)
    trainer = SFTTrainer(model=model, args=SFTConfig(**sft_kwargs(r, run)), train_dataset=rows,
                         processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)
    out = trainer.train()
    prepare_tokenizer(tokenizer, model)
    for thing in (model, tokenizer):
        thing.save_pretrained(str(Path(run) / WARMUP_ADAPTER_DIR))
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"examples": len(rows), "steps": int(out.global_step), "seconds": round(time.time() - start, 1),
            "final_loss": losses[-1] if losses else None}


def last_checkpoint(run: str | Path) -> str | None:
    """The newest *complete* checkpoint of ``RUN/grpo`` (it holds ``trainer_state.json``, written last), or None.

    Not transformers' ``get_last_checkpoint``: it takes the highest folder even when a disconnect cut it mid-save."""
    steps = {int(p.name.rsplit("-", 1)[1]): p for p in (Path(run) / GRPO_DIR).glob("checkpoint-*")
             if p.name.rsplit("-", 1)[1].isdigit() and (p / "trainer_state.json").is_file()}
    return str(steps[max(steps)]) if steps else None


def train_grpo(profile: Profile | Resolved, run: str | Path, model: Any = None, tokenizer: Any = None,
               resume: bool = True, warmup: bool | None = None, budget_start: float | None = None,
               live: bool | None = False, callbacks: Sequence[Any] = (), config_overrides: dict[str, Any] | None = None,
               task: Task | None = None) -> dict:
    """Notebook 03 in one call: warm-up unless resuming, GRPO, adapter saved; the budget starts at ``budget_start``.

    ``config_overrides``: ``GRPOConfig`` values on top of the profile's (a benchmark's variant), checked like the rest.
    ``task``: the instance that trains (a notebook's ``TASK``, changed or not), else the one the profile names.

    Watched as notebook 03 watches it: held-out accuracy every few steps (:class:`helpers.callbacks.HeldOutCallback`),
    the named warnings (:class:`helpers.callbacks.WatchCallback`), and trackio in ``RUN/trackio`` where it runs
    (:func:`helpers.tracking.use_trackio` says why not elsewhere)."""
    tracking = use_trackio(run)  # before TRL imports trackio: its folder is read once, at import
    if not tracking.on:
        print(tracking)
    r = resolve(profile, task)  # the task, model entry and GPU capability, looked up once for the whole run
    profile = r.profile
    import_unsloth(profile)  # first: Unsloth rewrites TRL's trainer and config when imported
    from transformers import PrinterCallback
    from trl import GRPOTrainer
    start, run = budget_start or time.time(), Path(run)
    if model is None:  # notebook 03's loading cell: float32 on a CPU
        model, tokenizer = load_model(r, bf16=r.precision["bf16"])
    rewards = r.task.rewards_for(profile.task_level)
    config = grpo_config(r, run, **(config_overrides or {}))
    checkpoint = last_checkpoint(run) if resume else None
    warm_up = (profile.warmup_examples > 0 if warmup is None else warmup) and checkpoint is None
    warm = run_warmup(model, tokenizer, r, run) if warm_up else None
    dataset = ensure_prepared(r, run, tokenizer=tokenizer, verbose=False)
    train_rows, selection = dataset["train"], None
    if profile.select_prompts and checkpoint is None:  # a resumed run keeps its data order from the checkpoint
        train_rows, selection = select_for_profile(model, tokenizer, train_rows, r)
        config.shuffle_dataset = profile.select_mode == "filter"
    heldout, headline = held_out_callback(r, tokenizer, dataset["eval"]), r.task.headline
    watch = WatchCallback(config.mask_truncated_completions, headline)
    course = [*([heldout] if heldout else []), watch, DashboardCallback(run, live=live, headline=headline),
              RunLogCallback(run), *callbacks]
    budget = TimeBudgetCallback(profile.time_budget_minutes, start=start) if profile.time_budget_minutes else None
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[f for f, _ in rewards], args=config,
                          train_dataset=train_rows, callbacks=course + ([budget] if budget else []))
    trainer.remove_callback(PrinterCallback)
    tracker_last(trainer)  # after the held-out callback, so trackio logs its numbers
    trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model(str(run / ADAPTER_DIR))
    tokenizer.save_pretrained(str(run / ADAPTER_DIR))
    summary = {"global_step": trainer.state.global_step, "resumed_from": checkpoint, "warmup": warm,
               "stopped_by_time_budget": bool(budget and budget.stopped_at_step is not None),
               "seconds": round(time.time() - start, 1), "heldout_seconds": round(heldout.seconds, 1) if heldout else 0,
               "warnings": [str(w) for w in watch.raised], "tracking": str(tracking), "selection": selection}
    write_train_config(run, r, config, rewards, summary=summary)
    return {"trainer": trainer, "model": model, "tokenizer": tokenizer, "summary": summary,
            "heldout": heldout.points if heldout else [], "warnings": watch.raised}


def held_out_callback(profile: Profile | Resolved, tokenizer: Any, rows: Any,
                      at_start: bool = False) -> HeldOutCallback | None:
    """The held-out slice scored while training: the first ``profile.watch_prompts`` rows, ``watch_evals`` times.

    Greedy, the profile's completion length (:func:`helpers.evaluation.eval_settings`); ``at_start``: once more
    before the first step (one more evaluation's time); None when ``watch_prompts`` is 0."""
    from .evaluation import eval_settings
    r = resolve(profile, probe=False)
    n, profile = min(r.profile.watch_prompts, rows.num_rows), r.profile
    if n <= 0:
        return None
    return HeldOutCallback(tokenizer, rows.select(range(n)), r.task,
                           watch_every(profile.max_steps, profile.watch_evals), eval_settings(profile),
                           chat_template_kwargs=r.spec.chat_template_kwargs, at_start=at_start)


def write_train_config(run: str | Path, profile: Profile | Resolved, config: Any, rewards: list,
                       **extra: Any) -> Path:
    """``RUN/train_config.json`` (profile, ``GRPOConfig``, rewards) and the versions and machine in ``RUN/run.json``."""
    r = resolve(profile, probe=False)
    path = write_json(Path(run) / "train_config.json", {
        "profile": r.profile.to_dict(), "prefill": r.task.prefill,
        "rewards": [{"name": f.__name__, "weight": w} for f, w in rewards], "grpo_config": config.to_dict(), **extra})
    info_path = Path(run) / "run.json"
    info = read_json(info_path) if info_path.is_file() else {"created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    info.update(profile=r.profile.to_dict(), versions=installed_versions(),
                training={"adapter": ADAPTER_DIR, "config": path.name},
                machine={"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()})
    write_json(info_path, info)
    return path


def ensure_adapter(profile: Profile, run: str | Path, **kwargs: Any) -> Path:
    """``RUN/adapter``; when missing, say so and train one stopped after ``profile.fallback_minutes``."""
    path = Path(run) / ADAPTER_DIR
    if (path / "adapter_config.json").is_file():
        return path
    print(f"No adapter in {path}. Training a short one now: profile {profile.name!r}'s recipe, stopped after "
          f"{profile.fallback_minutes:g} minutes (the full notebook 03 takes about "
          f"{profile.minutes.get('03_grpo_training', '?')} minutes). For the real one, run notebook 03 first, or copy "
          f"a finished run folder (its adapter/ and grpo/) into {Path(run)}.")
    train_grpo(profile.with_overrides(time_budget_minutes=profile.fallback_minutes), run, **kwargs)
    return path

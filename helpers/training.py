"""GRPO training: the checks TRL does not make, and the save point of notebook 03.

Notebook 03 writes ``SFTConfig``, ``SFTTrainer``, ``GRPOConfig`` and
``GRPOTrainer`` out in its cells. This module keeps:

* :func:`check_config`: what a ``GRPOConfig`` can get wrong that TRL does not
  catch (bf16 below compute capability 8.0, Gemma 3 in fp16, a completion
  length too short for the task, vLLM where it cannot run), and
  :func:`explain_config_error` for arguments TRL or transformers removed
  (``max_prompt_length``, ``warmup_ratio``), with the fix. TRL already checks
  that ``num_generations`` divides the generation batch.
* the save point of notebook 03's cells, the same calls as functions, for
  notebook 04 (a short run when no adapter exists) and the benchmarks:
  :func:`grpo_config`, :func:`warmup_dataset`, :func:`run_warmup`,
  :func:`train_grpo`, :func:`ensure_adapter`, and :func:`time_grpo_step` (notebook 00's plan).
  ``tests/test_notebooks.py`` checks
  that the notebook's ``GRPOConfig`` cell builds the same config.

On a GPU profile ``unsloth`` must be imported before TRL (Unsloth rewrites
TRL's classes at import): every function here that builds a TRL config or
trainer calls :func:`helpers.models.import_unsloth` first.

Example:
    >>> explain_config_error(TypeError("__init__() got an unexpected keyword argument 'max_prompt_length'"))[:39]
    'TRL 0.28 removed `max_prompt_length`: p'
"""

from __future__ import annotations

import importlib.util
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import Profile, get_model_spec
from .preflight import gpu_capability, native_bf16, precision

GRPO_DIR, ADAPTER_DIR, WARMUP_ADAPTER_DIR = "grpo", "adapter", "warmup-adapter"

#: Arguments that tutorials still pass and the pinned TRL / transformers no longer accept, with the fix.
REMOVED_ARGS: dict[str, str] = {
    "max_prompt_length": "TRL 0.28 removed `max_prompt_length`: prompts are no longer truncated by the trainer. "
                         "Drop long prompts from the dataset instead (notebook 01, profile.max_prompt_tokens).",
    "warmup_ratio": "transformers 5 removed `warmup_ratio`: give `warmup_steps` (a number of steps) instead.",
    "max_length": "GRPO has no `max_length`: set `max_completion_length` (tokens the model may generate).",
    "vllm_device": "TRL chooses the vLLM device itself: remove `vllm_device` (vllm_mode='colocate' on one GPU).",
    "use_liger_loss": "Renamed: use `use_liger_kernel`.",
}

#: The fewest completion tokens a full answer in the course format needs, per task.
MIN_COMPLETION_TOKENS: dict[str, int] = {"arithmetic": 20, "gsm8k": 128}


class TrainingConfigError(ValueError):
    """A training setting that would fail or silently teach nothing; the message says what to change."""


def explain_config_error(error: Exception) -> str:
    """What to do about a ``TypeError`` from ``GRPOConfig(...)`` / ``SFTConfig(...)`` (an unknown argument).

    Returns the course's fix for an argument the pinned libraries removed, else the error's own text.
    """
    found = re.search(r"unexpected keyword argument '(\w+)'", str(error))
    if found and found.group(1) in REMOVED_ARGS:
        return REMOVED_ARGS[found.group(1)]
    return str(error)


def check_config(config: Any, profile: Profile, capability: tuple[int, int] | None = None,
                 vllm_installed: bool | None = None) -> None:
    """Raise :class:`TrainingConfigError` for a ``GRPOConfig`` that TRL accepts but that fails or teaches nothing.

    ``capability`` is the GPU's compute capability (detected when None on a
    GPU profile); ``vllm_installed`` is detected when None.

    Example:
        >>> from helpers.config import get_profile
        >>> from types import SimpleNamespace as NS
        >>> check_config(NS(bf16=True, fp16=False, max_completion_length=256, use_vllm=False),
        ...              get_profile("colab-t4"), capability=(7, 5))
        Traceback (most recent call last):
        ...
        helpers.training.TrainingConfigError: bf16=True on a GPU of compute capability 7.5 (a T4 is 7.5): bf16 needs 8.0 or newer (A100, L4, H100), even if torch.cuda.is_bf16_supported() says True. Use fp16 (helpers.preflight.precision(PROFILE, capability) gives the right pair).
    """
    on_gpu = profile.backend == "unsloth"
    if on_gpu and capability is None:
        capability = gpu_capability()
    errors: list[str] = []
    bf16, fp16 = bool(getattr(config, "bf16", False)), bool(getattr(config, "fp16", False))
    fix = "helpers.preflight.precision(PROFILE, capability) gives the right pair"
    if (bf16 or fp16) and (not on_gpu or capability is None):
        errors.append(f"{'bf16' if bf16 else 'fp16'}=True on a CPU: CPU training runs in float32. Set bf16=False "
                      f"and fp16=False ({fix}).")
    elif bf16 and not native_bf16(capability):
        errors.append(f"bf16=True on a GPU of compute capability {capability[0]}.{capability[1]} (a T4 is 7.5): bf16 "
                      f"needs 8.0 or newer (A100, L4, H100), even if torch.cuda.is_bf16_supported() says True. Use "
                      f"fp16 ({fix}).")
    elif fp16 and get_model_spec(profile.model).fp32_on_t4:
        errors.append(f"fp16=True with {profile.model}: Gemma 3 overflows in fp16 (NaN losses). Below compute "
                      f"capability 8.0 it trains in float32: set fp16=False ({fix}).")
    length = getattr(config, "max_completion_length", None)
    floor = MIN_COMPLETION_TOKENS.get(profile.task, 16)
    if length is None or length < floor:
        errors.append(f"max_completion_length={length} is too short for the {profile.task!r} task: a full answer "
                      f"in the course format needs at least {floor} tokens, and cut-off completions score 0 (watch "
                      "completions/clipped_ratio). Raise it.")
    elif length + profile.max_prompt_tokens > profile.max_seq_length:
        errors.append(f"max_completion_length={length} + max_prompt_tokens={profile.max_prompt_tokens} exceeds "
                      f"max_seq_length={profile.max_seq_length}: lower one of them or raise max_seq_length.")
    if getattr(config, "use_vllm", False):
        if vllm_installed is None:
            vllm_installed = importlib.util.find_spec("vllm") is not None
        if not on_gpu:
            errors.append("use_vllm=True on a CPU profile: vLLM needs a CUDA GPU. Set use_vllm=False.")
        elif not vllm_installed:
            errors.append("use_vllm=True but vLLM is not installed: `pip install grpo-course[vllm]` and restart "
                          "the runtime, or set use_vllm=False (slower generation, the same results).")
    if errors:
        raise TrainingConfigError(errors[0] if len(errors) == 1 else
                                  "Fix these training settings:\n- " + "\n- ".join(errors))


# --------------------------------------------------------------------------- the save point of notebook 03


def grpo_config(profile: Profile, run: str | Path, reward_weights: list[float],
                capability: tuple[int, int] | None = None, **overrides: Any) -> Any:
    """The ``GRPOConfig`` notebook 03 writes out, from the profile (``overrides`` on top), checked.

    Import ``unsloth`` before calling this on a GPU profile (see the module doc).

    Example:
        cfg = grpo_config(get_profile("cpu-smoke"), "/tmp/run", [1.0])
        cfg.num_generations, cfg.beta
        # -> (2, 0.0)
    """
    from .models import import_unsloth

    import_unsloth(profile)  # before TRL: Unsloth replaces its GRPOConfig
    from trl import GRPOConfig

    if capability is None and profile.backend == "unsloth":
        capability = gpu_capability()
    config = GRPOConfig(**{**grpo_kwargs(profile, run, reward_weights, capability), **overrides})
    check_config(config, profile, capability=capability)
    return config


def grpo_kwargs(profile: Profile, run: str | Path, reward_weights: list[float],
                capability: tuple[int, int] | None = None) -> dict[str, Any]:
    """The keyword arguments :func:`grpo_config` gives ``GRPOConfig``: every value notebook 03 sets, as a dict
    (``helpers.recipe`` writes them into a ``trl grpo`` YAML). Imports nothing heavy.

    Example:
        >>> from helpers.config import get_profile
        >>> k = grpo_kwargs(get_profile("cpu-smoke"), "/tmp/run", [1.0])
        >>> k["num_generations"], k["loss_type"], k["use_cpu"]
        (2, 'dapo', True)
    """
    return dict(
        output_dir=str(Path(run) / GRPO_DIR),
        num_generations=profile.num_generations,
        per_device_train_batch_size=profile.per_device_train_batch_size,
        gradient_accumulation_steps=profile.gradient_accumulation_steps,
        max_completion_length=profile.max_completion_length,
        temperature=profile.temperature,
        chat_template_kwargs=get_model_spec(profile.model).chat_template_kwargs or None,
        learning_rate=profile.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim=profile.optim,
        weight_decay=profile.weight_decay,
        max_grad_norm=profile.max_grad_norm,
        beta=profile.beta,
        loss_type=profile.loss_type,
        scale_rewards=profile.scale_rewards,
        num_iterations=profile.num_iterations,
        epsilon_high=profile.epsilon_high,
        mask_truncated_completions=profile.mask_truncated_completions,
        reward_weights=list(reward_weights),
        max_steps=profile.max_steps,
        logging_steps=1,
        save_steps=profile.save_steps,
        save_total_limit=2,
        log_completions=True,
        num_completions_to_print=0,
        report_to="none",
        disable_tqdm=True,
        seed=profile.seed,
        use_cpu=profile.backend != "unsloth",
        use_vllm=profile.use_vllm,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=profile.gpu_memory_utilization,
        **precision(profile, capability),
    )


def warmup_dataset(profile: Profile, tokenizer: Any) -> Any:
    """The format warm-up rows: ``profile.warmup_examples`` problems of the (easier) ``warmup_level``
    as TRL prompt-completion conversations, the completion in the course format.

    ``SFTTrainer`` renders the prompt with the generation prompt (the prefill
    included) and trains only on what follows, so the model learns to continue
    the prefill as GRPO will ask it to.

    Example:
        warmup_dataset(get_profile("cpu-smoke"), tok)[0]["completion"][0]["content"][:12]
        # -> '<reasoning>\\n'
    """
    from datasets import Dataset

    from .prompts import build_prompt, reference_completion, supports_system_role
    from .tasks import generate_arithmetic

    role = supports_system_role(tokenizer)
    kwargs = get_model_spec(profile.model).chat_template_kwargs
    rows = []
    for r in generate_arithmetic(profile.warmup_examples, profile.warmup_level, seed=profile.seed + 1):
        row = {"prompt": build_prompt(r["question"], system_role=role),
               "completion": [{"role": "assistant", "content": reference_completion(r["solution"], r["answer"])}]}
        if kwargs:
            row["chat_template_kwargs"] = dict(kwargs)
        rows.append(row)
    return Dataset.from_list(rows)


def sft_kwargs(profile: Profile, run: str | Path, capability: tuple[int, int] | None = None) -> dict[str, Any]:
    """The keyword arguments of the warm-up's ``SFTConfig`` (:func:`run_warmup`), as a dict.

    Example:
        >>> from helpers.config import get_profile
        >>> k = sft_kwargs(get_profile("cpu-smoke"), "/tmp/run")
        >>> k["num_train_epochs"], k["completion_only_loss"], k["output_dir"]
        (1, True, '/tmp/run/warmup-adapter')
    """
    bits = precision(profile, capability)
    return dict(output_dir=str(Path(run) / WARMUP_ADAPTER_DIR), num_train_epochs=profile.warmup_epochs,
                learning_rate=profile.warmup_learning_rate, lr_scheduler_type="constant",
                per_device_train_batch_size=profile.warmup_batch_size, completion_only_loss=True,
                logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
                seed=profile.seed, use_cpu=profile.backend != "unsloth", bf16=bits["bf16"], fp16=bits["fp16"])


def run_warmup(model: Any, tokenizer: Any, profile: Profile, run: str | Path,
               capability: tuple[int, int] | None = None, dataset: Any = None) -> dict[str, Any]:
    """Notebook 03's warm-up cells: ``SFTConfig`` + ``SFTTrainer`` on :func:`warmup_dataset` (or on
    ``dataset``, prompt-completion rows of another task), then the adapter saved to
    ``RUN/warmup-adapter`` (notebook 04 evaluates it). Returns a summary."""
    from .models import import_unsloth, prepare_tokenizer

    import_unsloth(profile)
    from transformers import PrinterCallback
    from trl import SFTConfig, SFTTrainer


    if capability is None and profile.backend == "unsloth":
        capability = gpu_capability()
    config = SFTConfig(**sft_kwargs(profile, run, capability))
    start = time.time()
    rows = warmup_dataset(profile, tokenizer) if dataset is None else dataset
    trainer = SFTTrainer(model=model, args=config, train_dataset=rows, processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)
    out = trainer.train()
    prepare_tokenizer(tokenizer, model)
    model.save_pretrained(str(Path(run) / WARMUP_ADAPTER_DIR))
    tokenizer.save_pretrained(str(Path(run) / WARMUP_ADAPTER_DIR))
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"examples": len(rows), "steps": int(out.global_step),
            "seconds": round(time.time() - start, 1), "final_loss": losses[-1] if losses else None}


def last_checkpoint(run: str | Path) -> str | None:
    """The newest complete checkpoint of ``RUN/grpo``, or None.

    Complete: it holds ``trainer_state.json``, which the trainer writes last; a
    checkpoint cut off while saving (a disconnect) is passed over, where
    transformers' ``get_last_checkpoint`` would return it and resume from step 0.

    Example:
        >>> last_checkpoint("/nonexistent") is None
        True
    """
    folder = Path(run) / GRPO_DIR
    steps = {int(p.name.rsplit("-", 1)[1]): p for p in folder.glob("checkpoint-*")
             if p.name.rsplit("-", 1)[1].isdigit() and (p / "trainer_state.json").is_file()}
    return str(steps[max(steps)]) if steps else None


def train_grpo(profile: Profile, run: str | Path, model: Any = None, tokenizer: Any = None,
               rewards: list | None = None, resume: bool = True, warmup: bool | None = None,
               budget_start: float | None = None, live: bool | None = False,
               dataset: Any = None) -> dict[str, Any]:
    """Notebook 03 in one call: model, dataset, warm-up, ``GRPOConfig``, ``GRPOTrainer``, train, save.

    Resumes from ``RUN/grpo``'s last checkpoint when ``resume`` (the warm-up,
    already inside that checkpoint, is then skipped). The profile's time budget
    counts from ``budget_start`` (default: now). Returns
    ``{"trainer", "model", "tokenizer", "summary"}`` and writes ``RUN/adapter``,
    ``train_config.json`` and ``run.json``. ``dataset`` (a ``DatasetDict`` with ``train``) replaces
    the profile's prepared arithmetic/GSM8K rows: another task (notebook 05), with its ``rewards``.
    """
    from .models import import_unsloth, load_model

    import_unsloth(profile)  # first: Unsloth rewrites TRL's trainer and config when imported
    from transformers import PrinterCallback
    from trl import GRPOTrainer

    from .callbacks import DashboardCallback, RunLogCallback, TimeBudgetCallback
    from .data import ensure_prepared
    from .rewards import get_preset

    start = budget_start or time.time()
    run = Path(run)
    if model is None:
        model, tokenizer = load_model(profile)  # imports Unsloth first on a GPU profile
    rewards = rewards or get_preset(profile.reward_preset, prefill=profile.prefill)
    config = grpo_config(profile, run, [w for _, w in rewards])
    checkpoint = last_checkpoint(run) if resume else None
    warm = None
    if (profile.warmup_examples > 0 if warmup is None else warmup) and checkpoint is None:
        warm = run_warmup(model, tokenizer, profile, run)
    if dataset is None:
        dataset = ensure_prepared(profile, run, tokenizer=tokenizer, verbose=False)
    callbacks = [DashboardCallback(run, live=live), RunLogCallback(run)]
    if profile.time_budget_minutes:
        callbacks.append(TimeBudgetCallback(profile.time_budget_minutes, start=start))
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[f for f, _ in rewards],
                          args=config, train_dataset=dataset["train"], callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)
    trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model(str(run / ADAPTER_DIR))
    tokenizer.save_pretrained(str(run / ADAPTER_DIR))
    budget = next((c for c in callbacks if isinstance(c, TimeBudgetCallback)), None)
    summary = {"global_step": trainer.state.global_step, "resumed_from": checkpoint, "warmup": warm,
               "stopped_by_time_budget": bool(budget and budget.stopped_at_step is not None),
               "seconds": round(time.time() - start, 1)}
    write_train_config(run, profile, config, rewards, summary=summary)
    return {"trainer": trainer, "model": model, "tokenizer": tokenizer, "summary": summary}


def write_train_config(run: str | Path, profile: Profile, config: Any, rewards: list, **extra: Any) -> Path:
    """``RUN/train_config.json`` (the profile, every ``GRPOConfig`` value, the rewards with their
    weights, the prefill) and the versions and machine in ``run.json``: the run describes itself.

    Example:
        write_train_config(RUN, PROFILE, config, REWARDS)
    """
    from .runs import record_run_info, write_json

    path = write_json(Path(run) / "train_config.json", {
        "profile": profile.to_dict(), "prefill": profile.prefill,
        "rewards": [{"name": f.__name__, "weight": w} for f, w in rewards],
        "grpo_config": config.to_dict(), **extra})
    record_run_info(run, profile, training={"adapter": ADAPTER_DIR, "config": path.name})
    return path


def ensure_adapter(profile: Profile, run: str | Path, **kwargs: Any) -> Path:
    """``RUN/adapter``; when it is missing, say so and train a short one: the profile's recipe, stopped
    by ``profile.fallback_minutes`` (said up front), never the full run unannounced.

    Example::

        ensure_adapter(get_profile("colab-t4"), RUN)
        # -> No adapter in .../adapter. Training a short one now: ... stopped after 10 minutes ...
    """
    path = Path(run) / ADAPTER_DIR
    if (path / "adapter_config.json").is_file():
        return path
    short = profile.with_overrides(time_budget_minutes=profile.fallback_minutes)
    print(f"No adapter in {path}. Training a short one now: profile {profile.name!r}'s recipe, stopped after "
          f"{short.time_budget_minutes:g} minutes (the full notebook 03 takes about "
          f"{profile.minutes.get('03_grpo_training', '?')} minutes). For the real one, run notebook 03 first, "
          f"or copy a finished run folder (its adapter/ and grpo/) into {Path(run)}.")
    train_grpo(short, run, **kwargs)
    return path


@dataclass(frozen=True)
class StepTiming:
    """What GRPO steps cost on this machine, and what the profile's time budget buys with it.

    ``seconds`` are TRL's own ``step_time`` per logged step (generation, rewards, loss and backward
    of one optimizer step). The first step carries one-off costs (caches, kernels compiled on first
    use); the last one is the price of every later step.

    Example:
        >>> t = StepTiming("colab-t4", seconds=(31.0, 20.0), max_steps=250, budget_minutes=45, warmup=False)
        >>> t.step_seconds, t.steps_in_budget, t.fits
        (20.0, 134, False)
    """

    profile: str
    seconds: tuple[float, ...]
    max_steps: int
    budget_minutes: float | None
    warmup: bool

    @property
    def step_seconds(self) -> float:
        """A step after the first: what each step of the run will cost."""
        return self.seconds[-1]

    @property
    def steps_in_budget(self) -> int | None:
        """Steps that fit in the budget at this pace (the first step's extra cost counted); None: no budget."""
        if not self.budget_minutes:
            return None
        extra = max(0.0, self.seconds[0] - self.step_seconds)
        return max(0, int((self.budget_minutes * 60 - extra) // max(self.step_seconds, 1e-9)))

    @property
    def fits(self) -> bool:
        """True when all ``max_steps`` end inside the budget."""
        return self.steps_in_budget is None or self.steps_in_budget >= self.max_steps

    def plan(self) -> str:
        """Two or three sentences for notebook 00: the timed step, the budget in steps, what happens."""
        lines = [f"One GRPO step of profile {self.profile!r} takes {self.step_seconds:.1f} s here "
                 f"(the first took {self.seconds[0]:.1f} s: one-off costs)."]
        if self.budget_minutes is None:
            lines.append(f"No time budget: all {self.max_steps} steps take about "
                         f"{self.max_steps * self.step_seconds / 60:.0f} min.")
        else:
            fit = (f"all {self.max_steps} steps fit (about {self.max_steps * self.step_seconds / 60:.1f} min)"
                   if self.fits else f"training stops after about {self.steps_in_budget} of the "
                   f"{self.max_steps} steps, with the adapter saved; run notebook 03 again to go on "
                   "from there")
            lines.append(f"Time budget: {self.budget_minutes:g} min (COURSE_TIME_BUDGET changes it): {fit}.")
            if self.warmup:
                lines.append("The format warm-up before GRPO counts in the budget too.")
        return "\n".join(lines)


def time_grpo_step(profile: Profile, steps: int = 2, **kwargs: Any) -> StepTiming:
    """Time ``steps`` real GRPO steps of ``profile`` (its model, data and ``GRPOConfig``) in a scratch folder.

    Nothing is kept: the steps train a throw-away adapter in a temporary folder. ``kwargs`` go to
    :func:`train_grpo` (``model``, ``tokenizer``, ``rewards``).

    Example::

        print(time_grpo_step(get_profile("cpu-smoke")).plan())
        # -> One GRPO step of profile 'cpu-smoke' takes 3.1 s here (the first took 3.4 s: one-off costs). ...
    """
    import shutil
    import tempfile

    if steps < 1:
        raise ValueError(f"steps={steps}: time at least one step (2 shows the one-off costs of the first).")
    folder = Path(tempfile.mkdtemp(prefix="grpo-step-timing-"))
    try:
        timed = profile.with_overrides(max_steps=steps, time_budget_minutes=None, save_steps=steps + 1)
        out = train_grpo(timed, folder, resume=False, warmup=False, **kwargs)
        seconds = tuple(round(float(row["step_time"]), 2) for row in out["trainer"].state.log_history
                        if "step_time" in row)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if not seconds:
        raise RuntimeError("TRL logged no `step_time`: the pinned TRL should log it every step (logging_steps=1).")
    return StepTiming(profile.name, seconds, profile.max_steps, profile.time_budget_minutes,
                      warmup=profile.warmup_examples > 0)

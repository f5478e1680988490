"""GRPO training: the config from the profile, checked; the trainer; resume; the adapter.

The pieces, in the order notebook 03 uses them:

1. :func:`grpo_settings` turns the profile (plus your overrides) into the
   keyword arguments of TRL's ``GRPOConfig`` and :func:`check_settings`
   rejects what would fail later (before any model loads), saying what to
   change. :func:`build_grpo_config` does both and builds the config.
2. :func:`build_trainer` makes one ``GRPOTrainer`` from (model, tokenizer,
   dataset, rewards with weights, config), wired to the run folder: metrics
   and completions logs, the live dashboard, the time budget, checkpoints.
3. :func:`train` runs it, resuming from the last checkpoint when there is one
   (log lines after that checkpoint are dropped first, so no step is repeated
   or lost), and saves the adapter to ``RUN/adapter``.

:func:`run_grpo` chains everything (dataset, model, format warm-up, GRPO) and
:func:`ensure_adapter` trains briefly when ``RUN/adapter`` is missing.

Example:
    >>> from helpers.config import get_profile
    >>> from helpers.training import grpo_settings, check_settings
    >>> s = grpo_settings(get_profile("cpu-smoke"), "/tmp/run", max_steps=3)
    >>> s["max_steps"], s["num_generations"]
    (3, 2)
    >>> check_settings(s, get_profile("cpu-smoke"))
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .config import Profile, get_model_spec
from .runs import read_json, record_run_info, write_json

ADAPTER_DIR = "adapter"
CHECKPOINT_DIR = "checkpoints"
CONFIG_FILE = "train_config.json"
SUMMARY_FILE = "train_summary.json"

#: Arguments older tutorials pass that the installed TRL no longer accepts, and what to do instead.
REMOVED_ARGS: dict[str, str] = {
    "max_prompt_length": (
        "TRL 1.x removed `max_prompt_length`: prompts are no longer truncated by the trainer. "
        "Filter long prompts in the dataset instead (notebook 01: helpers.data.filter_by_budget, "
        "profile.max_prompt_tokens)."
    ),
    "max_length": "GRPO has no `max_length`: set `max_completion_length` (tokens the model may generate).",
    "vllm_device": "TRL 1.x chooses the vLLM device itself: remove `vllm_device`; use vllm_mode='colocate' on one GPU.",
    "vllm_guided_decoding_regex": "Renamed in TRL 1.x: use `vllm_structured_outputs_regex`.",
    "use_liger_loss": "Renamed in TRL 1.x: use `use_liger_kernel`.",
}

#: The fewest completion tokens that fit a full answer in the course format, per task.
MIN_COMPLETION_TOKENS: dict[str, int] = {"arithmetic": 20, "gsm8k": 128}


class TrainingConfigError(ValueError):
    """A training setting that would fail or silently teach nothing; the message says what to change."""


# --------------------------------------------------------------------------- precision


def gpu_capability() -> tuple[int, int] | None:
    """Compute capability of GPU 0, or None without CUDA.

    Example:
        >>> gpu_capability() is None or len(gpu_capability()) == 2
        True
    """
    try:
        import torch
    except ImportError:  # pragma: no cover
        return None
    if not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(0))  # type: ignore[return-value]


def choose_precision(profile: Profile, capability: tuple[int, int] | None) -> dict[str, bool]:
    """``{"bf16", "fp16"}`` for this profile on a GPU of this compute capability.

    bf16 needs compute capability >= 8.0 (Ampere); a T4 is 7.5, where
    ``torch.cuda.is_bf16_supported()`` can still say True (emulated, slow or
    wrong), so the capability decides. A model marked ``fp32_on_t4`` (Gemma 3
    overflows in fp16) trains in float32 below 8.0. CPU: float32.

    Example:
        >>> from helpers.config import get_profile
        >>> choose_precision(get_profile("colab-t4"), (7, 5))
        {'bf16': False, 'fp16': True}
        >>> choose_precision(get_profile("colab-t4", model="gemma3-1b"), (7, 5))
        {'bf16': False, 'fp16': False}
        >>> choose_precision(get_profile("gpu-large"), (8, 0))
        {'bf16': True, 'fp16': False}
    """
    if profile.backend != "unsloth" or capability is None:
        return {"bf16": False, "fp16": False}
    if tuple(capability) >= (8, 0):
        return {"bf16": True, "fp16": False}
    if get_model_spec(profile.model).fp32_on_t4:
        return {"bf16": False, "fp16": False}
    return {"bf16": False, "fp16": True}


# --------------------------------------------------------------------------- settings


def grpo_settings(profile: Profile, run: str | Path, capability: tuple[int, int] | None = None,
                  **overrides: Any) -> dict[str, Any]:
    """The ``GRPOConfig`` keyword arguments for a profile, with ``overrides`` on top.

    ``capability`` is the GPU's compute capability (detected when None).
    Nothing here imports TRL or loads a model.

    Example:
        >>> from helpers.config import get_profile
        >>> s = grpo_settings(get_profile("cpu-demo"), "/tmp/run")
        >>> s["per_device_train_batch_size"] % s["num_generations"]
        0
    """
    run = Path(run)
    if capability is None and profile.backend == "unsloth":
        capability = gpu_capability()
    s: dict[str, Any] = dict(
        output_dir=str(run / CHECKPOINT_DIR),
        learning_rate=profile.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        per_device_train_batch_size=profile.per_device_train_batch_size,
        gradient_accumulation_steps=profile.gradient_accumulation_steps,
        num_generations=profile.num_generations,
        max_completion_length=profile.max_completion_length,
        max_steps=profile.max_steps,
        temperature=profile.temperature,
        beta=profile.beta,
        loss_type=profile.loss_type,
        scale_rewards=profile.scale_rewards,
        num_iterations=profile.num_iterations,
        logging_steps=profile.logging_steps,
        save_strategy="steps",
        save_steps=profile.save_steps,
        save_total_limit=2,
        seed=profile.seed,
        report_to="none",
        disable_tqdm=True,
        **choose_precision(profile, capability),
    )
    if profile.backend == "unsloth":
        s.update(optim="adamw_8bit", max_grad_norm=0.1, weight_decay=0.1)
    else:
        s.update(use_cpu=True)
    if profile.use_vllm:
        s.update(use_vllm=True, vllm_mode="colocate",
                 vllm_gpu_memory_utilization=profile.gpu_memory_utilization)
    s.update(overrides)
    return s


def _grpo_fields() -> set[str]:
    from trl import GRPOConfig

    return {f.name for f in dataclasses.fields(GRPOConfig)}


def check_settings(settings: dict[str, Any], profile: Profile,
                   capability: tuple[int, int] | None = None,
                   vllm_installed: bool | None = None) -> None:
    """Raise :class:`TrainingConfigError` for settings that would fail or teach nothing.

    Checks: every key exists in the installed ``GRPOConfig`` (removed ones get
    a specific message); ``num_generations`` >= 2 and divides the generation
    batch; the completion length fits the task and the sequence budget;
    precision suits the hardware; vLLM only where installed and on a GPU, in
    colocate mode on one GPU; the time budget is positive.

    Example:
        >>> from helpers.config import get_profile
        >>> p = get_profile("cpu-smoke")
        >>> check_settings(grpo_settings(p, "/tmp/r", num_generations=3), p)
        Traceback (most recent call last):
        ...
        helpers.training.TrainingConfigError: num_generations=3 does not divide the generation batch of 2 completions (per_device_train_batch_size=2 x gradient_accumulation_steps=1). Set per_device_train_batch_size to a multiple of 3 (e.g. 3), or num_generations to a divisor of 2.
    """
    errors: list[str] = []
    fields = _grpo_fields()
    for key in settings:
        if key in fields:
            continue
        if key in REMOVED_ARGS:
            errors.append(f"`{key}`: {REMOVED_ARGS[key]}")
        else:
            close = difflib.get_close_matches(key, sorted(fields), n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            errors.append(f"`{key}` is not a GRPOConfig argument in the installed TRL.{hint}")

    g = int(settings.get("num_generations") or 8)
    per_device = int(settings.get("per_device_train_batch_size", 8))
    accum = int(settings.get("gradient_accumulation_steps", 1))
    if settings.get("generation_batch_size"):
        gen_batch, how = int(settings["generation_batch_size"]), "generation_batch_size"
    else:
        steps_per_gen = int(settings.get("steps_per_generation") or accum)
        gen_batch = per_device * steps_per_gen
        how = (f"per_device_train_batch_size={per_device} x "
               f"{'steps_per_generation' if settings.get('steps_per_generation') else 'gradient_accumulation_steps'}"
               f"={steps_per_gen}")
    if g < 2:
        errors.append(
            f"num_generations={g}: GRPO compares completions of the same prompt, so it needs at "
            "least 2 (4-16 is typical)."
        )
    elif gen_batch % g:
        errors.append(
            f"num_generations={g} does not divide the generation batch of {gen_batch} completions "
            f"({how}). Set per_device_train_batch_size to a multiple of {g} (e.g. {g * max(1, per_device // g)}), "
            f"or num_generations to a divisor of {gen_batch}."
        )

    length = settings.get("max_completion_length")
    floor = MIN_COMPLETION_TOKENS.get(profile.task, 16)
    if length is None or int(length) < floor:
        errors.append(
            f"max_completion_length={length} is too short for the {profile.task!r} task: a full "
            f"answer in the course format needs at least {floor} tokens, and truncated completions "
            "score 0 (watch completions/clipped_ratio). Raise it."
        )
    elif int(length) + profile.max_prompt_tokens > profile.max_seq_length:
        errors.append(
            f"max_completion_length={length} + max_prompt_tokens={profile.max_prompt_tokens} exceeds "
            f"max_seq_length={profile.max_seq_length}: lower one of them or raise max_seq_length."
        )

    on_gpu = profile.backend == "unsloth"
    if settings.get("bf16") and (not on_gpu or capability is None or tuple(capability) < (8, 0)):
        where = "a CPU" if not on_gpu or capability is None else f"a GPU of compute capability {capability[0]}.{capability[1]} (e.g. a T4)"
        errors.append(
            f"bf16=True on {where}: bf16 needs compute capability >= 8.0 (A100, L4, H100). "
            "Leave precision to the course (remove bf16/fp16 from your overrides): fp16 on a T4, "
            "float32 for Gemma 3 on a T4."
        )
    if settings.get("fp16"):
        if not on_gpu or capability is None:
            errors.append("fp16=True on a CPU: CPU training runs in float32; remove fp16.")
        elif tuple(capability) < (8, 0) and get_model_spec(profile.model).fp32_on_t4:
            errors.append(
                f"fp16=True with {profile.model} on a compute capability "
                f"{capability[0]}.{capability[1]} GPU: Gemma 3 overflows in fp16 (NaN losses). "
                "Remove fp16; it trains in float32 there."
            )
    if settings.get("bf16") and settings.get("fp16"):
        errors.append("bf16 and fp16 are both True: choose one (or leave both to the course).")

    if settings.get("use_vllm"):
        if vllm_installed is None:
            vllm_installed = importlib.util.find_spec("vllm") is not None
        if not on_gpu:
            errors.append("use_vllm=True on a CPU profile: vLLM needs a CUDA GPU. Remove it.")
        elif not vllm_installed:
            errors.append(
                "use_vllm=True but vLLM is not installed: `pip install grpo-course[vllm]` "
                "(restart the runtime after), or set use_vllm=False (slower generation, same results)."
            )
        mode = settings.get("vllm_mode", "colocate")
        if mode != "colocate":
            errors.append(
                f"vllm_mode={mode!r}: on one GPU use 'colocate' (vLLM shares the training GPU). "
                "'server' needs `trl vllm-serve` running on other GPUs."
            )

    lr = settings.get("learning_rate")
    if lr is not None and not (0 < float(lr) < 1):
        errors.append(f"learning_rate={lr}: use a small positive value (LoRA: 5e-6..5e-4).")
    if errors:
        raise TrainingConfigError(" ".join(errors) if len(errors) == 1 else
                                  "Fix these training settings:\n- " + "\n- ".join(errors))


def build_grpo_config(profile: Profile, run: str | Path, capability: tuple[int, int] | None = None,
                      **overrides: Any) -> Any:
    """A checked ``trl.GRPOConfig`` for the profile (plus overrides); no model is loaded.

    Example:
        >>> from helpers.config import get_profile
        >>> cfg = build_grpo_config(get_profile("cpu-smoke"), "/tmp/run", learning_rate=2e-4)
        >>> cfg.learning_rate, cfg.beta
        (0.0002, 0.0)
    """
    if capability is None and profile.backend == "unsloth":
        capability = gpu_capability()
    settings = grpo_settings(profile, run, capability=capability, **overrides)
    check_settings(settings, profile, capability=capability)
    from trl import GRPOConfig

    return GRPOConfig(**settings)


def describe_config(config: Any, keys: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Rows of ``{"setting", "value", "why"}`` for the knobs notebook 03 explains.

    Example:
        >>> rows = describe_config(build_grpo_config(get_profile("cpu-smoke"), "/tmp/r"))
        >>> rows[0]["setting"]
        'num_generations'
    """
    keys = keys or list(KNOBS)
    return [{"setting": k, "value": getattr(config, k, None), "why": KNOBS.get(k, "")} for k in keys]


#: What each knob does, in one line (the notebook's table).
KNOBS: dict[str, str] = {
    "num_generations": "completions sampled per prompt (the group); advantages compare within it",
    "per_device_train_batch_size": "completions per step (prompts per step = this / num_generations)",
    "max_completion_length": "tokens a completion may use; too short truncates answers (clipped_ratio)",
    "temperature": "sampling temperature; groups need diversity to get different rewards",
    "learning_rate": "LoRA step size; GRPO's updates are small, LoRA tolerates 1e-4..5e-4",
    "beta": "KL penalty to the reference model; 0 = no reference model, less memory",
    "loss_type": "how token losses are averaged (dapo: over all tokens of the batch)",
    "scale_rewards": "divide advantages by the group's reward std ('group'), the batch's, or not",
    "num_iterations": "optimisation passes per generated batch (>1 reuses completions, clipped ratio)",
    "max_steps": "optimizer steps (one generation batch each)",
    "save_steps": "checkpoint every N steps (resume after a disconnect)",
    "reward_weights": "weight of each reward in the total used for advantages",
}


# --------------------------------------------------------------------------- dataset


def with_prefill(dataset: Any, prefill: str | None) -> Any:
    """The dataset with every prompt ending in a prefilled assistant turn (``None``: unchanged).

    Example:
        >>> from datasets import Dataset
        >>> ds = Dataset.from_list([{"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"}])
        >>> with_prefill(ds, "<reasoning>\\n")[0]["prompt"][-1]
        {'role': 'assistant', 'content': '<reasoning>\\n'}
    """
    if not prefill:
        return dataset

    def add(row: dict[str, Any]) -> dict[str, Any]:
        prompt = list(row["prompt"])
        if prompt and prompt[-1].get("role") != "assistant":
            prompt = prompt + [{"role": "assistant", "content": prefill}]
        return {"prompt": prompt}

    return dataset.map(add)


# --------------------------------------------------------------------------- trainer


def _grpo_trainer_class() -> type:
    """GRPOTrainer subclass that hands every scored generation batch to the completions log."""
    from trl import GRPOTrainer

    class CourseGRPOTrainer(GRPOTrainer):
        """TRL's GRPOTrainer plus one hook: scored completions go to ``completion_sink``."""

        completion_sink: Callable[[list[dict[str, Any]]], None] | None = None
        drop_equal_reward_groups: bool = False

        def _generate_and_score_completions(self, inputs):  # noqa: D401
            output = super()._generate_and_score_completions(inputs)
            if self.model.training:
                if self.drop_equal_reward_groups:
                    _drop_equal_reward_groups(self, output)
                if self.completion_sink is not None:
                    try:
                        self.completion_sink(_rows_from_logs(self, inputs))
                    except Exception as exc:  # logging must never stop training
                        print(f"[completions log] skipped one batch: {exc!r}")
            return output

    return CourseGRPOTrainer


def _drop_equal_reward_groups(trainer: Any, output: dict[str, Any]) -> None:
    """Leave groups whose completions all got the same reward out of the loss normaliser.

    Their advantages are 0 already, so they add no gradient; but with
    ``loss_type="dapo"`` (TRL's default) their tokens still count in the
    number the loss is divided by, diluting the groups that do teach
    something. This is DAPO's "dynamic sampling" without the resampling.
    Logs ``course/kept_groups`` (fraction of groups that stay).
    """
    if trainer.loss_type not in ("dapo", "cispo", "vespo"):
        return
    adv = output["advantages"]
    mask = output["completion_mask"]
    g = trainer.num_generations
    if adv.numel() % g:
        return
    informative = (adv.view(-1, g) != 0).any(dim=1)
    keep_rows = informative.repeat_interleave(g)
    kept_tokens = (mask * keep_rows.unsqueeze(1).to(mask.dtype)).sum()
    output["num_items_in_batch"] = kept_tokens.clamp(min=1).to(output["num_items_in_batch"].dtype)
    trainer._metrics["train"]["course/kept_groups"].append(informative.float().mean().item())


def _question(row: dict[str, Any]) -> str:
    if row.get("question"):
        return str(row["question"])
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content", "") for m in prompt or [] if m.get("role") == "user"]
    return str(users[-1]) if users else ""


def _rows_from_logs(trainer: Any, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last ``len(inputs)`` completions TRL recorded, with question, answer, rewards, advantage."""
    n = len(inputs)
    logs = trainer._logs
    completions = list(logs["completion"])[-n:]
    advantages = list(logs["advantages"])[-n:]
    names = list(trainer.reward_func_names)
    per_func = {name: list(logs["rewards"][name])[-n:] for name in names}
    weights = [float(w) for w in trainer.reward_weights.tolist()]
    rows = []
    for i, row in enumerate(inputs):
        scores = {name: (None if per_func[name][i] is None or math.isnan(per_func[name][i])
                         else float(per_func[name][i])) for name in names}
        valid = [(scores[nm], w) for nm, w in zip(names, weights) if scores[nm] is not None]
        adv = advantages[i] if i < len(advantages) else None
        rows.append({
            "prompt": _question(row),
            "completion": completions[i] if i < len(completions) else "",
            "answer": None if row.get("answer") is None else str(row["answer"]),
            "rewards": scores,
            "reward": sum(s * w for s, w in valid) if valid else None,
            "advantage": None if adv is None or (isinstance(adv, float) and math.isnan(adv)) else float(adv),
        })
    return rows


RewardSpec = Sequence[Callable[..., Any] | tuple[Callable[..., Any], float]]


def split_rewards(rewards: RewardSpec) -> tuple[list[Callable[..., Any]], list[float]]:
    """``(funcs, weights)`` from a list of functions or ``(function, weight)`` pairs.

    Example:
        >>> def a_reward(completions, **kw): return [0.0] * len(completions)
        >>> def b_reward(completions, **kw): return [1.0] * len(completions)
        >>> split_rewards([(a_reward, 2.0), b_reward])[1]
        [2.0, 1.0]
    """
    funcs, weights = [], []
    for item in rewards:
        if isinstance(item, tuple):
            func, weight = item
        else:
            func, weight = item, 1.0
        if not callable(func):
            raise TypeError(f"Reward {func!r} is not callable; pass functions or (function, weight) pairs.")
        funcs.append(func)
        weights.append(float(weight))
    if not funcs:
        raise ValueError("No reward functions: pass at least one (helpers.rewards.get_preset('arithmetic')).")
    names = [getattr(f, "__name__", repr(f)) for f in funcs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"Reward names {dup} appear twice; TRL logs rewards by name, give each a distinct __name__.")
    return funcs, weights


def build_trainer(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    rewards: RewardSpec,
    config: Any,
    run: str | Path | None = None,
    time_budget_minutes: float | None = None,
    budget_start: float | None = None,
    dashboard: bool | None = None,
    dashboard_every: int = 5,
    progress: bool | Callable[[str], None] = False,
    callbacks: Sequence[Any] = (),
    drop_equal_reward_groups: bool = False,
) -> Any:
    """One ``GRPOTrainer`` wired to the run folder.

    ``rewards`` are functions or ``(function, weight)`` pairs (weights go to
    ``config.reward_weights``). With ``run``: ``metrics.jsonl``,
    ``completions.jsonl`` and ``figures/dashboard.png`` are written there
    (the dashboard is redrawn live in a notebook every ``dashboard_every``
    steps; ``dashboard=False`` only saves the PNG, ``True`` forces live drawing). ``time_budget_minutes`` stops training
    cleanly (counting from ``budget_start`` when given, e.g. before a warm-up).
    ``drop_equal_reward_groups`` leaves groups with equal rewards out of the
    loss normaliser (see :func:`_drop_equal_reward_groups`).

    Example:
        >>> trainer = build_trainer(model, tok, ds["train"], get_preset("arithmetic"),
        ...                         build_grpo_config(PROFILE, RUN), run=RUN)   # doctest: +SKIP
    """
    from .callbacks import (CompletionsLogCallback, DashboardCallback, MetricsLogCallback,
                            ProgressPrinter, TimeBudgetCallback)
    from .models import align_eos_with_chat_template

    funcs, weights = split_rewards(rewards)
    config.reward_weights = weights
    missing = [c for c in ("prompt",) if c not in dataset.column_names]
    if missing:
        raise ValueError(
            f"The training dataset lacks {missing}; it needs a 'prompt' column (and 'answer' for "
            "correctness rewards). Use helpers.data.ensure_prepared(PROFILE, RUN)['train']."
        )
    align_eos_with_chat_template(tokenizer, model)
    cbs: list[Any] = list(callbacks)
    log_cb = None
    if run is not None:
        run = Path(run)
        log_cb = CompletionsLogCallback(run)
        names = [getattr(f, "__name__", "reward") for f in funcs]
        cbs += [MetricsLogCallback(run), log_cb]
        cbs.append(DashboardCallback(run, every=dashboard_every, live=dashboard, reward_names=names))
    if time_budget_minutes:
        cbs.append(TimeBudgetCallback(time_budget_minutes, start=budget_start))
    if progress:
        cbs.append(ProgressPrinter(print_fn=progress if callable(progress) else None))
    cls = _grpo_trainer_class()
    trainer = cls(model=model, processing_class=tokenizer, reward_funcs=funcs, args=config,
                  train_dataset=dataset, callbacks=cbs)
    # With disable_tqdm, transformers prints every log dict; the dashboard and
    # ProgressPrinter show the same numbers readably.
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    if log_cb is not None:
        trainer.completion_sink = log_cb.add
    trainer.drop_equal_reward_groups = bool(drop_equal_reward_groups)
    trainer.course_run = run
    return trainer


def find_callback(trainer: Any, kind: type) -> Any:
    """The trainer's callback of a given class (None when absent)."""
    for cb in trainer.callback_handler.callbacks:
        if isinstance(cb, kind):
            return cb
    return None


# --------------------------------------------------------------------------- train / resume


def last_checkpoint(run: str | Path) -> tuple[Path, int] | None:
    """``(folder, step)`` of the newest complete checkpoint in ``RUN/checkpoints``, or None.

    Example:
        >>> last_checkpoint("/nonexistent") is None
        True
    """
    folder = Path(run) / CHECKPOINT_DIR
    if not folder.is_dir():
        return None
    best = None
    for ckpt in folder.glob("checkpoint-*"):
        state = ckpt / "trainer_state.json"
        if not state.is_file():  # killed while saving
            continue
        try:
            step = int(read_json(state)["global_step"])
        except (ValueError, KeyError):
            continue
        if best is None or step > best[1]:
            best = (ckpt, step)
    return best


def prepare_resume(run: str | Path) -> tuple[Path, int] | None:
    """Before resuming: drop log lines written after the last checkpoint; return it.

    Example:
        >>> prepare_resume("/nonexistent") is None
        True
    """
    from .callbacks import COMPLETIONS_FILE, METRICS_FILE, truncate_jsonl

    found = last_checkpoint(run)
    if found is None:
        return None
    _, step = found
    for name in (METRICS_FILE, COMPLETIONS_FILE):
        truncate_jsonl(Path(run) / name, step)
    return found


def save_adapter(trainer: Any, run: str | Path) -> Path:
    """Save the LoRA adapter and tokenizer to ``RUN/adapter`` (what notebook 04 loads)."""
    path = Path(run) / ADAPTER_DIR
    trainer.save_model(str(path))
    trainer.processing_class.save_pretrained(str(path))
    return path


def train(trainer: Any, run: str | Path | None = None, resume: bool = True) -> dict[str, Any]:
    """Train (resuming from ``RUN/checkpoints`` when a checkpoint exists), then save the adapter.

    Returns a summary: steps done, whether it resumed and from where, whether
    the time budget stopped it, seconds, and the adapter path. A fresh run
    (no checkpoint) starts the log files from scratch.

    Example:
        >>> summary = train(trainer, RUN)     # doctest: +SKIP
        >>> summary["global_step"]            # doctest: +SKIP
        60
    """
    from .callbacks import COMPLETIONS_FILE, METRICS_FILE, TimeBudgetCallback

    run = Path(run if run is not None else trainer.course_run)
    found = prepare_resume(run) if resume else None
    if found is None:
        for name in (METRICS_FILE, COMPLETIONS_FILE):
            (run / name).unlink(missing_ok=True)
    start = time.time()
    out = trainer.train(resume_from_checkpoint=str(found[0]) if found else None)
    budget = find_callback(trainer, TimeBudgetCallback)
    adapter = save_adapter(trainer, run)
    summary = {
        "global_step": int(trainer.state.global_step),
        "max_steps": int(trainer.state.max_steps),
        "resumed_from_step": found[1] if found else None,
        "stopped_by_time_budget": bool(budget and budget.stopped_at_step is not None),
        "seconds": round(time.time() - start, 1),
        "train_runtime": out.metrics.get("train_runtime"),
        "adapter": str(adapter),
    }
    write_json(run / SUMMARY_FILE, summary)
    return summary


# --------------------------------------------------------------------------- the whole pipeline


def warmup_rows(profile: Profile, prefill: str | None, system_role: bool = True) -> list[dict[str, Any]]:
    """The format warm-up examples: ``profile.warmup_examples`` problems of ``profile.warmup_level``.

    Example:
        >>> rows = warmup_rows(get_profile("cpu-smoke"), "<reasoning>\\n")
        >>> len(rows), rows[0]["prompt"][-1]["role"]
        (8, 'assistant')
    """
    from .data import build_prompt
    from .tasks import generate_arithmetic

    rows = generate_arithmetic(profile.warmup_examples, profile.warmup_level, seed=profile.seed + 1)
    out = []
    for r in rows:
        prompt = build_prompt(r["question"], system_role=system_role, prefill=False)
        if prefill:
            prompt = prompt + [{"role": "assistant", "content": prefill}]
        out.append({**r, "prompt": prompt})
    return out


def write_train_config(run: str | Path, profile: Profile, config: Any, rewards: RewardSpec,
                       prefill: str | None = None, warmup: dict[str, Any] | None = None,
                       overrides: dict[str, Any] | None = None) -> Path:
    """Write ``train_config.json`` (profile, GRPOConfig, rewards with weights, prefill, warm-up)
    and add the versions and machine to ``run.json``: the run folder describes itself.

    Example:
        >>> write_train_config(RUN, PROFILE, config, rewards, prefill="<reasoning>\\n")  # doctest: +SKIP
    """
    run = Path(run)
    funcs, weights = split_rewards(rewards)
    path = write_json(run / CONFIG_FILE, {
        "profile": profile.to_dict(),
        "grpo_config": {k: v for k, v in config.to_dict().items() if _jsonable(v)},
        "rewards": [{"name": getattr(f, "__name__", "reward"), "weight": w} for f, w in zip(funcs, weights)],
        "prefill": prefill,
        "warmup": warmup,
        "overrides": overrides or {},
    })
    record_run_info(run, profile, training={"config": CONFIG_FILE, "adapter": ADAPTER_DIR})
    return path


def run_grpo(
    profile: Profile,
    run: str | Path,
    rewards: RewardSpec | None = None,
    model: Any = None,
    tokenizer: Any = None,
    warmup: bool | None = None,
    resume: bool = True,
    dashboard: bool | None = None,
    progress: bool | Callable[[str], None] = False,
    after_warmup: Callable[[Any, Any], Any] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Dataset, model, format warm-up, GRPO, adapter: the whole of notebook 03 in one call.

    The warm-up runs when the profile has ``warmup_examples`` (and not when
    resuming from a checkpoint, which already holds it). ``after_warmup(model,
    tokenizer)`` is called after it (e.g. to evaluate; its time does not count
    against the time budget). ``overrides`` go to :func:`build_grpo_config`.
    Writes ``train_config.json`` and ``run.json``.

    Example:
        >>> summary = run_grpo(get_profile("cpu-smoke"), RUN)    # doctest: +SKIP
    """
    from .data import ensure_prepared, supports_system_role
    from .models import load_model
    from .rewards import get_preset
    from .warmup import format_warmup

    run = Path(run)
    config = build_grpo_config(profile, run, **overrides)  # checked before any model loads
    start = time.time()
    if model is None:
        model, tokenizer = load_model(profile)
    splits = ensure_prepared(profile, run, tokenizer=tokenizer, verbose=False)
    prefill = profile.prefill or None
    train_set = with_prefill(splits["train"], prefill)
    rewards = list(rewards) if rewards is not None else get_preset(profile.reward_preset)
    resuming = resume and last_checkpoint(run) is not None
    warm = None
    if warmup is None:
        warmup = profile.warmup_examples > 0
    if warmup and not resuming:
        rows = warmup_rows(profile, prefill, system_role=supports_system_role(tokenizer))
        warm = format_warmup(model, tokenizer, rows, run / "warmup", epochs=profile.warmup_epochs,
                             learning_rate=profile.warmup_learning_rate, seed=profile.seed,
                             use_cpu=profile.backend != "unsloth",
                             precision={"bf16": bool(config.bf16), "fp16": bool(config.fp16)})
    if after_warmup is not None:
        paused = time.time()
        after_warmup(model, tokenizer)
        start += time.time() - paused
    funcs, weights = split_rewards(rewards)
    write_train_config(run, profile, config, list(zip(funcs, weights)), prefill=prefill, warmup=warm,
                       overrides=overrides)
    trainer = build_trainer(model, tokenizer, train_set, list(zip(funcs, weights)), config, run=run,
                            time_budget_minutes=profile.time_budget_minutes, budget_start=start,
                            dashboard=dashboard, progress=progress,
                            drop_equal_reward_groups=profile.drop_equal_reward_groups)
    summary = train(trainer, run, resume=resume)
    summary.update(warmup=warm, total_seconds=round(time.time() - start, 1))
    write_json(run / SUMMARY_FILE, summary)
    return {"summary": summary, "trainer": trainer, "model": model, "tokenizer": tokenizer}


def _jsonable(v: Any) -> bool:
    return isinstance(v, (str, int, float, bool, type(None), list, dict))


def ensure_adapter(profile: Profile, run: str | Path, **overrides: Any) -> Path:
    """``RUN/adapter``, training one (briefly, with the profile's sizes) when it is missing.

    Example:
        >>> path = ensure_adapter(get_profile("cpu-smoke"), RUN)   # doctest: +SKIP
        >>> (path / "adapter_config.json").is_file()               # doctest: +SKIP
        True
    """
    path = Path(run) / ADAPTER_DIR
    if (path / "adapter_config.json").is_file():
        return path
    print(f"No adapter in {path}: training one now with profile {profile.name!r} "
          f"({profile.max_steps} steps).")
    run_grpo(profile, run, dashboard=False, **overrides)
    return path

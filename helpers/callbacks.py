"""Notebook 03's GRPO callbacks (Unsloth's trainer too): the dashboard, the time budget, the run log, the watch (a
held-out slice, how alike each group's completions are, the named warnings: :mod:`helpers.watch`), trackio's step."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

from transformers import TrainerCallback
from transformers.integrations import TrackioCallback
from transformers.integrations.integration_utils import rewrite_logs

from .plots import dashboard_figure, png_bytes
from .runs import write_bytes, write_json
from .watch import EVAL_PREFIX, RunWarning, diagnose, group_diversity


def step_logs(log_history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-step entries of a trainer's log history (not the final summary), NaN and inf as None."""
    return [{k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in entry.items()}
            for entry in log_history if "step" in entry and "train_runtime" not in entry]


class DashboardCallback(TrainerCallback):
    """The training dashboard, redrawn every ``every`` logged steps in a notebook, a progress line elsewhere."""

    def __init__(self, run: str | Path, every: int = 5, live: bool | None = None,
                 print_fn: Callable[[str], None] = print, headline: str = "accuracy") -> None:
        self.path = Path(run) / "figures" / "dashboard.png"
        self.headline = headline  # the task's held-out metric the warnings read (helpers.watch.diagnose)
        self.every = max(1, int(every))
        if live is None:  # a notebook's kernel has imported IPython; get_ipython() is None outside IPython
            live = "IPython" in sys.modules and hasattr(sys.modules["IPython"].get_ipython(), "kernel")
        self.live = live
        self.print_fn = print_fn
        self._handle: Any = None
        self._since_draw = 0

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: D102
        if not logs or "train_runtime" in logs or "reward" not in logs:
            return
        self._since_draw += 1
        if self.live and self._since_draw < self.every:
            return
        self._since_draw = 0
        if self.live:
            self._draw(state, args)
        held_out = f"eval_{self.headline}"
        self.print_fn(f"step {state.global_step:>4}/{state.max_steps}  " + "  ".join(
            f"{label} {'-' if logs.get(key) is None else format(logs[key], spec)}" for label, key, spec in (
                ("reward", "reward", ".3f"), ("std", "reward_std", ".3f"),
                ("zero-std", "frac_reward_zero_std", ".2f"), ("length", "completions/mean_length", ".1f"),
                ("entropy", "entropy", ".3f"), ("distinct", "diversity/distinct", ".2f")))
            + (f"  held-out {self.headline} {logs[held_out]:.0%}" if logs.get(held_out) is not None else ""))

    def figure(self, state: Any, args: Any = None) -> Any:
        """The dashboard of ``state``'s logs, with the warnings they raise (:func:`helpers.watch.diagnose`)."""
        logs = step_logs(state.log_history)
        mask = bool(getattr(args, "mask_truncated_completions", False))
        return dashboard_figure(logs, warnings=diagnose(logs, mask, self.headline))

    def _draw(self, state: Any, args: Any = None) -> None:
        from IPython.display import Image, display
        image = Image(png_bytes(self.figure(state, args), dpi=80))
        if self._handle is None:
            self._handle = display(image, display_id=True)
        else:
            self._handle.update(image)

    def save(self, state: Any, args: Any = None) -> Path | None:
        """Write the PNG now (None when nothing was logged yet)."""
        logs = step_logs(state.log_history)
        return write_bytes(self.path, png_bytes(self.figure(state, args), dpi=90)) if logs else None

    def on_save(self, args, state, control, **kwargs):  # noqa: D102
        self.save(state, args)

    def on_train_end(self, args, state, control, **kwargs):  # noqa: D102
        if self.live and self._since_draw:
            self._draw(state, args)
        self.save(state, args)


class TimeBudgetCallback(TrainerCallback):
    """Stop and save once one more step as long as the last would end ``minutes`` after ``start`` (a warm-up counts)."""

    def __init__(self, minutes: float, start: float | None = None) -> None:
        if not minutes or minutes <= 0:
            raise ValueError(f"A time budget is a positive number of minutes, got {minutes!r}.")
        self.minutes, self.start = float(minutes), start
        self.stopped_at_step: int | None = None
        self._step_start = 0.0

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: D102
        if self.start is None:
            self.start = time.time()

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: D102
        self._step_start = time.time()

    def on_step_end(self, args, state, control, **kwargs):  # noqa: D102
        now = time.time()
        if (now - self.start + now - self._step_start) / 60 >= self.minutes and state.global_step < state.max_steps:
            control.should_training_stop = True
            control.should_save = True
            self.stopped_at_step = int(state.global_step)


class RunLogCallback(TrainerCallback):
    """Keep ``<run>/metrics.jsonl`` equal to the per-step logs, rewritten at each save (a resumed run repeats none)."""

    def __init__(self, run: str | Path) -> None:
        self.path = Path(run) / "metrics.jsonl"

    def write(self, state: Any) -> Path:
        """Rewrite the file from ``state.log_history`` (atomically)."""
        return write_json(self.path, step_logs(state.log_history), lines=True)

    def on_save(self, args, state, control, **kwargs):  # noqa: D102
        self.write(state)

    def on_train_end(self, args, state, control, **kwargs):  # noqa: D102
        self.write(state)


class HeldOutCallback(TrainerCallback):
    """Score ``rows`` (greedy) every ``every`` steps and add ``eval_<metric>`` to that step's log.

    The evaluation runs at the step's end, before the trainer logs it; a callback placed before the tracker in the
    trainer's list (:func:`helpers.tracking.tracker_last`) puts the numbers in the tracker too. ``points`` keeps
    ``(step, {metric: value})``, the start (``at_start``, before the first step) included."""

    def __init__(self, tokenizer: Any, rows: Any, task: Any, every: int, settings: Any,
                 chat_template_kwargs: dict | None = None, at_start: bool = True,
                 evaluate_fn: Callable[..., dict] | None = None) -> None:
        self.tokenizer, self.rows, self.task, self.every = tokenizer, rows, task, max(1, int(every))
        self.settings, self.kwargs, self.at_start = settings, chat_template_kwargs or {}, at_start
        self.points: list[tuple[int, dict[str, float]]] = []
        self.seconds = 0.0
        self._pending: dict[str, float] | None = None
        if evaluate_fn is None:
            from .evaluation import evaluate as evaluate_fn
        self._evaluate = evaluate_fn

    def _score(self, model: Any, step: int) -> dict[str, float]:
        import torch
        start = time.time()
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):  # generation seeds torch: leave training's random stream as it was
            summary = self._evaluate(model, self.tokenizer, self.rows, self.task, self.settings,
                                     chat_template_kwargs=self.kwargs)["summary"]
        metrics = {k: round(float(v), 4) for k, v in summary.items()
                   if isinstance(v, (int, float)) and k not in ("n_prompts", "n_completions")}
        self.seconds += time.time() - start
        self.points.append((step, metrics))
        return metrics

    def on_train_begin(self, args, state, control, model=None, **kwargs):  # noqa: D102
        if self.at_start and state.global_step == 0 and model is not None:
            self._score(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):  # noqa: D102
        if model is not None and (state.global_step % self.every == 0 or state.global_step == state.max_steps):
            self._pending = self._score(model, state.global_step)
            control.should_log = True  # log this step even where logging_steps would skip it

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: D102
        if self._pending is None or logs is None or "train_runtime" in logs:
            return
        extra = {EVAL_PREFIX + k: v for k, v in self._pending.items()}
        logs.update(extra)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(extra)  # Trainer.log appended a copy of logs before calling on_log
        self._pending = None


class GroupDiversityCallback(TrainerCallback):
    """Add how alike each group's completions are (:func:`helpers.watch.group_diversity`) to every step's log.

    It reads the completions the trainer keeps for its completion log (``trainer._logs``, one generation batch), in
    TRL's trainer and in Unsloth's, generated from TRL's source and logging no entropy: the signal both have. It
    needs the trainer: :func:`helpers.tracking.tracker_last` hands it over. Place it before the log's readers."""

    def __init__(self, trainer: Any = None) -> None:
        self.trainer, self._told = trainer, False

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: D102
        if logs is None or "train_runtime" in logs or "reward" not in logs or (self.trainer is None and self._told):
            return
        if self.trainer is None:
            self._told = True
            return print("GroupDiversityCallback has no trainer to read: call helpers.tracking.tracker_last(trainer) "
                         "(or set callback.trainer = trainer) once the trainer is built.")
        held = getattr(self.trainer, "_logs", None) or {}
        extra = group_diversity(list(held.get("completion") or []), self.trainer.args.num_generations)
        logs.update(extra)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(extra)  # Trainer.log appended a copy of logs before calling on_log


class WatchCallback(TrainerCallback):
    """Run :func:`helpers.watch.diagnose` on every log; print each new warning once (a trackio alert too)."""

    def __init__(self, mask_truncated_completions: bool = False, headline: str = "accuracy",
                 print_fn: Callable[[str], None] = print, alert: bool = True) -> None:
        self.mask, self.headline, self.print_fn, self.alert = mask_truncated_completions, headline, print_fn, alert
        self.raised: list[RunWarning] = []

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: D102
        seen = {w.name for w in self.raised}
        for warning in diagnose(step_logs(state.log_history), self.mask, self.headline):
            if warning.name in seen:
                continue
            self.raised.append(warning)
            self.print_fn(f"WARNING {warning}")
            if self.alert and "trackio" in (getattr(args, "report_to", None) or []):
                _trackio_alert(warning)


def _trackio_alert(warning: RunWarning) -> None:
    """The warning in trackio's dashboard too, where a trackio run is open (never raises)."""
    try:
        import trackio
        run = trackio.context_vars.current_run.get()
        run.alert(title=warning.name, text=f"step {warning.step}: {warning.seen}. {warning.fix}",
                  level=trackio.AlertLevel.WARN, step=warning.step)  # trackio.alert has no step: the run's has
    except Exception:  # noqa: BLE001 - the printed line is the warning; the alert is a copy
        pass


class TrackioStepCallback(TrackioCallback):
    """transformers' ``TrackioCallback`` logging each point at the training step (put in place by ``tracker_last``).

    transformers logs without a step (integration_utils.py:1082-1096), so trackio numbers the calls, and TRL makes a
    second one a step, its completion table (trl/trainer/grpo_trainer.py:3473): trackio's step ran twice as fast."""

    #: The Trainer's end-of-run summary, which transformers' callback leaves out (integration_utils.py:1083-1089).
    SUMMARY = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "total_flos")

    def on_log(self, args, state, control, model=None, logs=None, **kwargs):  # noqa: D102
        if not self._initialized:
            self.setup(args, state, model)
        if not state.is_world_process_zero or not logs:
            return
        step = int(state.global_step)
        self._trackio.log({**rewrite_logs({k: v for k, v in logs.items() if k not in self.SUMMARY}),
                           "train/global_step": step}, step=step)
        run = self._trackio.context_vars.current_run.get()
        if run is not None and hasattr(run, "_next_step"):  # trackio 0.43's counter (run.py:1263-1265)
            run._next_step = step  # TRL's completion table, logged next without a step, lands on this one

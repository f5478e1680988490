"""GRPO callbacks (dashboard, time budget, run log) reading only ``state.log_history``: Unsloth's trainer works too."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

from transformers import TrainerCallback

from .plots import dashboard_figure, png_bytes
from .runs import write_bytes, write_json


def step_logs(log_history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-step entries of a trainer's log history (not the final summary), NaN and inf as None."""
    return [{k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in entry.items()}
            for entry in log_history if "step" in entry and "train_runtime" not in entry]


class DashboardCallback(TrainerCallback):
    """The training dashboard, redrawn every ``every`` logged steps in a notebook, a progress line elsewhere."""

    def __init__(self, run: str | Path, every: int = 5, live: bool | None = None,
                 print_fn: Callable[[str], None] = print) -> None:
        self.path = Path(run) / "figures" / "dashboard.png"
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
            self._draw(state)
        self.print_fn(f"step {state.global_step:>4}/{state.max_steps}  " + "  ".join(
            f"{label} {'-' if logs.get(key) is None else format(logs[key], spec)}" for label, key, spec in (
                ("reward", "reward", ".3f"), ("std", "reward_std", ".3f"),
                ("zero-std", "frac_reward_zero_std", ".2f"), ("length", "completions/mean_length", ".1f"))))

    def _draw(self, state: Any) -> None:
        from IPython.display import Image, display
        image = Image(png_bytes(dashboard_figure(step_logs(state.log_history)), dpi=80))
        if self._handle is None:
            self._handle = display(image, display_id=True)
        else:
            self._handle.update(image)

    def save(self, state: Any) -> Path | None:
        """Write the PNG now (None when nothing was logged yet)."""
        logs = step_logs(state.log_history)
        return write_bytes(self.path, png_bytes(dashboard_figure(logs), dpi=90)) if logs else None

    def on_save(self, args, state, control, **kwargs):  # noqa: D102
        self.save(state)

    def on_train_end(self, args, state, control, **kwargs):  # noqa: D102
        if self.live and self._since_draw:
            self._draw(state)
        self.save(state)


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

"""Trainer callbacks: the run's logs, the live dashboard and the time budget.

* :class:`MetricsLogCallback` appends every logged step to ``metrics.jsonl``.
* :class:`CompletionsLogCallback` appends every completion of every step,
  with each reward's score and its advantage, to ``completions.jsonl``.
* :class:`DashboardCallback` redraws the training dashboard in a notebook every
  few steps and saves it as ``figures/dashboard.png``.
* :class:`TimeBudgetCallback` stops training cleanly within N minutes: after
  the last step that the next one would overrun (a checkpoint is saved there,
  so the run can be resumed later).

:func:`truncate_jsonl` drops log lines written after a checkpoint, so a resumed
run neither repeats nor loses a step.

Example:
    >>> import tempfile, json
    >>> from pathlib import Path
    >>> p = Path(tempfile.mkdtemp()) / "metrics.jsonl"
    >>> _ = p.write_text("".join(json.dumps({"step": s}) + "\\n" for s in (1, 2, 3)))
    >>> truncate_jsonl(p, last_step=2)
    1
    >>> [json.loads(l)["step"] for l in p.read_text().splitlines()]
    [1, 2]
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

from transformers import TrainerCallback

METRICS_FILE = "metrics.jsonl"
COMPLETIONS_FILE = "completions.jsonl"
DASHBOARD_FILE = "dashboard.png"


def _clean(value: Any) -> Any:
    """JSON-safe value: NaN/inf become None, tensors and numpy scalars become floats."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        try:
            value = value.item()
        except (ValueError, TypeError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def append_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append rows to a JSON-lines file (one object per line), flushed to disk.

    Example:
        >>> import tempfile; p = Path(tempfile.mkdtemp()) / "x.jsonl"
        >>> append_jsonl(p, [{"step": 1}]); p.read_text()
        '{"step": 1}\\n'
    """
    if not rows:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps({k: _clean(v) for k, v in row.items()}, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All rows of a JSON-lines file ([] when it does not exist); a torn last line is skipped.

    Example:
        >>> read_jsonl(Path("/nonexistent.jsonl"))
        []
    """
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill mid-write
            continue
    return rows


def truncate_jsonl(path: Path, last_step: int) -> int:
    """Drop rows whose ``step`` is after ``last_step`` (and torn lines); return how many were dropped."""
    path = Path(path)
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    kept, dropped = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1
            continue
        if int(row.get("step", 0)) > last_step:
            dropped += 1
            continue
        kept.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    os.replace(tmp, path)
    return dropped


class MetricsLogCallback(TrainerCallback):
    """Append each training log (TRL's keys, plus ``step``) to ``<run>/metrics.jsonl``.

    The final summary log of ``Trainer.train`` (``train_runtime`` ...) is kept
    out: it is not a step.

    Example:
        >>> cb = MetricsLogCallback("/tmp/run")     # doctest: +SKIP
    """

    def __init__(self, run: str | Path) -> None:
        self.path = Path(run) / METRICS_FILE
        self.records: list[dict[str, Any]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: D102
        if not logs or "train_runtime" in logs:
            return
        row = {"step": int(state.global_step), **{k: _clean(v) for k, v in logs.items()}}
        self.records.append(row)
        append_jsonl(self.path, [row])


class CompletionsLogCallback(TrainerCallback):
    """Append every completion of a step to ``<run>/completions.jsonl``.

    The trainer (:class:`helpers.training.CourseGRPOTrainer`) hands each scored
    generation batch to :meth:`add`; rows are written at the end of the step
    with that step's number, one JSON object per completion::

        {"step", "prompt", "completion", "answer", "rewards": {name: score},
         "reward", "advantage"}

    Example:
        >>> cb = CompletionsLogCallback("/tmp/run")    # doctest: +SKIP
    """

    def __init__(self, run: str | Path) -> None:
        self.path = Path(run) / COMPLETIONS_FILE
        self.pending: list[dict[str, Any]] = []
        self.rows_written = 0

    def add(self, rows: list[dict[str, Any]]) -> None:
        self.pending.extend(rows)

    def on_step_end(self, args, state, control, **kwargs):  # noqa: D102
        if not self.pending:
            return
        rows = [{"step": int(state.global_step), **row} for row in self.pending]
        self.pending = []
        append_jsonl(self.path, rows)
        self.rows_written += len(rows)


class TimeBudgetCallback(TrainerCallback):
    """Stop training within ``minutes`` and save a checkpoint.

    Checked at the end of every step: when one more step as long as the last
    would end past the budget, training stops there.

    ``start`` (a ``time.time()`` value) lets time spent before training, e.g.
    a warm-up, count against the budget. ``stopped_at_step`` tells whether and
    where the budget stopped the run.

    Example:
        >>> cb = TimeBudgetCallback(minutes=10)
        >>> cb.stopped_at_step is None
        True
    """

    def __init__(self, minutes: float, start: float | None = None) -> None:
        if minutes <= 0:
            raise ValueError(f"time budget must be positive minutes, got {minutes!r}")
        self.minutes = float(minutes)
        self.start = start
        self.stopped_at_step: int | None = None

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: D102
        if self.start is None:
            self.start = time.time()

    def elapsed_minutes(self) -> float:
        return 0.0 if self.start is None else (time.time() - self.start) / 60

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: D102
        self._step_start = time.time()

    def on_step_end(self, args, state, control, **kwargs):  # noqa: D102
        # Stop when the next step (as long as this one) would end past the budget.
        began = getattr(self, "_step_start", None)
        last_step = (time.time() - began) / 60 if began is not None else 0.0
        if self.elapsed_minutes() + last_step >= self.minutes and state.global_step < state.max_steps:
            control.should_training_stop = True
            control.should_save = True
            self.stopped_at_step = int(state.global_step)


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


class DashboardCallback(TrainerCallback):
    """Live training dashboard: redrawn in a notebook every ``every`` logged steps.

    Headless (scripts, CI) it only saves ``<run>/figures/dashboard.png`` at the
    end of training and at every checkpoint save, so it costs nothing per step.

    Example:
        >>> cb = DashboardCallback("/tmp/run", every=5)    # doctest: +SKIP
    """

    def __init__(self, run: str | Path, every: int = 5, live: bool | None = None,
                 reward_names: list[str] | None = None) -> None:
        self.path = Path(run) / "figures" / DASHBOARD_FILE
        self.every = max(1, int(every))
        self.live = _in_notebook() if live is None else live
        self.reward_names = reward_names
        self.records: list[dict[str, Any]] = []
        self._handle: Any = None
        self._since_draw = 0

    def _figure(self) -> Any:
        from .plots import dashboard_figure

        return dashboard_figure(self.records, reward_names=self.reward_names)

    def save(self) -> Path | None:
        """Write the PNG now (None when nothing was logged yet)."""
        if not self.records:
            return None
        fig = self._figure()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(self.path, dpi=90)
        return self.path

    def redraw(self) -> None:
        from IPython.display import display

        fig = self._figure()
        if self._handle is None:
            self._handle = display(fig, display_id=True)
        else:
            self._handle.update(fig)

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: D102
        if not logs or "train_runtime" in logs:
            return
        self.records.append({"step": int(state.global_step), **{k: _clean(v) for k, v in logs.items()}})
        self._since_draw += 1
        if self.live and self._since_draw >= self.every:
            self._since_draw = 0
            self.redraw()

    def on_save(self, args, state, control, **kwargs):  # noqa: D102
        self.save()

    def on_train_end(self, args, state, control, **kwargs):  # noqa: D102
        if self.live and self._since_draw:
            self.redraw()
        self.save()


class ProgressPrinter(TrainerCallback):
    """Print one short line per logged step (reward, zero-std groups, length): handy in scripts.

    Example:
        >>> ProgressPrinter(print_fn=print).every
        1
    """

    def __init__(self, every: int = 1, print_fn: Callable[[str], None] | None = None) -> None:
        self.every = max(1, int(every))
        self.print_fn = print_fn or print

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: D102
        if not logs or "reward" not in logs or state.global_step % self.every:
            return

        def fmt(key: str, spec: str = ".3f") -> str:
            v = logs.get(key)
            return "-" if v is None else format(v, spec)

        self.print_fn(
            f"step {state.global_step:>4}/{state.max_steps}  reward {fmt('reward')}  "
            f"std {fmt('reward_std')}  zero-std groups {fmt('frac_reward_zero_std', '.2f')}  "
            f"length {fmt('completions/mean_length', '.1f')}"
        )

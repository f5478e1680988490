"""The training callbacks write what they promise (no model needed)."""

import json
import time
from types import SimpleNamespace

import pytest
from transformers import TrainerControl, TrainerState

from helpers.callbacks import (
    CompletionsLogCallback,
    DashboardCallback,
    MetricsLogCallback,
    ProgressPrinter,
    TimeBudgetCallback,
    append_jsonl,
    read_jsonl,
    truncate_jsonl,
)

ARGS = SimpleNamespace()


def _state(step, max_steps=10):
    s = TrainerState()
    s.global_step, s.max_steps = step, max_steps
    return s


LOG = {"loss": 0.01, "reward": 0.5, "reward_std": 0.3, "frac_reward_zero_std": 0.25,
       "completions/mean_length": 18.0, "completions/clipped_ratio": 0.0,
       "rewards/correctness_reward/mean": 0.4, "rewards/correctness_reward/std": 0.2}


def test_metrics_log_one_line_per_step_with_step_and_trl_keys(tmp_path):
    cb = MetricsLogCallback(tmp_path)
    for step in (1, 2):
        cb.on_log(ARGS, _state(step), TrainerControl(), logs=dict(LOG, loss=float("nan")))
    cb.on_log(ARGS, _state(2), TrainerControl(), logs={"train_runtime": 3.0, "train_loss": 0.1})
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]  # the end-of-training summary is not a step
    assert rows[0]["frac_reward_zero_std"] == 0.25
    assert rows[0]["loss"] is None  # NaN is not valid JSON: written as null


def test_completions_log_rows_get_the_step_they_were_trained_at(tmp_path):
    cb = CompletionsLogCallback(tmp_path)
    row = {"prompt": "What is 2 + 3?", "completion": "2 + 3 = 5\n</reasoning>", "answer": "5",
           "rewards": {"correctness_reward": 1.0, "fmt": None}, "reward": 1.0, "advantage": 0.7}
    cb.add([row, dict(row, reward=0.0)])
    cb.on_step_end(ARGS, _state(3), TrainerControl())
    cb.on_step_end(ARGS, _state(4), TrainerControl())  # nothing pending: nothing written
    rows = read_jsonl(tmp_path / "completions.jsonl")
    assert [r["step"] for r in rows] == [3, 3]
    assert set(rows[0]) == {"step", "prompt", "completion", "answer", "rewards", "reward", "advantage"}
    assert rows[0]["rewards"] == {"correctness_reward": 1.0, "fmt": None}
    assert cb.rows_written == 2


def test_truncate_drops_later_steps_and_torn_lines(tmp_path):
    path = tmp_path / "m.jsonl"
    append_jsonl(path, [{"step": s} for s in (1, 2, 3, 4)])
    with open(path, "a") as fh:
        fh.write('{"step": 5, "rew')  # a kill mid-write
    assert truncate_jsonl(path, last_step=2) == 3
    assert [r["step"] for r in read_jsonl(path)] == [1, 2]
    assert truncate_jsonl(tmp_path / "missing.jsonl", 1) == 0


def test_time_budget_stops_and_saves(tmp_path):
    cb = TimeBudgetCallback(minutes=0.5, start=time.time() - 31)
    control = TrainerControl()
    cb.on_step_end(ARGS, _state(3), control)
    assert control.should_training_stop and control.should_save
    assert cb.stopped_at_step == 3
    fresh = TimeBudgetCallback(minutes=5)
    fresh.on_train_begin(ARGS, _state(0), TrainerControl())
    control = TrainerControl()
    fresh.on_step_end(ARGS, _state(1), control)
    assert not control.should_training_stop and fresh.stopped_at_step is None
    with pytest.raises(ValueError, match="positive"):
        TimeBudgetCallback(minutes=0)


def test_time_budget_stops_before_a_step_would_overrun():
    cb = TimeBudgetCallback(minutes=0.5, start=time.time() - 15)  # 15 s left
    cb.on_step_begin(ARGS, _state(1), TrainerControl())
    cb._step_start -= 20  # this step took 20 s: the next would end past 30 s
    control = TrainerControl()
    cb.on_step_end(ARGS, _state(2), control)
    assert control.should_training_stop and cb.stopped_at_step == 2


def test_dashboard_saves_png_headless_and_redraws_live(tmp_path, monkeypatch):
    cb = DashboardCallback(tmp_path, every=2, live=False)
    assert cb.save() is None  # nothing logged yet
    for step in (1, 2, 3):
        cb.on_log(ARGS, _state(step), TrainerControl(), logs=dict(LOG, reward=0.1 * step))
    cb.on_train_end(ARGS, _state(3), TrainerControl())
    png = tmp_path / "figures" / "dashboard.png"
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"

    live = DashboardCallback(tmp_path, every=2, live=True)
    draws = []
    monkeypatch.setattr(live, "redraw", lambda: draws.append(len(live.records)))
    for step in (1, 2, 3, 4, 5):
        live.on_log(ARGS, _state(step), TrainerControl(), logs=LOG)
    assert draws == [2, 4]


def test_progress_printer_prints_reward_lines():
    lines = []
    cb = ProgressPrinter(print_fn=lines.append)
    cb.on_log(ARGS, _state(2), TrainerControl(), logs=LOG)
    cb.on_log(ARGS, _state(2), TrainerControl(), logs={"train_runtime": 1.0})
    assert len(lines) == 1 and "reward 0.500" in lines[0] and "2/10" in lines[0]
    json.dumps(lines)

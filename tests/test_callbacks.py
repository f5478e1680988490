"""helpers.callbacks: the time budget, metrics.jsonl across a resume, the dashboard, the held-out slice, the group
diversity and the warnings while training (no model needed: a stand-in evaluation, a stand-in holding what
GRPOTrainer keeps for its completion log); the group diversity on Unsloth's own trainer (contract environment)."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import TrainerControl, TrainerState

from helpers import callbacks
from helpers.callbacks import (DashboardCallback, GroupDiversityCallback, HeldOutCallback, RunLogCallback,
                               TimeBudgetCallback, WatchCallback, step_logs)

ARGS = SimpleNamespace()


def _state(step, max_steps=10, history=()):
    s = TrainerState()
    s.global_step, s.max_steps, s.log_history = step, max_steps, [dict(h) for h in history]
    return s


def _log(step, reward=0.5):
    """One per-step entry of TRL's log history (transformers adds "step")."""
    return {"loss": 0.01, "reward": reward, "reward_std": 0.3, "frac_reward_zero_std": 0.25,
            "completions/mean_length": 18.0, "completions/clipped_ratio": 0.0,
            "rewards/correctness_reward/mean": reward, "step": step}


SUMMARY = {"train_runtime": 12.0, "train_loss": 0.1, "step": 3}


# --------------------------------------------------------------------------- step_logs


def test_step_logs_drops_the_summary_and_makes_values_json_safe():
    rows = step_logs([_log(1), dict(_log(2), loss=float("nan"), kl=float("inf")), SUMMARY, {"epoch": 1.0}])
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1]["loss"] is None and rows[1]["kl"] is None and rows[1]["reward"] == 0.5
    json.dumps(rows, allow_nan=False)


# --------------------------------------------------------------------------- time budget


class Clock:
    def __init__(self):
        self.now = 1000.0

    def time(self):
        return self.now


def _train(cb, clock, step_seconds, max_steps=100):
    """Run steps of ``step_seconds`` through the callback until it stops training; the last step done."""
    cb.on_train_begin(ARGS, _state(0, max_steps), TrainerControl())
    for step in range(1, max_steps + 1):
        cb.on_step_begin(ARGS, _state(step - 1, max_steps), TrainerControl())
        clock.now += step_seconds
        control = TrainerControl()
        cb.on_step_end(ARGS, _state(step, max_steps), control)
        if control.should_training_stop:
            assert control.should_save  # a checkpoint where it stopped
            return step
    return max_steps


def test_time_budget_stops_before_the_next_step_would_overrun(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(callbacks, "time", clock)
    cb = TimeBudgetCallback(minutes=1)
    start = clock.now
    stopped = _train(cb, clock, step_seconds=15)
    assert stopped == 3 and cb.stopped_at_step == 3  # 45 s done; a 4th step would end at 60 s
    assert clock.now - start <= 60


def test_time_budget_counts_earlier_work_from_start(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(callbacks, "time", clock)
    cb = TimeBudgetCallback(minutes=1, start=clock.now - 30)  # a warm-up took 30 s
    assert _train(cb, clock, step_seconds=10) == 2 and cb.start == 970.0


def test_time_budget_leaves_a_run_that_fits_alone(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(callbacks, "time", clock)
    cb = TimeBudgetCallback(minutes=1)
    assert _train(cb, clock, step_seconds=15, max_steps=3) == 3
    assert cb.stopped_at_step is None  # the last step ends the run anyway: no stop, no extra save


@pytest.mark.parametrize("minutes", [0, -1, None])
def test_time_budget_must_be_positive(minutes):
    with pytest.raises(ValueError, match="positive number of minutes"):
        TimeBudgetCallback(minutes=minutes)


# --------------------------------------------------------------------------- metrics.jsonl


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_run_log_rewrites_metrics_equal_to_the_log_history(tmp_path):
    cb = RunLogCallback(tmp_path)
    history = [_log(1), dict(_log(2), loss=float("nan"))]
    cb.on_save(ARGS, _state(2, history=history), TrainerControl())
    assert _read(tmp_path / "metrics.jsonl") == step_logs(history)
    history += [_log(3), SUMMARY]
    cb.on_train_end(ARGS, _state(3, history=history), TrainerControl())
    rows = _read(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[1]["loss"] is None
    assert not list(tmp_path.glob("*.tmp"))


def test_a_resumed_run_has_each_step_once(tmp_path):
    cb = RunLogCallback(tmp_path)
    first = [_log(1), _log(2)]
    cb.on_save(ARGS, _state(2, history=first), TrainerControl())  # checkpoint-2
    # killed after logging step 3: the file is not rewritten, checkpoint-2 keeps steps 1-2
    resumed = RunLogCallback(tmp_path)  # a new process; the history comes back from checkpoint-2
    history = first + [_log(3, reward=0.7), _log(4), SUMMARY]
    resumed.on_train_end(ARGS, _state(4, history=history), TrainerControl())
    rows = _read(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[2]["reward"] == 0.7


# --------------------------------------------------------------------------- dashboard


def test_dashboard_headless_prints_one_line_per_step_and_saves_a_png(tmp_path):
    lines = []
    cb = DashboardCallback(tmp_path, live=False, print_fn=lines.append)
    assert cb.save(_state(0)) is None  # nothing logged yet: no empty figure
    history = []
    for step in (1, 2, 3):
        history.append(_log(step, reward=0.1 * step))
        cb.on_log(ARGS, _state(step, max_steps=3, history=history), TrainerControl(), logs=history[-1])
    cb.on_log(ARGS, _state(3, max_steps=3, history=history), TrainerControl(), logs=SUMMARY)
    cb.on_log(ARGS, _state(3, max_steps=3, history=history), TrainerControl(), logs={"loss": 0.2})
    assert len(lines) == 3
    assert lines[1].split() == ["step", "2/3", "reward", "0.200", "std", "0.300", "zero-std", "0.25",
                                "length", "18.0", "entropy", "-", "distinct", "-"]
    cb.on_train_end(ARGS, _state(3, max_steps=3, history=history), TrainerControl())
    png = tmp_path / "figures" / "dashboard.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dashboard_prints_a_dash_for_a_missing_metric(tmp_path):
    lines = []
    cb = DashboardCallback(tmp_path, live=False, print_fn=lines.append)
    logs = {k: v for k, v in _log(1).items() if k != "frac_reward_zero_std"}
    cb.on_log(ARGS, _state(1, 5, history=[logs]), TrainerControl(), logs=logs)
    assert "zero-std -" in lines[0]


def test_dashboard_live_redraws_every_n_steps_and_at_the_end(tmp_path, monkeypatch):
    lines = []
    cb = DashboardCallback(tmp_path, every=2, live=True, print_fn=lines.append)
    draws = []
    monkeypatch.setattr(cb, "_draw", lambda state, args=None: draws.append(state.global_step))
    history = []
    for step in range(1, 6):
        history.append(_log(step))
        cb.on_log(ARGS, _state(step, history=history), TrainerControl(), logs=history[-1])
    assert draws == [2, 4]
    assert [line.split("/")[0] for line in lines] == ["step    2", "step    4"]  # a line with each redraw
    cb.on_train_end(ARGS, _state(5, history=history), TrainerControl())
    assert draws == [2, 4, 5] and (tmp_path / "figures" / "dashboard.png").is_file()


def test_dashboard_is_headless_outside_a_kernel(tmp_path):
    assert DashboardCallback(tmp_path).live is False


def test_dashboard_live_shows_one_figure_and_updates_it_in_place(tmp_path, monkeypatch):
    import IPython.display

    shown, updates = [], []

    class Handle:
        def update(self, obj):
            updates.append(obj)

    def display(obj, display_id=None):
        shown.append((obj, display_id))
        return Handle()

    monkeypatch.setattr(IPython.display, "display", display)
    cb = DashboardCallback(tmp_path, every=1, live=True)
    history = []
    for step in (1, 2, 3):
        history.append(_log(step))
        cb.on_log(ARGS, _state(step, history=history), TrainerControl(), logs=history[-1])
    assert len(shown) == 1 and shown[0][1] is True and len(updates) == 2


def test_dashboard_line_shows_entropy_and_the_held_out_accuracy_when_scored(tmp_path):
    lines = []
    cb = DashboardCallback(tmp_path, live=False, print_fn=lines.append, headline="exact_match")
    logs = dict(_log(4), entropy=0.4321, eval_exact_match=0.375, **{"diversity/distinct": 0.625})
    cb.on_log(ARGS, _state(4, 8, history=[logs]), TrainerControl(), logs=logs)
    assert lines[0].endswith("entropy 0.432  distinct 0.62  held-out exact_match 38%")


def test_dashboard_figure_names_the_warnings_the_logs_raise(tmp_path):
    history = [dict(_log(s), frac_reward_zero_std=1.0) for s in range(1, 6)]
    fig = DashboardCallback(tmp_path, live=False).figure(_state(5, history=history))
    assert fig._suptitle.get_text() == "WARNING: no-reward-spread (step 4)"
    assert DashboardCallback(tmp_path, live=False).figure(_state(2, history=history[:2]))._suptitle is None


# --------------------------------------------------------------------------- the watch: held-out slice, warnings


class FakeEvaluate:
    def __init__(self):
        self.calls = 0

    def __call__(self, model, tokenizer, rows, task, settings, chat_template_kwargs=None):
        self.calls += 1
        return {"summary": {"accuracy": 0.25 * self.calls, "format": 1.0, "n_prompts": 4, "rewards": {}}}


def test_heldout_scores_every_few_steps_and_adds_the_numbers_to_that_steps_log():
    fake = FakeEvaluate()
    cb = HeldOutCallback(None, rows=[1, 2, 3, 4], task=None, every=4, settings=None, evaluate_fn=fake)
    args, model = SimpleNamespace(), object()
    cb.on_train_begin(args, _state(0), TrainerControl(), model=model)
    assert cb.points == [(0, {"accuracy": 0.25, "format": 1.0})]
    for step in range(1, 9):
        control = TrainerControl()
        cb.on_step_end(args, _state(step), control, model=model)
        assert control.should_log == (step in (4, 8))
        logs = {"reward": 1.0}
        s = _state(step, history=[{**logs, "step": step}])  # Trainer.log appends a copy, then calls on_log
        cb.on_log(args, s, control, logs=logs)
        if step in (4, 8):
            assert logs["eval_accuracy"] == s.log_history[-1]["eval_accuracy"] == (0.5 if step == 4 else 0.75)
            assert "eval_n_prompts" not in logs
        else:
            assert "eval_accuracy" not in logs
    assert fake.calls == 3 and [p[0] for p in cb.points] == [0, 4, 8]


def test_heldout_does_not_touch_trainings_random_stream():
    import torch
    fake = FakeEvaluate()

    def reseeding(*a, **kw):
        torch.manual_seed(0)  # as helpers.generation.generate does
        return fake(*a, **kw)

    cb = HeldOutCallback(None, rows=[1], task=None, every=1, settings=None, evaluate_fn=reseeding)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    cb.on_step_end(SimpleNamespace(), _state(1), TrainerControl(), model=object())
    assert torch.equal(torch.rand(3), expected)


def test_watch_callback_prints_each_warning_once():
    printed = []
    cb = WatchCallback(print_fn=printed.append)
    rows = [{"step": n, "reward": 0.1, "frac_reward_zero_std": 1.0} for n in range(1, 7)]
    args = SimpleNamespace(report_to=["none"])
    for n in range(1, 7):
        cb.on_log(args, _state(n, history=rows[:n]), TrainerControl(), logs=rows[n - 1])
    assert len(printed) == 1 and printed[0].startswith("WARNING [no-reward-spread] step 4")
    assert [w.name for w in cb.raised] == ["no-reward-spread"]


# --------------------------------------------------------------------------- the group diversity


def _holding(prompts, completions, num_generations):
    """What GRPOTrainer keeps for its completion log (``_logs``, deques of one generation batch) and its config."""
    from collections import deque
    size = len(completions)
    return SimpleNamespace(_logs={"prompt": deque(prompts, maxlen=size), "completion": deque(completions, maxlen=size)},
                           args=SimpleNamespace(num_generations=num_generations))


def test_group_diversity_is_added_to_the_steps_log_and_its_history_entry():
    trainer = _holding(["p1"] * 4 + ["p2"] * 4, ["7", "7", "7", "7", "a b", "a c", "d", "a b"], 4)
    cb = GroupDiversityCallback()
    cb.trainer = trainer  # as tracker_last does once the trainer is built
    logs = _log(3)
    state = _state(3, history=[dict(logs)])
    cb.on_log(ARGS, state, TrainerControl(), logs=logs)
    # group 1: one text of 4 (0.25), every pair the same words (1.0); group 2: 3 of 4 differ, share 5/18 a pair
    assert logs["diversity/distinct"] == state.log_history[-1]["diversity/distinct"] == 0.5
    assert logs["diversity/overlap"] == state.log_history[-1]["diversity/overlap"] == pytest.approx((1 + 5 / 18) / 2, abs=1e-4)
    summary = dict(SUMMARY)
    cb.on_log(ARGS, state, TrainerControl(), logs=summary)  # the end-of-run summary is not a step
    assert "diversity/distinct" not in summary


def test_group_diversity_without_its_trainer_says_how_to_give_it_once(capsys):
    cb = GroupDiversityCallback()
    for step in (1, 2):
        logs = _log(step)
        cb.on_log(ARGS, _state(step, history=[dict(logs)]), TrainerControl(), logs=logs)
        assert "diversity/distinct" not in logs
    assert capsys.readouterr().out.count("tracker_last(trainer)") == 1


def test_the_watch_reads_the_diversity_the_callback_added_before_it():
    """In the trainer's order (the diversity first, the watch after), a collapse in the completions is named at the
    step it is seen, where the trainer logs no entropy (Unsloth's)."""
    varied = [f"{i} + {i} = {2 * i} then {i}" for i in range(4)]
    batches = [varied] * 3 + [["same words"] * 4] * 3
    trainer, printed = _holding(["p"] * 4, varied, 4), []
    diversity, watch = GroupDiversityCallback(trainer), WatchCallback(print_fn=printed.append, alert=False)
    history = []
    for step, batch in enumerate(batches, 1):
        trainer._logs["completion"].extend(batch)  # the next generation batch replaces the last (maxlen)
        logs = {**_log(step), "frac_reward_zero_std": 1.0 if step > 3 else 0.0}
        logs.pop("step")
        history.append({**logs, "step": step})
        state = _state(step, history=history)
        for cb in (diversity, watch):
            cb.on_log(ARGS, state, TrainerControl(), logs=logs)
        history = state.log_history
    assert [h["diversity/overlap"] for h in history] == [pytest.approx(history[0]["diversity/overlap"])] * 3 + [1.0] * 3
    assert [(w.name, w.step) for w in watch.raised] == [("diversity-collapse", 6)]
    assert printed[0].startswith("WARNING [diversity-collapse] step 6: a group's completions share 100% of their words")


@pytest.mark.contract
def test_on_unsloths_trainer_the_group_diversity_is_logged_where_no_entropy_is(tmp_path_factory):
    """The course's training through Unsloth's own GRPOTrainer (tests/unsloth_cpu.py, the colab-t4 recipe on a CPU):
    Unsloth computes no entropy (unsloth/models/rl_replacements.py:2014, 3034: ``compute_entropy = False``), so no
    step logs one; the trainer it compiles from TRL's source keeps TRL's completion log, so every step logs the group
    diversity, and the completion log's files are there too."""
    from .contract import unsloth_case

    for name in ("colab-t4", "gpu-large"):
        run = Path(unsloth_case(name, tmp_path_factory)["run"])
        logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert logged and all("entropy" not in entry for entry in logged)
        assert all(0 < entry["diversity/distinct"] <= 1 and 0 <= entry["diversity/overlap"] <= 1 for entry in logged)
        assert sorted(p.name for p in (run / "grpo" / "completions").glob("*.parquet")) == [
            f"completions_{entry['step']:05d}.parquet" for entry in logged]

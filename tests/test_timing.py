"""helpers.timing: what a GRPO step costs here and what the time budget buys with it (notebook 00)."""

import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import timing
from helpers.profiles import get_profile
from helpers.timing import StepTiming, time_grpo_step

SMOKE = get_profile("cpu-smoke")


def test_step_timing_turns_a_timed_step_into_a_budget_in_steps():
    t4 = StepTiming("colab-t4", seconds=(40.0, 20.0), max_steps=250, budget_minutes=45, warmup=False)
    assert t4.step_seconds == 20.0
    assert t4.steps_in_budget == (45 * 60 - 20) // 20 == 134   # the first step's extra 20 s counted once
    assert "stops after about 134 of the 250 steps, with the adapter saved" in t4.plan()
    assert "(the first took 40.0 s: one-off costs)" in t4.plan() and "warm-up" not in t4.plan()
    demo = StepTiming("cpu-demo", seconds=(9.0, 9.5), max_steps=60, budget_minutes=10, warmup=True)
    assert demo.steps_in_budget == 63  # a first step faster than the next: no credit
    assert "all 60 steps fit" in demo.plan() and "warm-up before GRPO counts" in demo.plan()
    free = StepTiming("gpu-large", seconds=(6.0,), max_steps=100, budget_minutes=None, warmup=False)
    assert free.steps_in_budget is None and "No time budget: all 100 steps take about 10 min" in free.plan()
    slow = StepTiming("cpu-demo", seconds=(700.0, 700.0), max_steps=60, budget_minutes=10, warmup=False)
    assert slow.steps_in_budget == 0 and "stops after about 0 of the 60" in slow.plan()  # never negative


class FakeTrainGrpo:
    """Stands in for helpers.training.train_grpo: records the call, logs the given step times."""

    def __init__(self, step_times):
        self.step_times, self.calls = step_times, []

    def __call__(self, profile, run, **kwargs):
        self.calls.append((profile, Path(run), kwargs, Path(run).is_dir()))
        history = [{"loss": 0.1}] + [{"step_time": t, "step": i + 1} for i, t in enumerate(self.step_times)]
        return {"trainer": SimpleNamespace(state=SimpleNamespace(log_history=history))}


def test_time_grpo_step_runs_the_profiles_recipe_for_a_few_steps_in_a_throwaway_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the scratch folder lands here
    fake = FakeTrainGrpo([12.346, 7.0])
    monkeypatch.setattr(timing, "train_grpo", fake)
    result = time_grpo_step(SMOKE, steps=2, model="M", tokenizer="T")
    [(timed, folder, kwargs, existed)] = fake.calls
    assert existed and folder.parent == tmp_path and list(tmp_path.iterdir()) == []  # made, then removed
    assert (timed.max_steps, timed.time_budget_minutes, timed.save_steps) == (2, None, 3)  # no checkpoint
    assert timed.with_overrides(max_steps=SMOKE.max_steps, time_budget_minutes=SMOKE.time_budget_minutes,
                                save_steps=SMOKE.save_steps) == SMOKE  # otherwise the profile's own recipe
    assert kwargs == {"resume": False, "warmup": False, "model": "M", "tokenizer": "T"}
    assert result == StepTiming("cpu-smoke", (12.35, 7.0), SMOKE.max_steps, SMOKE.time_budget_minutes, warmup=True)


def test_time_grpo_step_removes_its_folder_on_an_error_and_refuses_nonsense(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def broken(profile, run, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(timing, "train_grpo", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        time_grpo_step(SMOKE)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(timing, "train_grpo", FakeTrainGrpo([]))
    with pytest.raises(RuntimeError, match="TRL logged no `step_time`"):
        time_grpo_step(SMOKE)
    with pytest.raises(ValueError, match="at least one step"):
        time_grpo_step(SMOKE, steps=0)


@pytest.mark.slow
def test_time_grpo_step_times_real_steps_and_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))       # the scratch folder lands here
    result = time_grpo_step(SMOKE, steps=2)
    assert len(result.seconds) == 2 and all(s > 0 for s in result.seconds)
    assert result.max_steps == SMOKE.max_steps and result.budget_minutes == SMOKE.time_budget_minutes
    assert result.warmup                                          # cpu-smoke warms up: the plan says so
    assert list(tmp_path.iterdir()) == []                         # the throw-away run is gone

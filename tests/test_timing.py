"""helpers.timing: what a GRPO step costs here and what the time budget buys with it (notebook 00)."""

import inspect
import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import readiness, timing
from helpers.profiles import PROFILES, get_profile
from helpers.timing import StepTiming, notebook_minutes, preflight_estimate, time_grpo_step
from helpers.watch import watch_every

SMOKE = get_profile("cpu-smoke")
ROOT = Path(__file__).resolve().parents[1]


def test_step_timing_turns_a_timed_step_into_a_budget_in_steps():
    t4 = StepTiming("colab-t4", seconds=(40.0, 20.0), max_steps=250, budget_minutes=45, warmup=False)
    assert t4.step_seconds == 20.0
    assert t4.steps_in_budget == (45 * 60 - 20) // 20 == 134   # the first step's extra 20 s counted once
    assert "stops after about 134 of the 250 steps, with the adapter saved" in t4.plan()
    assert "(the first took 40.0 s: one-off costs)" in t4.plan() and "warm-up" not in t4.plan()
    assert "outside the budget" not in t4.plan() and "held-out" not in t4.plan()  # nothing else was timed
    demo = StepTiming("cpu-demo", seconds=(9.0, 9.5), max_steps=60, budget_minutes=10, warmup=True)
    assert demo.steps_in_budget == 60  # 63 would fit at this pace (a faster first step: no credit); 60 is the run
    assert "all 60 steps fit" in demo.plan()
    assert "Before the first step, outside the budget: the format warm-up." in demo.plan()
    free = StepTiming("gpu-large", seconds=(6.0,), max_steps=100, budget_minutes=None, warmup=False)
    assert free.steps_in_budget is None and "No time budget: all 100 steps take about 10 min" in free.plan()
    slow = StepTiming("cpu-demo", seconds=(700.0, 700.0), max_steps=60, budget_minutes=10, warmup=False)
    assert slow.steps_in_budget == 0 and "stops after about 0 of the 60" in slow.plan()  # never negative


def test_the_held_out_evaluations_and_the_preflight_come_out_of_the_budget():
    """A T4 plan that counted only step_time would promise 134 steps; six evaluations of 60 s leave 128."""
    t4 = StepTiming("colab-t4", seconds=(40.0, 20.0), max_steps=250, budget_minutes=45, warmup=False,
                    eval_seconds=60.0, eval_every=50, preflight_seconds=120.0)
    assert t4.evaluations(250) == 5 and t4.evaluations(128) == 2 and t4.evaluations(49) == 0
    assert t4.seconds_for(128) == 20 + 128 * 20 + 2 * 60 == 2700 and t4.seconds_for(129) > 45 * 60
    assert t4.steps_in_budget == 128
    plan = t4.plan()
    assert "A held-out evaluation takes 60.0 s here: 5 while training (every 50 steps) cost 5.0 min" in plan
    assert "stops after about 128 of the 250 steps" in plan
    assert ("Before the first step, outside the budget: one held-out evaluation (60 s), the pre-flight (about "
            "120 s, estimated, 4% of the budget).") in plan
    free = StepTiming("gpu-large", seconds=(6.0,), max_steps=100, budget_minutes=None, warmup=False,
                      eval_seconds=30.0, eval_every=20)
    assert "all 100 steps take about 12 min" in free.plan()   # 600 s of steps + 5 evaluations of 30 s


def test_the_evaluation_count_is_the_callbacks_own_on_a_stored_run():
    """bench/measured/learning/learning.json: cpu-demo's 30 steps scored the held-out slice at 5 steps (7, 14, 21, 28, 30)."""
    run = json.loads((ROOT / "bench" / "measured" / "learning" / "learning.json").read_text())
    demo = PROFILES["cpu-demo"]
    every = watch_every(demo.max_steps, demo.watch_evals)
    timed = StepTiming("cpu-demo", (run["seconds_per_step"],) * 2, demo.max_steps, demo.time_budget_minutes, True,
                       eval_seconds=run["heldout_seconds"] / len(run["heldout_curve"]), eval_every=every)
    assert timed.evaluations(run["steps"]) == len(run["heldout_curve"]) == 5
    assert [every * k for k in range(1, 5)] + [30] == [point[0] for point in run["heldout_curve"]]
    assert timed.seconds_for(30) == pytest.approx(30 * run["seconds_per_step"] + run["heldout_seconds"])


def test_the_preflight_estimate_follows_the_readiness_defaults():
    groups = inspect.signature(readiness.check).parameters["groups"].default
    probe = inspect.signature(readiness.measure).parameters["probe"].default
    demo, t4 = PROFILES["cpu-demo"], PROFILES["colab-t4"]
    # cpu-demo: groups x 8 completions of up to probe x 32 tokens, against 32 greedy ones of up to 32
    assert preflight_estimate(demo, 5.0, 32) == pytest.approx(5.0 * groups * 8 / 32 * probe)
    room = t4.max_seq_length - t4.max_prompt_tokens
    tokens = min(int(t4.max_completion_length * probe), room)
    assert preflight_estimate(t4, 60.0, 32) == pytest.approx(60.0 * groups * 6 / 32 * tokens / 256)
    short_room = demo.with_overrides(max_seq_length=demo.max_prompt_tokens + 40)   # probe capped by the room
    assert preflight_estimate(short_room, 5.0, 32) == pytest.approx(5.0 * groups * 8 / 32 * 40 / 32)


def test_each_colab_notebook_repeats_the_install_cell_and_a_laptop_installs_once():
    t4 = notebook_minutes(PROFILES["colab-t4"])
    assert t4["00_setup"] == (PROFILES["colab-t4"].minutes["00_setup"], 0.0)    # 00 times its install already
    assert t4["03_grpo_training"] == (PROFILES["colab-t4"].minutes["03_grpo_training"], timing.INSTALL_MINUTES)
    assert list(t4) == list(PROFILES["colab-t4"].minutes)
    assert all(install == 0.0 for _, install in notebook_minutes(PROFILES["cpu-demo"]).values())


class FakeTrainGrpo:
    """Stands in for helpers.training.train_grpo: records the call, logs the given step times and evaluations."""

    def __init__(self, step_times, heldout_seconds=0.0):
        self.step_times, self.calls, self.heldout_seconds = step_times, [], heldout_seconds

    def __call__(self, profile, run, **kwargs):
        self.calls.append((profile, Path(run), kwargs, Path(run).is_dir()))
        history = [{"loss": 0.1}] + [{"step_time": t, "step": i + 1} for i, t in enumerate(self.step_times)]
        points = [(i + 1, {"accuracy": 0.5}) for i in range(len(self.step_times))] if self.heldout_seconds else []
        return {"trainer": SimpleNamespace(state=SimpleNamespace(log_history=history)), "heldout": points,
                "summary": {"heldout_seconds": self.heldout_seconds}}


def test_time_grpo_step_runs_the_profiles_recipe_for_a_few_steps_in_a_throwaway_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the scratch folder lands here
    fake = FakeTrainGrpo([12.346, 7.0], heldout_seconds=3.0)
    monkeypatch.setattr(timing, "train_grpo", fake)
    result = time_grpo_step(SMOKE, steps=2, model="M", tokenizer="T")
    [(timed, folder, kwargs, existed)] = fake.calls
    assert existed and folder.parent == tmp_path and list(tmp_path.iterdir()) == []  # made, then removed
    assert (timed.max_steps, timed.time_budget_minutes, timed.save_steps) == (2, None, 3)  # no checkpoint
    assert timed.with_overrides(max_steps=SMOKE.max_steps, time_budget_minutes=SMOKE.time_budget_minutes,
                                save_steps=SMOKE.save_steps) == SMOKE  # otherwise the profile's own recipe
    assert kwargs == {"resume": False, "warmup": False, "model": "M", "tokenizer": "T"}
    every = watch_every(SMOKE.max_steps, SMOKE.watch_evals)
    preflight = round(preflight_estimate(SMOKE, 1.5, SMOKE.watch_prompts), 1)
    assert result == StepTiming("cpu-smoke", (12.35, 7.0), SMOKE.max_steps, SMOKE.time_budget_minutes, warmup=True,
                                eval_seconds=1.5, eval_every=every, preflight_seconds=preflight)  # 3 s over 2 points
    monkeypatch.setattr(timing, "train_grpo", FakeTrainGrpo([5.0, 4.0]))  # no held-out slice: nothing estimated
    none = time_grpo_step(SMOKE.with_overrides(watch_prompts=0))
    assert (none.eval_seconds, none.eval_every, none.preflight_seconds) == (None, 0, None)


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
    assert result.eval_seconds > 0 and result.preflight_seconds > 0  # its held-out slice was scored after each step
    assert list(tmp_path.iterdir()) == []                         # the throw-away run is gone

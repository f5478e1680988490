"""helpers.readiness: the verdict on constructed and stored figures (each verdict), and the pre-flight on the bundled
model (cpu-smoke): the figures it measures, a limit that cuts every answer, and ``python -m helpers.readiness``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.profiles import get_profile
from helpers.readiness import SETTINGS, Figures, Plan, check, decide, main, plan_for
from helpers.training import grpo_kwargs

ROOT = Path(__file__).resolve().parents[1]
STORED = ROOT / "bench" / "measured" / "readiness" / "readiness.json"

#: cpu-demo's recipe after its warm-up, seed 3407, as the pre-flight measured it (bench/measured/readiness/readiness.json):
#: the run learned (+40 points).
HEALTHY = Figures(groups=8, group_size=8, limit=32, masked=False, temperature=1.0, spread=1.0, learnable=1.0,
                  truncated=0.421875, format=0.390625, headline=0.046875, pass_at_g=0.125, solved_all=0.0,
                  distinct=0.90625, length_p95=64.0, probe_limit=64)
PLAN = Plan(steps=30, warmup_examples=16, easier="add2-small", harder="add3", room=256)


def test_a_healthy_run_is_go():
    verdict = decide(HEALTHY, PLAN)
    assert verdict.verdict == "go" and verdict.change == "" and verdict.settings == {}
    assert str(verdict).startswith("go: 100% of 8 groups can teach")


def test_all_truncated_names_the_measured_length_and_its_cost():
    cut = dataclasses.replace(HEALTHY, limit=20, masked=True, truncated=1.0, learnable=0.0, length_p95=29)
    verdict = decide(cut, PLAN)
    assert verdict.verdict == "fix first"
    assert verdict.settings == {"max_completion_length": 32}  # 29 rounded up to 16 tokens
    assert verdict.cost_steps == round(30 * (1 - 20 / 32)) and "estimate" in verdict.cost
    assert verdict.change.startswith("raise max_completion_length 20 -> 32 (95% of the sampled answers end within 29")


def test_all_truncated_without_an_end_in_sight_warms_up_first():
    """history_trunc20.json's run: no warm-up, a 20-token limit, the answers never end and miss the format."""
    rambling = dataclasses.replace(HEALTHY, limit=20, masked=True, truncated=1.0, learnable=0.0, format=0.0,
                                   headline=0.0, pass_at_g=0.0, length_p95=40, probe_limit=40)
    verdict = decide(rambling, dataclasses.replace(PLAN, warmup_examples=0))
    assert verdict.settings == {"warmup_examples": 16} and verdict.change.startswith("warm up first")
    longer = decide(rambling, dataclasses.replace(PLAN, warmup_examples=16, warmup_seconds_per_example=0.3,
                                                  step_seconds=2.0))
    assert longer.settings == {"warmup_examples": 32} and longer.change.startswith("warm up longer")
    assert longer.cost_steps == 3  # 16 more examples x 0.3 s = 4.8 s, over 2 s a step: at most 3 steps


def test_cut_completions_the_loss_keeps_are_no_reason_to_stop():
    """Unmasked, a cut completion scores low and teaches the model to stop: recipe seed 1 started with 58% cut and
    gained 45 points (bench/measured/readiness/readiness.json). Masked, the same start would learn from few completions."""
    cut = dataclasses.replace(HEALTHY, truncated=0.58, pass_at_g=0.5)
    assert decide(cut, PLAN).verdict == "go"
    assert decide(dataclasses.replace(cut, masked=True), PLAN).settings == {"warmup_examples": 32}


def test_answers_longer_than_the_sequence_allows_warm_up_instead():
    long = dataclasses.replace(HEALTHY, masked=True, truncated=0.9, length_p95=300, probe_limit=512)
    verdict = decide(long, PLAN)
    assert verdict.settings == {"warmup_examples": 32} and "more than the 256" in verdict.change


@pytest.mark.parametrize("change, expected", [
    (dict(pass_at_g=0.0, headline=0.0, format=0.95), {"task_level": "add2-small"}),  # never solved: easier
    (dict(pass_at_g=0.0, headline=0.0, format=0.2), {"warmup_examples": 32}),  # ... and no format: warm up
    (dict(pass_at_g=1.0, solved_all=0.9, learnable=0.1), {"task_level": "add3"}),  # always solved: harder
    (dict(learnable=0.1, distinct=0.3), {"temperature": 1.2}),  # groups of the same answer: hotter
    (dict(learnable=0.1), {"num_generations": 16}),  # too few differ: a larger group
])
def test_no_spread_names_the_change_that_brings_it(change, expected):
    verdict = decide(dataclasses.replace(HEALTHY, **change), PLAN)
    assert verdict.verdict == "fix first" and verdict.settings == expected, verdict


def test_the_easiest_level_asks_for_another_task():
    verdict = decide(dataclasses.replace(HEALTHY, pass_at_g=0.0, format=0.95), dataclasses.replace(PLAN, easier=None))
    assert verdict.verdict == "fix first" and verdict.settings == {} and "easiest level" in verdict.change


def test_plan_names_the_neighbouring_levels():
    plan = plan_for(get_profile("cpu-demo"), warmup_seconds=4.8, step_seconds=3.0)
    assert (plan.easier, plan.harder, plan.steps, plan.room) == ("add2-small", "add3", 30, 256)
    assert plan.warmup_seconds_per_example == pytest.approx(0.3)
    assert plan_for(get_profile("cpu-demo", task_level="add1")).easier is None


@pytest.mark.parametrize("name", ["cpu-smoke", "cpu-demo", "colab-t4"])
def test_without_a_config_it_reads_what_grpo_config_sets(name, tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_TRACKIO", "0")
    profile = get_profile(name)
    asked = grpo_kwargs(profile, tmp_path, capability=(7, 5) if profile.backend == "unsloth" else None)
    assert {k: getattr(profile, k) for k in SETTINGS} == {k: asked[k] for k in SETTINGS}


def test_the_stored_verdicts_follow_from_the_stored_figures():
    """Each validation run's verdict is decide() of its figures and plan, as stored (bench/readiness.py): the logic
    tested here is the one that ran, on stored runs that include a go and a fix first."""
    runs = json.loads(STORED.read_text())["runs"]
    assert len(runs) >= 8 and {r["readiness"]["verdict"]["verdict"] for r in runs} == {"go", "fix first"}
    for run in runs:
        verdict = decide(Figures(**run["readiness"]["figures"]), Plan(**run["readiness"]["plan"]))
        assert dataclasses.asdict(verdict) == run["readiness"]["verdict"], run["name"]


# --- on the bundled model

@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """cpu-smoke's model after its warm-up, and the run folder holding its prepared dataset."""
    from helpers.models import load_model
    from helpers.training import run_warmup
    profile = get_profile("cpu-smoke")
    run = tmp_path_factory.mktemp("readiness-run")
    model, tok = load_model(profile)
    warm = run_warmup(model, tok, profile, run)
    return profile, model, tok, run, warm


def test_the_pre_flight_measures_groups_as_grpo_samples_them(warmed):
    profile, model, tok, run, warm = warmed
    report = check(model, tok, profile, run=run, groups=4, warmup_seconds=warm["seconds"])
    f, rows = report.figures, report.completions
    assert (f.groups, f.group_size, f.limit, f.probe_limit) == (4, 2, 28, 56)
    assert len(rows) == 8 and {r["truncated"] for r in rows} <= {True, False}
    assert f.truncated == sum(r["length"] >= 28 for r in rows) / 8  # cut: no end within the limit
    assert all(len(tok(r["completion"], add_special_tokens=False)["input_ids"]) <= 29 for r in rows)
    assert 0 <= f.learnable <= f.spread <= 1 and f.solved_all <= f.pass_at_g
    assert f.pass_at_g == sum(any(r["accuracy"] for r in rows[i:i + 2]) for i in range(0, 8, 2)) / 4
    assert report.verdict.verdict in ("go", "fix first") and "pre-flight (4 groups of 2" in str(report)
    assert json.loads(json.dumps(report.to_dict()))["figures"]["groups"] == 4


def test_a_limit_that_cuts_every_answer_is_fix_first(warmed):
    """The config training will use decides: a 6-token limit cuts every worked answer of cpu-smoke's task."""
    profile, model, tok, run, _ = warmed
    config = SimpleNamespace(num_generations=2, max_completion_length=6, temperature=1.0,
                             mask_truncated_completions=True, per_device_train_batch_size=2,
                             chat_template_kwargs=None)
    report = check(model, tok, profile, run=run, config=config, groups=4)
    assert report.figures.truncated == 1.0 and report.figures.learnable == 0.0
    assert report.verdict.verdict == "fix first"
    assert set(report.verdict.settings) <= {"max_completion_length", "warmup_examples"}, report.verdict


def test_the_command_line_runs_it_alone(warmed, capsys):
    profile, model, tok, run, _ = warmed
    code = main(["--profile", "cpu-smoke", "--adapter", str(run / "warmup-adapter"), "--groups", "2"])
    out = capsys.readouterr().out
    assert "pre-flight (2 groups of 2" in out and ("go:" in out or "fix first:" in out)
    assert code == (0 if "\ngo:" in out else 2)

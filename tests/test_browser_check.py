"""dev/browser_check.py's trackio check, its parts that need no browser: the stored runs it shows, and the project
transformers' own TrackioCallback builds from them (read back by trackio). The browser part runs as
`.venv/bin/python dev/browser_check.py --only trackio` (headless Chromium)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from dev.browser_check import (ROOT, TRACKIO_DEMO_RUNS, TRACKIO_METRICS, TRACKIO_WHERE_LOGGED, CheckError, _pick,
                                 demo_runs, expected_plots, headline_plot, logged_names, project_metrics)


def test_pick_follows_the_annotation_paths():
    data = {"runs": [{"seed": 1, "after": 0.5}, {"seed": 3407, "after": 0.7}], "a": {"b": 2}}
    assert _pick(data, "runs.seed=3407.after") == 0.7 and _pick(data, "runs.0.seed") == 1
    assert _pick(data, "a.b") == 2 and _pick(data, "") == data


def test_the_demo_shows_stored_real_runs_under_the_course_names():
    runs = demo_runs()
    assert len(runs) == len(TRACKIO_DEMO_RUNS), "a stored run the trackio check shows is missing"
    names = [r["name"] for r in runs]
    assert names[:2] == ["arithmetic-dapo-seed3407", "arithmetic-dapo-seed1"] and names[2].endswith("-lr0.001")
    for run in runs:
        assert len(run["history"]) >= 10 and all("step" in h for h in run["history"])
        keys = {k for h in run["history"] for k in h}
        assert {"reward", "entropy", "frac_reward_zero_std", "completions/mean_length", "eval_accuracy"} <= keys


def test_transformers_trackio_callback_builds_the_project_the_dashboard_reads(tmp_path):
    code = textwrap.dedent(f"""
        import json, os, sys
        os.environ["TRACKIO_DIR"] = {str(tmp_path)!r}
        sys.path.insert(0, {str(ROOT)!r})
        from dev.browser_check import build_project, demo_runs
        runs = demo_runs()[:2]
        build_project(runs, "grpo-course")
        from trackio.sqlite_storage import SQLiteStorage
        logs = SQLiteStorage.get_logs("grpo-course", runs[0]["name"])
        print(json.dumps({{"runs": SQLiteStorage.get_runs("grpo-course"), "rows": len(logs),
                          "keys": sorted({{k for row in logs for k in row}}), "steps": [row["step"] for row in logs],
                          "history_steps": [h["step"] for h in runs[0]["history"]]}}))""")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["runs"] == ["arithmetic-dapo-seed3407", "arithmetic-dapo-seed1"] and out["rows"] >= 10
    assert {*TRACKIO_METRICS, "eval/accuracy", "train/entropy"} <= set(out["keys"])  # every plot the browser reads
    assert out["steps"] == out["history_steps"]  # at the training step, as a course run logs (TrackioStepCallback)


def test_each_run_is_checked_in_its_own_tasks_headline():
    assert headline_plot("arithmetic-dapo-seed3407") == "eval/accuracy"
    assert headline_plot("json-dapo-seed3407-loss-grpo") == "eval/exact_match"  # notebook 05's, a sub-run's folder
    assert headline_plot("tools-dapo-seed1") == "eval/accuracy"
    with pytest.raises(CheckError, match="<task>-<loss type>-seed<N>"):
        headline_plot("my-run")
    plots = expected_plots({"arithmetic-dapo-seed1": ["train/reward", "train/entropy", "eval/accuracy"],
                            "json-dapo-seed1": ["train/reward", "train/diversity/distinct", "eval/exact_match"]})
    assert plots["eval/accuracy"] == ["arithmetic-dapo-seed1"] and plots["eval/exact_match"] == ["json-dapo-seed1"]
    assert plots["train/reward"] == ["arithmetic-dapo-seed1", "json-dapo-seed1"]  # missing from a log: checked anyway
    # entropy and the group diversity only where the run's trainer logged them (Unsloth's logs no entropy)
    assert plots["train/entropy"] == ["arithmetic-dapo-seed1"]
    assert plots["train/diversity/distinct"] == ["json-dapo-seed1"]
    assert set(plots) == {*TRACKIO_METRICS, *TRACKIO_WHERE_LOGGED, "eval/accuracy", "eval/exact_match"}


def test_a_folder_with_two_tasks_runs_is_read_back_with_each_runs_own_headline(tmp_path):
    """The failure of issue 52: on a ``make course`` folder (notebook 03's arithmetic run and notebook 05's JSON run in
    one project) the check waited for every run in ``eval/accuracy``. A project with both, written by the course's
    tracker, read back by trackio's storage: the JSON run is looked for in ``eval/exact_match`` only. Its history is
    a stored arithmetic run's with the held-out keys renamed to the JSON task's (no per-step JSON history is stored)."""
    arithmetic = demo_runs()[0]
    renamed = {"eval_accuracy": "eval_exact_match", "eval_format": "eval_schema_valid"}
    json_run = {"name": "json-dapo-seed3407", "history": [{renamed.get(k, k): v for k, v in h.items()}
                                                          for h in arithmetic["history"]]}
    code = textwrap.dedent(f"""
        import json, os, sys
        os.environ["TRACKIO_DIR"] = {str(tmp_path)!r}
        sys.path.insert(0, {str(ROOT)!r})
        from dev.browser_check import build_project
        build_project(json.loads(sys.argv[1]), "grpo-course")""")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps([arithmetic, json_run])], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = project_metrics(sys.executable, tmp_path, "grpo-course")
    assert sorted(logged) == ["arithmetic-dapo-seed3407", "json-dapo-seed3407"]
    assert set(logged["json-dapo-seed3407"]) == {*logged_names(json_run["history"]), "train/global_step"}
    plots = expected_plots(logged)
    assert plots["eval/accuracy"] == ["arithmetic-dapo-seed3407"]
    assert plots["eval/exact_match"] == ["json-dapo-seed3407"]
    assert plots["train/entropy"] == ["arithmetic-dapo-seed3407", "json-dapo-seed3407"]

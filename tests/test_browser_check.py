"""tools/browser_check.py's trackio check, its parts that need no browser: the stored runs it shows, and the project
transformers' own TrackioCallback builds from them (read back by trackio). The browser part runs as
`.venv/bin/python tools/browser_check.py --only trackio` (headless Chromium)."""

import json
import os
import subprocess
import sys
import textwrap

from tools.browser_check import ROOT, TRACKIO_DEMO_RUNS, TRACKIO_METRICS, _pick, demo_runs


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
        from tools.browser_check import build_project, demo_runs
        runs = demo_runs()[:2]
        build_project(runs, "grpo-course")
        from trackio.sqlite_storage import SQLiteStorage
        logs = SQLiteStorage.get_logs("grpo-course", runs[0]["name"])
        print(json.dumps({{"runs": SQLiteStorage.get_runs("grpo-course"), "rows": len(logs),
                          "keys": sorted({{k for row in logs for k in row}})}}))""")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["runs"] == ["arithmetic-dapo-seed3407", "arithmetic-dapo-seed1"] and out["rows"] >= 10
    assert set(TRACKIO_METRICS) <= set(out["keys"])  # every plot the browser looks for has data

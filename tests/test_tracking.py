"""helpers.tracking: trackio's folder inside the run folder, off (with the reason) where it cannot run, the run
names, and the tracker moved after the course's callbacks. Each case that imports trackio runs in a fresh Python:
trackio reads its folder once, at import."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import tracking
from helpers.tracking import PROJECT, Tracking, run_name_for, trackio_dir

ROOT = Path(__file__).resolve().parents[1]


def fresh(code: str, env: dict | None = None) -> dict:
    """Run ``code`` in a new interpreter (the course venv's); it prints one JSON line last."""
    import os
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_trackio_writes_its_project_into_the_run_folder(tmp_path):
    out = fresh(f"""
        import json, os
        os.environ.pop("TRACKIO_DIR", None)
        from helpers.tracking import use_trackio
        t = use_trackio({str(tmp_path)!r})
        import trackio
        trackio.init(project="grpo-course", name="a")
        trackio.log({{"reward": 1.0}})
        trackio.finish()
        print(json.dumps({{"on": t.on, "folder": str(t.folder), "env": os.environ["TRACKIO_DIR"],
                          "files": sorted(os.listdir(t.folder))}}))""")
    assert out["on"] and out["folder"] == out["env"] == str(tmp_path / "trackio")
    assert "grpo-course.db" in out["files"]


def test_trackio_imported_earlier_keeps_its_folder_and_says_so(tmp_path):
    out = fresh(f"""
        import json, os
        os.environ["TRACKIO_DIR"] = {str(tmp_path / "first")!r}
        import trackio
        from helpers.tracking import use_trackio
        t = use_trackio({str(tmp_path / "run")!r})
        print(json.dumps({{"on": t.on, "folder": str(t.folder), "text": str(t)}}))""")
    assert out["on"] and out["folder"] == str(tmp_path / "first")
    assert "imported before this run folder" in out["text"]


@pytest.fixture(autouse=True)
def own_environment(monkeypatch):
    """use_trackio sets TRACKIO_DIR: each test starts without it, and leaves none behind."""
    for name in ("TRACKIO_DIR", "_COURSE_TRACKIO_DIR", "COURSE_TRACKIO"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "trackio.utils", raising=False)  # as if not imported yet (restored after)


def test_the_run_folder_points_trackio_there_and_its_sub_runs_share_the_project(tmp_path, monkeypatch):
    from helpers.runs import run_dir
    monkeypatch.setenv("COURSE_RUN_DIR", str(tmp_path / "course"))
    run = run_dir("cpu-smoke")
    import os
    assert os.environ["TRACKIO_DIR"] == str(run / "trackio")
    sub = tracking.use_trackio(run / "json-task")  # notebook 05's run, beside notebook 03's
    assert sub.on and sub.folder == run / "trackio" and sub.reason == "the run folder's"
    other = tracking.use_trackio(tmp_path / "elsewhere")  # trackio is imported now: its folder stays, and it says so
    assert other.folder == run / "trackio" and "imported before this run folder" in other.reason


def test_a_learners_own_trackio_dir_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "mine"))
    t = tracking.use_trackio(tmp_path / "run")
    assert t.on and t.folder == tmp_path / "mine" and "TRACKIO_DIR is set" in t.reason


def test_off_switch_and_missing_package_turn_it_off_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_TRACKIO", "0")
    t = tracking.use_trackio(tmp_path)
    assert not t.on and t.report_to == "none" and "COURSE_TRACKIO=0" in str(t)
    monkeypatch.delenv("COURSE_TRACKIO")
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name: None)
    t = tracking.use_trackio(tmp_path)
    assert not t.on and "pip install trackio==0.43.0" in t.reason and "training runs the same" in str(t)


def test_an_unwritable_folder_turns_it_off(tmp_path):
    blocker = tmp_path / "run"
    blocker.write_text("a file where the run folder should be")
    t = tracking.use_trackio(blocker)
    assert not t.on and "cannot be written" in t.reason


def test_run_names_tell_the_runs_apart():
    assert run_name_for("arithmetic", "dapo", 3407, "/r/grpo") == "arithmetic-dapo-seed3407"
    assert run_name_for("json", "grpo", 1, "/r/loss-grpo") == "json-grpo-seed1-loss-grpo"
    assert trackio_dir("/r") == Path("/r/trackio")
    assert "trackio: off" in str(Tracking(False, None, "x")) and PROJECT == "grpo-course"


def test_training_still_runs_where_trackio_cannot_start_and_says_why(tmp_path):
    out = fresh(f"""
        import json, io, contextlib, sys
        sys.modules["trackio"] = None  # as if not installed: find_spec gives None, the import fails
        from helpers import training
        from helpers.profiles import get_profile
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            out = training.train_grpo(get_profile("cpu-smoke", max_steps=1, watch_prompts=2), {str(tmp_path)!r},
                                      warmup=False)
        print(json.dumps({{"steps": out["summary"]["global_step"], "report_to": out["trainer"].args.report_to,
                          "printed": printed.getvalue()}}))""", env={"OMP_NUM_THREADS": "1"})
    assert out["steps"] == 1 and out["report_to"] == []
    assert "trackio: off (trackio is not installed" in out["printed"]
    assert not (tmp_path / "trackio").exists()


@pytest.mark.slow
def test_a_course_run_lands_in_trackio_with_held_out_accuracy(tmp_path):
    out = fresh(f"""
        import json, os
        os.environ.pop("TRACKIO_DIR", None)
        from helpers.profiles import get_profile
        from helpers.training import train_grpo
        out = train_grpo(get_profile("cpu-smoke", max_steps=2, watch_prompts=2, watch_evals=2), {str(tmp_path)!r},
                         warmup=False)
        from trackio.sqlite_storage import SQLiteStorage
        logs = SQLiteStorage.get_logs("grpo-course", "arithmetic-dapo-seed3407")
        print(json.dumps({{"runs": SQLiteStorage.get_runs("grpo-course"), "keys": sorted({{k for r in logs for k in r}}),
                          "callbacks": [type(c).__name__ for c in out["trainer"].callback_handler.callbacks]}}))""",
                env={"OMP_NUM_THREADS": "1"})
    assert out["runs"] == ["arithmetic-dapo-seed3407"]
    assert {"train/reward", "train/entropy", "train/frac_reward_zero_std", "eval/accuracy"} <= set(out["keys"])
    assert out["callbacks"][-1] == "TrackioCallback" and out["callbacks"].index("HeldOutCallback") < len(out["callbacks"]) - 1
    assert (tmp_path / "trackio" / "grpo-course.db").is_file()

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

from .shared import smoke_run

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
def test_a_course_run_lands_in_trackio_with_held_out_accuracy(tmp_path_factory):
    """The shared 2-step cpu-smoke run (tests/shared.py, run once per session in a fresh interpreter)."""
    out = smoke_run(tmp_path_factory)
    run = Path(out["run"])
    assert out["runs"] == ["arithmetic-dapo-seed3407"]
    assert {"train/reward", "train/entropy", "train/frac_reward_zero_std", "eval/accuracy"} <= set(out["keys"])
    assert out["callbacks"][-1] == "TrackioStepCallback" and out["callbacks"].index("HeldOutCallback") < len(out["callbacks"]) - 1
    assert out["callbacks"].index("GroupDiversityCallback") < out["callbacks"].index("WatchCallback")
    assert "train/diversity/distinct" in out["keys"]
    assert (run / "trackio" / "grpo-course.db").is_file()


@pytest.mark.slow
def test_every_point_a_course_run_logs_in_trackio_carries_its_training_step(tmp_path_factory):
    """trackio numbers log calls where none gives a step, and TRL makes two a step (the metrics, its completion
    table): a course run stopped near step 24 had its held-out curve end at trackio step 40. Read back from the
    shared 2-step run's own SQLite file: the metrics, the held-out slice, the group diversity and the completion
    table of each training step sit at that step. TRL's own timings (``profiling/...``) carry the step it passes,
    ``global_step`` while the step runs, so the one before (trl/extras/profiling.py:166)."""
    run = Path(smoke_run(tmp_path_factory)["run"])
    out = fresh("""
        import json
        from trackio.sqlite_storage import SQLiteStorage
        logs = SQLiteStorage.get_logs("grpo-course", "arithmetic-dapo-seed3407")
        print(json.dumps([{"step": row["step"], "keys": sorted(k for k in row if k not in ("step", "timestamp"))}
                          for row in logs]))""", env={"TRACKIO_DIR": str(run / "trackio")})
    logged = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2]
    metrics = [row for row in out if "train/reward" in row["keys"]]
    assert [row["step"] for row in metrics] == logged
    for row in metrics:
        assert {"train/global_step", "eval/accuracy", "train/diversity/distinct"} <= set(row["keys"])
    tables = [row["step"] for row in out if "completions" in row["keys"]]
    assert tables[:2] == logged and set(tables) == set(logged)  # TRL's table (the run's end logs it once more)
    timings = {row["step"] for row in out if all(k.startswith("profiling/") for k in row["keys"])}
    assert timings == {0, 1}
    assert max(row["step"] for row in out) == 2  # trackio's step never runs ahead of training's


# --------------------------------------------------------------------------- the dashboard stays private


def _stand_in_colab(monkeypatch) -> list:
    """A stand-in ``google.colab`` whose ``output.serve_kernel_port_as_iframe`` records its calls."""
    import types

    served = []
    google, colab, output = (types.ModuleType(n) for n in ("google", "google.colab", "google.colab.output"))
    output.serve_kernel_port_as_iframe = lambda port, **kw: served.append((port, kw))
    google.colab, colab.output = colab, output
    for module in (google, colab, output):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    return served


def test_show_privately_uses_colabs_proxy_without_the_write_token(monkeypatch):
    dashboard = (None, "http://127.0.0.1:7861/", None, "http://127.0.0.1:7861/?project=grpo-course&write_token=s3")
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    tracking.show_privately(dashboard)  # a laptop: trackio's own frame works, nothing more to do
    served = _stand_in_colab(monkeypatch)
    tracking.show_privately(dashboard)
    assert served == [(7861, {"path": "/?project=grpo-course", "height": "1000"})]


def test_show_privately_refuses_and_closes_a_public_link():
    closed = []
    server = type("Server", (), {"close": lambda self: closed.append(True)})()
    with pytest.raises(RuntimeError, match="share=False"):
        tracking.show_privately((server, "http://127.0.0.1:7860/", "https://abc.trackio.live", "https://abc..."))
    assert closed == [True]


def test_the_notebooks_dashboard_call_makes_no_public_link_where_trackio_would(tmp_path):
    """Notebook 03's call, with trackio told it runs on Colab (where it would share by itself): no tunnel is
    asked for, and the port handed to Colab's proxy is the live dashboard's."""
    out = fresh(f"""
        import json, sys, types, urllib.request
        import trackio, trackio.launch
        trackio.launch.colab_check = lambda: True          # what trackio sees on Colab
        def no_tunnel(**kw):
            raise AssertionError("a public share link was asked for")
        trackio.launch.setup_tunnel = no_tunnel
        served = []
        google, colab, output = (types.ModuleType(n) for n in ("google", "google.colab", "google.colab.output"))
        output.serve_kernel_port_as_iframe = lambda port, **kw: served.append([port, kw["path"]])
        google.colab, colab.output = colab, output
        sys.modules.update({{m.__name__: m for m in (google, colab, output)}})
        from helpers.tracking import show_privately
        dashboard = trackio.show(project="grpo-course", share=False, open_browser=False, block_thread=False)
        show_privately(dashboard)
        port, path = served[0]
        status = urllib.request.urlopen(f"http://127.0.0.1:{{port}}{{path}}", timeout=30).status
        dashboard[0].close()
        print(json.dumps({{"share_url": dashboard[2], "served": served, "url": dashboard[1], "status": status}}))""",
                env={"TRACKIO_DIR": str(tmp_path)})
    assert out["share_url"] is None and out["status"] == 200
    assert out["served"] == [[int(out["url"].rstrip("/").rsplit(":", 1)[1]), "/?project=grpo-course"]]


def _dashboard_calls(source: str, where: str) -> list[str]:
    """Every call in ``source`` that can start trackio's dashboard (``trackio.show``, ``launch_trackio_dashboard``)
    and does not pass ``share=False``."""
    import ast

    tree, bad = ast.parse(source), []
    starters = {"trackio.show", "launch_trackio_dashboard"} | {  # `from trackio import show as s` -> s
        alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith("trackio") for alias in node.names if alias.name == "show"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name in starters or name.endswith((".launch_trackio_dashboard", "trackio.show")):
                share = next((k.value for k in node.keywords if k.arg == "share"), None)
                if not (isinstance(share, ast.Constant) and share.value is False):
                    bad.append(f"{where}:{node.lineno} {ast.unparse(node)[:80]}")
    return bad


def test_no_course_cell_or_helper_can_start_a_shared_dashboard():
    from tests.notebook_code import notebook_code

    bad, seen = [], 0
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        source = notebook_code(path)  # every code cell and exercise solution
        seen += source.count("trackio.show(")
        bad += _dashboard_calls(source, path.name)
    for path in sorted([*(ROOT / "helpers").rglob("*.py"), *(ROOT / "examples").glob("*.py"),
                        *(ROOT / "tools").rglob("*.py"), *(ROOT / "dev").rglob("*.py"),
                        *(ROOT / "bench").glob("*.py")]):
        bad += _dashboard_calls(path.read_text(), str(path.relative_to(ROOT)))
    assert seen >= 1, "notebook 03 no longer starts the dashboard: this test checks nothing"
    assert not bad, f"a dashboard started without share=False (on Colab trackio then shares it publicly): {bad}"
    assert _dashboard_calls("import trackio\ntrackio.show(project='p')", "x") == ["x:2 trackio.show(project='p')"]
    assert _dashboard_calls("trackio.show(project='p', share=True)", "x") == ["x:1 trackio.show(project='p', share=True)"]
    assert _dashboard_calls("from trackio import show as s\ns(share=None)", "x") == ["x:2 s(share=None)"]

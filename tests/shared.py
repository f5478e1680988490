"""Work done once per test session and read by several test files, on whichever pytest-xdist worker asks first.

``once(name, tmp_path_factory, produce)`` runs ``produce(folder)`` (which returns a JSON-able dict) the first time
any worker asks for ``name``, in a folder of the session's temporary root, under a file lock; every later caller, on
this worker or the other, waits for the lock and reads the stored result. A failure is stored too, so the other
worker fails with the same message instead of redoing a long run. Without xdist it is a plain once-per-session.

    @pytest.fixture(scope="module")
    def smoke_run(tmp_path_factory):
        return once("smoke-run", tmp_path_factory, lambda folder: {"steps": train(folder)})
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path
from typing import Any, Callable

import pytest


def session_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every worker of this session shares: the parent of a worker's basetemp under xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once(name: str, tmp_path_factory: pytest.TempPathFactory, produce: Callable[[Path], dict[str, Any]]) -> dict:
    """``produce(<root>/<name>)`` once per session across workers; its result (or its failure) for every caller."""
    from filelock import FileLock  # a dependency of huggingface_hub and torch

    root = session_root(tmp_path_factory)
    folder, stored = root / name, root / f"{name}.json"
    with FileLock(str(root / f"{name}.lock")):
        if not stored.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            try:
                result = {"ok": produce(folder)}
            except pytest.fail.Exception as exc:  # a failed assertion of the producer: its message
                result = {"error": str(exc)}
            except Exception as exc:  # noqa: BLE001 - stored for the other worker, then raised below
                result = {"error": "".join(traceback.format_exception(exc))[-6000:]}
            stored.write_text(json.dumps(result, default=str))
    result = json.loads(stored.read_text())
    if "error" in result:
        pytest.fail(f"the shared run {name!r} (in {folder}) failed:\n{result['error']}", pytrace=False)
    return result["ok"]


#: The shared 2-step cpu-smoke GRPO run, in a fresh interpreter (trackio reads its folder once, at import): held-out
#: accuracy at step 2, the course's callbacks with one of the test's (it records the steps it sees) and a GRPOConfig
#: value on top of the profile's (a benchmark's variant). Prints one JSON line last.
SMOKE_RUN = """
import json, os, sys
os.environ.pop("TRACKIO_DIR", None)
from transformers import TrainerCallback
from helpers.profiles import get_profile
from helpers.training import train_grpo

class Steps(TrainerCallback):
    def __init__(self):
        self.seen = []

    def on_step_end(self, args, state, control, **kwargs):
        self.seen.append(state.global_step)

steps = Steps()
run = sys.argv[1]
out = train_grpo(get_profile("cpu-smoke", max_steps=2, watch_prompts=2, watch_evals=2, time_budget_minutes=None),
                 run, warmup=False, callbacks=[steps], config_overrides={"top_entropy_quantile": 0.2})
from trackio.sqlite_storage import SQLiteStorage
logs = SQLiteStorage.get_logs("grpo-course", "arithmetic-dapo-seed3407")
print(json.dumps({"runs": SQLiteStorage.get_runs("grpo-course"), "keys": sorted({k for r in logs for k in r}),
                  "callbacks": [type(c).__name__ for c in out["trainer"].callback_handler.callbacks],
                  "steps_seen": steps.seen, "top_entropy_quantile": out["trainer"].top_entropy_quantile,
                  "summary": out["summary"]}, default=str))
"""


def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The shared 2-step cpu-smoke run (:data:`SMOKE_RUN`): its printed JSON, plus ``"run"``, the run folder.

    Read by tests/test_tracking.py, tests/test_explorer.py and tests/test_training.py's callbacks test."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]

    def produce(folder: Path) -> dict:
        run = folder / "run"
        env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
        for name in ("TRACKIO_DIR", "_COURSE_TRACKIO_DIR", "COURSE_TRACKIO"):
            env.pop(name, None)
        proc = subprocess.run([sys.executable, "-c", SMOKE_RUN, str(run)], capture_output=True, text=True,
                              timeout=900, cwd=root, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return {**json.loads(proc.stdout.strip().splitlines()[-1]), "run": str(run)}

    return once("smoke-run", tmp_path_factory, produce)


#: Notebooks whose nbval run (conftest.py) is kept for the session, with a record: tests/test_colab_layout.py reads
#: them instead of running them again.
KEPT_NBVAL_RUNS = ("notebooks/03_grpo_training.ipynb", "notebooks/04_merge_and_inference.ipynb")


def nbval_run_folder(root: Path, notebook: str) -> Path:
    """Where conftest.py keeps nbval's run of ``notebook`` (``drive-runs/``, ``content/``); its record beside it."""
    return root / f"nbval-{Path(notebook).stem}"


def cell_text(outputs: list, label: str) -> str:
    """One cell's stream outputs and ``text/plain`` results joined, an error as ``[label] ename: evalue``."""
    parts = []
    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream":
            parts.append(out.get("text", ""))
        elif kind in ("execute_result", "display_data"):
            parts.append(str(out.get("data", {}).get("text/plain", "")) + "\n")
        elif kind == "error":
            parts.append(f"[{label}] {out.get('ename')}: {out.get('evalue')}\n")
    return "".join(parts)


def nbval_run(notebook: str, tmp_path_factory: pytest.TempPathFactory, timeout: float = 3600.0) -> dict:
    """Wait for conftest.py's record of this session's nbval run of ``notebook`` (on either worker), and return it.

    The record: ``drive``, ``content`` (the kernel's Drive and working folder), ``text`` (every cell's output
    joined), ``probe`` (what the kernel saw, from the last cell), ``ran`` and ``items`` (the cells run, the cells
    collected), ``failed`` (cells that failed). Call it only when this session runs that notebook whole."""
    import time

    record = nbval_run_folder(session_root(tmp_path_factory), notebook).with_suffix(".json")
    deadline = time.monotonic() + timeout
    while not record.is_file():
        if time.monotonic() > deadline:
            pytest.fail(f"no record of nbval's run of {notebook} after {timeout:.0f} s ({record}): did its "
                        "worker crash, or does this test run on the worker that holds the notebook after it?",
                        pytrace=False)
        time.sleep(2)
    return json.loads(record.read_text())

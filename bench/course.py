"""Wall time of the course, notebook by notebook, and of the test suite on this machine.

    python bench/course.py [--what course-smoke course-demo test]

Runs the course runner (what `make course` runs) on cpu-smoke and cpu-demo,
each into a fresh run folder with the network cut off from the Hub
(HF_HUB_OFFLINE), and `make test`, and prints one JSON object: the seconds each
took, each notebook's minutes (what the profiles' `minutes` record), the
held-out evaluation of the run, the median GRPO step of notebook 03 (how fast
the machine was in that run), the runs the notebooks left in the run folder's
trackio project, the machine's core count and whether each succeeded. Progress goes to stderr. Not a test: it never gates CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = str(ROOT / ".venv" / "bin" / "python")
JOBS = {
    "course-smoke": ([PY, "tools/course.py", "run", "--profile", "cpu-smoke"], {"HF_HUB_OFFLINE": "1"}),
    "course-demo": ([PY, "tools/course.py", "run", "--profile", "cpu-demo"], {"HF_HUB_OFFLINE": "1"}),
    "test": (["make", "test"], {}),
}


def timed(cmd: list[str], env: dict[str, str]) -> dict:
    import tempfile

    run = Path(tempfile.mkdtemp(prefix="bench-course-"))
    if "tools/course.py" in cmd:
        cmd = cmd + ["--run-dir", str(run)]
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, **env), stdout=sys.stderr, stderr=sys.stderr)
    out = {"seconds": round(time.time() - start, 1), "ok": proc.returncode == 0}
    summary = run / "summary.json"
    if summary.is_file():
        data = json.loads(summary.read_text())
        out["minutes"] = {k: round(v / 60, 1) for k, v in data["notebooks"].items()}
        out["eval"] = (data.get("eval") or {}).get("sides")
    metrics = run / "metrics.jsonl"  # notebook 03's GRPO steps: how fast the machine was in this run
    logs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.is_file() else []
    if steps := [r["step_time"] for r in logs if r.get("step_time")]:
        out["median_step_seconds"] = round(statistics.median_high(steps), 1)
    if (run / "trackio").is_dir():  # the notebooks' runs, tracked in the run folder (helpers.tracking)
        out["trackio_runs"] = trackio_runs(run / "trackio")
    return out


def trackio_runs(folder: Path, project: str = "grpo-course") -> list[str]:
    """The run names of a trackio folder's project, read by trackio itself in a fresh Python (it reads TRACKIO_DIR
    once, at import)."""
    code = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage; "
            "print(json.dumps(SQLiteStorage.get_runs(sys.argv[1])))")
    proc = subprocess.run([PY, "-c", code, project], capture_output=True, text=True,
                          env=dict(os.environ, TRACKIO_DIR=str(folder)))
    return json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 and proc.stdout.strip() else []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--what", nargs="*", default=list(JOBS), choices=list(JOBS))
    args = ap.parse_args()
    subprocess.run(["make", "setup"], cwd=ROOT, stdout=sys.stderr, check=True)
    result = {"cpus": os.cpu_count(), "loadavg_before": os.getloadavg()[0]}
    for name in args.what:
        print(f"bench/course: {name}", file=sys.stderr)
        cmd, env = JOBS[name]
        result[name] = timed(cmd, env)
    from archive import stamped  # bench/archive.py: the command, commit, date and machine
    print(json.dumps(stamped(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

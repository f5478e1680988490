"""Wall time of the course and of the test suite on this machine.

    python bench/course.py [--what course-smoke course-demo test]

Runs `make course` with COURSE_PROFILE=cpu-smoke and cpu-demo (each into a
fresh run folder) and `make test`, and prints one JSON object with the seconds
each took, the machine's core count and whether each succeeded. Progress goes
to stderr. Not a test: it never gates CI.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOBS = {
    "course-smoke": (["make", "course"], {"COURSE_PROFILE": "cpu-smoke"}),
    "course-demo": (["make", "course"], {"COURSE_PROFILE": "cpu-demo"}),
    "test": (["make", "test"], {}),
}


def timed(cmd: list[str], env: dict[str, str]) -> dict:
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, **env), stdout=sys.stderr,
                          stderr=sys.stderr)
    return {"seconds": round(time.time() - start, 1), "ok": proc.returncode == 0}


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
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

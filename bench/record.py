"""The machine record a measurement is stored with: the CPU's name, its cores, the load, the date, the commit.

    python bench/record.py     # this machine's record now, one JSON object

One place for what ``bench/serve.py``, ``bench/judge.py``, ``bench/t4_memory.py``, ``bench/readiness.py`` and
``tests/fixtures/group_diversity_run.py`` record beside their numbers; each keeps its own JSON fields and takes
the values from here. Imported as ``bench.record`` (the project's root on ``sys.path``).

>>> from bench.record import machine
>>> sorted(machine(threads=2))
['cpu', 'cpus', 'threads']
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s first ``model name``), else what ``platform`` knows."""
    info = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in (info.read_text().splitlines() if info.is_file() else [])
             if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


def load() -> float:
    """The 1-minute load average, to 2 decimals (what else ran beside the measurement)."""
    return round(os.getloadavg()[0], 2)


def commit(short: bool = True) -> str:
    """The checkout's commit (``git rev-parse``), ``""`` outside a git checkout."""
    cmd = ["git", "rev-parse", *(["--short"] if short else []), "HEAD"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True).stdout.strip()


def stamp(fmt: str = "%Y-%m-%d", utc: bool = False) -> str:
    """The date (and time, with ``fmt``) now, local or UTC."""
    return time.strftime(fmt, time.gmtime() if utc else time.localtime())


def machine(**extra: Any) -> dict[str, Any]:
    """``{"cpu": <model name>, "cpus": <cores>, **extra}``: the ``machine`` field of a measurement."""
    return {"cpu": cpu_name(), "cpus": os.cpu_count(), **extra}


if __name__ == "__main__":
    print(json.dumps({"commit": commit(), "date": stamp("%Y-%m-%dT%H:%M:%SZ", utc=True),
                      "machine": machine(loadavg_1min=load())}))

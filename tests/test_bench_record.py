"""bench/record.py: the machine record (CPU, cores, load, date, commit) measurements are stored with, in one place."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from bench import record

ROOT = Path(__file__).resolve().parents[1]
#: Each wrote its own copy of the CPU's name, the commit and the date before bench/record.py (issue 55, item 3).
USERS = ["bench/serve.py", "bench/judge.py", "bench/t4_memory.py", "bench/readiness.py",
         "tests/fixtures/group_diversity_run.py"]


def test_the_record_is_this_machine_and_this_checkout():
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()  # noqa: E731
    assert record.commit() == git("rev-parse", "--short", "HEAD") != ""
    assert record.commit(short=False) == git("rev-parse", "HEAD") and record.commit(short=False).startswith(
        record.commit())
    name = record.cpu_name()
    assert name and name == name.strip()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        assert name == (names[0] if names else name)
    assert record.machine(threads=3) == {"cpu": name, "cpus": os.cpu_count(), "threads": 3}
    assert list(record.machine(b=1, a=2)) == ["cpu", "cpus", "b", "a"]  # the order a JSON file shows
    load = record.load()
    assert isinstance(load, float) and load >= 0 and load == round(load, 2)


def test_the_dates_are_the_formats_the_files_hold():
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", record.stamp())
    utc = record.stamp("%Y-%m-%dT%H:%M:%SZ", utc=True)
    assert abs(time.mktime(time.strptime(utc, "%Y-%m-%dT%H:%M:%SZ")) - time.mktime(time.gmtime())) < 120
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}", record.stamp("%Y-%m-%dT%H:%M:%S%z"))


def test_the_script_prints_one_json_object():
    out = subprocess.run([sys.executable, "bench/record.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    assert set(data) == {"commit", "date", "machine"} and data["machine"]["cpu"] == record.cpu_name()


def test_no_measurement_keeps_its_own_copy():
    for name in USERS:
        text = (ROOT / name).read_text()
        tree = ast.parse(text)
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert not defined & {"cpu_name", "commit"}, f"{name} defines its own {defined & {'cpu_name', 'commit'}}"
        assert "model name" not in text and '"rev-parse"' not in text, f"{name} reads the CPU or commit itself"
        assert "bench.record" in text, f"{name} does not take its record from bench/record.py"

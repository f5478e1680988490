"""Ask pip whether the pinned GPU stack installs on Colab, without installing it.

    python tools/check_gpu_pins.py [--report out.json]

Colab runs Python 3.12 on Linux x86_64. pip resolves the shared pins plus the
"gpu" and "vllm" extras for that platform (``--dry-run``, binary wheels only)
and prints one JSON object: whether it resolved, in how many seconds, and the
versions it chose for the libraries that matter. Exit status 1 when it does
not resolve or when pip picks another version than a pin.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLATFORMS = ["manylinux2014_x86_64"] + [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)]
WATCH = ["torch", "transformers", "trl", "peft", "datasets", "accelerate", "bitsandbytes",
         "unsloth", "unsloth-zoo", "vllm", "xformers", "triton"]


def gpu_requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [r for r in project["dependencies"] if "==" in r] + extras["gpu"] + extras["vllm"]


def resolve(requirements: list[str], python: str = "3.12") -> dict:
    with tempfile.TemporaryDirectory() as target, tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
               "--only-binary=:all:", "--python-version", python, "--target", target,
               "--disable-pip-version-check", "--quiet", "--report", str(report)]
        for plat in PLATFORMS:
            cmd += ["--platform", plat]
        start = time.time()
        proc = subprocess.run(cmd + requirements, capture_output=True, text=True)
        seconds = round(time.time() - start, 1)
        if proc.returncode != 0:
            return {"resolved": False, "seconds": seconds, "error": proc.stderr.strip()[-2000:]}
        chosen = {
            re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower(): item["metadata"]["version"]
            for item in json.loads(report.read_text())["install"]
        }
    return {"resolved": True, "seconds": seconds, "versions": {k: chosen.get(k) for k in WATCH}}


def main() -> int:
    reqs = gpu_requirements()
    result = resolve(reqs)
    result["python"] = "3.12"
    result["requirements"] = reqs
    if result["resolved"]:
        mismatched = {}
        for req in reqs:
            name, _, version = req.partition("==")
            key = re.sub(r"[-_.]+", "-", name).lower()
            got = result["versions"].get(key)
            if key in result["versions"] and got != version:
                mismatched[key] = got
        result["mismatched"] = mismatched
    if "--report" in sys.argv:
        Path(sys.argv[sys.argv.index("--report") + 1]).write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0 if result["resolved"] and not result.get("mismatched") else 1


if __name__ == "__main__":
    raise SystemExit(main())

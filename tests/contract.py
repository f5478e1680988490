"""Shared code of the contract tests: run the probe in the contract environment."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile
from pathlib import Path

PROBE = Path(__file__).with_name("contract_probe.py")
ROOT = Path(__file__).resolve().parents[1]


def contract_python() -> str:
    """The python of the environment where Unsloth is installed (see `make contract-env`)."""
    env = os.environ.get("COURSE_CONTRACT_PYTHON", "").strip()
    if env:
        return env
    default = ROOT / ".cache" / "contract-venv" / "bin" / "python"
    if default.exists():
        return str(default)
    raise RuntimeError(
        "No contract environment: run `make contract-env` (or `make test`), or set "
        "COURSE_CONTRACT_PYTHON to a python that has Unsloth installed."
    )


@functools.lru_cache(maxsize=None)
def signatures(*targets: str) -> dict:
    """``{target: {"params": [...], "var_kw": bool}}`` from the real installed packages."""
    env = dict(os.environ, UNSLOTH_ALLOW_CPU="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [contract_python(), str(PROBE), *targets],
        capture_output=True, text=True, env=env, timeout=600,
        cwd=tempfile.mkdtemp(prefix="contract-"),  # Unsloth writes unsloth_compiled_cache/ here
    )
    line = next((l for l in proc.stdout.splitlines() if l.startswith("CONTRACT-JSON ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"contract probe failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(line[len("CONTRACT-JSON "):])


def assert_accepts(target: str, kwargs: dict, info: dict) -> None:
    """Every keyword must be a named parameter (not swallowed by ``**kwargs``)."""
    params = set(info["targets"][target]["params"])
    unknown = sorted(set(kwargs) - params)
    assert not unknown, (
        f"{target} (unsloth {info['versions']['unsloth']}, trl {info['versions']['trl']}) "
        f"has no parameter(s) {unknown}; they would be ignored or raise on a GPU."
    )


UNSLOTH_CPU = Path(__file__).with_name("unsloth_cpu.py")


def run_unsloth_cases(folder: Path) -> dict:
    """``tests/unsloth_cpu.py`` in the contract environment, every case in one process: ``{case: what it reported}``."""
    env = dict(os.environ, UNSLOTH_ALLOW_CPU="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT),
               PYTHONWARNINGS="ignore",
               UNSLOTH_COMPILE_DISABLE="1")  # Unsloth's compiled backward recompiles every step on a CPU
    proc = subprocess.run([contract_python(), str(UNSLOTH_CPU), str(folder)], capture_output=True, text=True,
                          env=env, timeout=1800, cwd=folder)  # Unsloth writes unsloth_compiled_cache/ into the cwd
    cases = {}
    for line in proc.stdout.splitlines():
        if line.startswith("UNSLOTH-CPU-JSON "):
            out = json.loads(line[len("UNSLOTH-CPU-JSON "):])
            cases[out["case"]] = out
    assert proc.returncode == 0 and cases, (
        f"Unsloth's trainer did not run ({proc.returncode}). If Unsloth moved "
        f"`unsloth.models.rl._patch_trl_rl_trainers_impl`, update tests/unsloth_cpu.py.\n{proc.stderr[-4000:]}")
    return {"cases": cases, "stderr_tail": proc.stderr[-4000:]}


def unsloth_case(name: str, tmp_path_factory) -> dict:
    """What case ``name`` of ``tests/unsloth_cpu.py`` reported; the process runs once per test session (all cases)."""
    from .shared import once

    out = once("unsloth-cpu", tmp_path_factory, run_unsloth_cases)
    case = out["cases"].get(name)
    assert case is not None, f"tests/unsloth_cpu.py reported no case {name!r}:\n{out['stderr_tail']}"
    assert "crash" not in case, f"case {name!r} of tests/unsloth_cpu.py crashed:\n{case['crash']}"
    return case

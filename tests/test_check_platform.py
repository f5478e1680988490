"""`make setup` refuses a platform or Python the pinned wheels do not cover, at once, saying what to do
(tools/check_platform.py; issue 50, item 5)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from tools.check_platform import CPU_INDEX, MAX_PYTHON, MIN_PYTHON, main, notes, problems

ROOT = Path(__file__).resolve().parents[1]
GLIBC = ("glibc", "2.35")


@pytest.mark.parametrize("system, machine, python, mac, libc", [
    ("Linux", "x86_64", (3, 11), "", GLIBC),
    ("Linux", "aarch64", (3, 10), "", ("glibc", "2.28")),
    ("Linux", "x86_64", (3, 14), "", GLIBC),
    ("Darwin", "arm64", (3, 12), "14.0", ("", "")),
    ("Darwin", "arm64", (3, 13), "15.3.1", ("", "")),
])
def test_the_platforms_with_wheels_pass(system, machine, python, mac, libc):
    assert problems(system, machine, python, mac, libc) == []


@pytest.mark.parametrize("system, machine, python, mac, libc, says", [
    ("Darwin", "arm64", (3, 9), "14.5", ("", ""), ["Python 3.9 is too old", "PYTHON=python3.12 make setup"]),
    ("Linux", "x86_64", (3, 15), "", GLIBC, ["Python 3.15 is too new", "3.10 to 3.14"]),
    ("Windows", "AMD64", (3, 12), "", ("", ""), ["Native Windows", "WSL2", "wsl --install", "Colab"]),
    ("MINGW64_NT-10.0-22631", "x86_64", (3, 12), "", ("", ""), ["Native Windows", "WSL2"]),
    ("CYGWIN_NT-10.0", "x86_64", (3, 12), "", ("", ""), ["Native Windows", "WSL2"]),
    ("Darwin", "x86_64", (3, 12), "14.5", ("", ""), ["Intel Mac", "Rosetta", "arm64 Python", "Colab"]),
    ("Darwin", "arm64", (3, 12), "13.6.1", ("", ""), ["macOS 13.6.1", "macOS 14", "Update macOS", "Colab"]),
    ("Linux", "armv7l", (3, 11), "", GLIBC, ["x86_64 and aarch64 only"]),
    ("Linux", "x86_64", (3, 11), "", ("glibc", "2.27"), ["glibc 2.27", "2.28"]),
    ("Linux", "x86_64", (3, 11), "", ("", ""), ["musl", "glibc distribution"]),
    ("FreeBSD", "amd64", (3, 11), "", ("", ""), ["FreeBSD is not supported", "WSL2"]),
])
def test_an_unsupported_platform_is_refused_with_what_to_do(system, machine, python, mac, libc, says):
    found = " ".join(problems(system, machine, python, mac, libc))
    for words in says:
        assert words in found, f"{system} {machine} {python}: {words!r} missing from {found!r}"


def test_an_old_python_on_an_old_mac_hears_both():
    assert len(problems("Darwin", "arm64", (3, 9), "13.0")) == 2


def test_the_python_range_starts_at_pyprojects_requires_python():
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=" + ".".join(map(str, MIN_PYTHON))
    assert problems("Linux", "x86_64", MAX_PYTHON, "", GLIBC) == []


def test_linux_without_nvidia_is_told_about_the_cpu_build():
    said = notes("Linux", None, {})
    assert len(said) == 1 and f"PIP_EXTRA_INDEX_URL={CPU_INDEX} make setup" in said[0]
    assert notes("Linux", "/usr/bin/nvidia-smi", {}) == []
    assert notes("Linux", None, {"PIP_EXTRA_INDEX_URL": CPU_INDEX}) == []
    assert notes("Darwin", None, {}) == []


def test_this_machine_passes(capsys):
    assert main() == 0  # the project's own machine: Linux x86_64, Python 3.11
    assert "cannot install" not in capsys.readouterr().err


def _stand_in(folder: Path) -> Path:
    """A `python3` that reports 3.9.6 (macOS's usual one): the real interpreter, its version replaced."""
    script = folder / "python3.9"
    script.write_text(
        "#!/bin/sh\n"
        '[ "$1" = "--version" ] && { echo "Python 3.9.6"; exit 0; }\n'
        f'exec "{sys.executable}" -c \'import runpy, sys; sys.version_info = (3, 9, 6, "final", 0); '
        'sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name="__main__")\' "$@"\n')
    script.chmod(0o755)
    return script


def test_make_setup_with_an_old_python_fails_at_once_and_makes_no_venv(tmp_path):
    for name in ("Makefile", "pyproject.toml", "tools/check_platform.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    old = _stand_in(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}  # not the outer `make test`'s flags
    start = time.time()
    proc = subprocess.run(["make", "setup", f"PYTHON={old}"], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode != 0
    assert time.time() - start < 30, "the refusal must come before anything is installed"
    assert "Python 3.9 is too old" in proc.stderr and "PYTHON=python3.12 make setup" in proc.stderr, proc.stderr
    assert not (tmp_path / ".venv").exists()
    missing = subprocess.run(["make", "setup", "PYTHON=no-such-python3"], cwd=tmp_path, capture_output=True,
                             text=True, env=env, timeout=120)
    assert missing.returncode != 0 and re.search(r"no 'no-such-python3' here.*PYTHON=python3\.12", missing.stderr)

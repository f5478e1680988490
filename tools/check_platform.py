"""Can this machine install the course's pinned CPU stack? `make setup` asks before it makes ``.venv``.

    python3 tools/check_platform.py    # exit 0: go on (perhaps with a note); exit 1: says what to do instead

The standard library only, in syntax any Python 3.6+ parses: it runs under whatever interpreter
``make setup`` was given (``PYTHON=python3.12 make setup``), old ones included, so that it can refuse them.

What it accepts follows the wheels PyPI holds for the pinned torch 2.13.0 and bitsandbytes 0.50.2, as
pip answered on 2026-12-02 (``pip install --dry-run --no-deps --only-binary=:all: --platform P
--python-version V``; neither package has a source distribution to fall back on):

* torch 2.13.0: CPython 3.10 to 3.14 on ``manylinux_2_28`` x86_64 and aarch64 (glibc 2.28 or newer),
  ``macosx_14_0_arm64`` and ``win_amd64``; nothing for macOS on Intel, macOS below 14, Windows on Arm,
  musl Linux, other Linux CPUs, or Python 3.9 and 3.15;
* bitsandbytes 0.50.2 (Python 3.10+): ``manylinux_2_24`` x86_64 and aarch64, ``macosx_14_0_arm64``,
  ``win_amd64`` and ``win_arm64``.

Native Windows has the wheels but not the Makefile (bash, ``.venv/bin/python``): WSL2 runs it as Linux.

Example:
    >>> problems("Darwin", "arm64", (3, 12), mac_release="13.6.1")[0][:30]
    'macOS 13.6.1: torch 2.13.0 and'
    >>> problems("Linux", "x86_64", (3, 11), libc=("glibc", "2.35"))
    []
"""

import os
import platform
import shutil
import sys
from typing import List, Optional, Sequence, Tuple

MIN_PYTHON = (3, 10)  #: pyproject's requires-python, and the oldest Python torch 2.13.0 has wheels for
MAX_PYTHON = (3, 14)  #: the newest Python torch 2.13.0 has wheels for
MIN_MACOS = (14, 0)  #: torch's and bitsandbytes' only macOS wheels: macosx_14_0_arm64
MIN_GLIBC = (2, 28)  #: torch's Linux wheels: manylinux_2_28
LINUX_CPUS = ("x86_64", "amd64", "aarch64", "arm64")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
WAY_ROUND = ("Or run the notebooks on Colab instead: a CPU runtime is enough for the laptop profile, cpu-demo "
             "(see the README).")


def _version(text: str) -> Tuple[int, ...]:
    """``"13.6.1"`` -> ``(13, 6, 1)``; the leading numeric parts only (``""`` -> ``()``)."""
    out = []
    for part in text.split("."):
        digits = "".join(c for c in part if c.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def _show(version: Sequence[int]) -> str:
    return ".".join(str(v) for v in version)


def problems(system: str, machine: str, python: Sequence[int], mac_release: str = "",
             libc: Tuple[str, str] = ("", "")) -> List[str]:
    """Why the pinned stack cannot install here, each with what to do instead (``[]``: it can).

    ``system`` and ``machine`` as :mod:`platform` names them, ``python`` as ``sys.version_info[:2]``,
    ``mac_release`` as ``platform.mac_ver()[0]``, ``libc`` as ``platform.libc_ver()``."""
    out = []
    py = tuple(python[:2])
    better = "python3.12"
    if py < MIN_PYTHON or py > MAX_PYTHON:
        why = "too old" if py < MIN_PYTHON else "too new for the pinned torch 2.13.0 (no wheel yet)"
        out.append("Python {} is {}: the course needs Python {} to {} (tested on 3.11). Install one (python.org, "
                   "Homebrew's `brew install python@3.12`, or your system's package manager), then run "
                   "`PYTHON={} make setup`.".format(_show(py), why, _show(MIN_PYTHON), _show(MAX_PYTHON), better))
    lowered = system.lower()
    if lowered == "windows" or lowered.startswith(("cygwin", "msys", "mingw")):
        out.append("Native Windows is not supported: the Makefile needs bash and a Linux-style virtual "
                   "environment. Use WSL2: run `wsl --install` in PowerShell, restart, open Ubuntu, and clone "
                   "and `make setup` there. " + WAY_ROUND)
    elif system == "Darwin":
        if machine != "arm64":
            out.append("macOS on {}: PyPI has no macOS wheel of torch 2.13.0 or bitsandbytes 0.50.2 but for "
                       "Apple silicon (arm64) with macOS 14 or newer, so an Intel Mac cannot install the course. "
                       "On an Apple-silicon Mac this Python runs under Rosetta: install an arm64 Python "
                       "(python.org's installer, or Homebrew in /opt/homebrew) and run `PYTHON=python3.12 make "
                       "setup`. {}".format(machine, WAY_ROUND))
        elif _version(mac_release) < MIN_MACOS:
            out.append("macOS {}: torch 2.13.0 and bitsandbytes 0.50.2 ship macOS wheels for macOS 14 (Sonoma) "
                       "or newer only. Update macOS (Apple menu > System Settings > General > Software Update). "
                       "{}".format(mac_release or "(version unknown)", WAY_ROUND))
    elif system == "Linux":
        if machine.lower() not in LINUX_CPUS:
            out.append("Linux on {}: torch 2.13.0 ships Linux wheels for x86_64 and aarch64 only. {}".format(
                machine, WAY_ROUND))
        elif libc[0] == "glibc" and _version(libc[1]) < MIN_GLIBC:
            out.append("glibc {}: torch 2.13.0's Linux wheels need glibc {} or newer (manylinux_2_28: Ubuntu "
                       "20.04, Debian 11, RHEL 8 and later). Use a newer distribution or a container of one. "
                       "{}".format(libc[1], _show(MIN_GLIBC), WAY_ROUND))
        elif libc[0] != "glibc":
            out.append("This Linux has no glibc (musl, e.g. Alpine?): torch 2.13.0 ships no musllinux wheel. Use a "
                       "glibc distribution (Debian, Ubuntu, Fedora) or a container of one. " + WAY_ROUND)
    else:
        out.append("{} is not supported: the course installs on Linux (x86_64 or aarch64), macOS 14+ on Apple "
                   "silicon, or Windows through WSL2. {}".format(system or "This system", WAY_ROUND))
    return out


def notes(system: str, nvidia_smi: Optional[str], environ: dict) -> List[str]:
    """Advice that does not stop the install: Linux without an NVIDIA GPU and without the CPU-only torch index."""
    indexes = " ".join(environ.get(k, "") for k in ("PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL"))
    if system != "Linux" or nvidia_smi or "download.pytorch.org" in indexes:
        return []
    return ["No NVIDIA GPU found (no nvidia-smi): on Linux, PyPI's torch 2.13.0 brings CUDA's libraries "
            "(cuda-toolkit, nvidia-cudnn-cu13, nvidia-nccl-cu13, ...: its Requires-Dist), a large download a CPU "
            "never uses. For torch's small CPU build, stop this (Ctrl-C) and run:\n"
            "    rm -rf .venv; PIP_EXTRA_INDEX_URL={} make setup".format(CPU_INDEX)]


def main() -> int:
    found = problems(platform.system(), platform.machine(), sys.version_info[:2], platform.mac_ver()[0],
                     platform.libc_ver())
    for message in found:
        print("setup: cannot install here. " + message, file=sys.stderr)
    if found:
        return 1
    for message in notes(platform.system(), shutil.which("nvidia-smi"), dict(os.environ)):
        print("setup: note. " + message, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

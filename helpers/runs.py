"""Run folders: one self-describing folder per course run.

Notebook 01 writes ``dataset/`` into it, 03 writes ``adapter/``, logs,
completions and figures, 04 reads them and writes ``eval.json`` and
``merged/``. ``COURSE_RUN_DIR`` names the folder (``make course`` sets it);
otherwise notebooks share ``runs/lab-<profile>``.

Example:
    >>> from helpers.runs import run_dir
    >>> d = run_dir(profile_name="cpu-smoke")       # doctest: +SKIP
    >>> d.name                                      # doctest: +SKIP
    'lab-cpu-smoke'
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from .config import Profile, runs_root
from .versions import installed_versions



def run_dir(profile_name: str | None = None, create: bool = True) -> Path:
    """The current run folder: ``COURSE_RUN_DIR``, else ``runs/lab-<profile>``."""
    env = os.environ.get("COURSE_RUN_DIR", "").strip()
    if env:
        path = Path(env).expanduser()
    else:
        if profile_name is None:
            from .config import detect_profile

            profile_name = detect_profile()[0]
        path = runs_root() / f"lab-{profile_name}"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def write_json(path: Path, data: Any) -> Path:
    """Write JSON atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return path


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def record_run_info(run: Path, profile: Profile, **extra: Any) -> Path:
    """Write ``run.json`` (profile, model, versions, machine) into a run folder.

    Keeps earlier keys, so every notebook can add what it knows.
    """
    path = Path(run) / "run.json"
    info: dict[str, Any] = read_json(path) if path.is_file() else {}
    info.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%S"))
    info.update(
        profile=profile.to_dict(),
        versions=installed_versions(),
        machine={"python": platform.python_version(), "platform": platform.platform(),
                 "cpus": os.cpu_count()},
    )
    info.update(extra)
    return write_json(path, info)

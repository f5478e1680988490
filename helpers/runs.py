"""Where things live (checkout, cache, run folders, data files), and atomic writes a killed process cannot half-do.

Serves every notebook (00-08): the run folder each writes into.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .machine import on_colab, on_kaggle
from .profiles import REPO_REF, REPO_URL, detect_profile

DRIVE_RUNS = Path("/content/drive/MyDrive/grpo-course/runs")
DRIVE_MOUNT = DRIVE_RUNS.parents[2]  #: where use_persistent_runs mounts Google Drive on Colab
DRIVE_QUOTA = "your Google Drive quota, shared with Gmail and Google Photos (15 GB on a free account)"
KAGGLE_RUNS = Path("/kaggle/working/runs")


def project_root() -> Path | None:
    """The course checkout this package was installed from (editable install), or None."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() and (root / "notebooks").is_dir() else None


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name, "").strip()
    return Path(value).expanduser() if value else None


def cache_dir() -> Path:
    """Where the bundled model is built: ``COURSE_CACHE`` or the user's cache folder."""
    from platformdirs import user_cache_dir
    return _env_path("COURSE_CACHE") or Path(user_cache_dir("grpo-course"))


def runs_root() -> Path:
    """Where run folders live: ``COURSE_RUNS``, else ``runs/`` in the checkout (or the working folder)."""
    return _env_path("COURSE_RUNS") or (project_root() or Path.cwd()) / "runs"


def run_dir(profile_name: str | None = None) -> Path:
    """The current run folder, created: ``COURSE_RUN_DIR``, else ``runs/lab-<profile>``.

    It also holds the runs' trackio project: trackio, imported later, writes to ``RUN/trackio``
    (:func:`helpers.tracking.point_trackio`; a ``TRACKIO_DIR`` of your own wins)."""
    from .tracking import point_trackio
    path = _env_path("COURSE_RUN_DIR") or runs_root() / f"lab-{profile_name or detect_profile()[0]}"
    path.mkdir(parents=True, exist_ok=True)
    point_trackio(path)
    return path


def use_persistent_runs(keep: bool = True) -> Path | None:
    """On Colab (Drive) or Kaggle, set ``COURSE_RUNS`` to a folder a disconnect cannot lose, and return it."""
    if not keep or _env_path("COURSE_RUNS"):
        return None
    if on_colab():
        try:
            from google.colab import drive  # type: ignore[import-not-found]
            drive.mount(str(DRIVE_RUNS.parents[2]))
        except Exception as exc:  # noqa: BLE001 - declined, or no Drive: the run stays in /content
            print(f"Google Drive not mounted ({exc}): run folders stay in /content and are lost at a "
                  "disconnect. Run this cell again to allow it, or set KEEP_RUNS = False to stop asking.")
            return None
        folder = DRIVE_RUNS
    elif on_kaggle():
        folder = KAGGLE_RUNS
    else:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["COURSE_RUNS"] = str(folder)
    print(f"Run folders are kept in {folder} (COURSE_RUNS): the next notebook, or this one after a "
          "disconnect, finds them there.")
    return folder


def data_file(name: str) -> Path:
    """A file of the course's ``data/`` folder: from the checkout, or fetched once into the cache (a bare install)."""
    root = project_root()
    if root is not None and (root / "data" / name).is_file():
        return root / "data" / name
    cached = cache_dir() / "data" / name
    if not cached.is_file():
        url = REPO_URL.replace("github.com", "raw.githubusercontent.com") + f"/{REPO_REF}/data/{name}"
        try:
            with urllib.request.urlopen(url, timeout=20) as resp:
                write_bytes(cached, resp.read())
        except Exception as exc:  # noqa: BLE001 - any failure gets the same advice
            raise FileNotFoundError(
                f"The course data file {name!r} is not in a checkout and could not be fetched from {url} ({exc}). "
                f"Clone the course repository and `pip install -e .` from it, or put the file at {cached}.") from exc
    return cached


def write_bytes(path: str | Path, payload: bytes) -> Path:
    """Write a file atomically (a temporary file beside it, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(payload)
    os.replace(tmp, path)
    return path


def write_json(path: str | Path, data: Any, lines: bool = False) -> Path:
    """Write JSON atomically; ``lines``: each item of ``data`` on a line of its own (JSON Lines)."""
    rows = [json.dumps(r, default=str) for r in data] if lines else [json.dumps(data, indent=2, default=str)]
    return write_bytes(path, "".join(row + "\n" for row in rows).encode())


def read_json(path: str | Path) -> Any:
    """The parsed JSON file."""
    return json.loads(Path(path).read_text())


@contextmanager
def atomic_folder(out_dir: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """A temporary folder beside ``out_dir``, renamed into place when the block succeeds (``overwrite``: replace)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(f"{out_dir} already exists and is not empty, so nothing was written. "
                              "Pass overwrite=True to replace it, or choose another folder.")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}-writing-{os.getpid()}-{time.time_ns()}")
    tmp.mkdir()  # not mkdtemp: its folder is private (0700), this one an ordinary folder
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = out_dir.with_name(f".{out_dir.name}-old-{time.time_ns()}")
    if out_dir.exists():
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    shutil.rmtree(old, ignore_errors=True)


def free_space(folder: str | Path) -> tuple[int, Path, bool]:
    """``(free bytes, the folder measured, on Google Drive)`` for ``folder`` or its nearest existing parent. On the
    Drive mount (``KEEP_RUNS = True`` on Colab) the free space is what is left of the Drive quota, not the VM's disk.

    Example:
        >>> free, where, drive = free_space("/tmp/not/yet")
        >>> where, drive
        (PosixPath('/tmp'), False)"""
    probe = Path(folder).absolute()
    while not probe.exists():
        probe = probe.parent
    return shutil.disk_usage(probe).free, probe, probe.resolve().is_relative_to(DRIVE_MOUNT.resolve())


def describe_free(folder: str | Path) -> str:
    """``free_space`` in words: "12.3 GB free on this machine's disk", or left in the Drive quota."""
    free, _, drive = free_space(folder)
    return f"{free / 1e9:.1f} GB " + (f"left in {DRIVE_QUOTA}" if drive else "free on this machine's disk")


def check_free_disk(folder: str | Path, needed_bytes: int, what: str = "the merged model") -> int:
    """The free bytes at ``folder``; ``OSError`` naming the shortfall (and the Drive quota) when fewer than
    ``needed_bytes``."""
    free, probe, drive = free_space(folder)
    if free < needed_bytes and drive:
        raise OSError(f"Not enough space in {DRIVE_QUOTA} for {what}: it needs about {needed_bytes / 1e9:.2f} GB in "
                      f"{probe}, and {free / 1e9:.2f} GB are left. Delete old run folders or checkpoints "
                      f"(grpo/checkpoint-*) in {DRIVE_RUNS.relative_to(DRIVE_RUNS.parents[2])}, then empty Drive's bin at "
                      "drive.google.com (files there still count); or write it to this machine's disk instead "
                      '(notebook 04: MERGED = Path("/content/merged"); lost at a disconnect, the adapter stays on '
                      "Drive).")
    if free < needed_bytes:
        raise OSError(f"Not enough disk for {what}: it needs about {needed_bytes / 1e9:.2f} GB in {probe}, and "
                      f"{free / 1e9:.2f} GB are free. Delete old runs/ folders or checkpoints, or keep only the "
                      "adapter (a few MB) and merge on a machine with more disk.")
    return free

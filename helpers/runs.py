"""Run folders: one self-describing folder per course run, written safely.

Notebook 01 writes ``dataset/`` into it, 03 writes ``grpo/`` (TRL's
checkpoints and completion logs), ``adapter/``, ``warmup-adapter/`` and
figures, 04 reads them and writes ``eval.json`` and ``merged/``.
``COURSE_RUN_DIR`` names the folder (``make course`` sets it); otherwise the
notebooks share ``runs/lab-<profile>``.

Example:
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()) / "out"
    >>> with atomic_folder(d) as tmp:
    ...     _ = (tmp / "x.txt").write_text("hi")
    >>> (d / "x.txt").read_text()
    'hi'
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .config import Profile, runs_root


def run_dir(profile_name: str | None = None, create: bool = True) -> Path:
    """The current run folder: ``COURSE_RUN_DIR``, else ``runs/lab-<profile>``.

    Example:
        run_dir("cpu-smoke", create=False).name
        # -> 'lab-cpu-smoke'
    """
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


#: Where run folders go when kept on Google Drive (Colab) or in the notebook's output (Kaggle).
DRIVE_RUNS = Path("/content/drive/MyDrive/grpo-course/runs")
KAGGLE_RUNS = Path("/kaggle/working/runs")


def use_persistent_runs(keep: bool = True) -> Path | None:
    """Keep the course's run folders where a disconnect cannot lose them, through ``COURSE_RUNS``.

    Each notebook opened from a Colab badge runs on a fresh machine, and a disconnect recycles it:
    a run folder in ``/content`` is gone, and notebook 04 would not find notebook 03's adapter. With
    ``keep``, on Colab this mounts Google Drive (Colab asks you to allow it: decline, and nothing
    changes) and uses ``MyDrive/grpo-course/runs``; on Kaggle it uses ``/kaggle/working/runs``
    (kept as the notebook's output). Elsewhere, or when ``COURSE_RUNS`` is already set, nothing
    changes. Returns the folder in use, or None.

    Example::

        KEEP_RUNS = True                    # False: never ask, keep runs in /content
        use_persistent_runs(KEEP_RUNS)      # on Colab: Drive asks once; on a laptop: nothing happens
        RUN = run_dir(PROFILE.name)         # then under MyDrive/grpo-course/runs/
    """
    import sys

    if not keep or os.environ.get("COURSE_RUNS", "").strip():
        return None
    if "google.colab" in sys.modules:
        try:
            from google.colab import drive  # type: ignore[import-not-found]

            drive.mount(str(DRIVE_RUNS.parents[2]))
        except Exception as exc:  # noqa: BLE001 - declined, or no Drive: the run stays in /content
            print(f"Google Drive not mounted ({exc}): run folders stay in /content and are lost at a "
                  "disconnect. Run this cell again to allow it, or set KEEP_RUNS = False to stop asking.")
            return None
        folder = DRIVE_RUNS
    elif "KAGGLE_KERNEL_RUN_TYPE" in os.environ:
        folder = KAGGLE_RUNS
    else:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["COURSE_RUNS"] = str(folder)
    print(f"Run folders are kept in {folder} (COURSE_RUNS): the next notebook, or this one after a "
          "disconnect, finds them there.")
    return folder


def write_json(path: str | Path, data: Any) -> Path:
    """Write JSON atomically (a temporary file, then a rename).

    Example:
        >>> import tempfile; p = write_json(Path(tempfile.mkdtemp()) / "a.json", {"x": 1})
        >>> read_json(p)
        {'x': 1}
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return path


def read_json(path: str | Path) -> Any:
    """The parsed JSON file."""
    return json.loads(Path(path).read_text())


@contextmanager
def atomic_folder(out_dir: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside ``out_dir``; rename it into place when the block succeeds.

    An existing non-empty ``out_dir`` is refused unless ``overwrite=True``; on
    any error the temporary folder is removed and ``out_dir`` is untouched, so a
    half-written model or dataset never looks complete.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(
            f"{out_dir} already exists and is not empty, so nothing was written. "
            "Pass overwrite=True to replace it, or choose another folder.")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-writing-", dir=out_dir.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private (0700); the result is an ordinary folder
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}-old-{time.time_ns()}")
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def check_free_disk(folder: str | Path, needed_bytes: int, what: str = "the merged model") -> int:
    """Raise ``OSError`` naming the shortfall unless ``folder``'s disk has ``needed_bytes`` free.

    Returns the free bytes.

    Example:
        >>> check_free_disk(".", 1) > 0
        True
    """
    probe = Path(folder)
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < needed_bytes:
        raise OSError(
            f"Not enough disk for {what}: it needs about {needed_bytes / 1e9:.2f} GB in {probe}, and "
            f"{free / 1e9:.2f} GB are free. Delete old runs/ folders or checkpoints, or keep only the "
            "adapter (a few MB) and merge on a machine with more disk.")
    return free


def record_run_info(run: str | Path, profile: Profile, **extra: Any) -> Path:
    """Add the profile, library versions and machine to ``run.json``, keeping earlier keys.

    Example:
        record_run_info(RUN, PROFILE, training={"adapter": "adapter"})
    """
    from .preflight import installed_versions

    path = Path(run) / "run.json"
    info: dict[str, Any] = read_json(path) if path.is_file() else {}
    info.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%S"))
    info.update(profile=profile.to_dict(), versions=installed_versions(),
                machine={"python": platform.python_version(), "platform": platform.platform(),
                         "cpus": os.cpu_count()})
    info.update(extra)
    return write_json(path, info)

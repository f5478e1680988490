"""Runs tracked in trackio, locally: the project lives in the run folder (``RUN/trackio``), no account, no network
(notebooks 03 and 07).

transformers' ``TrackioCallback`` (``report_to="trackio"``) calls ``trackio.init(project=args.project,
name=args.run_name, space_id=args.trackio_space_id, ...)``; with no Space it writes a SQLite file under trackio's
folder, ``TRACKIO_DIR``, which trackio reads once, when it is imported. So :func:`use_trackio` sets ``TRACKIO_DIR``
before anything imports trackio (``from trl import GRPOTrainer`` does), and says why it is off where it cannot run.

Example:
    >>> run_name_for("arithmetic", "dapo", 3407, "/tmp/run/grpo")
    'arithmetic-dapo-seed3407'
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROJECT = "grpo-course"  #: the trackio project every course run logs to (one SQLite file in RUN/trackio)
TRACKIO_SUBDIR = "trackio"
OFF_ENV = "COURSE_TRACKIO"  #: set to 0 to turn tracking off
MARK = "_COURSE_TRACKIO_DIR"  #: the TRACKIO_DIR the course set (a learner's own TRACKIO_DIR differs from it)


@dataclass(frozen=True)
class Tracking:
    """Where this process's trackio logs go, or why it is off: ``report_to`` is what ``GRPOConfig`` gets."""

    on: bool
    folder: Path | None
    reason: str

    @property
    def report_to(self) -> str:
        return "trackio" if self.on else "none"

    def __str__(self) -> str:
        return (f"trackio: project {PROJECT!r} in {self.folder} ({self.reason})" if self.on
                else f"trackio: off ({self.reason}); training runs the same, without it")


def trackio_dir(run: str | Path) -> Path:
    """The folder of a run's trackio project."""
    return Path(run) / TRACKIO_SUBDIR


def _imported_dir() -> Path | None:
    utils = sys.modules.get("trackio.utils")
    return Path(utils.TRACKIO_DIR) if utils is not None else None


def _belongs(folder: Path, run: Path) -> bool:
    """Whether ``folder`` is the trackio folder of ``run`` or of a run folder holding it (notebook 05's sub-run)."""
    folder = folder.resolve()
    return folder.name == TRACKIO_SUBDIR and folder.parent in (run, *run.parents)


def point_trackio(run: str | Path) -> Path | None:
    """Set ``TRACKIO_DIR`` to ``RUN/trackio`` for the trackio this process imports later; the folder, or None.

    Nothing changes where the learner set ``TRACKIO_DIR`` (their folder wins) or trackio is already imported (its
    folder is fixed). Called by :func:`helpers.runs.run_dir`, so a notebook's runs, its sub-runs' too (notebook
    05's ``RUN/json-task``), share one project in the notebook's run folder."""
    own = os.environ.get(MARK)
    if _imported_dir() is not None or (os.environ.get("TRACKIO_DIR") and os.environ["TRACKIO_DIR"] != own):
        return None
    folder = trackio_dir(run).resolve()
    os.environ["TRACKIO_DIR"] = os.environ[MARK] = str(folder)
    return folder


def use_trackio(run: str | Path) -> Tracking:
    """Where this run's trackio logs go (``RUN/trackio``, or the enclosing run folder's), or why tracking is off.

    Off, with the reason, when ``COURSE_TRACKIO=0``, trackio is not installed or fails to import, or its folder
    cannot be written. Where trackio was imported before the run folder was chosen, its folder cannot move: the
    runs log where it is, and the reason says where."""
    if os.environ.get(OFF_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return Tracking(False, None, f"{OFF_ENV}={os.environ[OFF_ENV]} turns it off")
    if importlib.util.find_spec("trackio") is None:
        return Tracking(False, None, "trackio is not installed: `pip install trackio==0.43.0` (the course pins it), "
                                     "then restart the kernel")
    run = Path(run).resolve()
    own = os.environ.get(MARK)
    if (imported := _imported_dir()) is not None:
        folder = imported
        reason = ("the run folder's" if _belongs(imported, run) else
                  "trackio was imported before this run folder was chosen, so it keeps its folder")
    elif os.environ.get("TRACKIO_DIR") and os.environ["TRACKIO_DIR"] != own:
        folder, reason = Path(os.environ["TRACKIO_DIR"]), "TRACKIO_DIR is set"
    elif own and _belongs(Path(own), run):
        folder, reason = Path(own), "the run folder's"
    else:
        folder, reason = point_trackio(run) or trackio_dir(run), "the run folder's"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        return Tracking(False, folder, f"its folder {folder} cannot be written: {exc}")
    try:
        import sqlite3  # noqa: F401  (trackio's local store)
        import trackio  # noqa: F401
        import trackio.utils  # noqa: F401  (where trackio keeps its folder: read by _imported_dir)
    except Exception as exc:  # noqa: BLE001 - any import failure turns tracking off, with the reason
        return Tracking(False, folder, f"`import trackio` failed ({type(exc).__name__}: {exc})")
    return Tracking(True, folder, reason)


def run_name_for(task: str, loss_type: str, seed: int, output_dir: str | Path) -> str:
    """A run's name in trackio: task, loss and seed, and the output folder's parent when it is not ``grpo/``."""
    out = Path(output_dir)
    where = "" if out.name == "grpo" else f"-{out.name}"
    return f"{task}-{loss_type}-seed{seed}{where}"


def tracking_kwargs(run: str | Path, task: str, loss_type: str, seed: int, output_dir: str | Path) -> dict[str, Any]:
    """``GRPOConfig`` / ``SFTConfig`` keywords: ``report_to`` (trackio where it runs), ``project``, ``run_name``.

    ``trackio_static_space_id=False``: no Space is ever created or frozen (transformers' ``TrackioCallback``
    would otherwise offer one when pushing to the Hub)."""
    tracking = use_trackio(run)
    return dict(report_to=tracking.report_to, project=PROJECT, run_name=run_name_for(task, loss_type, seed, output_dir),
                trackio_static_space_id=False)


def show_privately(dashboard: Any, project: str = PROJECT) -> None:
    """On Colab, show ``trackio.show(..., share=False)``'s dashboard through Colab's own port proxy; elsewhere its
    frame (127.0.0.1) already works. ``dashboard``: what ``trackio.show`` returned (server, url, share url, full url).

    On Colab 127.0.0.1 is the learner's own computer, not the runtime; Colab's ``output.serve_kernel_port_as_iframe``
    reaches the runtime's port through a proxy only the learner's signed-in browser can use while the notebook is
    open. Written against Colab's published API (google/colab/output/_util.py; google.colab is not installed here).
    The frame's path carries no write token, so this view only reads; a public share link is refused."""
    from urllib.parse import urlsplit

    from .machine import on_colab
    server, url, share_url = dashboard[0], dashboard[1], dashboard[2]
    if share_url:
        server.close()
        raise RuntimeError("trackio made a public share link, which carries the dashboard's write token; it is "
                           "closed now. Call trackio.show(..., share=False).")
    if on_colab():
        from google.colab import output  # type: ignore[import-not-found]
        from IPython.display import clear_output
        clear_output()  # trackio's own frame, which points at 127.0.0.1 and holds the write token
        output.serve_kernel_port_as_iframe(urlsplit(url).port, path=f"/?project={project}", height="1000")


def tracker_last(trainer: Any) -> Any:
    """Order the course's callbacks once the trainer is built (a callback sees only what those before it added to a
    log, and transformers puts ``report_to``'s first): ``GroupDiversityCallback`` (added where missing) before the
    log's readers, given the trainer it reads; trackio last, as ``TrackioStepCallback`` (at the training step)."""
    from transformers.integrations import TrackioCallback
    from .callbacks import DashboardCallback, GroupDiversityCallback, TrackioStepCallback, WatchCallback
    callbacks = trainer.callback_handler.callbacks
    diversity = next((c for c in callbacks if isinstance(c, GroupDiversityCallback)), None)
    if diversity is None:
        diversity = GroupDiversityCallback()
        readers = [i for i, c in enumerate(callbacks) if isinstance(c, (WatchCallback, DashboardCallback))]
        callbacks.insert(readers[0] if readers else len(callbacks), diversity)
    diversity.trainer = trainer
    tracker = trainer.pop_callback(TrackioCallback)
    if tracker is not None:
        trainer.add_callback(tracker if isinstance(tracker, TrackioStepCallback) else TrackioStepCallback())
    return trainer

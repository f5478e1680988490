"""Run the whole course headless, and keep Colab links pointing at one repository.

``python tools/course.py run`` executes every notebook in ``notebooks/`` in
order with nbclient, on the detected profile, streaming each cell's output, and
writes one run folder: ``runs/<time>-<profile>/`` with the executed notebooks,
the figures, ``summary.md`` and ``summary.json``. A failing cell stops the run
and is named (notebook, cell number, first line of code).

``python tools/course.py run --task my_module:MyTask`` (or ``COURSE_TASK=my_module:MyTask make course``) checks
the task first (``helpers.tasks.check``), then runs the notebooks that train and evaluate whatever task the
profile names (:data:`TASK_NOTEBOOKS`) on it; the others teach the course's own tasks by name.

``python tools/course.py badges`` rewrites every Colab badge and install
line from :data:`helpers.profiles.REPO_URL`.

Example:
    $ python tools/course.py run --profile cpu-smoke
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from helpers.profiles import REPO_REF, REPO_URL, detect_profile, get_profile
from helpers.runs import project_root, runs_root
from helpers.tasks import import_root


class NotebookFailed(RuntimeError):
    """A notebook cell raised; the message names the notebook and the cell."""


#: The notebooks that read the task from the profile alone: they train and evaluate a task of your own unchanged.
TASK_NOTEBOOKS = ("03_grpo_training", "04_merge_and_inference")


def notebooks_dir() -> Path:
    root = project_root()
    if root is None:
        raise RuntimeError("The course runner needs a checkout of the course (notebooks/ not found).")
    return root / "notebooks"


def course_notebooks(folder: Path | None = None) -> list[Path]:
    """The course notebooks in order (``NN_name.ipynb``)."""
    folder = folder or notebooks_dir()
    return sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))


def _first_line(source: str) -> str:
    for line in source.splitlines():
        if line.strip() and not line.startswith("# NBVAL"):
            return line.strip()[:80]
    return ""


def execute_notebook(path: Path, out_path: Path, env: dict[str, str], timeout: int = 3600,
                     echo: bool = True) -> float:
    """Execute one notebook, saving the executed copy to ``out_path``; return seconds taken."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    code_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    name = path.stem

    class _Client(NotebookClient):
        def output(self, outs: list, msg: dict, display_id: Any, cell_index: int) -> Any:
            if echo and msg["msg_type"] == "stream":
                text = msg["content"]["text"]
                # Progress bars redraw with carriage returns: keep the last frame of each line.
                text = "\n".join(part.split("\r")[-1] for part in text.split("\n"))
                sys.stdout.write(text)
                sys.stdout.flush()
            return super().output(outs, msg, display_id, cell_index)

    def on_start(cell: Any, cell_index: int) -> None:
        if cell.cell_type == "code" and echo:
            n = code_cells.index(cell_index) + 1
            print(f"\n[{name}] cell {n}/{len(code_cells)}: {_first_line(cell.source)}", flush=True)

    old_env = dict(os.environ)
    os.environ.update(env)
    start = time.time()
    client = _Client(nb, timeout=timeout, kernel_name="python3",
                     resources={"metadata": {"path": str(path.parent)}},
                     on_cell_start=on_start)
    try:
        client.execute()
    except CellExecutionError as exc:
        failed = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code" and any(
            o.get("output_type") == "error" for o in c.get("outputs", []))), None)
        where = (f"code cell {code_cells.index(failed) + 1} (`{_first_line(nb.cells[failed].source)}`)"
                 if failed is not None else "a cell")
        nbformat.write(nb, out_path)
        short = str(exc).strip().splitlines()
        raise NotebookFailed(
            f"{path.name} failed at {where}: {short[-1] if short else exc}\n"
            f"The executed notebook with the full traceback is {out_path}"
        ) from None
    finally:
        os.environ.clear()
        os.environ.update(old_env)
    nbformat.write(nb, out_path)
    return time.time() - start


def run_course(profile_name: str | None = None, only: list[str] | None = None,
               run: Path | None = None, echo: bool = True, folder: Path | None = None,
               task: str | None = None) -> Path:
    """Execute the course notebooks in order into one run folder; return the folder.

    ``task`` (default: ``COURSE_TASK``): a task of your own, checked before anything runs (a ``TaskCheckError``
    names what to fix); only :data:`TASK_NOTEBOOKS` run, on it."""
    if profile_name is None:
        profile_name, reason = detect_profile()
    else:
        reason = "chosen on the command line"
    task = task or os.environ.get("COURSE_TASK", "").strip() or None
    profile = get_profile(profile_name, **({"task": task} if task else {}))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run = Path(run) if run else runs_root() / f"{stamp}-{profile.name}"
    (run / "notebooks").mkdir(parents=True, exist_ok=True)
    env = {"COURSE_PROFILE": profile.name, "COURSE_RUN_DIR": str(run.resolve()), "MPLBACKEND": "Agg",
           "COURSE_HEADLESS": "1"}  # cells that only serve a person (a dashboard server) skip themselves
    if task:  # the kernels read it in get_profile(); they import the task's module from where this process did
        env["COURSE_TASK"] = task
        if (root := import_root(task.partition(":")[0])) is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(root)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    if profile.backend == "transformers":
        # CPU profiles use the bundled model and offline data: prove it by going offline.
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    books = [p for p in course_notebooks(folder) if not only or any(p.stem.startswith(o) for o in only)]
    if task:
        books = [p for p in books if p.stem in TASK_NOTEBOOKS]
        print(f"course: task {task} passed its checks; running {', '.join(p.stem for p in books)}, the notebooks "
              "that train and evaluate the profile's task (the others teach the course's own tasks)")
    print(f"course: profile {profile.name} ({reason}); model {profile.model}; run folder {run}")
    timings: dict[str, float] = {}
    status, error = "ok", None
    t0 = time.time()
    for i, book in enumerate(books, 1):
        print(f"\n=== [{i}/{len(books)}] {book.name} ===", flush=True)
        try:
            timings[book.stem] = round(execute_notebook(book, run / "notebooks" / book.name, env, echo=echo), 1)
        except NotebookFailed as exc:
            status, error = "failed", str(exc)
            break
        print(f"=== {book.name} done in {timings[book.stem]:.0f} s ===", flush=True)
    write_summary(run, profile.name, profile.model, timings, status, error, time.time() - t0, task=profile.task)
    if error:
        raise NotebookFailed(error)
    return run


def write_summary(run: Path, profile: str, model: str, timings: dict[str, float], status: str,
                  error: str | None, seconds: float, task: str = "arithmetic") -> None:
    """``summary.json`` and a readable ``summary.md`` of what happened in a run."""
    from helpers.tasks import get_task

    figures = sorted(str(p.relative_to(run)) for p in run.rglob("*.png"))
    evaluation = _read(run / "eval.json")
    the_task = get_task(task)
    metrics = list(dict.fromkeys([the_task.headline, the_task.format_metric]))
    summary = {"profile": profile, "model": model, "task": task, "status": status, "error": error,
               "seconds": round(seconds, 1), "notebooks": timings, "figures": figures,
               "eval": evaluation, "artifacts": sorted(p.name for p in run.iterdir())}
    (run / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = [f"# Course run: {run.name}", "", f"- profile: `{profile}`, model: `{model}`, task: `{task}`",
             f"- status: **{status}** in {seconds / 60:.1f} min", ""]
    if error:
        lines += ["## Failure", "", "```", error, "```", ""]
    lines += ["## Notebooks", "", "| notebook | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in timings.items()]
    if isinstance(evaluation, dict) and evaluation.get("sides"):
        lines += ["", "## Held-out evaluation", "", "| | " + " | ".join(metrics) + " | mean length |",
                  "|---|" + "---|" * (len(metrics) + 1)]
        for side, e in evaluation["sides"].items():
            lines.append(f"| {side} | " + " | ".join(f"{e.get(m, float('nan')):.1%}" for m in metrics)
                         + f" | {e.get('mean_length', float('nan')):.1f} |")
    if figures:
        lines += ["", "## Figures", ""] + [f"- [{f}]({f})" for f in figures]
    (run / "summary.md").write_text("\n".join(lines) + "\n")


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


BADGE = re.compile(r"https://colab\.research\.google\.com/github/[^/\s)]+/[^/\s)]+/blob/[^/\s)]+/notebooks/")
INSTALL = re.compile(r"git\+https://github\.com/[^/\s\"@]+/[^/\s\"@]+@[^\s\"\\]+")


def colab_prefix() -> str:
    return REPO_URL.replace("https://github.com/", "https://colab.research.google.com/github/") + \
        f"/blob/{REPO_REF}/notebooks/"


def install_spec() -> str:
    return f"git+{REPO_URL}@{REPO_REF}"


def link_problems(text: str) -> list[str]:
    """Colab badges or install lines in ``text`` that do not point at REPO_URL."""
    bad = [m for m in BADGE.findall(text) if m != colab_prefix()]
    bad += [m for m in INSTALL.findall(text) if m != install_spec()]
    return bad


def rewrite_links(text: str) -> str:
    return INSTALL.sub(install_spec(), BADGE.sub(colab_prefix(), text))


def fix_badges(root: Path | None = None) -> list[Path]:
    """Rewrite Colab badges and install lines in README and notebooks; return changed files."""
    root = root or project_root()
    changed = []
    for path in [root / "README.md", *course_notebooks(root / "notebooks")]:
        text = path.read_text()
        new = rewrite_links(text)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/course.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="execute every notebook in order into a new run folder")
    r.add_argument("--profile", help="profile name (default: COURSE_PROFILE or detected)")
    r.add_argument("--only", nargs="*", help="notebook prefixes to run, e.g. 00 01")
    r.add_argument("--run-dir", type=Path, help="run folder (default: runs/<time>-<profile>)")
    r.add_argument("--task", help="a task of your own, 'module:Class' (default: COURSE_TASK): checked, then "
                                  "notebooks 03 and 04 train and evaluate it")
    sub.add_parser("badges", help="rewrite Colab badges and install lines from REPO_URL")
    args = parser.parse_args(argv)
    if args.cmd == "badges":
        for p in fix_badges():
            print(f"updated {p}")
        return 0
    try:
        run = run_course(args.profile, args.only, args.run_dir, task=args.task)
    except NotebookFailed as exc:
        print(f"\ncourse: FAILED\n{exc}", file=sys.stderr)
        return 1
    except (ValueError, TypeError) as exc:  # unknown profile, a task that is not importable or fails its checks
        print(f"course: {exc}", file=sys.stderr)
        return 2
    print(f"\ncourse: done. Run folder: {run}\nSummary: {run / 'summary.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

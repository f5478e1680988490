"""Keep notebooks free of stray outputs.

    python dev/clean_notebooks.py notebooks/*.ipynb            # strip outputs
    python dev/clean_notebooks.py --execute notebooks/02_*.ipynb

Every cell loses its outputs and execution count, except cells whose first line
is ``# NBVAL_CHECK_OUTPUT``: nbval compares those, so their outputs (and the
execution count nbval insists on) are kept.
With ``--execute`` the notebook is first run on ``cpu-smoke`` in a temporary run
folder, so the kept outputs are exactly what nbval will produce.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import nbformat

CHECK = "# NBVAL_CHECK_OUTPUT"


def is_checked(cell) -> bool:
    return cell.cell_type == "code" and cell.source.lstrip().startswith(CHECK)


def clean(nb) -> None:
    nb.metadata.pop("widgets", None)  # saved widget state: large, and differs on every run
    for cell in nb.cells:
        if cell.cell_type != "code":
            cell.pop("outputs", None)
            cell.pop("execution_count", None)
            continue
        if not is_checked(cell):  # nbval refuses a checked cell without a count
            cell.execution_count = None
            cell.outputs = []
        cell.metadata.pop("execution", None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--execute", action="store_true")
    ap.add_argument("paths", nargs="+", type=Path)
    args = ap.parse_args()
    for path in args.paths:
        nb = nbformat.read(path, as_version=4)
        if args.execute:
            from nbclient import NotebookClient

            os.environ.update(COURSE_PROFILE="cpu-smoke", MPLBACKEND="Agg", HF_HUB_OFFLINE="1",
                              COURSE_RUN_DIR=tempfile.mkdtemp(prefix="clean-run-"))
            NotebookClient(nb, timeout=1800, kernel_name="python3",
                           resources={"metadata": {"path": str(path.parent)}}).execute()
        clean(nb)
        nbformat.write(nb, path)
        print(f"cleaned {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

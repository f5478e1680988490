"""Test helper: a notebook's code cells as one Python source, for ``ast`` (IPython magics become ``pass``)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat


def notebook_code(path: Path, solutions: bool = True) -> str:
    """The code cells of a notebook joined in order, then its exercise solutions (as the tests run them);
    ``%pip ...`` lines become ``pass  # %pip ...``."""
    nb = nbformat.read(path, as_version=4)
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    if solutions:
        sources += solution_blocks(nb)
    return "\n".join(re.sub(r"^(\s*)%(.*)$", r"\1pass  # %\2", s, flags=re.M) for s in sources)


_DETAILS = re.compile(r"<details>\s*<summary>(.*?)</summary>(.*?)</details>", re.S)
_FENCE = re.compile(r"```python\n(.*?)```", re.S)
#: A fold whose summary starts with "Solution" holds exercise solutions; any other fold is depth to read.
_SOLUTION = re.compile(r"\s*(<\w+>)?\s*solutions?\b", re.I)


def solution_folds(source: str) -> list[str]:
    """The bodies of the ``<details>`` folds of one markdown cell whose ``<summary>`` names a solution."""
    return [body for summary, body in _DETAILS.findall(source) if _SOLUTION.match(summary)]


def solution_blocks(nb: nbformat.NotebookNode) -> list[str]:
    """The ```python blocks inside the solution folds of a notebook's markdown cells: its exercise solutions."""
    blocks = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for details in solution_folds(cell.source):
                blocks += [block.strip("\n") for block in _FENCE.findall(details)]
    return blocks

"""Test helper: a notebook's code cells as one Python source, for ``ast`` (IPython magics become ``pass``)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat


def notebook_code(path: Path) -> str:
    """The code cells of a notebook joined in order; ``%pip ...`` lines become ``pass  # %pip ...``."""
    cells = nbformat.read(path, as_version=4).cells
    return "\n".join(re.sub(r"^(\s*)%(.*)$", r"\1pass  # %\2", c.source, flags=re.M)
                     for c in cells if c.cell_type == "code")

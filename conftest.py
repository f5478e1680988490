"""pytest configuration shared by the unit tests and the nbval notebook run.

Every notebook collected by nbval gets a fresh, empty run folder
(``COURSE_RUN_DIR``) before its kernel starts, so each notebook is checked
running on its own, rebuilding whatever earlier notebooks would have made.
The folder is deleted when the next notebook starts and when the run ends
(notebook 04 alone leaves about 1 GB of merged models); set
``COURSE_KEEP_NBVAL_RUNS=1`` to keep them for a look after a failure.

After a notebook's own cells, nbval also runs its **exercise solutions**: every
```python block inside a ``<details>`` of its markdown, in order, in the same
kernel (items named ``Solution N``). A solution that no longer runs, or whose
``assert`` of the outcome it states fails, fails the test run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import defaultdict

import pytest

_current: dict[str, str] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    path = str(getattr(item, "path", item.fspath))
    if path.endswith(".ipynb") and _current.get("notebook") != path:
        _drop_run_folder()
        _current["notebook"] = path
        _current["run"] = os.environ["COURSE_RUN_DIR"] = tempfile.mkdtemp(prefix="nbval-run-")


def _drop_run_folder() -> None:
    """Delete the last notebook's run folder (unless ``COURSE_KEEP_NBVAL_RUNS`` is set)."""
    run = _current.pop("run", None)
    if run is not None and not os.environ.get("COURSE_KEEP_NBVAL_RUNS"):
        shutil.rmtree(run, ignore_errors=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    _drop_run_folder()


def pytest_configure(config: pytest.Config) -> None:
    try:
        from nbval import plugin
    except ImportError:  # nbval not installed: no notebooks to run
        return
    if getattr(plugin.IPyNbFile.collect, "with_solutions", False):
        return
    notebook_cells = plugin.IPyNbFile.collect

    def collect(self):  # the notebook's code cells, then its solutions as more cells
        yield from notebook_cells(self)
        import nbformat

        from tests.notebook_code import solution_blocks

        first = sum(cell.cell_type == "code" for cell in self.nb.cells)
        for i, source in enumerate(solution_blocks(self.nb)):
            yield plugin.IPyNbCell.from_parent(self, name=f"Solution {i + 1}", cell_num=first + i,
                                               cell=nbformat.v4.new_code_cell(source),
                                               options=defaultdict(bool, check=False))

    collect.with_solutions = True
    plugin.IPyNbFile.collect = collect

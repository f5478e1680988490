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

With ``--no-loadscope-reorder`` (``make test``: ``--dist loadfile``, a file's items on one worker, in order, a
notebook's cells in one kernel) the files start longest first, by the per-file seconds in ``tests/durations.json``
(files it does not list follow in collection order): xdist hands out files in collection order then. Its default
order is by item count, which started notebook 06, the longest file, minutes in. (``--dist loadgroup`` cannot
group by file here: pytest 9.2 ignores the ``@group`` suffix pytest-xdist 3.8 writes into ``item._nodeid``, so
every item became its own unit.) ``COURSE_TEST_DURATIONS_OUT=PATH`` writes this run's per-file seconds to PATH,
in that file's format.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

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


DURATIONS = Path(__file__).resolve().parent / "tests" / "durations.json"
_seconds: dict[str, float] = defaultdict(float)


def _file_of(nodeid: str) -> str:
    return nodeid.split("::")[0].split("@")[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``--no-loadscope-reorder``: the files longest first (``tests/durations.json``), each file's items in order."""
    if config.getoption("loadscopereorder", default=True) is not False:
        return
    weights = {k: v for k, v in json.loads(DURATIONS.read_text()).items() if not k.startswith("_")}
    items.sort(key=lambda item: -weights.get(_file_of(item.nodeid), 0.0))  # stable: a file's items keep their order


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if os.environ.get("COURSE_TEST_DURATIONS_OUT"):
        _seconds[_file_of(report.nodeid)] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = os.environ.get("COURSE_TEST_DURATIONS_OUT")
    if not out or hasattr(session.config, "workerinput") or not _seconds:  # the controller writes, once
        return
    import datetime

    import torch

    note = (f"Seconds per test file (summed over its items, on its worker), used only to start the longest files "
            f"first (conftest.py). Measured: COURSE_TEST_DURATIONS_OUT, {datetime.date.today()}, torch CPU kernels "
            f"{torch.backends.cpu.get_cpu_capability()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}.")
    table = dict(sorted(((k, round(v)) for k, v in _seconds.items()), key=lambda kv: -kv[1]))
    Path(out).write_text(json.dumps({"_note": note, **table}, indent=2) + "\n")

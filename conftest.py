"""pytest configuration shared by the unit tests and the nbval notebook run.

Every notebook collected by nbval runs the way Colab runs it, checked running on its own: before its
kernel starts it gets a fresh, empty stand-in Drive (``COURSE_RUNS``; ``COURSE_RUN_DIR`` removed, so
``helpers.runs.run_dir`` makes ``<Drive>/lab-<profile>`` as it does on Colab), the kernel's working folder
is a fresh empty folder (``/content``, not the notebook's folder; ``nbval.plugin.RunningKernel`` is
wrapped for that) and ``PYTHONPATH`` starts with this checkout. Each notebook rebuilds whatever earlier
notebooks would have made. The variables are restored once the notebook's last cell is done, so no
other test on the worker sees them. The folders are deleted when the notebook ends (notebook 04 alone
leaves about 1 GB of merged models); set ``COURSE_KEEP_NBVAL_RUNS=1`` to keep them for a look after a
failure.

After a notebook's own cells, nbval also runs its **exercise solutions**: every
```python block inside a ``<details>`` of its markdown, in order, in the same
kernel (items named ``Solution N``). A solution that no longer runs, or whose
``assert`` of the outcome it states fails, fails the test run. The last item, ``Colab layout``,
prints what the kernel saw (``PROBE {...}``: helpers' origin, cwd, the run variables) and asserts
that helpers came from this checkout, nothing was written into the working folder and the Drive
holds only ``lab-<profile>``.

nbval's runs of notebooks 03 and 04 (``tests/shared.py``'s ``KEPT_NBVAL_RUNS``) are kept for the
session in its shared temporary root, with a record (``nbval-<notebook>.json``: the folders, every
cell's output, the probe, the cells run and failed) that ``tests/test_colab_layout.py`` reads on
either worker instead of running both notebooks again; the controller deletes them at the end.
Its items are ordered after those notebooks' cells.

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

ROOT = Path(__file__).resolve().parent
PROBE_ITEM = "Colab layout"
#: The last cell of every notebook under nbval: what the kernel saw, then the Colab layout's invariants.
PROBE = f"""\
import json as _json, os as _os, sys as _sys
import helpers as _helpers
from helpers.profiles import detect_profile as _detect_profile
_runs = _os.environ.get("COURSE_RUNS")
_probe = {{"helpers": _helpers.__file__, "cwd": _os.getcwd(), "executable": _sys.executable,
          "cwd_holds": sorted(_os.listdir(".")), "drive_holds": sorted(_os.listdir(_runs)) if _runs else None,
          **{{k: _os.environ.get(k) for k in ("COURSE_RUN_DIR", "COURSE_RUNS", "COURSE_PROFILE",
                                             "COURSE_TIME_BUDGET", "COURSE_MODEL", "KAGGLE_KERNEL_RUN_TYPE",
                                             "HF_HUB_OFFLINE", "MPLBACKEND")}}}}
print("PROBE " + _json.dumps(_probe))
_name = PROFILE.name if "PROFILE" in globals() else _detect_profile()[0]
assert _os.path.realpath(_helpers.__file__).startswith({str(ROOT) + os.sep!r}), (
    f"helpers imported from {{_helpers.__file__}}, not from {str(ROOT)!r}")
assert _probe["COURSE_RUN_DIR"] is None and _runs, _probe
_content = _os.path.join(_os.path.dirname(_runs), "content")
assert _os.path.realpath(_os.getcwd()) == _os.path.realpath(_content), f"cwd is not {{_content}}: {{_probe}}"
assert not _probe["cwd_holds"], (
    f"written into the working folder instead of the run folder: {{_probe['cwd_holds'][:20]}}")
assert _probe["drive_holds"] == [f"lab-{{_name}}"], (
    f"the Drive (COURSE_RUNS) holds {{_probe['drive_holds']}}, not only lab-{{_name}}")
"""
_ENV = ("COURSE_RUNS", "COURSE_RUN_DIR", "PYTHONPATH")
_current: dict = {}


def _notebook_of(item: pytest.Item | None) -> str | None:
    path = str(getattr(item, "path", getattr(item, "fspath", ""))) if item is not None else ""
    return path if path.endswith(".ipynb") else None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    path = _notebook_of(item)
    if path is None or _current.get("notebook") == path:
        return
    _finish_notebook()
    from tests.shared import KEPT_NBVAL_RUNS, nbval_run_folder, session_root

    rel = Path(path).resolve().relative_to(ROOT).as_posix() if Path(path).resolve().is_relative_to(ROOT) else path
    if rel in KEPT_NBVAL_RUNS:  # kept for tests/test_colab_layout.py, in the folder both workers share
        folder = nbval_run_folder(session_root(item.config._tmp_path_factory), rel)
        shutil.rmtree(folder, ignore_errors=True)
        folder.with_suffix(".json").unlink(missing_ok=True)
        folder.mkdir(parents=True)
    else:
        folder = Path(tempfile.mkdtemp(prefix="nbval-run-"))
    drive, content = folder / "drive-runs", folder / "content"
    drive.mkdir()
    content.mkdir()
    _current.update(notebook=path, rel=rel, folder=folder, drive=drive, content=content,
                    kept=rel in KEPT_NBVAL_RUNS, saved={k: os.environ.get(k) for k in _ENV},
                    items=list(getattr(item.parent, "course_items", [])), text=[], ran=[], failed=[], probe=None)
    os.environ["COURSE_RUNS"] = str(drive)  # the kernel, started next (nbval's IPyNbFile.setup), inherits these
    os.environ.pop("COURSE_RUN_DIR", None)
    paths = (_current["saved"]["PYTHONPATH"] or "").split(os.pathsep)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, paths)])  # helpers from this checkout


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    path = _notebook_of(item)
    if path is not None and _current.get("notebook") == path:
        if report.failed:
            _current["failed"].append(f"{item.name} ({report.when})")
        if call.when == "call":
            from tests.shared import cell_text

            _current["ran"].append(item.name)
            text = cell_text(getattr(item, "test_outputs", None) or [], item.name)
            _current["text"].append(text)
            if item.name == PROBE_ITEM:
                _current["probe"] = next((json.loads(line[len("PROBE "):]) for line in text.splitlines()
                                          if line.startswith("PROBE ")), None)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    try:
        return (yield)  # nbval stops the kernel here after a notebook's last item
    finally:
        path = _notebook_of(item)
        if path is not None and _current.get("notebook") == path and _notebook_of(nextitem) != path:
            _finish_notebook()


def _finish_notebook() -> None:
    """Restore the environment; keep a kept notebook's folders (with their record), delete the others'."""
    if "notebook" not in _current:
        return
    state = dict(_current)
    _current.clear()
    for name, value in state["saved"].items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if state["kept"]:
        record = {k: state[k] for k in ("items", "ran", "failed", "probe")}
        record.update(notebook=state["rel"], drive=str(state["drive"]), content=str(state["content"]),
                      text="".join(state["text"]))
        out = state["folder"].with_suffix(".json")
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, out)  # whole or absent: the other worker polls for it
    elif not os.environ.get("COURSE_KEEP_NBVAL_RUNS"):
        shutil.rmtree(state["folder"], ignore_errors=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    _finish_notebook()
    if hasattr(config, "workerinput") or os.environ.get("COURSE_KEEP_NBVAL_RUNS"):
        return
    factory = getattr(config, "_tmp_path_factory", None)
    base = getattr(factory, "_basetemp", None)  # only where this session made one
    if base is not None:  # the controller, or a run without xdist: every worker is done
        from tests.shared import KEPT_NBVAL_RUNS, nbval_run_folder

        for rel in KEPT_NBVAL_RUNS:
            shutil.rmtree(nbval_run_folder(Path(base), rel), ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    try:
        from nbval import plugin
    except ImportError:  # nbval not installed: no notebooks to run
        return
    if getattr(plugin.IPyNbFile.collect, "with_solutions", False):
        return
    notebook_cells = plugin.IPyNbFile.collect
    running_kernel = plugin.RunningKernel

    def collect(self):  # the notebook's code cells, then its solutions as more cells, then the probe
        import nbformat

        from tests.notebook_code import solution_blocks

        items = list(notebook_cells(self))
        first = sum(cell.cell_type == "code" for cell in self.nb.cells)
        sources = [*solution_blocks(self.nb), PROBE]
        for i, source in enumerate(sources):
            name = PROBE_ITEM if i == len(sources) - 1 else f"Solution {i + 1}"
            items.append(plugin.IPyNbCell.from_parent(self, name=name, cell_num=first + i,
                                                      cell=nbformat.v4.new_code_cell(source),
                                                      options=defaultdict(bool, check=False)))
        self.course_items = [item.name for item in items]
        yield from items

    def kernel_in_content(kernel_name, cwd=None, **kwargs):  # cwd: the notebook's folder; Colab's is /content
        return running_kernel(kernel_name, cwd=str(_current.get("content") or cwd), **kwargs)

    collect.with_solutions = True
    plugin.IPyNbFile.collect = collect
    plugin.RunningKernel = kernel_in_content


DURATIONS = Path(__file__).resolve().parent / "tests" / "durations.json"
_seconds: dict[str, float] = defaultdict(float)


def _file_of(nodeid: str) -> str:
    return nodeid.split("::")[0].split("@")[0]


#: Files that read nbval's kept runs (tests/shared.py's KEPT_NBVAL_RUNS): they wait for them, so they come after.
READS_NBVAL_RUNS = ("tests/test_colab_layout.py",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``--no-loadscope-reorder``: the files longest first (``tests/durations.json``), each file's items in order.

    Always: the items of :data:`READS_NBVAL_RUNS` after the last cell of the kept notebooks, so that a worker never
    waits for a notebook it holds itself later (one process, or xdist handing out files in this order)."""
    if config.getoption("loadscopereorder", default=True) is False:
        weights = {k: v for k, v in json.loads(DURATIONS.read_text()).items() if not k.startswith("_")}
        items.sort(key=lambda item: -weights.get(_file_of(item.nodeid), 0.0))  # stable: a file's items keep order
    from tests.shared import KEPT_NBVAL_RUNS

    kept = [i for i, item in enumerate(items) if _file_of(item.nodeid) in KEPT_NBVAL_RUNS]
    readers = [item for item in items if _file_of(item.nodeid) in READS_NBVAL_RUNS]
    if kept and readers and items.index(readers[0]) < kept[-1]:
        rest = [item for item in items if _file_of(item.nodeid) not in READS_NBVAL_RUNS]
        last = rest.index(items[kept[-1]])
        items[:] = rest[:last + 1] + readers + rest[last + 1:]


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

"""helpers.install: the install cell's own check for packages upgraded after the kernel imported them.

The stand-in distributions here are real ones to ``importlib.metadata``: a ``.dist-info`` folder with METADATA and
RECORD in a temporary folder on ``sys.path``, "upgraded" by replacing that folder, as pip does."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import nbformat
import pytest

from helpers.install import canonical, changed, installed, module_names, restart_check, stale_imports
from tools.course import course_notebooks

ROOT = Path(__file__).resolve().parents[1]


def test_changed_compares_canonical_names_and_sees_removals():
    before = {"PyArrow": "18.1.0", "Unsloth_Zoo": "1.0", "tqdm": "4.67.1", "gone": "1.0"}
    after = {"pyarrow": "26.0.1", "unsloth-zoo": "1.0", "tqdm": "4.67.1", "trl": "1.13.0"}
    assert changed(before, after) == {"gone": ("1.0", None), "pyarrow": ("18.1.0", "26.0.1")}
    assert canonical({"Unsloth_Zoo": "1", "unsloth.zoo": "2", None: "3"}) == {"unsloth-zoo": "1"}  # the first copy wins


def test_only_a_changed_package_imported_before_asks_for_a_restart():
    before = {"pyarrow": "18.1.0", "datasets": "4.0.0", "requests": "2.32.3"}
    after = {"pyarrow": "26.0.1", "datasets": "4.8.5", "requests": "2.32.3"}
    provides = {"pyarrow": {"pyarrow", "pyarrow.lib"}, "datasets": {"datasets"}, "requests": {"requests"}}
    # requests was imported but not changed; datasets changed but was not imported; pyarrow is both
    stale = stale_imports(before, after, imported={"pyarrow.lib", "requests", "os"}, modules_of=provides.get)
    assert stale == {"pyarrow": ("18.1.0", "26.0.1", ["pyarrow.lib"])}
    assert stale_imports(before, after, imported={"os", "requests"}, modules_of=provides.get) == {}
    assert stale_imports(before, before, imported={"pyarrow"}, modules_of=provides.get) == {}  # nothing changed


def test_module_names_come_from_a_distributions_files():
    files = ["pyarrow/__init__.py", "pyarrow/lib.cpython-311-x86_64-linux-gnu.so", "pyarrow/include/arrow/api.h",
             "pyarrow/__pycache__/lib.cpython-311.pyc", "pyarrow-26.0.1.dist-info/RECORD", "six.py",
             "../../../bin/pyarrow-tool", "google/protobuf/message.py", "_yaml/__init__.py"]
    assert module_names(files) == {"pyarrow", "pyarrow.lib", "six", "google.protobuf.message", "_yaml"}


def _distribution(site: Path, name: str, version: str, module: str) -> None:
    """A distribution as pip leaves it: the module, and a .dist-info folder with METADATA and RECORD."""
    for old in site.glob(f"{name}-*.dist-info"):  # an upgrade replaces the old metadata
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    (site / module).mkdir(exist_ok=True)
    (site / module / "__init__.py").write_text(f"VERSION = {version!r}\n")
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{module}/__init__.py,,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")


@pytest.fixture()
def site(tmp_path, monkeypatch):
    """A folder on sys.path for stand-in distributions; their modules leave sys.modules afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("course_standin_")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def test_restart_check_reads_the_installed_metadata(site, capsys):
    _distribution(site, "course-standin-used", "1.0", "course_standin_used")
    _distribution(site, "course-standin-idle", "1.0", "course_standin_idle")
    importlib.invalidate_caches()
    before = installed()
    assert before["course-standin-used"] == "1.0"
    import course_standin_used  # noqa: F401  (imported before the "upgrade")

    _distribution(site, "course-standin-used", "2.0", "course_standin_used")
    _distribution(site, "course-standin-idle", "2.0", "course_standin_idle")
    _distribution(site, "course-standin-new", "1.0", "course_standin_new")
    assert restart_check(before) is True
    out = capsys.readouterr().out
    assert "changed 2 package(s) the image had and added 1" in out
    assert "course-standin-used 1.0 -> 2.0: imported before the install (course_standin_used)" in out
    assert "course-standin-idle" not in out  # changed, but never imported
    assert "Runtime > Restart session" in out and "from the next cell" in out

    del sys.modules["course_standin_used"]  # what a restart does
    assert restart_check(before) is False
    assert "nothing to restart" in capsys.readouterr().out


def install_cells() -> dict[str, str]:
    """Cell 1 of every notebook but 06 (whose cell the coordinator sets from /work/notes/install_cell.py)."""
    return {p.stem: nbformat.read(p, as_version=4).cells[1].source for p in course_notebooks()
            if not p.stem.startswith("06_")}


@pytest.mark.parametrize("name", sorted(install_cells()))
def test_the_install_cell_notes_the_versions_before_pip_and_checks_after(name):
    cell = install_cells()[name]
    lines = cell.splitlines()
    index = {key: next(i for i, line in enumerate(lines) if key in line)
             for key in ("distributions()", "%pip install", "restart_check(BEFORE)")}
    assert index["distributions()"] < index["%pip install"] < index["restart_check(BEFORE)"], index
    assert "Nothing to restart" not in cell and "nothing to restart" not in cell


def test_the_install_cell_itself_catches_an_upgraded_import(site, capsys):
    """The notebooks' cell 1, run as on Colab with ``%pip install`` replaced by an upgrade of a stand-in package
    that this session imported before."""
    cell = install_cells()["00_setup"]
    cell = cell.replace('if "google.colab" in sys.modules or "KAGGLE_KERNEL_RUN_TYPE" in os.environ:', "if True:")
    cell = re.sub(r"^(\s*)%pip install .*$", r"\1upgrade()", cell, flags=re.M)
    _distribution(site, "course-standin-arrow", "18.1.0", "course_standin_arrow")
    importlib.invalidate_caches()
    import course_standin_arrow  # noqa: F401

    exec(cell, {"upgrade": lambda: _distribution(site, "course-standin-arrow", "26.0.1", "course_standin_arrow")})  # noqa: S102
    out = capsys.readouterr().out
    assert "course-standin-arrow 18.1.0 -> 26.0.1: imported before the install" in out

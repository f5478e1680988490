"""pytest configuration shared by the unit tests and the nbval notebook run.

Every notebook collected by nbval gets a fresh, empty run folder
(``COURSE_RUN_DIR``) before its kernel starts, so each notebook is checked
running on its own, rebuilding whatever earlier notebooks would have made.
"""

from __future__ import annotations

import os
import tempfile

import pytest

_current: dict[str, str] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    path = str(getattr(item, "path", item.fspath))
    if path.endswith(".ipynb") and _current.get("notebook") != path:
        _current["notebook"] = path
        os.environ["COURSE_RUN_DIR"] = tempfile.mkdtemp(prefix="nbval-run-")

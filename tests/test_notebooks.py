"""Notebook hygiene: the conventions every course notebook follows.

(The notebooks themselves are executed by nbval in `make test`.)
"""

import nbformat
import pytest

from helpers.course import course_notebooks

BOOKS = course_notebooks()
INSTALL_LINE = '%pip install -q "grpo-course[gpu] @ git+'


def cells(path):
    return nbformat.read(path, as_version=4).cells


@pytest.mark.parametrize("path", BOOKS, ids=lambda p: p.stem)
def test_only_checked_cells_keep_outputs(path):
    for i, cell in enumerate(cells(path)):
        if cell.cell_type != "code":
            continue
        if cell.source.lstrip().startswith("# NBVAL_CHECK_OUTPUT"):
            assert cell.outputs, f"checked cell {i} has no reference output: run tools/clean_notebooks.py --execute"
        else:
            assert not cell.outputs, f"cell {i} has stray outputs: run tools/clean_notebooks.py"
            assert cell.execution_count is None, f"cell {i}: run tools/clean_notebooks.py"


@pytest.mark.parametrize("path", BOOKS, ids=lambda p: p.stem)
def test_opens_with_badge_install_cell_and_profile(path):
    first = cells(path)[0]
    install, profile = [c for c in cells(path) if c.cell_type == "code"][:2]
    assert first.cell_type == "markdown" and f"notebooks/{path.name}" in first.source
    for word in ("learn", "cpu-demo", "colab-t4"):
        assert word.lower() in first.source.lower(), f"intro lacks {word!r}"
    assert INSTALL_LINE in install.source and 'if "google.colab" in sys.modules' in install.source
    assert "PROFILE = get_profile()" in profile.source and "RUN = run_dir(" in profile.source


@pytest.mark.parametrize("path", BOOKS, ids=lambda p: p.stem)
def test_has_exercises_with_solutions_and_troubleshooting(path):
    text = "\n".join(c.source for c in cells(path) if c.cell_type == "markdown")
    assert "<details>" in text and "Exercise" in text
    assert "Troubleshooting" in text


@pytest.mark.parametrize("path", BOOKS, ids=lambda p: p.stem)
def test_gpu_only_cells_are_skipped_by_nbval_and_guarded(path):
    for i, cell in enumerate(cells(path)):
        if cell.cell_type == "code" and cell.source.startswith("# NBVAL_SKIP"):
            assert "PROFILE.backend" in cell.source or "PROFILE.use_vllm" in cell.source, (
                f"cell {i} is skipped by nbval but not guarded for `make course` on a CPU")


@pytest.mark.parametrize("path", BOOKS, ids=lambda p: p.stem)
def test_notebooks_are_small(path):
    assert path.stat().st_size < 200_000

"""`COURSE_TASK=module:Class make course`: the task is checked first, then the notebooks that train and evaluate
the profile's task run on it, able to import it (tools/course.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.tasks.check import TaskCheckError
from tools import course

GOOD, BROKEN = "tests.tasks.test_check:Echo", "tests.tasks.test_check:NoKwargs"


@pytest.fixture
def executed(monkeypatch):
    """Record what run_course would execute, and with which environment, instead of running notebooks."""
    calls = []

    def fake(path, out_path, env, timeout=3600, echo=True):
        calls.append((path.stem, dict(env)))
        return 0.0

    monkeypatch.setattr(course, "execute_notebook", fake)
    return calls


def test_a_task_of_your_own_runs_the_training_and_evaluation_notebooks(executed, tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_TASK", GOOD)
    run = course.run_course("cpu-smoke", run=tmp_path / "run", echo=False)
    assert [stem for stem, _ in executed] == list(course.TASK_NOTEBOOKS)
    env = executed[0][1]
    assert env["COURSE_TASK"] == GOOD
    assert env["PYTHONPATH"].split(":")[0] == str(Path(course.__file__).resolve().parents[1])  # where `tests` is
    summary = (run / "summary.md").read_text()
    assert f"task: `{GOOD}`" in summary


def test_a_broken_task_is_refused_before_any_notebook_runs(executed, tmp_path, capsys, monkeypatch):
    with pytest.raises(TaskCheckError, match="said_reward_no_kwargs: its signature has no"):
        course.run_course("cpu-smoke", run=tmp_path / "run", task=BROKEN, echo=False)
    assert executed == []
    monkeypatch.setattr(course, "run_course", lambda *a, **k: (_ for _ in ()).throw(TaskCheckError("the message")))
    assert course.main(["run", "--task", BROKEN]) == 2
    assert capsys.readouterr().err == "course: the message\n"  # the message, not a traceback


def test_without_a_task_every_notebook_runs(executed, tmp_path, monkeypatch):
    monkeypatch.delenv("COURSE_TASK", raising=False)
    course.run_course("cpu-smoke", run=tmp_path / "run", echo=False)
    assert [stem for stem, _ in executed] == [p.stem for p in course.course_notebooks()]
    assert "COURSE_TASK" not in executed[0][1]


def test_the_task_notebooks_read_the_task_from_the_profile_alone():
    """03 and 04 never name a built-in task: what makes them run a task of yours unchanged."""
    import nbformat

    for stem in course.TASK_NOTEBOOKS:
        nb = nbformat.read(course.notebooks_dir() / f"{stem}.ipynb", as_version=4)
        source = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        assert 'get_task("arithmetic")' not in source and 'task="json"' not in source, stem
        assert "get_task(PROFILE.task)" in source, stem

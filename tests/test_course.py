"""tools/course.py: the headless course runner and the one-place repository URL."""

import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from helpers.profiles import REPO_URL
from helpers.runs import project_root
from tools.course import NotebookFailed, course_notebooks, link_problems, rewrite_links, run_course


def write_nb(path, *sources):
    nb = new_notebook(cells=[new_code_cell(s) for s in sources],
                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(nb, path)


def test_every_link_points_at_the_one_repository():
    root = project_root()
    for path in [root / "README.md", *course_notebooks()]:
        assert not link_problems(path.read_text()), f"{path.name}: run `python tools/course.py badges`"


def test_links_open_the_release_of_this_version():
    import tomllib

    import helpers
    from helpers.profiles import REPO_REF
    from tools.course import colab_prefix, install_spec

    version = tomllib.loads((project_root() / "pyproject.toml").read_text())["project"]["version"]
    assert helpers.__version__ == version, "helpers/__init__.py and pyproject.toml disagree on the version"
    assert REPO_REF == f"v{version}", f"REPO_REF {REPO_REF!r} is not the tag of version {version}: see README, Releases"
    assert f"/blob/{REPO_REF}/" in colab_prefix() and install_spec().endswith(f"@{REPO_REF}")
    assert "/blob/main/" not in (project_root() / "README.md").read_text()


def test_link_checker_catches_and_fixes_a_stale_url():
    stale = ("https://colab.research.google.com/github/old/repo/blob/main/notebooks/01_x.ipynb "
             '%pip install "grpo-course[gpu] @ git+https://github.com/old/repo@main"')
    assert len(link_problems(stale)) == 2
    fixed = rewrite_links(stale)
    assert not link_problems(fixed) and REPO_URL in fixed


def test_course_notebooks_are_the_nine_in_order():
    names = [p.stem for p in course_notebooks()]
    assert names == ["00_setup", "01_dataset_prep", "02_reward_lab", "03_grpo_training",
                     "04_merge_and_inference", "05_your_own_task", "06_inside_grpo", "07_grpo_with_tools",
                     "08_rewards_from_a_model"]


def test_runner_executes_in_order_and_writes_a_run_folder(tmp_path, capsys):
    books = tmp_path / "nbs"
    books.mkdir()
    write_nb(books / "00_a.ipynb", "import os\nprint('profile', os.environ['COURSE_PROFILE'])",
             "open(os.environ['COURSE_RUN_DIR'] + '/a.txt', 'w').write('x')")
    write_nb(books / "01_b.ipynb", "import os\nassert os.path.exists(os.environ['COURSE_RUN_DIR'] + '/a.txt')")
    run = run_course("cpu-smoke", run=tmp_path / "run", folder=books)
    out = capsys.readouterr().out
    assert "profile cpu-smoke" in out and "[00_a] cell 2/2" in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "ok" and list(summary["notebooks"]) == ["00_a", "01_b"]
    assert (run / "notebooks" / "01_b.ipynb").is_file() and (run / "summary.md").is_file()


def test_runner_names_the_failing_notebook_and_cell(tmp_path):
    books = tmp_path / "nbs"
    books.mkdir()
    write_nb(books / "00_ok.ipynb", "x = 1")
    write_nb(books / "01_bad.ipynb", "y = 2", "raise ValueError('reward stuck at zero')", "z = 3")
    write_nb(books / "02_never.ipynb", "open('never-ran', 'w')")
    with pytest.raises(NotebookFailed) as exc:
        run_course("cpu-smoke", run=tmp_path / "run", folder=books, echo=False)
    msg = str(exc.value)
    assert "01_bad.ipynb" in msg and "code cell 2" in msg and "reward stuck at zero" in msg
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and "02_never" not in summary["notebooks"]
    assert (tmp_path / "run" / "notebooks" / "01_bad.ipynb").is_file()


def test_unknown_profile_fails_fast(monkeypatch, capsys):
    from tools.course import main

    monkeypatch.setenv("COURSE_PROFILE", "nonsense")
    assert main(["run"]) == 2
    err = capsys.readouterr().err
    assert "nonsense" in err and "cpu-demo" in err

"""`python -m helpers.tasks check module:Class`: the whole check as a report, for a task kept outside the course."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from helpers.tasks.__main__ import main

TASK = textwrap.dedent('''
    import random

    from helpers.rewards import completion_texts
    from helpers.tasks import Task


    def said_reward(completions, answer, **kwargs):
        return [float(t.strip() == a) for t, a in zip(completion_texts(completions), answer)]


    def bad_reward(completions, answer):
        return [0.0 for _ in completions]


    class Echo(Task):
        name, system_prompt, headline, format_metric = "echo", "Repeat the number.", "correct", "bare"
        levels = {"short": "one to three digits", "long": "ten-word sentences"}
        rewards = [(said_reward, 1.0)]

        def make_rows(self, level, n, seed):
            rng = random.Random(seed)
            return [{"question": f"Say {x}.", "answer": str(x) if level == "short" else " ".join([str(x)] * 40)}
                    for x in rng.sample(range(1000), n)]

        def reference(self, row):
            return row["answer"]

        def score(self, text, row):
            return {"correct": float(text.strip() == row["answer"]), "bare": float(text.strip().isdigit())}


    class Chatty(Echo):
        levels = {"long": "the number forty times", "short": "one to three digits"}


    class Broken(Echo):
        rewards = [(bad_reward, 1.0)]

        def score(self, text, row):
            return {"correct": float(int(text) == int(row["answer"])), "bare": 1.0}
''')


@pytest.fixture
def outside(tmp_path, monkeypatch):
    """A task module in a folder of its own, outside the checkout, importable as Python finds it from there."""
    (tmp_path / "echo_task.py").write_text(TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_sound_task_is_ready_to_train(outside, capsys):
    assert main(["check", "echo_task:Echo", "--profile", "cpu-smoke"]) == 0
    out = capsys.readouterr().out
    assert "levels ['short']" in out and "0 error(s), 0 warning(s): ready to train." in out


def test_a_level_whose_references_do_not_fit_is_an_error_naming_rows_and_the_length(outside, capsys):
    assert main(["check", "echo_task:Chatty", "--profile", "cpu-smoke"]) == 1  # it warms up and trains on "long"
    out = capsys.readouterr().out
    assert "levels ['long']" in out and "ERROR    level 'long':" in out
    assert "references do not fit max_completion_length=28" in out and "fits them all" in out


def test_a_broken_task_gets_every_error_and_exit_1(outside, capsys):
    assert main(["check", "echo_task:Broken", "--profile", "cpu-smoke"]) == 1
    out = capsys.readouterr().out
    assert "ERROR    Broken.score: raised ValueError" in out and "'empty'" in out
    assert "ERROR    reward bad_reward: its signature has no **kwargs" in out
    assert "2 error(s)" in out and "Traceback" not in out


def test_a_task_that_cannot_be_imported_says_where_to_put_it(capsys):
    assert main(["check", "no_such_module:Task"]) == 2
    assert "could not be imported" in capsys.readouterr().err


def test_the_real_command_from_the_task_s_own_folder(tmp_path):
    """As a learner runs it: from the folder holding the module, the course installed, no PYTHONPATH."""
    (tmp_path / "echo_task.py").write_text(TASK)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "helpers.tasks", "check", "echo_task:Broken"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "reward bad_reward: its signature has no **kwargs" in done.stdout and "Traceback" not in done.stderr

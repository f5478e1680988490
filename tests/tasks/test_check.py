"""helpers.tasks.check: a task is checked before any model loads, and every failure names what to fix."""

from __future__ import annotations

import random
import time

import pytest

from helpers.profiles import PROFILES, get_profile
from helpers.rewards import completion_texts
from helpers.tasks import Task, get_task
from helpers.tasks.check import (STRANGE, TaskCheckError, check_reference_lengths, check_task, return_problem,
                                 signature_problem, trl_call)


# --------------------------------------------------------------------------- a small task, and ways to break it

def said_reward(completions, answer, **kwargs):
    """1.0 when the completion is the answer."""
    return [float(t.strip() == a) for t, a in zip(completion_texts(completions), answer)]


class Echo(Task):
    name, system_prompt, headline, format_metric = "echo", "Repeat the number.", "correct", "bare"
    levels = {"short": "one to three digits"}
    rewards = [(said_reward, 1.0)]

    def make_rows(self, level, n, seed):
        return [{"question": f"Say {x}.", "answer": str(x)} for x in random.Random(seed).sample(range(1000), n)]

    def reference(self, row):
        return row["answer"]

    def score(self, text, row):
        return {"correct": float(text.strip() == row["answer"]), "bare": float(text.strip().isdigit())}


def errors(task, **kwargs):
    return [f for f in check_task(task, levels=["short"], **kwargs) if f.kind == "error"]


def broken(**attributes):
    return type("Broken", (Echo,), attributes)()


def test_a_sound_task_passes():
    assert check_task(Echo(), levels=["short"]) == []


def test_the_builtin_tasks_pass_on_the_levels_every_profile_trains(monkeypatch):
    monkeypatch.setenv("COURSE_GSM8K_DIR", "data/gsm8k_sample")
    for name in PROFILES:
        for key in ("arithmetic", "json"):
            profile = get_profile(name, task=key)
            assert [f for f in check_task(get_task(key), profile) if f.kind == "error"] == [], (name, key)


def test_a_score_that_raises_is_named_with_the_completion_and_the_row():
    def score(self, text, row):
        return {"correct": float(float(text.split()[-1]) == float(row["answer"])), "bare": 1.0}

    [finding] = errors(broken(score=score))
    assert finding.where == "Broken.score"
    assert "raised IndexError" in finding.message and "'empty'" in finding.message and "row 0" in finding.message
    assert "must never raise" in finding.message


def test_a_reward_without_kwargs_says_what_trl_passes():
    def answer_reward(completions, answer):
        return [1.0] * len(completions)

    [finding] = errors(broken(rewards=[(answer_reward, 1.0)]))
    assert finding.where == "reward answer_reward" and "no **kwargs" in finding.message
    assert "prompts, completion_ids" in finding.message and "(answer, question)" in finding.message
    assert "def answer_reward(completions, <the columns you use>, **kwargs):" in finding.message


def test_a_reward_asking_for_a_column_that_does_not_exist():
    def gold_reward(completions, gold, **kwargs):
        return [0.0] * len(completions)

    [finding] = errors(broken(rewards=[(gold_reward, 1.0)]))
    assert "needs ['gold'], which TRL never passes" in finding.message


@pytest.mark.parametrize("returns, message", [
    (lambda n: 1.0, "it returned 1.0 (float); TRL needs a list of"),
    (lambda n: [1.0] * (n + 1), "values for"),
    (lambda n: ["1"] * n, "'1' (str) among its values"),
    (lambda n: [float("nan")] * n, "never NaN or infinity"),
])
def test_a_reward_returning_what_trl_cannot_use(returns, message):
    def odd_reward(completions, **kwargs):
        return returns(len(completions))

    [finding] = errors(broken(rewards=[(odd_reward, 1.0)]))
    assert message in finding.message


def test_a_reward_that_only_reads_chat_messages_is_caught_on_plain_strings():
    def chat_only_reward(completions, **kwargs):
        return [float(len(c[0]["content"]) > 0) for c in completions]

    [finding] = errors(broken(rewards=[(chat_only_reward, 1.0)]))
    assert "as a plain string" in finding.message and "raised IndexError" in finding.message


def test_none_is_allowed_it_means_does_not_apply():
    assert return_problem([None, 0.5], 2) is None
    assert return_problem([True], 1) is not None  # a bool is not a score


def test_a_headline_missing_from_score_and_a_reference_that_does_not_win():
    [missing] = errors(broken(headline="accuracy"))
    assert "without ['accuracy']" in missing.message
    [loses] = errors(broken(reference=lambda self, row: row["answer"] + "0"))
    assert "scores the task's own reference 0.0" in loses.message


def test_make_rows_that_fails_on_a_generated_level_is_an_error():
    def make_rows(self, level, n, seed):
        raise KeyError("level")

    [finding] = errors(broken(make_rows=make_rows))
    assert finding.where == "Broken.make_rows" and "raised KeyError" in finding.message


def test_trl_call_passes_what_grpo_trainer_passes():
    seen = {}

    def spy(**kwargs):
        seen.update(kwargs)
        return [0.0] * len(kwargs["completions"])

    trl_call(spy, ["a", "b"], {"question": "q", "answer": "1", "prompt": "skipped"})
    assert set(seen) == {"prompts", "completions", "completion_ids", "question", "answer", "trainer_state",
                         "log_extra", "log_metric"}
    assert seen["completions"] == [[{"role": "assistant", "content": "a"}], [{"role": "assistant", "content": "b"}]]
    assert seen["answer"] == ["1", "1"]
    source = open(__import__("trl.trainer.grpo_trainer", fromlist=["x"]).__file__).read()
    assert 'reward_kwargs["trainer_state"]' in source and 'reward_kwargs["log_extra"]' in source  # what TRL adds


def test_signature_problem_accepts_kwargs_and_defaults():
    assert signature_problem(lambda completions, **kw: [], {"answer"}) is None
    assert signature_problem(lambda completions, answer, extra=1, **kw: [], {"answer"}) is None


def test_strange_completions_cover_the_issue_s_list():
    assert {"empty", "no tags", "nested tags", "repeated tags", "a unit after the number", "10,000 characters",
            "non-ASCII", "the reference cut in half"} <= set(STRANGE)
    assert len(STRANGE["10,000 characters"]) == 10_000


# --------------------------------------------------------------------------- references and the completion length

class Words:
    """A stand-in tokenizer: one token per word."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": text.split()}


def test_references_that_do_not_fit_are_counted_named_and_sized():
    task = broken(reference=lambda self, row: " ".join(["w"] * int(row["answer"][-1])))
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(10)]
    [finding] = check_reference_lengths(task, rows, Words(), budget=6, level="short")
    assert finding.kind == "error" and finding.where == "level 'short'"
    assert "4 of 10 references do not fit max_completion_length=6" in finding.message
    assert "row 9 (10 tokens)" in finding.message and "max_completion_length=10 fits them all" in finding.message
    assert check_reference_lengths(task, rows, Words(), budget=10, level="short") == []


def test_the_warm_up_level_is_an_error_the_grpo_level_a_warning():
    long_rows = broken(reference=lambda self, row: "w " * 30)

    def length_findings(profile):
        return {f.kind for f in check_task(long_rows, profile, tokenizer=Words(), levels=["short"])
                if "references do not fit" in f.message}

    profile = get_profile("cpu-smoke", check=False, task="tests.tasks.test_check:Echo")
    assert length_findings(profile) == {"error"}  # a warm-up on this level would learn cut-off answers
    assert length_findings(profile.with_overrides(warmup_examples=0)) == {"warning"}


# --------------------------------------------------------------------------- where the course calls it

def test_get_profile_refuses_a_broken_task_before_any_model_loads(monkeypatch):
    from helpers import models

    loads = []
    monkeypatch.setattr(models, "load_model", lambda *a, **k: loads.append(a))
    start = time.time()
    with pytest.raises(TaskCheckError) as err:
        get_profile("cpu-demo", task="tests.tasks.test_check:NoKwargs")
    assert time.time() - start < 60 and loads == []
    message = str(err.value)
    assert message.startswith("Task 'echo' is not ready to train (1 problem(s); `python -m helpers.tasks check "
                              "tests.tasks.test_check:NoKwargs` prints the full report):")
    assert "reward said_reward_no_kwargs: its signature has no **kwargs" in message
    assert get_profile("cpu-demo", check=False, task="tests.tasks.test_check:NoKwargs").task_level == "short"


def test_course_task_picks_the_task_from_the_environment(monkeypatch):
    monkeypatch.setenv("COURSE_TASK", "tests.tasks.test_check:Echo")
    assert get_profile("cpu-smoke").task == "tests.tasks.test_check:Echo"
    assert get_profile("cpu-smoke", task="json").task == "json"  # an explicit task wins
    monkeypatch.setenv("COURSE_TASK", "tests.tasks.test_check:NoKwargs")
    with pytest.raises(TaskCheckError):
        get_profile("cpu-smoke")


def said_reward_no_kwargs(completions, answer):
    return said_reward(completions, answer)


class NoKwargs(Echo):
    rewards = [(said_reward_no_kwargs, 1.0)]

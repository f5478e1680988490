"""helpers.tasks.tool_arithmetic: rows, the reference rollout, and scoring rollouts as TRL hands them over."""

from __future__ import annotations

import json

import pytest

from helpers.calculator import calculate
from helpers.tasks import Task, get_task, level_table
from helpers.tasks.tool_arithmetic import (LEVELS, PRODUCTS, ToolArithmeticTask, error_replies, final_answer,
                                           messages_of, tool_answer_reward, tool_calls, unparsed_calls)

TASK = ToolArithmeticTask()


def call(expression, name="calculator"):
    return {"type": "function", "function": {"name": name, "arguments": {"expression": expression}}}


def rollout(*turns):
    """Messages as TRL's loop builds them: ("call", expr), ("tool", text), ("say", text)."""
    out = []
    for kind, value in turns:
        if kind == "call":
            out.append({"role": "assistant", "content": "", "tool_calls": [call(value)]})
        elif kind == "tool":
            out.append({"role": "tool", "name": "calculator", "content": value})
        else:
            out.append({"role": "assistant", "content": value})
    return out


ROW = {"question": "What is 347 times 58?", "expression": "347 * 58", "answer": "20126"}


def test_rows_are_distinct_reproducible_and_answered_by_the_calculator():
    rows = TASK.make_rows("products", 200, seed=0)
    assert rows == TASK.make_rows("products", 200, seed=0) != TASK.make_rows("products", 200, seed=1)
    assert len({r["question"] for r in rows}) == 200
    for r in rows:
        a, b = map(int, r["expression"].split(" * "))
        assert 100 <= a <= 999 and 10 <= b <= 99 and r["answer"] == str(a * b) == calculate(r["expression"])
        assert r["question"] in {t.format(a=a, b=b) for t in PRODUCTS} and r["level"] == "products"
        assert "*" not in r["question"]  # in words: the model must find the sign
    sums = TASK.make_rows("sums", 50, seed=0)
    assert all(" + " in r["expression"] and len(r["expression"].split(" + ")[0]) == 4 for r in sums)
    assert {q.split()[0] for q in (r["question"] for r in sums)} == {"What", "Add"}  # words, never a sign
    assert not any(word in r["question"] for r in sums for word in ("times", "product", "Multiply"))
    assert [row["level"] for row in level_table(TASK)] == list(LEVELS)


def test_an_unknown_level_names_the_levels():
    with pytest.raises(ValueError, match="Levels: sums, products"):
        TASK.make_rows("division", 3, seed=0)


def test_it_is_a_task_the_course_can_look_up():
    assert isinstance(get_task("helpers.tasks.tool_arithmetic:ToolArithmeticTask"), Task)
    assert isinstance(get_task("tools"), ToolArithmeticTask)  # its key in helpers.tasks.BUILTIN
    assert TASK.prefill == "" and TASK.headline == "accuracy" and TASK.rewards[0][0] is tool_answer_reward


def test_the_reference_rollout_is_one_call_the_reply_and_the_number():
    messages = TASK.reference_messages(ROW)
    assert [m["role"] for m in messages] == ["assistant", "tool", "assistant"]
    assert tool_calls(messages) == [{"name": "calculator", "arguments": {"expression": "347 * 58"}}]
    assert messages[1]["content"] == "20126" and TASK.reference(ROW) == "20126"
    assert TASK.score_messages(messages, ROW) == {"accuracy": 1.0, "called": 1.0, "calls": 1.0, "unparsed": 0.0,
                                                   "malformed": 0.0, "answered": 1.0}


@pytest.mark.parametrize("turns, expected", [
    ([("say", "20126")], dict(accuracy=1.0, called=0.0, calls=0.0, answered=1.0)),   # right without the tool (luck)
    ([("say", "347 * 58 = 19986.")], dict(accuracy=0.0, called=0.0, answered=1.0)),  # the last number counts
    ([("say", "It is 20,126.")], dict(accuracy=1.0, answered=1.0)),
    ([("call", "347 + 58"), ("tool", "405"), ("say", "405")], dict(accuracy=0.0, called=1.0, calls=1.0)),
    ([("call", "347 x 58"), ("tool", calculate("347 x 58")), ("call", "347 * 58"), ("tool", "20126"),
      ("say", "20126")], dict(accuracy=1.0, calls=2.0, malformed=1.0)),                # a retry after an error
    ([("call", "347 * 58"), ("tool", "20126"), ("call", "20126 * 1")], dict(accuracy=0.0, answered=0.0)),  # forever
    ([("say", '<tool_call>\n{"name": "calculator", "arguments": {"expression": 347 * 58}}\n</tool_call>')],
     dict(accuracy=0.0, called=0.0, unparsed=1.0, malformed=1.0, answered=0.0)),      # TRL could not parse it
])
def test_score_messages(turns, expected):
    scores = TASK.score_messages(rollout(*turns), ROW)
    assert {k: scores[k] for k in expected} == expected


def test_an_unknown_tool_or_argument_is_a_malformed_call():
    """TRL answers a call it cannot make with {'error': ...} as the tool's reply (grpo_trainer.py 2026-2030)."""
    messages = [{"role": "assistant", "content": "", "tool_calls": [call("1 + 1", name="calc")]},
                {"role": "tool", "name": "calc", "content": str({"error": "Tool calc not found."})}]
    assert error_replies(messages) == 1 and unparsed_calls(messages) == 0 and final_answer(messages) is None


def test_the_reward_pays_the_right_final_answer_and_never_raises():
    completions = [TASK.reference_messages(ROW), rollout(("say", "19986")), None, 42, [{"role": "assistant"}],
                   "20126", rollout(("call", "347 * 58"), ("tool", "20126"))]
    assert tool_answer_reward(completions, answer=["20126"] * 7) == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]


def test_the_reward_logs_the_turns_for_the_explorer():
    logged = {}
    tool_answer_reward([TASK.reference_messages(ROW)], answer=["20126"], log_extra=logged.__setitem__)
    assert json.loads(logged["turns"][0]) == TASK.reference_messages(ROW) and logged["answer"] == ["20126"]


def test_messages_of_reads_every_shape():
    assert messages_of("7") == [{"role": "assistant", "content": "7"}]
    assert messages_of({"role": "assistant", "content": "7"}) == [{"role": "assistant", "content": "7"}]
    assert messages_of(None) == [] and messages_of(3) == []
    assert TASK.score("The answer is 20126", ROW)["accuracy"] == 1.0

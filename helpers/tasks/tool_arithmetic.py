"""Arithmetic with a calculator (notebook 07): numbers too big to work out in a 135M model's head, a tool that can.

A completion is a conversation, not a string: the model's tool call, the tool's reply, the model's answer. The
task reads the messages TRL hands a reward function (``completions``: one list of messages per rollout) and the
same messages in the evaluation.

Example:
    >>> task = ToolArithmeticTask()
    >>> row = task.make_rows("products", 1, seed=0)[0]
    >>> row["question"], row["answer"]
    ('What is the product of 908 and 30?', '27240')
    >>> task.score_messages(task.reference_messages(row), row)["accuracy"]
    1.0
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..calculator import calculate
from . import Task, distinct_rows
from .reasoning import find_numbers

TOOL_NAME = "calculator"
#: The CPU recipe (cpu-demo; cpu-smoke keeps its smaller sizes): 64 warm-up sums, 5 GRPO steps at learning rate
#: 3e-4 (what bench/measured/tools/tools.json measured), 64 tokens a rollout, 100 held-out products.
CPU_WARMUP, CPU_MAX_STEPS, CPU_COMPLETION, CPU_EVAL, CPU_LEARNING_RATE = 64, 5, 64, 100, 3e-4
#: On a GPU (estimated, not measured here): Qwen's longer turns, and fewer steps than notebook 03's GSM8K.
GPU_MAX_STEPS, GPU_COMPLETION = 60, 128
SYSTEM_PROMPT = ("You are a careful assistant. For arithmetic, call the calculator, then reply with the number "
                 "alone.")
#: What a completion's text holds where the model tried to call a tool and TRL could not parse it.
CALL_OPENING = "<tool_call>"
#: The tool's reply to a call it refused: the calculator's own ``Error: ...``, or TRL's ``{'error': ...}`` when the
#: call itself failed (an unknown tool, a wrong argument name).
_ERROR_REPLY = re.compile(r"^\s*(?:Error:|\{'error':)")


@dataclass(frozen=True)
class Level:
    """Two numbers, ``a`` in ``first`` and ``b`` in ``second`` (inclusive), asked in words by one of ``templates``;
    the calculator's expression is ``a op b``."""

    description: str
    op: str
    first: tuple[int, int]
    second: tuple[int, int]
    templates: tuple[str, ...]


SUMS = ("What is {a} plus {b}?", "Add {a} and {b}.", "What is the sum of {a} and {b}?")
PRODUCTS = ("What is {a} times {b}?", "Multiply {a} by {b}.", "What is the product of {a} and {b}?")
LEVELS: dict[str, Level] = {
    "sums": Level("sums of two 4-digit numbers, in words (the warm-up's: it shows the call, never a product)", "+",
                  (1000, 9999), (1000, 9999), SUMS),
    "products": Level("a 3-digit number times a 2-digit number, in words (what GRPO trains and the evaluation asks)",
                      "*", (100, 999), (10, 99), PRODUCTS),
}


def _one_problem(rng: random.Random, level: Level) -> dict[str, str]:
    a, b, template = rng.randint(*level.first), rng.randint(*level.second), rng.choice(level.templates)
    expression = f"{a} {level.op} {b}"
    return {"question": template.format(a=a, b=b), "expression": expression, "answer": calculate(expression)}


def messages_of(completion: Any) -> list[dict]:
    """The messages of one completion as TRL hands it to a reward (a list of dicts); a string is one message."""
    if isinstance(completion, str):
        return [{"role": "assistant", "content": completion}]
    if isinstance(completion, dict):
        return [completion]
    try:
        return [m for m in completion if isinstance(m, dict)]
    except TypeError:  # not iterable: no messages
        return []


def tool_calls(completion: Any) -> list[dict]:
    """Every well-formed call TRL parsed in the completion: ``{"name": ..., "arguments": {...}}`` each."""
    calls = []
    for message in messages_of(completion):
        for call in message.get("tool_calls") or []:
            function = call.get("function", call) if isinstance(call, dict) else {}
            calls.append({"name": function.get("name"), "arguments": function.get("arguments")})
    return calls


def tool_replies(completion: Any) -> list[str]:
    """The content of every tool message in the completion, in order."""
    return [str(m.get("content", "")) for m in messages_of(completion) if m.get("role") == "tool"]


def final_answer(completion: Any) -> str | None:
    """The last number of the model's last turn, when that turn answers (no call in it); else ``None``.

    Example:
        >>> final_answer([{"role": "assistant", "content": "It is 26,068."}])
        '26068'
    """
    turns = [m for m in messages_of(completion) if m.get("role") == "assistant"]
    if not turns or turns[-1].get("tool_calls") or CALL_OPENING in str(turns[-1].get("content") or ""):
        return None
    numbers = find_numbers(str(turns[-1].get("content") or ""), limit=64)
    return numbers[-1] if numbers else None


def unparsed_calls(completion: Any) -> int:
    """Calls TRL could not parse: the model's turns keep them as ``<tool_call>`` text, and no tool ran."""
    return sum(str(m.get("content") or "").count(CALL_OPENING) for m in messages_of(completion)
               if m.get("role") == "assistant")


def error_replies(completion: Any) -> int:
    """Tool replies that are errors: a call parsed and run, but refused (a bad expression, a wrong argument name)."""
    return sum(bool(_ERROR_REPLY.match(r)) for r in tool_replies(completion))


def tool_answer_reward(completions: Any, answer: Sequence[Any], log_extra: Callable | None = None,
                       **kwargs: Any) -> list[float]:
    """1.0 when the final answer (:func:`final_answer`) is the gold number, else 0.0; logs the turns it read.

    The answer only: the reward does not ask for a call. The model is paid for being right, and learns that
    the calculator is how it gets there. ``log_extra`` (TRL's) adds the rollout's messages as JSON to the
    completion log, one column ``turns``, which the explorer shows turn by turn."""
    completions = list(completions or [])
    if log_extra is not None:
        log_extra("turns", [json.dumps(messages_of(c), default=str) for c in completions])
        log_extra("answer", [str(a) for a in answer])
    out = []
    for completion, gold in zip(completions, answer):
        try:
            out.append(1.0 if final_answer(completion) == str(gold).strip() else 0.0)
        except Exception:  # noqa: BLE001 - a reward never raises
            out.append(0.0)
    return out


class ToolArithmeticTask(Task):
    """Products of a 3-digit and a 2-digit number, answered with the help of a calculator the model calls."""

    name = "tool-arithmetic"
    system_prompt = SYSTEM_PROMPT
    prefill = ""  # the model decides how to start: with a call, or with an answer
    levels = LEVELS
    rewards = [(tool_answer_reward, 1.0)]
    headline, format_metric = "accuracy", "called"
    min_completion_tokens = 48  # a call (~30 tokens), the tool's reply (~10) and an answer (~6)
    #: Tool-calling turns per rollout before TRL stops the loop (GRPOConfig(max_tool_calling_iterations=...)).
    max_tool_calling_iterations = 2

    def make_rows(self, level: str, n: int, seed: int) -> list[dict[str, str]]:
        if level not in LEVELS:
            raise ValueError(f"Unknown level {level!r}. Levels: {', '.join(LEVELS)}; add one with "
                             "helpers.tasks.tool_arithmetic.LEVELS['name'] = Level(...).")
        rng, spec = random.Random(f"tool-arithmetic:{level}:{seed}"), LEVELS[level]
        rows = distinct_rows(lambda: _one_problem(rng, spec), n, f"Level {level!r} ({spec.description})")
        return [dict(row, level=level) for row in rows]

    def reference_messages(self, row: Mapping[str, Any]) -> list[dict]:
        """The rollout a perfect model has: one call, the calculator's reply, the number (the warm-up's target)."""
        call = {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"expression": row["expression"]}}}
        return [{"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "name": TOOL_NAME, "content": calculate(row["expression"])},
                {"role": "assistant", "content": str(row["answer"])}]

    def reference(self, row: Mapping[str, Any]) -> str:
        return str(row["answer"])  # the final turn; the whole rollout is reference_messages

    def score(self, text: str, row: Mapping[str, Any]) -> dict[str, float]:
        """A plain-text completion (no tool loop): right when its last number is the answer."""
        return self.score_messages([{"role": "assistant", "content": text}], row)

    def score_messages(self, completion: Any, row: Mapping[str, Any]) -> dict[str, float]:
        """One rollout's ``accuracy``, ``called`` (a call TRL parsed), ``calls``, ``unparsed`` calls, ``malformed``
        calls (unparsed, or answered with an error) and ``answered`` (the last turn gives a number)."""
        calls, unparsed, answer = len(tool_calls(completion)), unparsed_calls(completion), final_answer(completion)
        return {"accuracy": float(answer is not None and answer == str(row["answer"]).strip()),
                "called": float(calls > 0), "calls": float(calls), "unparsed": float(unparsed),
                "malformed": float(unparsed + error_replies(completion)), "answered": float(answer is not None)}

    def settings(self, profile: Any) -> dict[str, Any]:
        """The products after a warm-up on sums; on a CPU a longer warm-up, fewer GRPO steps and a higher learning
        rate than notebook 03's (``bench/measured/tools/tools.json``); on a GPU the Qwen model calls tools already, and
        gets no warm-up."""
        if profile.backend == "unsloth":
            return {"task_level": "products", "warmup_level": "sums", "max_completion_length": GPU_COMPLETION,
                    "max_steps": min(profile.max_steps, GPU_MAX_STEPS)}
        full = profile.max_steps > CPU_MAX_STEPS  # cpu-demo; cpu-smoke (2 steps, the plumbing) keeps small sizes
        return {"task_level": "products", "warmup_level": "sums", "max_completion_length": CPU_COMPLETION,
                "max_steps": min(profile.max_steps, CPU_MAX_STEPS),
                "warmup_examples": CPU_WARMUP if full else profile.warmup_examples,
                "learning_rate": CPU_LEARNING_RATE if full else profile.learning_rate,
                "eval_prompts": min(profile.eval_prompts, CPU_EVAL if full else 4)}

"""The arithmetic task: sums generated offline in levels, with worked solutions, and GSM8K as its level ``gsm8k``.

Serves notebooks 01, 02 and 05 (and every notebook, as the default task).

Example:
    >>> generate_arithmetic(1, "add1", seed=1)[0]
    {'question': 'What is 3 + 6?', 'answer': '9', 'solution': '3 + 6 = 9', 'level': 'add1'}
"""

from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from . import Task, distinct_rows
from .reasoning import (PREFILL, SYSTEM_PROMPT, answer_matches, correctness_reward, extract_answer, has_strict_format,
                        normalize_number, numeric_answer_reward, partial_correctness_reward,
                        prefilled_soft_format_reward, prefilled_strict_format_reward, prefilled_xmlcount_reward,
                        reference_completion)


@dataclass(frozen=True)
class Level:
    """A level: ``n_operands`` numbers in ``[low, high]``, or word ``templates`` each with a formula (``"a + b"``)."""

    description: str
    low: int = 0
    high: int = 0
    n_operands: int = 2
    operators: tuple[str, ...] = ("+",)
    templates: tuple[tuple[str, str | None], ...] = (("What is {expr}?", None),)
    source: str | None = None  # where a loaded level's rows come from (None: generated)


GSM8K_DIR_ENV = "COURSE_GSM8K_DIR"
NAMES = ("Ava", "Ben", "Chloe", "Dev", "Emma", "Finn", "Grace", "Hugo", "Isla", "Jonah",
         "Kira", "Leo", "Maya", "Noah", "Omar", "Priya", "Ravi", "Sara", "Tom", "Zoe")
ITEMS = ("apples", "marbles", "stickers", "books", "pencils", "coins", "cookies", "stamps", "shells", "cards")
WORD_ONE_STEP = (
    ("{name} has {a} {item}. {name} buys {b} more. How many {item} does {name} have now?", "a + b"),
    ("There are {a} {item} in a box and {b} {item} in a bag. How many {item} are there in total?", "a + b"),
    ("{name} collected {a} {item} on Monday and {b} on Tuesday. How many {item} did {name} collect in all?", "a + b"),
    ("{name} had {a} {item} and gave {b} of them to a friend. How many {item} does {name} have left?", "a - b"),
    ("A shelf holds {a} {item}. {name} takes {b} of them away. How many {item} are still on the shelf?", "a - b"),
)
WORD_TWO_STEP = (
    ("{name} has {a} {item}, buys {b} more and then gives {c} away. How many {item} does {name} have now?",
     "a + b - c"),
    ("{name} picked {a} {item} in the morning, {b} at noon and {c} in the evening. How many {item} did {name} "
     "pick altogether?", "a + b + c"),
    ("A box holds {a} {item}. {name} takes out {b} and then puts {c} back. How many {item} are in the box now?",
     "a - b + c"),
    ("{name} had {a} {item}, gave {b} to a friend and {c} to a cousin. How many {item} does {name} have left?",
     "a - b - c"),
)
#: The levels, easiest first; add one with a line: ``LEVELS["add2-wide"] = Level("sums, 10..99", 10, 99)``.
LEVELS: dict[str, Level] = {
    "add1": Level("single-digit sums, 0..9 (format-only warm-up)", 0, 9),
    "add2-small": Level("two-number sums, 1..20", 1, 20),
    "add2": Level("two-number sums, 10..60", 10, 60),
    "add3": Level("three-number sums, 1..30", 1, 30, n_operands=3),
    "sub": Level("two-number differences, 10..99, never negative", 10, 99, operators=("-",)),
    "mixed": Level("three numbers with + and -, 1..50, never negative", 1, 50, n_operands=3, operators=("+", "-")),
    "mul1": Level("single-digit products, 2..9", 2, 9, operators=("*",)),
    "word1": Level("one-step word problems, 2..30", 2, 30, templates=WORD_ONE_STEP),
    "word": Level("one- and two-step word problems, 2..30", 2, 30, templates=WORD_ONE_STEP + WORD_TWO_STEP),
    "gsm8k": Level("GSM8K: real grade-school word problems (Hub, or COURSE_GSM8K_DIR)", source="openai/gsm8k"),
}
_OPS = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}
PRESETS: dict[str, list] = {  #: reward presets ``[(reward, weight)]``; TRL logs their weighted sum as ``reward``
    "arithmetic": [(correctness_reward, 1.0), (partial_correctness_reward, 0.5), (prefilled_strict_format_reward, 0.5),
                   (prefilled_xmlcount_reward, 0.25)],
    "gsm8k": [(correctness_reward, 1.0), (numeric_answer_reward, 1.0), (prefilled_strict_format_reward, 0.5),
              (prefilled_soft_format_reward, 0.5), (prefilled_xmlcount_reward, 0.5)],
    "format-only": [(prefilled_strict_format_reward, 1.0), (prefilled_soft_format_reward, 0.5),
                    (prefilled_xmlcount_reward, 0.5)],
}


def _one_problem(rng: random.Random, level: Level) -> dict[str, str] | None:
    text, formula = rng.choice(level.templates)
    ops = formula.split()[1::2] if formula else [rng.choice(level.operators) for _ in range(level.n_operands - 1)]
    nums = [rng.randint(level.low, level.high) for _ in range(len(ops) + 1)]
    steps, value = [], nums[0]
    for op, y in zip(ops, nums[1:]):
        new = _OPS[op](value, y)
        if new < 0:
            return None
        steps.append(f"{value} {op} {y} = {new}")
        value = new
    expr = " ".join([str(nums[0])] + [f"{op} {y}" for op, y in zip(ops, nums[1:])])
    question = text.format(expr=expr, name=rng.choice(NAMES), item=rng.choice(ITEMS), **dict(zip("abc", nums)))
    return {"question": question, "answer": str(value), "solution": "\n".join(steps)}


def generate_arithmetic(n: int, level: str = "add2", seed: int = 0) -> list[dict[str, str]]:
    """``n`` distinct problems of a generated level, the same for the same ``(level, seed)``."""
    if level not in LEVELS or level == "gsm8k":
        raise ValueError(f"Unknown generated level {level!r}. Levels: {', '.join(LEVELS)} ('gsm8k' is loaded, "
                         "not generated). Add your own with LEVELS['name'] = Level(...).")
    rng, spec = random.Random(f"arithmetic:{level}:{seed}"), LEVELS[level]
    rows = distinct_rows(lambda: _one_problem(rng, spec), n, f"Level {level!r} ({spec.description})")
    return [dict(row, level=level) for row in rows]


def extract_hash_answer(text: Any) -> str | None:
    """The final answer after the last ``####`` of a GSM8K solution, normalised (``None`` without ``####``)."""
    if not isinstance(text, str) or "####" not in text:
        return None
    tail = text.rsplit("####", 1)[1].strip()
    return normalize_number(tail) or tail


def solution_text(gsm8k_answer: str) -> str:
    """The worked solution of a GSM8K answer: before ``####``, calculator notes ``<<...>>`` removed."""
    return re.sub(r"<<[^>]*>>", "", str(gsm8k_answer).rsplit("####", 1)[0]).strip()


def load_gsm8k(source: str | Path | None = None) -> Any:
    """GSM8K's splits from a folder of ``train.jsonl``/``test.jsonl`` (``source``, ``$COURSE_GSM8K_DIR``) or the Hub."""
    from datasets import load_dataset
    source = source or os.environ.get(GSM8K_DIR_ENV, "").strip()
    if source:
        files = {s: str(Path(source) / f"{s}.jsonl") for s in ("train", "test")}
        missing = [f for f in files.values() if not Path(f).is_file()]
        if missing:
            raise FileNotFoundError(f"No GSM8K file at {missing[0]}: give a folder holding train.jsonl and "
                                    "test.jsonl (one JSON object per line with 'question' and 'answer').")
        return load_dataset("json", data_files=files)
    try:
        return load_dataset("openai/gsm8k", "main")
    except Exception as exc:  # noqa: BLE001 - offline, auth or cache: the same advice
        raise ConnectionError(f"Could not load 'openai/gsm8k' from the Hub ({type(exc).__name__}: {exc}). Offline, set "
                              f"{GSM8K_DIR_ENV} to a folder with train.jsonl and test.jsonl, or use a CPU profile "
                              "(COURSE_PROFILE=cpu-demo): its levels need no download.") from exc


class ArithmeticTask(Task):
    """Sums in levels (CPU profiles) and GSM8K (GPU profiles), in the ``<reasoning>``/``<answer>`` format."""

    name = "arithmetic"
    system_prompt = SYSTEM_PROMPT
    prefill = PREFILL
    levels = LEVELS
    rewards = PRESETS["arithmetic"]
    headline, format_metric = "accuracy", "format"
    min_completion_tokens = 20

    def make_rows(self, level: str, n: int, seed: int) -> Any:
        if level != "gsm8k":
            return generate_arithmetic(n, level, seed)
        gsm8k = load_gsm8k()
        split = {"train": gsm8k["train"], "eval": gsm8k["test"]}
        return {k: [dict(question=r["question"], answer=extract_hash_answer(r["answer"]), level="gsm8k",
                         solution=solution_text(r["answer"])) for r in v] for k, v in split.items()}

    def reference(self, row: Mapping[str, Any]) -> str:
        return reference_completion(row.get("solution") or str(row["answer"]), str(row["answer"]))

    def score(self, text: str, row: Mapping[str, Any]) -> dict[str, float]:
        correct, fmt = answer_matches(extract_answer(text), row["answer"]), has_strict_format(text)
        return {"accuracy": float(correct and fmt), "correct": float(correct), "format": float(fmt)}

    def clean_answer(self, row: Mapping[str, Any]) -> str:
        """A number string from a number, ``1,200``, ``$18`` or a GSM8K ``#### 72`` solution."""
        raw = "" if row.get("answer") is None else str(row["answer"]).strip()
        if not raw:
            raise ValueError("the answer is missing: write the final answer, e.g. 42")
        value = extract_hash_answer(raw) if "####" in raw else normalize_number(raw)
        if normalize_number(value) is None:
            raise ValueError(f"{raw[:40]!r} is not a number: write the answer as digits, e.g. 12 ($, % and 1,000 "
                             "are fine; a GSM8K solution ends with '#### 42')")
        return value

    def rewards_for(self, level: str) -> list:
        return list(PRESETS["gsm8k" if level == "gsm8k" else "arithmetic"])

    def settings(self, profile: Any) -> dict[str, Any]:
        gpu = profile.backend == "unsloth"
        return {"task_level": "gsm8k" if gpu else "add2", "warmup_level": "add1", "max_completion_length":
                256 if gpu else 32}

"""The ``<reasoning>``/``<answer>`` format and its rewards; :func:`answer_matches` is THE rule for a right answer.

Serves notebooks 02, 04, 05 and 08 (and every task in this format).

Example:
    >>> correctness_reward(["7\\n</reasoning>\\n<answer>\\n7\\n</answer>", "<answer>8</answer>"], answer=["7", "7"])
    [2.0, 0.0]
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any, Callable, Sequence

from ..rewards import Prefilled, completion_text, completion_texts

REASONING_START, REASONING_END, ANSWER_START, ANSWER_END = "<reasoning>", "</reasoning>", "<answer>", "</answer>"
TAGS = (REASONING_START, REASONING_END, ANSWER_START, ANSWER_END)
PREFILL = REASONING_START + "\n"
SYSTEM_PROMPT = (f"Respond in the following format:\n{REASONING_START}\n...\n{REASONING_END}\n"
                 f"{ANSWER_START}\n...\n{ANSWER_END}")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?")
_DIGIT_SPACE_DIGIT = re.compile(r"\d\s+[\d.]|[\d.]\s+\d")
_NUMBER_IN_TEXT = re.compile(r"(?<![\w.])[+-]?\$?\d[\d,]*(?:\.\d+)?")
_STRICT = re.compile(re.escape(REASONING_START) + r"[ \t]*\n(.*?)\n[ \t]*" + re.escape(REASONING_END) + r"\s*"
                     + re.escape(ANSWER_START) + r"[ \t]*\n(.*?)\n[ \t]*" + re.escape(ANSWER_END), re.DOTALL)


def reference_completion(solution: str, answer: str) -> str:
    """A completion in the format (the warm-up's targets, test cases)."""
    return f"{REASONING_START}\n{solution}\n{REASONING_END}\n{ANSWER_START}\n{answer}\n{ANSWER_END}"


def _last_block(text: str, start_tag: str, end_tag: str) -> str | None:
    end = text.rfind(end_tag)
    start = text.rfind(start_tag, 0, end) if end >= 0 else -1
    return None if start < 0 else text[start + len(start_tag):end].strip()


def extract_answer(text: Any) -> str | None:
    """The stripped content of the last *complete* ``<answer>`` block (a completion cut off has none)."""
    return _last_block(completion_text(text), ANSWER_START, ANSWER_END)


def extract_reasoning(text: Any) -> str | None:
    """The stripped content of the last complete ``<reasoning>`` block, or ``None``."""
    return _last_block(completion_text(text), REASONING_START, REASONING_END)


def normalize_number(text: Any) -> str | None:
    """One canonical string for a single number written as text (``$``, ``%``, ``1,000``, ``18.00``), else ``None``."""
    try:
        if text is None or isinstance(text, bool) or len(str(text)) > 200:  # no answer is longer: bounded work
            return None
        s = str(text).strip().replace("\u2212", "-").replace("$", "").replace("%", "")
        if _DIGIT_SPACE_DIGIT.search(s):
            return None  # "1 2" is two numbers
        s = "".join(s.split()).removesuffix(".")
        if "," in s and not _THOUSANDS.fullmatch(s):
            return None
        s = s.replace(",", "")
        if not _NUMBER.fullmatch(s):
            return None
        whole, _, frac = s.lstrip("+-").partition(".")
        out = (whole.lstrip("0") or "0") + ("." + frac.rstrip("0") if frac.rstrip("0") else "")
        return "-" + out if s.startswith("-") and out != "0" else out
    except Exception:  # noqa: BLE001
        return None


def find_numbers(text: Any, limit: int = 1000) -> list[str]:
    """Every number in the text, normalised, in order; of the last ``limit`` candidates only (bounded work)."""
    last = deque(_NUMBER_IN_TEXT.finditer(completion_text(text)), maxlen=limit)
    return [n for n in (normalize_number(m.group(0).rstrip(",")) for m in last) if n is not None]


def answer_matches(pred: Any, gold: Any) -> bool:
    """THE right answer: equal numbers once normalised, or equal stripped text where the gold is not a number."""
    if pred is None or gold is None:
        return False
    pred, gold = str(pred).strip(), str(gold).strip()
    gold_number = normalize_number(gold)
    return bool(pred) and (pred == gold if gold_number is None else normalize_number(pred) == gold_number)


def has_strict_format(text: Any) -> bool:
    """One reasoning block then one answer block, each tag on its own line, both non-empty, nothing else."""
    t = completion_text(text).strip()
    if any(t.count(tag) != 1 for tag in TAGS):
        return False
    m = _STRICT.fullmatch(t)
    return bool(m and m.group(1).strip() and m.group(2).strip())


def strict_format_reward(completions: Any, **kwargs: Any) -> list[float]:
    """1.0 when the completion is exactly the format (:func:`has_strict_format`); else 0.0."""
    return [1.0 if has_strict_format(t) else 0.0 for t in completion_texts(completions)]


def soft_format_reward(completions: Any, **kwargs: Any) -> list[float]:
    """1.0 when a complete reasoning block comes before a complete answer block, anywhere; else 0.0."""
    out = []
    for t in completion_texts(completions):
        r = t.find(REASONING_START)
        r_end = t.find(REASONING_END, r) if r >= 0 else -1
        a = t.find(ANSWER_START, r_end) if r_end >= 0 else -1
        out.append(1.0 if a >= 0 and t.find(ANSWER_END, a) >= 0 else 0.0)
    return out


def xmlcount_reward(completions: Any, **kwargs: Any) -> list[float]:
    """Per tag +0.25 if used once, -0.125 if repeated; -0.001 a character after ``</answer>`` (to -0.5); in [-1, 1]."""
    out = []
    for t in completion_texts(completions):
        score = sum(0.25 if t.count(tag) == 1 else -0.125 if t.count(tag) > 1 else 0.0 for tag in TAGS)
        end = t.rfind(ANSWER_END)
        if end >= 0:
            score -= min(0.5, 0.001 * len(t[end + len(ANSWER_END):].strip()))
        out.append(max(-1.0, min(1.0, score)))
    return out


def correctness_reward(completions: Any, answer: Sequence[Any], log_extra: Callable | None = None,
                       **kwargs: Any) -> list[float]:
    """2.0 when the last ``<answer>`` block matches ``answer`` (:func:`answer_matches`), else 0.0; logs both."""
    preds = [extract_answer(t) for t in completion_texts(completions)]
    if log_extra is not None:
        log_extra("answer", ["" if a is None else str(a) for a in answer])
        log_extra("extracted", ["" if p is None else p for p in preds])
    return [2.0 if answer_matches(p, a) else 0.0 for p, a in zip(preds, answer)]


def numeric_answer_reward(completions: Any, **kwargs: Any) -> list[float]:
    """0.5 when the answer block holds a single number (right or wrong); else 0.0."""
    return [0.5 if normalize_number(extract_answer(t)) is not None else 0.0 for t in completion_texts(completions)]


def partial_correctness_reward(completions: Any, answer: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """1.0 right answer block, 0.5 right number in it, 0.25 right last number anywhere; None for a non-number gold."""
    out: list[float | None] = []
    for t, gold in zip(completion_texts(completions), answer):
        g, block = normalize_number(gold), extract_answer(t)
        if g is None:
            out.append(None)
        elif block is not None and normalize_number(block) == g:
            out.append(1.0)
        elif block is not None and g in find_numbers(block):
            out.append(0.5)
        else:
            last = find_numbers(t.replace(ANSWER_END, " ").replace(REASONING_END, " "), limit=64)[-1:]
            out.append(0.25 if last == [g] else 0.0)
    return out


prefilled_strict_format_reward = Prefilled(strict_format_reward, PREFILL)
prefilled_soft_format_reward = Prefilled(soft_format_reward, PREFILL)
prefilled_xmlcount_reward = Prefilled(xmlcount_reward, PREFILL)

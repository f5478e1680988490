"""The course's reward functions, hardened, in TRL's convention.

TRL's ``GRPOTrainer`` calls every reward as
``f(prompts=..., completions=..., completion_ids=..., **kwargs)``: the kwargs
carry every dataset column except ``prompt`` as a list (``answer=[...]``), plus
``trainer_state``, ``log_extra`` and ``log_metric``. Each reward here:

- accepts plain-string completions *and* conversational ones
  (``[{"role": "assistant", "content": ...}]``), and odd objects;
- returns one float per completion (``None`` only where documented: "does not
  apply", which TRL skips);
- never raises on a completion, whatever its text: a completion that cannot be
  read scores as empty text.

Notebook 02 writes the plain versions of the format and correctness rewards in
its cells, then tests these against them. The prefill (``<reasoning>\\n``, put
into the chat template's generation prompt by
:func:`helpers.prompts.install_prefill`) is not part of the completion TRL
hands over: the ``prefilled_*`` format rewards put it back before checking.

Example:
    >>> good = "<reasoning>\\n15 + 27 = 42\\n</reasoning>\\n<answer>\\n42\\n</answer>"
    >>> correctness_reward(completions=[good, "42"], answer=["42", "42"])
    [2.0, 0.0]
    >>> strict_format_reward(completions=[[{"role": "assistant", "content": good}]])
    [1.0]
    >>> prefilled_strict_format_reward(completions=[good[len("<reasoning>\\n"):]])
    [1.0]
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any, Callable, Sequence

from .prompts import ANSWER_END, ANSWER_START, PREFILL, REASONING_END, REASONING_START

RewardFunc = Callable[..., list]
_TAGS = (REASONING_START, REASONING_END, ANSWER_START, ANSWER_END)


# --------------------------------------------------------------------------- reading completions


def completion_text(completion: Any) -> str:
    """The text of one completion, plain or conversational; ``""`` for ``None`` or an unreadable object.

    Example:
        >>> completion_text([{"role": "assistant", "content": "hi"}]), completion_text(None)
        ('hi', '')
    """
    try:
        if completion is None:
            return ""
        if isinstance(completion, str):
            return completion
        if isinstance(completion, dict):
            completion = [completion]
        if isinstance(completion, (list, tuple)):
            msgs = [m for m in completion if isinstance(m, dict)]
            chosen = [m for m in msgs if m.get("role") == "assistant"] or msgs
            return "\n".join(_content(m.get("content")) for m in chosen)
        return str(completion)
    except Exception:  # noqa: BLE001 - a reward never raises
        return ""


def _content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, (list, tuple)):  # multimodal parts: [{"type": "text", "text": ...}]
        return "".join(_content(p.get("text")) if isinstance(p, dict) else _content(p) for p in content)
    return str(content)


def completion_texts(completions: Any) -> list[str]:
    """:func:`completion_text` of each completion (``None`` gives ``[]``).

    Example:
        >>> completion_texts(["a", [{"role": "assistant", "content": "b"}]])
        ['a', 'b']
    """
    if completions is None:
        return []
    if isinstance(completions, str):
        return [completions]
    try:
        return [completion_text(c) for c in completions]
    except TypeError:  # not iterable
        return [completion_text(completions)]


def _last_block(text: str, start_tag: str, end_tag: str) -> str | None:
    end = text.rfind(end_tag)
    start = text.rfind(start_tag, 0, end) if end >= 0 else -1
    return None if start < 0 else text[start + len(start_tag):end].strip()


def extract_answer(text: Any) -> str | None:
    """The stripped content of the last *complete* ``<answer>...</answer>`` block, or ``None``.

    Last, because a model that corrects itself does so at the end; complete,
    because a completion cut at ``max_completion_length`` has no answer.

    Example:
        >>> extract_answer("<answer>\\n 41 \\n</answer> no, <answer>42</answer>"), extract_answer("<answer>42")
        ('42', None)
    """
    return _last_block(completion_text(text), ANSWER_START, ANSWER_END)


def extract_reasoning(text: Any) -> str | None:
    """The stripped content of the last complete ``<reasoning>...</reasoning>`` block, or ``None``.

    Example:
        >>> extract_reasoning("<reasoning>\\n2 + 2 = 4\\n</reasoning>")
        '2 + 2 = 4'
    """
    return _last_block(completion_text(text), REASONING_START, REASONING_END)


_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?")
_DIGIT_SPACE_DIGIT = re.compile(r"\d\s+[\d.]|[\d.]\s+\d")
_NUMBER_IN_TEXT = re.compile(r"(?<![\w.])[+-]?\$?\d[\d,]*(?:\.\d+)?")


def normalize_number(text: Any) -> str | None:
    """One canonical string for a number written as text, or ``None`` unless it is a single number.

    Drops ``$``, ``%``, thousands commas, spaces, a trailing period, a leading
    ``+`` and zeros, and trailing zeros after a decimal point. Gold answers
    (notebook 01) and the model's answers go through this same function.

    Example:
        >>> [normalize_number(s) for s in ["$1,234", "18.00", "3.50", "-7", "42.", "1 2", "x"]]
        ['1234', '18', '3.5', '-7', '42', None, None]
    """
    try:
        if text is None or isinstance(text, bool):
            return None
        s = str(text)
        if len(s) > 200:  # no answer is this long; keeps the work bounded
            return None
        s = s.strip().replace("\u2212", "-").replace("$", "").replace("%", "")
        if _DIGIT_SPACE_DIGIT.search(s):
            return None  # "1 2" is two numbers
        s = "".join(s.split()).removesuffix(".")
        if "," in s:
            if not _THOUSANDS.fullmatch(s):
                return None
            s = s.replace(",", "")
        if not _NUMBER.fullmatch(s):
            return None
        sign = "-" if s.startswith("-") else ""
        whole, _, frac = s.lstrip("+-").partition(".")
        out = (whole.lstrip("0") or "0") + ("." + frac.rstrip("0") if frac.rstrip("0") else "")
        return out if out == "0" else sign + out
    except Exception:  # noqa: BLE001
        return None


def find_numbers(text: Any, limit: int = 1000) -> list[str]:
    """Every number in the text, normalised, in order (at most ``limit``).

    Example:
        >>> find_numbers("15 + 27 = 42, so $1,042.50 in all.")
        ['15', '27', '42', '1042.5']
    """
    out: list[str] = []
    for m in _NUMBER_IN_TEXT.finditer(completion_text(text)):
        n = normalize_number(m.group(0).rstrip(","))
        if n is not None:
            out.append(n)
            if len(out) >= limit:
                break
    return out


def _last_number(text: str) -> str | None:
    """The last number of the text, normalised (:func:`find_numbers` stops at its limit)."""
    for m in reversed(deque(_NUMBER_IN_TEXT.finditer(text), maxlen=64)):
        n = normalize_number(m.group(0).rstrip(","))
        if n is not None:
            return n
    return None


def answer_matches(pred: Any, gold: Any) -> bool:
    """THE course's definition of a right answer: equal numbers once normalised, or, when the
    gold answer is not a number, equal stripped text. Used by the rewards and the evaluation.

    Example:
        >>> answer_matches("$1,080.00", "1080"), answer_matches("Paris", "Paris"), answer_matches(None, "4")
        (True, True, False)
    """
    if pred is None or gold is None:
        return False
    p, g = str(pred).strip(), str(gold).strip()
    if not p or not g:
        return False
    gold_number = normalize_number(g)
    return normalize_number(p) == gold_number if gold_number is not None else p == g


# --------------------------------------------------------------------------- format rewards

_STRICT = re.compile(
    re.escape(REASONING_START) + r"[ \t]*\n(.*?)\n[ \t]*" + re.escape(REASONING_END) + r"\s*"
    + re.escape(ANSWER_START) + r"[ \t]*\n(.*?)\n[ \t]*" + re.escape(ANSWER_END), re.DOTALL)


def has_strict_format(text: Any) -> bool:
    """True when the text (outer whitespace aside) is one reasoning block then one answer block,
    each tag on its own line, both non-empty. DOTALL: multi-line reasoning is fine.

    Example:
        >>> has_strict_format("<reasoning>\\nfirst\\nthen\\n</reasoning>\\n<answer>\\n4\\n</answer>")
        True
    """
    t = completion_text(text).strip()
    if any(t.count(tag) != 1 for tag in _TAGS):
        return False
    m = _STRICT.fullmatch(t)
    return bool(m and m.group(1).strip() and m.group(2).strip())


def strict_format_reward(completions: Any, **kwargs: Any) -> list[float]:
    """1.0 when the completion is exactly the course format (:func:`has_strict_format`); else 0.0."""
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
    """Partial credit per tag: +0.25 for each tag used exactly once, -0.125 for each repeated tag,
    -0.001 per character after the last ``</answer>`` (at most -0.5); clamped to [-1, 1]."""
    out = []
    for t in completion_texts(completions):
        score = sum(0.25 if t.count(tag) == 1 else -0.125 if t.count(tag) > 1 else 0.0 for tag in _TAGS)
        end = t.rfind(ANSWER_END)
        if end >= 0:
            score -= min(0.5, 0.001 * len(t[end + len(ANSWER_END):].strip()))
        out.append(max(-1.0, min(1.0, score)))
    return out


def get_prefilled_reward(reward: RewardFunc, prefill: str = PREFILL) -> RewardFunc:
    """``reward`` scored on ``prefill + completion``: for prompts whose template prefilled the opening tag.

    The completion TRL hands over starts *after* the prefill (TRL #6966), so a
    format reward would score a perfect answer 0. A model that writes the tag
    again shows it twice, which the format rewards count as the error it is.
    Named ``prefilled_<name>`` (TRL logs rewards by name).

    Example:
        >>> r = get_prefilled_reward(strict_format_reward, "<reasoning>\\n")
        >>> r(completions=["5 + 8 = 13\\n</reasoning>\\n<answer>\\n13\\n</answer>", "13"]), r.__name__
        ([1.0, 0.0], 'prefilled_strict_format_reward')
    """
    def prefilled(completions: Any, **kwargs: Any) -> list:
        return reward(completions=[prefill + t for t in completion_texts(completions)], **kwargs)

    prefilled.__name__ = prefilled.__qualname__ = f"prefilled_{reward.__name__}"
    prefilled.__doc__ = f"{reward.__name__} on {prefill!r} + completion (the template prefilled it)."
    return prefilled


prefilled_strict_format_reward = get_prefilled_reward(strict_format_reward)
prefilled_soft_format_reward = get_prefilled_reward(soft_format_reward)
prefilled_xmlcount_reward = get_prefilled_reward(xmlcount_reward)


# --------------------------------------------------------------------------- answer rewards


def correctness_reward(completions: Any, answer: Sequence[Any], log_extra: Callable | None = None,
                       **kwargs: Any) -> list[float]:
    """2.0 when the last ``<answer>`` block matches the gold ``answer`` (:func:`answer_matches`); else 0.0.

    Inside TRL it also logs the gold answer and what it extracted to the
    completions table (``log_extra``, a callable TRL passes to every reward).
    """
    preds = [extract_answer(t) for t in completion_texts(completions)]
    if log_extra is not None:
        log_extra("answer", ["" if a is None else str(a) for a in answer])
        log_extra("extracted", ["" if p is None else p for p in preds])
    return [2.0 if answer_matches(p, a) else 0.0 for p, a in zip(preds, answer)]


def numeric_answer_reward(completions: Any, **kwargs: Any) -> list[float]:
    """0.5 when the answer block holds a single number (right or wrong); else 0.0."""
    return [0.5 if normalize_number(extract_answer(t)) is not None else 0.0
            for t in completion_texts(completions)]


def partial_correctness_reward(completions: Any, answer: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """A gentler slope for a small model: 1.0 when the answer block is the right number, 0.5 when
    the right number is one of several in it, 0.25 when the *last* number anywhere is right (tags or
    not), else 0.0. The last number, not any number, so listing numbers does not pay. ``None``
    when the gold answer is not a number.

    Example:
        >>> partial_correctness_reward(["<answer>13</answer>", "<answer>5+8=13</answer>", "5 + 8 = 13",
        ...                             "13 or 12"], answer=["13"] * 4)
        [1.0, 0.5, 0.25, 0.0]
    """
    out: list[float | None] = []
    for t, gold in zip(completion_texts(completions), answer):
        g = normalize_number(gold)
        block = extract_answer(t)
        if g is None:
            out.append(None)
        elif block is not None and normalize_number(block) == g:
            out.append(1.0)
        elif block is not None and g in find_numbers(block):
            out.append(0.5)
        else:
            last = _last_number(t.replace(ANSWER_END, " ").replace(REASONING_END, " "))
            out.append(0.25 if last == g else 0.0)
    return out


def get_target_length_reward(target: int, unit: str = "words") -> RewardFunc:
    """1.0 at ``target`` length, falling linearly to 0.0 at 0 and at twice the target:
    a length term that cannot be farmed by writing more. ``unit``: "words", "chars" or
    "tokens" (from ``completion_ids``).

    Example:
        >>> r = get_target_length_reward(10)
        >>> r(completions=["one two three four five", " ".join(["w"] * 10), " ".join(["w"] * 30)])
        [0.5, 1.0, 0.0]
    """
    if target <= 0 or unit not in ("words", "chars", "tokens"):
        raise ValueError(f"target must be > 0 and unit one of words/chars/tokens (got {target}, {unit!r}).")

    def target_length(completions: Any, completion_ids: Any = None, **kwargs: Any) -> list[float | None]:
        texts = completion_texts(completions)
        if unit == "tokens":
            if completion_ids is None:  # called outside a trainer without ids: does not apply
                return [None] * len(texts)
            sizes = [len(ids) for ids in completion_ids]
        else:
            sizes = [len(t.split()) if unit == "words" else len(t) for t in texts]
        return [max(0.0, 1.0 - abs(n - target) / target) for n in sizes]

    target_length.__name__ = f"target_length_{target}_{unit}_reward"
    return target_length


# --------------------------------------------------------------------------- presets

#: What each preset rewards, as the most each reward adds to the weighted total.
PRESETS: dict[str, str] = {
    "format-only": "the format only: strict 1.0 + soft 0.5 + xmlcount 0.5 (at most 2.0)",
    "arithmetic": "synthetic sums: correctness 2.0 + partial credit 0.5 + strict format 0.5 + xmlcount 0.25 "
                  "(at most 3.25)",
    "gsm8k": "GSM8K: correctness 2.0 + numeric answer 0.5 + strict format 0.5 + soft format 0.5 + xmlcount 0.5 "
             "(at most 4.0)",
}


def get_preset(name: str, prefill: str | None = PREFILL) -> list[tuple[RewardFunc, float]]:
    """``[(reward_function, weight), ...]`` of a course task, its format rewards matched to ``prefill``.

    Pass ``[f for f, _ in preset]`` to ``GRPOTrainer(reward_funcs=...)`` and
    ``[w for _, w in preset]`` to ``GRPOConfig(reward_weights=...)``: TRL sums
    ``weight x score`` into the ``reward`` it logs and ranks.

    Example:
        >>> [(f.__name__, w) for f, w in get_preset("format-only")]
        [('prefilled_strict_format_reward', 1.0), ('prefilled_soft_format_reward', 0.5), ('prefilled_xmlcount_reward', 0.5)]
        >>> [f.__name__ for f, _ in get_preset("format-only", prefill="")][0]
        'strict_format_reward'
    """
    def fmt(reward: RewardFunc) -> RewardFunc:
        if not prefill:
            return reward
        if prefill == PREFILL:  # the module-level instances: importable by name (trl grpo recipes)
            return globals()[f"prefilled_{reward.__name__}"]
        return get_prefilled_reward(reward, prefill)

    presets = {
        "format-only": [(fmt(strict_format_reward), 1.0), (fmt(soft_format_reward), 0.5),
                        (fmt(xmlcount_reward), 0.5)],
        "arithmetic": [(correctness_reward, 1.0), (partial_correctness_reward, 0.5),
                       (fmt(strict_format_reward), 0.5), (fmt(xmlcount_reward), 0.25)],
        "gsm8k": [(correctness_reward, 1.0), (numeric_answer_reward, 1.0), (fmt(strict_format_reward), 0.5),
                  (fmt(soft_format_reward), 0.5), (fmt(xmlcount_reward), 0.5)],
    }
    if name not in presets:
        raise ValueError(f"Unknown reward preset {name!r}. Valid presets: {', '.join(PRESETS)}.")
    return presets[name]

"""Reward plumbing in TRL's convention: ``f(completions, **columns)`` -> a float or ``None`` each, never raising.

Serves notebooks 02, 04, 05 and 08 (and every task's rewards).

Example:
    >>> completion_texts(["plain", [{"role": "assistant", "content": "chat"}]])
    ['plain', 'chat']
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

RewardFunc = Callable[..., list]


def completion_text(completion: Any) -> str:
    """The text of one completion, plain or conversational; ``""`` for ``None`` or an unreadable object."""
    try:
        if isinstance(completion, dict):
            completion = [completion]
        if isinstance(completion, (list, tuple)):
            messages = [m for m in completion if isinstance(m, dict)]
            chosen = [m for m in messages if m.get("role") == "assistant"] or messages
            return "\n".join(_content(m.get("content")) for m in chosen)
        return _content(completion)
    except Exception:  # noqa: BLE001 - a reward never raises
        return ""


def _content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, (list, tuple)):  # multimodal parts: [{"type": "text", "text": ...}]
        return "".join(_content(p.get("text")) if isinstance(p, dict) else _content(p) for p in content)
    return str(content)


def completion_texts(completions: Any) -> list[str]:
    """:func:`completion_text` of each completion (``None`` gives ``[]``)."""
    if completions is None:
        return []
    if isinstance(completions, str):
        return [completions]
    try:
        return [completion_text(c) for c in completions]
    except TypeError:  # not iterable
        return [completion_text(completions)]


class Prefilled:
    """``reward`` on ``prefill + completion`` (TRL passes the completion without it, trl #6966); a class: it pickles."""

    def __init__(self, reward: RewardFunc, prefill: str) -> None:
        self.reward, self.prefill = reward, prefill
        self.__name__ = f"prefilled_{getattr(reward, '__name__', type(reward).__name__)}"  # TRL logs rewards by name
        self.__doc__ = f"{self.__name__[10:]} on {prefill!r} + completion (the chat template wrote the prefill)."

    def __call__(self, completions: Any = None, **kwargs: Any) -> list:
        return self.reward(completions=[self.prefill + t for t in completion_texts(completions)], **kwargs)

    def __repr__(self) -> str:
        return f"Prefilled({getattr(self.reward, '__name__', self.reward)!s}, {self.prefill!r})"


def clip(text: Any, width: int | None) -> str:
    """``text`` on one line (a newline shown as ↵), cut to ``width`` characters (``None``: not cut)."""
    text = str(text).replace("\n", " \u21b5 ")
    return text if width is None or len(text) <= width else text[: width - 1] + "\u2026"


def weighted(rewards: Any) -> list[tuple[str, Any, float]]:
    """``[(name, function, weight)]`` from a function, functions, or ``(function, weight)`` pairs, names distinct."""
    out = []
    for item in [rewards] if callable(rewards) else list(rewards):
        func, weight = item if isinstance(item, tuple) else (item, 1.0)
        if not callable(func):
            raise TypeError(f"Expected a reward function or a (function, weight) pair, got {item!r}.")
        out.append((getattr(func, "__name__", type(func).__name__), func, float(weight)))
    dupes = sorted(name for name, count in Counter(name for name, _, _ in out).items() if count > 1)
    if dupes:
        raise ValueError(f"Two rewards share the name(s) {dupes}: TRL logs rewards by __name__, so give each "
                         "function a distinct name.")
    return out

"""Rewards for one JSON object that fits the row's ``schema`` and holds its ``answer``; bounded, never raising.

Serves notebook 05 (through the JSON task, helpers.tasks.orders).

Example:
    >>> find_json_object('Sure: {"item": "tea"} done')
    JsonFind(obj={'item': 'tea'}, outside='Sure: done', error='')
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from ..rewards import completion_texts

MAX_CHARS = 20_000  # longer completions are not answers: not searched
MAX_DEPTH = 20  # objects nested deeper are refused
MAX_STARTS = 16  # how many "{" a completion is searched from
_DECODER = json.JSONDecoder(parse_constant=int)  # int("NaN") raises ValueError: NaN and Infinity are not JSON


def _too_deep(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            if d > MAX_DEPTH:
                return True
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return False


@dataclass(frozen=True)
class JsonFind:
    """The object found (or None), the text around it (``clean``: none), and why none was found."""

    obj: dict | None
    outside: str = ""
    error: str = ""

    @property
    def clean(self) -> bool:
        return self.obj is not None and not self.outside


def find_json_object(text: Any) -> JsonFind:
    """The first JSON *object* in the text, tried from each ``{`` (prose or a code fence around it is ``outside``)."""
    try:
        t = completion_texts([text])[0]
        if len(t) > MAX_CHARS:
            return JsonFind(None, error=f"longer than {MAX_CHARS} characters")
        start, tries = t.find("{"), 0
        while start >= 0 and tries < MAX_STARTS:
            tries += 1
            try:
                obj, end = _DECODER.raw_decode(t, start)
            except (ValueError, RecursionError):
                start = t.find("{", start + 1)
                continue
            if _too_deep(obj):
                return JsonFind(None, error=f"nested deeper than {MAX_DEPTH} levels")
            return JsonFind(obj, outside=" ".join((t[:start] + " " + t[end:]).split()))
        return JsonFind(None, error="no complete JSON object")
    except Exception as exc:  # noqa: BLE001 - a reward never raises
        return JsonFind(None, error=type(exc).__name__)


def as_object(value: Any) -> dict | None:
    """An expected answer (a dict, or JSON text of one) as a dict; None when it is neither."""
    if isinstance(value, dict):
        return value
    try:
        obj = json.loads(value) if isinstance(value, (str, bytes)) and len(value) <= MAX_CHARS else None
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def same_value(got: Any, want: Any) -> bool:
    """THE field rule: strings equal ignoring case and outer spaces, numbers as numbers (not booleans or strings)."""
    if isinstance(want, str):
        return isinstance(got, str) and got.strip().casefold() == want.strip().casefold()
    if isinstance(want, bool) or isinstance(got, bool):
        return isinstance(got, bool) and isinstance(want, bool) and got == want
    if isinstance(want, (int, float)):
        return isinstance(got, (int, float)) and got == want
    return got == want


def is_exact_match(obj: Any, expected: Any) -> bool:
    """``obj`` has exactly the expected keys, each value right (:func:`same_value`)."""
    want = as_object(expected)
    return (isinstance(obj, dict) and want is not None and set(obj) == set(want)
            and all(same_value(obj[k], v) for k, v in want.items()))


@lru_cache(maxsize=64)
def _validator(schema_text: str) -> Any:
    from jsonschema import Draft202012Validator
    schema = json.loads(schema_text)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def schema_errors(obj: Any, schema: Any) -> list[str] | None:
    """The schema's complaints about ``obj`` (``[]``: valid), or None when the schema itself is unusable."""
    try:
        text = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True)
        return [e.message for e in _validator(text).iter_errors(obj)][:10]
    except Exception:  # noqa: BLE001 - a bad schema means "cannot judge", never a crash
        return None


def _found(completions: Any, *columns: Any) -> list[tuple]:
    """Each completion's :func:`find_json_object`, beside its row's value of each column (a lone value: every row's)."""
    found = [find_json_object(t) for t in completion_texts(completions)]
    n = len(found)
    aligned = [[c] * n if c is None or isinstance(c, (str, dict)) else (list(c) + [None] * n)[:n]
               for c in columns]  # a lone value (None, a text, an object) stands for every row
    return list(zip(found, *aligned))


def json_format_reward(completions: Any, **kwargs: Any) -> list[float]:
    """1.0 when the completion is exactly one JSON object, 0.5 when one is found among other text, else 0.0."""
    return [1.0 if f.clean else 0.5 if f.obj is not None else 0.0
            for f in map(find_json_object, completion_texts(completions))]


def schema_valid_reward(completions: Any, schema: Any = None, **kwargs: Any) -> list[float | None]:
    """1.0 when the object satisfies the row's ``schema``, else 0.0; ``None`` without a usable schema."""
    checked = [(f, None if s is None else schema_errors(f.obj, s)) for f, s in _found(completions, schema)]
    return [None if errors is None else float(f.obj is not None and not errors) for f, errors in checked]


def field_match_reward(completions: Any, answer: Any = None, log_extra: Callable | None = None,
                       **kwargs: Any) -> list[float | None]:
    """The share of expected fields right; 0.0 without an object, ``None`` for a non-object answer; logs both."""
    rows = _found(completions, answer)
    if log_extra is not None:
        log_extra("expected", ["" if a is None else str(a) for _, a in rows])
        log_extra("extracted", ["" if f.obj is None else json.dumps(f.obj)[:500] for f, _ in rows])
    wants = [as_object(a) for _, a in rows]
    return [None if not want else 0.0 if f.obj is None else
            sum(k in f.obj and same_value(f.obj[k], v) for k, v in want.items()) / len(want)
            for (f, _), want in zip(rows, wants)]


def exact_match_reward(completions: Any, answer: Any = None, **kwargs: Any) -> list[float | None]:
    """1.0 when the object is exactly the expected one, else 0.0; ``None`` when the answer is not an object."""
    return [None if as_object(a) is None else float(is_exact_match(f.obj, a)) for f, a in _found(completions, answer)]


def json_extras_penalty(completions: Any, schema: Any = None, answer: Any = None, **kwargs: Any) -> list[float]:
    """-0.25 per key unknown to the schema (else the answer), to -0.75, and -0.25 for text around; 0.0 without one."""
    out = []
    for f, sch, ans in _found(completions, schema, answer):
        if f.obj is None:
            out.append(0.0)
            continue
        known = (as_object(sch) or {}).get("properties")
        known = known if isinstance(known, dict) else as_object(ans)
        extra = 0 if known is None else sum(k not in known for k in f.obj)
        out.append(0.0 - min(0.75, 0.25 * extra) - (0.25 if f.outside else 0.0))
    return out

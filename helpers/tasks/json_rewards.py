"""Rewards for structured output: one JSON object, valid against a schema, with the right fields.

TRL's convention like every course reward (:mod:`helpers.rewards`), never raising, whatever the text:
huge, cut off, nested a thousand levels deep (the work is bounded by :data:`MAX_CHARS`,
:data:`MAX_DEPTH` and :data:`MAX_STARTS`). The rows carry ``answer`` (the expected object as JSON text)
and ``schema`` (its JSON Schema, checked by ``jsonschema``); the rewards read both as keywords.

Example:
    >>> find_json_object('Sure! ```json\\n{"a": 1}\\n``` Done.').obj
    {'a': 1}
    >>> field_match_reward(['{"name": "Ava", "quantity": 3}'], answer=['{"name": "Ava", "quantity": 2}'])
    [0.5]
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from ..rewards import completion_texts

#: Longer completions are not answers: they are not searched (keeps every reward's time bounded).
MAX_CHARS = 20_000
#: Objects nested deeper than this are refused (Python's parser refuses far deeper ones itself).
MAX_DEPTH = 20
#: How many ``{`` a completion is searched from before giving up.
MAX_STARTS = 16


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _depth(value: Any) -> int:
    """Nesting depth of a parsed value (iterative: no recursion limit to hit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if d > MAX_DEPTH:
                return d
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


@dataclass(frozen=True)
class JsonFind:
    """What :func:`find_json_object` found: the object (or None), the text around it, why none."""

    obj: dict | None
    outside: str = ""
    error: str = ""

    @property
    def clean(self) -> bool:
        """True when the completion is the object and nothing else (whitespace aside)."""
        return self.obj is not None and not self.outside


def find_json_object(text: Any) -> JsonFind:
    """The first JSON *object* in the text, parsed from each ``{`` in turn, so prose or a code fence around
    it does not hide it; ``outside`` is the rest of the text, whitespace collapsed. Never raises.

    Example:
        >>> f = find_json_object('Here: {"name": "Ava"} ok')
        >>> f.obj, f.outside, f.clean
        ({'name': 'Ava'}, 'Here: ok', False)
    """
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
            if _depth(obj) > MAX_DEPTH:
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
    """THE field rule: strings equal ignoring case and outer spaces, numbers equal as numbers (a boolean
    or a string is not a number), anything else equal as JSON values.

    Example:
        >>> same_value(" Ava ", "ava"), same_value(3, 3.0), same_value("3", 3), same_value(True, 1)
        (True, True, False, False)
    """
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
    """A compiled ``jsonschema`` validator per schema (cached: one schema serves every row)."""
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


def _column(values: Any, n: int) -> list:
    """One value per completion from a dataset column (TRL passes lists; a missing column gives Nones)."""
    if values is None or isinstance(values, (str, dict)):
        return [values] * n
    values = list(values)
    return values + [None] * (n - len(values)) if len(values) < n else values[:n]


def json_format_reward(completions: Any, **kwargs: Any) -> list[float]:
    """1.0 when the completion is exactly one JSON object, 0.5 when one is found among other text, else 0.0.

    Example:
        >>> json_format_reward(['{"a": 1}', 'Answer: {"a": 1}', '{"a": 1', 'none'])
        [1.0, 0.5, 0.0, 0.0]
    """
    return [1.0 if f.clean else 0.5 if f.obj is not None else 0.0
            for f in map(find_json_object, completion_texts(completions))]


def schema_valid_reward(completions: Any, schema: Any = None, **kwargs: Any) -> list[float | None]:
    """1.0 when the object satisfies the row's JSON Schema (the ``schema`` column), else 0.0; ``None``
    (does not apply) when the row has no usable schema."""
    texts = completion_texts(completions)
    out: list[float | None] = []
    for t, sch in zip(texts, _column(schema, len(texts))):
        f = find_json_object(t)
        errors = None if sch is None else schema_errors(f.obj, sch)
        out.append(None if errors is None else 1.0 if f.obj is not None and not errors else 0.0)
    return out


def field_match_reward(completions: Any, answer: Any = None, log_extra: Callable | None = None,
                       **kwargs: Any) -> list[float | None]:
    """The share of the expected object's fields the completion's object gets right (partial credit); 0.0
    without an object, ``None`` when the expected answer is not an object. Logs both objects inside TRL."""
    texts = completion_texts(completions)
    out: list[float | None] = []
    found = [find_json_object(t) for t in texts]
    for f, ans in zip(found, _column(answer, len(texts))):
        want = as_object(ans)
        out.append(None if not want else 0.0 if f.obj is None else
                   sum(k in f.obj and same_value(f.obj[k], v) for k, v in want.items()) / len(want))
    if log_extra is not None:
        try:
            log_extra("expected", ["" if a is None else str(a) for a in _column(answer, len(texts))])
            log_extra("extracted", ["" if f.obj is None else json.dumps(f.obj)[:500] for f in found])
        except Exception:  # noqa: BLE001 - logging never breaks a reward
            pass
    return out


def exact_match_reward(completions: Any, answer: Any = None, **kwargs: Any) -> list[float | None]:
    """1.0 when the object is exactly the expected one (no key missing or extra, every value right), else
    0.0; ``None`` when the expected answer is not an object."""
    texts = completion_texts(completions)
    return [None if as_object(ans) is None else float(is_exact_match(find_json_object(t).obj, ans))
            for t, ans in zip(texts, _column(answer, len(texts)))]


def json_extras_penalty(completions: Any, schema: Any = None, answer: Any = None, **kwargs: Any) -> list[float]:
    """-0.25 per key the schema (else the expected object) does not know, at most -0.75, and -0.25 for
    text around the object; 0.0 for a clean object and for no object (the other rewards see to that).

    Example:
        >>> json_extras_penalty(['{"a": 1}', '{"a": 1, "z": 2} thanks', 'nothing'], answer=['{"a": 1}'] * 3)
        [0.0, -0.5, 0.0]
    """
    texts = completion_texts(completions)
    out = []
    for t, sch, ans in zip(texts, _column(schema, len(texts)), _column(answer, len(texts))):
        f = find_json_object(t)
        if f.obj is None:
            out.append(0.0)
            continue
        known = (as_object(sch) or {}).get("properties") if sch is not None else None
        known = known if isinstance(known, dict) else as_object(ans)
        extra = 0 if known is None else sum(k not in known for k in f.obj)
        out.append(0.0 - min(0.75, 0.25 * extra) - (0.25 if f.outside else 0.0))
    return out

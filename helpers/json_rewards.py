"""Rewards for structured output: one JSON object, valid against a schema, with the right fields.

In TRL's convention, like :mod:`helpers.rewards`: ``f(completions, **kwargs)``
returns one float (or ``None``: does not apply) per completion, accepts plain
strings and conversational ``[{"role": "assistant", "content": ...}]``
completions, and never raises, whatever the text (huge, cut off, nested a
thousand levels deep: the work is bounded by :data:`MAX_CHARS` and
:data:`MAX_DEPTH`).

* :func:`json_format_reward`: 1.0 for a completion that is exactly one JSON
  object, 0.5 for one found inside other text or a code fence, else 0.0;
* :func:`schema_valid_reward`: 1.0 when the object satisfies the row's JSON
  Schema (the ``schema`` column, checked by ``jsonschema``);
* :func:`field_match_reward`: the share of expected fields (the ``answer``
  column) the object gets right: partial credit;
* :func:`exact_match_reward`: 1.0 when the object is exactly the expected one;
* :func:`json_extras_penalty`: minus a little for every key the schema does not
  know and for text around the object.

With a prefilled ``{"`` (:data:`helpers.json_task.JSON_PREFILL`) the completion TRL hands over
lacks it: use the ``prefilled_`` versions (:func:`json_preset` picks them).

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
from typing import Any, Callable, Sequence

from .json_task import JSON_PREFILL
from .rewards import completion_texts, get_prefilled_reward

#: Longer completions are not answers: they are not searched (keeps every reward's time bounded).
MAX_CHARS = 20_000
#: Objects nested deeper than this are refused (and Python's parser refuses far deeper ones itself).
MAX_DEPTH = 20
#: How many ``{`` a completion is searched from before giving up.
MAX_STARTS = 16

RewardFunc = Callable[..., list]


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
    """What :func:`find_json_object` found: the object (or None), and the text around it."""

    obj: dict | None
    outside: str = ""
    error: str = ""

    @property
    def clean(self) -> bool:
        """True when the completion is the object and nothing else (whitespace aside)."""
        return self.obj is not None and not self.outside


def find_json_object(text: Any) -> JsonFind:
    """The first JSON *object* in the text: parsed from each ``{`` in turn (at most :data:`MAX_STARTS`),
    so prose or a code fence around it does not hide it. ``outside`` is the rest of the text (a fence
    included), whitespace collapsed: the object is ``clean`` when there is none.

    Never raises; a text over :data:`MAX_CHARS` or an object deeper than :data:`MAX_DEPTH` gives no object.

    Example:
        >>> f = find_json_object('Here: {"name": "Ava"} ok')
        >>> f.obj, f.outside, f.clean
        ({'name': 'Ava'}, 'Here: ok', False)
        >>> find_json_object('{"name": "Ava"').error
        'no complete JSON object'
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
            if not isinstance(obj, dict):  # cannot happen from "{", kept for safety
                start = t.find("{", start + 1)
                continue
            if _depth(obj) > MAX_DEPTH:
                return JsonFind(None, error=f"nested deeper than {MAX_DEPTH} levels")
            outside = " ".join((t[:start] + " " + t[end:]).split())
            return JsonFind(obj, outside=outside)
        return JsonFind(None, error="no complete JSON object")
    except Exception as exc:  # noqa: BLE001 - a reward never raises
        return JsonFind(None, error=f"{type(exc).__name__}")


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
    """THE field rule: strings equal ignoring case and outer spaces, numbers equal as numbers (a
    boolean is not a number, a string is not a number), anything else equal as JSON values.

    Example:
        >>> same_value(" Ava ", "ava"), same_value(3, 3), same_value("3", 3), same_value(True, 1)
        (True, True, False, False)
    """
    if isinstance(want, str):
        return isinstance(got, str) and got.strip().casefold() == want.strip().casefold()
    if isinstance(want, bool) or isinstance(got, bool):
        return isinstance(got, bool) and isinstance(want, bool) and got == want
    if isinstance(want, (int, float)):
        return isinstance(got, (int, float)) and got == want
    return got == want


@lru_cache(maxsize=64)
def _validator(schema_text: str) -> Any:
    """A compiled ``jsonschema`` validator per schema (cached: one schema serves every row)."""
    from jsonschema import Draft202012Validator

    schema = json.loads(schema_text)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def schema_errors(obj: Any, schema: Any) -> list[str] | None:
    """The schema's complaints about ``obj`` (``[]``: valid), or None when the schema itself is unusable.

    Example:
        >>> schema_errors({"quantity": "three"}, {"properties": {"quantity": {"type": "integer"}}})
        ["'three' is not of type 'integer'"]
    """
    try:
        text = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True)
        validator = _validator(text)
        return [e.message for e in validator.iter_errors(obj)][:10]
    except Exception:  # noqa: BLE001 - a bad schema means "cannot judge", never a crash
        return None


def _column(values: Any, n: int) -> list:
    """One value per completion from a dataset column (TRL passes lists; a missing column gives Nones)."""
    if values is None or isinstance(values, (str, dict)):
        return [values] * n
    values = list(values)
    return values + [None] * (n - len(values)) if len(values) < n else values[:n]


# --------------------------------------------------------------------------- the rewards


def json_format_reward(completions: Any, **kwargs: Any) -> list[float]:
    """1.0 when the completion is exactly one JSON object, 0.5 when one is found among other text
    (a code fence, a sentence), 0.0 when there is none.

    Example:
        >>> json_format_reward(['{"a": 1}', 'Answer: {"a": 1}', '{"a": 1', 'none'])
        [1.0, 0.5, 0.0, 0.0]
    """
    out = []
    for t in completion_texts(completions):
        f = find_json_object(t)
        out.append(1.0 if f.clean else 0.5 if f.obj is not None else 0.0)
    return out


def schema_valid_reward(completions: Any, schema: Any = None, **kwargs: Any) -> list[float | None]:
    """1.0 when the completion's object satisfies the row's JSON Schema (the ``schema`` column), else
    0.0; ``None`` (does not apply) when the row has no usable schema.

    Example:
        >>> s = '{"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}'
        >>> schema_valid_reward(['{"n": 2}', '{"n": "2"}', '{}', 'no'], schema=[s] * 4)
        [1.0, 0.0, 0.0, 0.0]
    """
    texts = completion_texts(completions)
    out: list[float | None] = []
    for t, sch in zip(texts, _column(schema, len(texts))):
        if sch is None:
            out.append(None)
            continue
        f = find_json_object(t)
        errors = schema_errors(f.obj if f.obj is not None else None, sch)
        out.append(None if errors is None else 1.0 if f.obj is not None and not errors else 0.0)
    return out


def field_match_reward(completions: Any, answer: Any = None, log_extra: Callable | None = None,
                       **kwargs: Any) -> list[float | None]:
    """The share of the expected object's fields (the ``answer`` column) that the completion's object
    gets right (:func:`same_value`): partial credit, 0.0 without an object, ``None`` when the expected
    answer is not a JSON object. Inside TRL it logs the expected and the extracted objects too.

    Example:
        >>> field_match_reward(['{"a": 1, "b": 2}', '{"a": 1}', '{"b": 9}'], answer=['{"a": 1, "b": 2}'] * 3)
        [1.0, 0.5, 0.0]
    """
    texts = completion_texts(completions)
    out: list[float | None] = []
    found = []
    for t, ans in zip(texts, _column(answer, len(texts))):
        want, f = as_object(ans), find_json_object(t)
        found.append(f)
        if not want:
            out.append(None)
        elif f.obj is None:
            out.append(0.0)
        else:
            out.append(sum(k in f.obj and same_value(f.obj[k], v) for k, v in want.items()) / len(want))
    if log_extra is not None:
        try:
            log_extra("expected", ["" if a is None else str(a) for a in _column(answer, len(texts))])
            log_extra("extracted", ["" if f.obj is None else json.dumps(f.obj)[:500] for f in found])
        except Exception:  # noqa: BLE001 - logging never breaks a reward
            pass
    return out


def is_exact_match(obj: Any, expected: Any) -> bool:
    """True when ``obj`` has exactly the expected keys, each value right (:func:`same_value`).

    Example:
        >>> is_exact_match({"a": "X"}, {"a": "x"}), is_exact_match({"a": "x", "b": 1}, {"a": "x"})
        (True, False)
    """
    want = as_object(expected)
    return (isinstance(obj, dict) and want is not None and set(obj) == set(want)
            and all(same_value(obj[k], v) for k, v in want.items()))


def exact_match_reward(completions: Any, answer: Any = None, **kwargs: Any) -> list[float | None]:
    """1.0 when the completion's object is exactly the expected one (no key missing, none extra, every
    value right), else 0.0; ``None`` when the expected answer is not a JSON object.

    Example:
        >>> exact_match_reward(['{"a": 1}', '{"a": 1, "b": 0}'], answer=['{"a": 1}'] * 2)
        [1.0, 0.0]
    """
    texts = completion_texts(completions)
    out: list[float | None] = []
    for t, ans in zip(texts, _column(answer, len(texts))):
        want = as_object(ans)
        out.append(None if want is None else 1.0 if is_exact_match(find_json_object(t).obj, want) else 0.0)
    return out


def json_extras_penalty(completions: Any, schema: Any = None, answer: Any = None, **kwargs: Any) -> list[float]:
    """A penalty for what nobody asked for: -0.25 per key the schema's ``properties`` (else the
    expected object) does not have, at most -0.75, and -0.25 for any text around the object (code
    fences included). 0.0 for a clean object, and for no object at all (the other rewards see to that).

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
        if not isinstance(known, dict):
            known = as_object(ans)
        extra = 0 if known is None else sum(k not in known for k in f.obj)
        out.append(0.0 - min(0.75, 0.25 * extra) - (0.25 if f.outside else 0.0))
    return out


# --------------------------------------------------------------------------- presets

JSON_REWARDS: tuple[RewardFunc, ...] = (json_format_reward, schema_valid_reward, field_match_reward,
                                        exact_match_reward, json_extras_penalty)
#: The task's weights: the fields carry the most, the exact object a bonus, the form a little.
JSON_WEIGHTS: dict[str, float] = {"json_format_reward": 0.5, "schema_valid_reward": 0.5, "field_match_reward": 2.0,
                                  "exact_match_reward": 1.0, "json_extras_penalty": 1.0}



def _here(reward: RewardFunc) -> RewardFunc:
    """The reward on ``JSON_PREFILL + completion``, named in this module (importable by dotted path, picklable)."""
    func = get_prefilled_reward(reward, JSON_PREFILL)
    func.__module__ = __name__
    return func


prefilled_json_format_reward = _here(json_format_reward)
prefilled_schema_valid_reward = _here(schema_valid_reward)
prefilled_field_match_reward = _here(field_match_reward)
prefilled_exact_match_reward = _here(exact_match_reward)
prefilled_json_extras_penalty = _here(json_extras_penalty)


def json_preset(prefill: str | None = JSON_PREFILL) -> list[tuple[RewardFunc, float]]:
    """``[(reward, weight), ...]`` of the JSON task, each reward reading ``prefill + completion``
    (the template wrote the prefill, TRL's completion lacks it). At most 4.0 in all.

    Example:
        >>> [(f.__name__, w) for f, w in json_preset()][:2]
        [('prefilled_json_format_reward', 0.5), ('prefilled_schema_valid_reward', 0.5)]
        >>> json_preset(prefill="")[0][0].__name__
        'json_format_reward'
    """
    out = []
    for reward in JSON_REWARDS:
        if not prefill:
            func = reward
        elif prefill == JSON_PREFILL:  # the module-level instances: importable by name (trl grpo recipes)
            func = globals()[f"prefilled_{reward.__name__}"]
        else:
            func = get_prefilled_reward(reward, prefill)
        out.append((func, JSON_WEIGHTS[reward.__name__]))
    return out


def field_accuracy(objs: Sequence[Any], answers: Sequence[Any]) -> dict[str, float]:
    """Per expected field, the share of objects that got it right (a missing object counts as wrong).

    Example:
        >>> field_accuracy([{"a": 1, "b": 2}, None], ['{"a": 1, "b": 3}', '{"a": 1, "b": 3}'])
        {'a': 0.5, 'b': 0.0}
    """
    hits: dict[str, list[bool]] = {}
    for obj, ans in zip(objs, answers):
        for k, v in (as_object(ans) or {}).items():
            hits.setdefault(k, []).append(isinstance(obj, dict) and k in obj and same_value(obj[k], v))
    return {k: sum(v) / len(v) for k, v in hits.items()}

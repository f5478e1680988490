"""The JSON task: extract an order from a short message into one JSON object, with messages generated in levels.

Serves notebook 05.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..rewards import Prefilled
from . import Task, distinct_rows
from .arithmetic import NAMES
from .json_rewards import (as_object, exact_match_reward, field_match_reward, find_json_object, is_exact_match,
                           json_extras_penalty, json_format_reward, same_value, schema_errors, schema_valid_reward)

JSON_PREFILL = '{"'  #: not ``{``: a tokenizer writes ``{"`` as one token, so ``{`` is no token prefix of the answer
NUMBER_WORDS = tuple("zero one two three four five six seven eight nine ten eleven twelve".split())
MONTHS = tuple("January February March April May June July August September October November December".split())
ITEMS = tuple("books lamps mugs chairs pens tickets shirts plates candles towels kites notebooks".split())
SHIPPING_PHRASES = {  #: how each ``shipping`` value may be written in the text (the first is the literal one)
    "express": ("express shipping", "next-day delivery", "overnight delivery", "the fastest delivery"),
    "standard": ("standard shipping", "regular post", "the cheapest delivery", "no rush on delivery"),
}
FIELD_SCHEMAS: dict[str, dict[str, Any]] = {  #: JSON Schema of each field the task knows; a level picks some
    "name": {"type": "string", "minLength": 1, "description": "who ordered"},
    "item": {"type": "string", "minLength": 1, "description": "what was ordered, as written"},
    "quantity": {"type": "integer", "minimum": 1, "description": "how many, as a number"},
    "shipping": {"enum": ["standard", "express"], "description": "the delivery speed"},
    "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$", "description": "delivery date, YYYY-MM-DD"},
}
YEAR = 2025
CPU_MAX_STEPS = 15  #: at most, on a CPU: exact match +22 points after 10 steps, +30.5 after 15, +35 after 20
CPU_GROUP, CPU_LEARNING_RATE = 4, 1e-4  #: on a CPU: 4 orders a step in groups of 4 (8 wrote "standard" everywhere)
prefilled_json_format_reward = Prefilled(json_format_reward, JSON_PREFILL)
prefilled_schema_valid_reward = Prefilled(schema_valid_reward, JSON_PREFILL)
prefilled_field_match_reward = Prefilled(field_match_reward, JSON_PREFILL)
prefilled_exact_match_reward = Prefilled(exact_match_reward, JSON_PREFILL)
prefilled_json_extras_penalty = Prefilled(json_extras_penalty, JSON_PREFILL)


@dataclass(frozen=True)
class Level:
    """A level: the object's fields, and the message templates that hide them."""

    description: str
    fields: tuple[str, ...]
    templates: tuple[str, ...]  # using {name}, {qty}, {item}, {ship}, {date}, {extra}
    words: float = 0.0  # share of quantities written as words
    paraphrase: bool = False  # shipping in any of its phrases, not only the literal one
    distractors: float = 0.0  # share of messages with a distracting number


_MAIN = ("{name} ordered {qty} {item} with {ship}.{extra}", "Please send {qty} {item} to {name}, {ship}.{extra}",
         "New order from {name}: {qty} {item}, {ship}.{extra}",
         "{name} wants {qty} {item} and asked for {ship}.{extra}", "Order for {name}: {qty} {item}, {ship}.{extra}")
_DATED = ("{name} ordered {qty} {item} with {ship}, to arrive on {date}.{extra}",
          "Please send {qty} {item} to {name} by {date}, {ship}.{extra}",
          "New order from {name}: {qty} {item}, {ship}, delivery on {date}.{extra}")
_FOUR = ("name", "item", "quantity", "shipping")
LEVELS: dict[str, Level] = {
    "orders-easy": Level("four fields written literally, digits (format-only warm-up)", _FOUR,
                         ("{name} ordered {qty} {item} with {ship}.",)),
    "orders": Level("four fields; numbers as words, paraphrased shipping, distracting numbers", _FOUR, _MAIN,
                    words=0.5, paraphrase=True, distractors=0.5),
    "orders-dated": Level("five fields: the orders level plus a delivery date to write as YYYY-MM-DD",
                          _FOUR + ("date",), _DATED, words=0.5, paraphrase=True, distractors=0.5),
}


def make_schema(fields: Sequence[str]) -> dict[str, Any]:
    """A strict JSON Schema for these fields: all required, no other key allowed."""
    unknown = [f for f in fields if f not in FIELD_SCHEMAS]
    if unknown:
        raise ValueError(f"Unknown field(s) {unknown}: known fields are {list(FIELD_SCHEMAS)}; add yours to "
                         "helpers.tasks.orders.FIELD_SCHEMAS first.")
    return {"type": "object", "properties": {f: dict(FIELD_SCHEMAS[f]) for f in fields},
            "required": list(fields), "additionalProperties": False}


def _one_order(rng: random.Random, level: Level) -> dict[str, str]:
    qty, ship = rng.randint(2, 12), rng.choice(sorted(SHIPPING_PHRASES))
    month, day = rng.randint(1, 12), rng.randint(1, 28)
    values = {"name": rng.choice(NAMES), "item": rng.choice(ITEMS), "quantity": qty, "shipping": ship,
              "date": f"{YEAR}-{month:02d}-{day:02d}"}
    extra = ""
    if rng.random() < level.distractors:
        extra = rng.choice([f" It costs ${rng.randint(13, 99)}.", f" Order number {rng.randint(100, 999)}.",
                            f" Call {rng.randint(20, 99)} minutes before arriving."])
    phrases = SHIPPING_PHRASES[ship] if level.paraphrase else SHIPPING_PHRASES[ship][:1]
    text = rng.choice(level.templates).format(
        name=values["name"], item=values["item"], ship=rng.choice(phrases), extra=extra,
        qty=NUMBER_WORDS[qty] if rng.random() < level.words else str(qty), date=f"{MONTHS[month - 1]} {day}, {YEAR}")
    text = " ".join(text.split())
    return {"question": text[0].upper() + text[1:],
            "answer": json.dumps({f: values[f] for f in level.fields}, ensure_ascii=False)}


class OrdersTask(Task):
    """Orders to JSON objects, checked against a JSON Schema, scored field by field."""

    name, prefill, levels = "json", JSON_PREFILL, LEVELS
    #: The fields carry the most, the exact object a bonus, the form a little (at most 4.0).
    rewards = [(prefilled_json_format_reward, 0.5), (prefilled_schema_valid_reward, 0.5),
               (prefilled_field_match_reward, 2.0), (prefilled_exact_match_reward, 1.0),
               (prefilled_json_extras_penalty, 1.0)]
    headline, format_metric = "exact_match", "schema_valid"
    min_completion_tokens = 32

    def system_prompt_for(self, row: Mapping[str, Any]) -> str:
        keys = []  # the schema's keys in words (the model never sees the schema itself)
        for key, spec in json.loads(row["schema"]).get("properties", {}).items():
            kind = (" or ".join(json.dumps(v) for v in spec["enum"]) if "enum" in spec else "date as YYYY-MM-DD"
                    if spec.get("pattern") == FIELD_SCHEMAS["date"]["pattern"] else str(spec.get("type", "any value")))
            keys.append(f"{key} ({kind})")
        return ("Extract the order from the message. Reply with one JSON object and nothing else, with exactly "
                f"these keys: {', '.join(keys)}.")

    def make_rows(self, level: str, n: int, seed: int) -> list[dict[str, str]]:
        if level not in LEVELS:
            raise ValueError(f"Unknown level {level!r}. Valid levels: {', '.join(LEVELS)}; add your own with "
                             "helpers.tasks.orders.LEVELS['name'] = Level(...).")
        rng, spec = random.Random(f"orders:{level}:{seed}"), LEVELS[level]
        schema = json.dumps(make_schema(spec.fields))
        rows = distinct_rows(lambda: _one_order(rng, spec), n, f"Level {level!r}")
        return [dict(row, schema=schema, level=level) for row in rows]

    def reference(self, row: Mapping[str, Any]) -> str:
        return str(row["answer"])  # the whole object: it starts with the prefill '{"'

    def score(self, text: str, row: Mapping[str, Any]) -> dict[str, float]:
        found, want, schema = find_json_object(text), as_object(row["answer"]) or {}, row.get("schema") or {}
        obj, errors = found.obj or {}, schema_errors(found.obj, schema) if found.obj is not None else None
        right = {k: float(k in obj and same_value(obj[k], v)) for k, v in want.items()}
        return {"exact_match": float(is_exact_match(found.obj, want)), "schema_valid": float(errors == []),
                "valid_json": float(found.obj is not None), "clean_json": float(found.clean),
                "field_rate": sum(right.values()) / max(1, len(right)), **{f"field: {k}": v for k, v in right.items()}}

    def clean_answer(self, row: Mapping[str, Any]) -> str:
        obj = as_object(row.get("answer"))
        if obj is None:
            raise ValueError(f"{str(row.get('answer'))[:60]!r} is not a JSON object: write one such as "
                             '{"name": "Ava"} with double quotes')
        errors = schema_errors(obj, row.get("schema") or {})
        if errors is None:
            raise ValueError("the row's schema is not a valid JSON Schema: fix the schema first")
        if errors:
            raise ValueError(f"{errors[0]}: make the object match the schema, or change the schema")
        return json.dumps(obj, ensure_ascii=False)

    def settings(self, profile: Any) -> dict[str, Any]:
        if profile.backend == "unsloth":
            return {"task_level": "orders-dated", "warmup_level": "orders-easy", "max_completion_length": 96}
        return {"task_level": "orders", "warmup_level": "orders-easy", "max_completion_length": 40,
                "max_steps": min(profile.max_steps, CPU_MAX_STEPS), "learning_rate": CPU_LEARNING_RATE,
                "num_generations": min(profile.num_generations, CPU_GROUP)}

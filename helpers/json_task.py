"""A second verifiable task: extract a JSON object (structured output) from a short order message.

The ``orders`` task is generated offline from a seed, like the arithmetic task
(:mod:`helpers.tasks`): a sentence about an order, and the JSON object a program
would want from it::

    Maya ordered three lamps, next-day delivery please.
    {"name": "Maya", "item": "lamps", "quantity": 3, "shipping": "express"}

Each difficulty level is one entry of :data:`JSON_LEVELS`: which fields the
object has and how the sentence hides them (numbers as words, paraphrased
shipping, distracting numbers, a date to normalise). Every row has
``question`` (the text), ``answer`` (the expected object as canonical JSON),
``schema`` (the JSON Schema the answer must satisfy, as JSON text) and
``level``; reward functions receive all of them as keywords.

A learner's own CSV or JSONL of ``text``/``expected`` pairs goes through
:func:`load_json_rows`, which checks every row against the schema and names
each problem (row, field, fix).

Example:
    >>> row = generate_orders(1, "orders-easy", seed=0)[0]
    >>> sorted(row)
    ['answer', 'level', 'question', 'schema']
    >>> sorted(json.loads(row["answer"]))
    ['item', 'name', 'quantity', 'shipping']
"""

from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

#: What the JSON task prefills in the chat template's generation prompt: the object's opening brace and
#: quote. ``{"`` and not ``{``: the tokenizer writes ``{"`` as one token, so a prompt ending in ``{`` alone
#: would not be a token prefix of prompt + answer (``SFTTrainer`` warns of the mismatch, and generation
#: would start from a token split the model never saw). ``{"`` ends on a token boundary.
JSON_PREFILL = '{"'

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                "eleven", "twelve")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
NAMES = ("Ava", "Ben", "Chloe", "Dev", "Emma", "Finn", "Grace", "Hugo", "Isla", "Jonah", "Kira", "Leo", "Maya",
         "Noah", "Omar", "Priya", "Ravi", "Sara", "Tom", "Zoe")
ITEMS = ("books", "lamps", "mugs", "chairs", "pens", "tickets", "shirts", "plates", "candles", "towels", "kites",
         "notebooks")

#: How each ``shipping`` value may be written in the text (the first is the literal one).
SHIPPING_PHRASES = {
    "express": ("express shipping", "next-day delivery", "overnight delivery", "the fastest delivery"),
    "standard": ("standard shipping", "regular post", "the cheapest delivery", "no rush on delivery"),
}

#: JSON Schema of each field the task knows. A level picks some of them.
FIELD_SCHEMAS: dict[str, dict[str, Any]] = {
    "name": {"type": "string", "minLength": 1, "description": "who ordered"},
    "item": {"type": "string", "minLength": 1, "description": "what was ordered, as written"},
    "quantity": {"type": "integer", "minimum": 1, "description": "how many, as a number"},
    "shipping": {"enum": ["standard", "express"], "description": "the delivery speed"},
    "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$", "description": "delivery date, YYYY-MM-DD"},
}

YEAR = 2025


@dataclass(frozen=True)
class JsonLevel:
    """One difficulty level of the orders task.

    ``templates`` use ``{name}``, ``{qty}``, ``{item}``, ``{ship}``, ``{date}``
    and ``{extra}`` (a distracting number or nothing).

    Example:
        >>> JSON_LEVELS["orders"].fields
        ('name', 'item', 'quantity', 'shipping')
    """

    description: str
    fields: tuple[str, ...]
    templates: tuple[str, ...]
    #: Share of quantities written as words ("three") rather than digits.
    words: float = 0.0
    #: Shipping written with any of its phrases (else only the literal "express/standard shipping").
    paraphrase: bool = False
    #: Share of rows with a distracting number (a price, an order number).
    distractors: float = 0.0


_EASY = ("{name} ordered {qty} {item} with {ship}.",)
_MAIN = ("{name} ordered {qty} {item} with {ship}.{extra}",
         "Please send {qty} {item} to {name}, {ship}.{extra}",
         "New order from {name}: {qty} {item}, {ship}.{extra}",
         "{name} wants {qty} {item} and asked for {ship}.{extra}",
         "Order for {name}: {qty} {item}, {ship}.{extra}")
_DATED = ("{name} ordered {qty} {item} with {ship}, to arrive on {date}.{extra}",
          "Please send {qty} {item} to {name} by {date}, {ship}.{extra}",
          "New order from {name}: {qty} {item}, {ship}, delivery on {date}.{extra}")

#: The registry of levels, easiest first. Add a level with one line.
JSON_LEVELS: dict[str, JsonLevel] = {
    "orders-easy": JsonLevel("four fields written literally, digits (format-only warm-up)",
                             ("name", "item", "quantity", "shipping"), _EASY),
    "orders": JsonLevel("four fields; numbers as words, paraphrased shipping, distracting numbers",
                        ("name", "item", "quantity", "shipping"), _MAIN, words=0.5, paraphrase=True,
                        distractors=0.5),
    "orders-dated": JsonLevel("five fields: the orders level plus a delivery date to write as YYYY-MM-DD",
                              ("name", "item", "quantity", "shipping", "date"), _DATED, words=0.5,
                              paraphrase=True, distractors=0.5),
}


def get_json_level(level: str | JsonLevel) -> JsonLevel:
    """The :class:`JsonLevel` for a name; unknown names list the valid ones.

    Example:
        >>> get_json_level("orders-dated").fields[-1]
        'date'
    """
    if isinstance(level, JsonLevel):
        return level
    if level not in JSON_LEVELS:
        raise ValueError(f"Unknown JSON level {level!r}. Valid levels: {', '.join(JSON_LEVELS)}. Add your own "
                         "with helpers.json_task.JSON_LEVELS['name'] = JsonLevel(...).")
    return JSON_LEVELS[level]


def make_schema(fields: Sequence[str]) -> dict[str, Any]:
    """A strict JSON Schema for these fields: all required, no other key allowed.

    Example:
        >>> s = make_schema(["name", "quantity"])
        >>> s["required"], s["additionalProperties"]
        (['name', 'quantity'], False)
    """
    unknown = [f for f in fields if f not in FIELD_SCHEMAS]
    if unknown:
        raise ValueError(f"Unknown field(s) {unknown}: known fields are {list(FIELD_SCHEMAS)}; add yours to "
                         "helpers.json_task.FIELD_SCHEMAS first.")
    return {"type": "object", "properties": {f: dict(FIELD_SCHEMAS[f]) for f in fields},
            "required": list(fields), "additionalProperties": False}


def canonical(obj: Any) -> str:
    """One JSON text per object (the ``answer`` column): compact, keys in the schema's order.

    Example:
        >>> canonical({"name": "Ava", "quantity": 2})
        '{"name": "Ava", "quantity": 2}'
    """
    return json.dumps(obj, ensure_ascii=False)


def _one_order(rng: random.Random, level: JsonLevel) -> tuple[str, dict[str, Any]]:
    qty = rng.randint(2, 12)
    ship = rng.choice(sorted(SHIPPING_PHRASES))
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
        qty=NUMBER_WORDS[qty] if rng.random() < level.words else str(qty),
        date=f"{MONTHS[month - 1]} {day}, {YEAR}")
    text = " ".join(text.split())
    return text[0].upper() + text[1:], {f: values[f] for f in level.fields}


def generate_orders(n: int, level: str | JsonLevel = "orders", seed: int = 0) -> list[dict[str, str]]:
    """``n`` distinct order messages of one level with their expected objects; the same for the same seed.

    Raises ``ValueError`` when the level has fewer than ``n`` distinct messages.

    Example:
        >>> generate_orders(1, "orders-easy", seed=1)[0]["question"]
        'Ravi ordered 7 lamps with express shipping.'
    """
    spec = get_json_level(level)
    name = level if isinstance(level, str) else "custom"
    rng = random.Random(f"orders:{name}:{seed}")
    schema = json.dumps(make_schema(spec.fields))
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    attempts, limit = 0, 50 * n + 1000
    while len(rows) < n:
        attempts += 1
        if attempts > limit:
            raise ValueError(f"Level {name!r} gave only {len(rows)} distinct messages in {limit} draws, fewer than "
                             f"the {n} asked for. Ask for fewer rows or add templates to the level.")
        text, obj = _one_order(rng, spec)
        if text in seen:
            continue
        seen.add(text)
        rows.append({"question": text, "answer": canonical(obj), "schema": schema, "level": name})
    return rows


def json_level_table() -> list[dict[str, Any]]:
    """One row per level (name, fields, description, an example) for display.

    Example:
        >>> json_level_table()[0]["level"]
        'orders-easy'
    """
    return [{"level": name, "fields": ", ".join(lvl.fields), "description": lvl.description,
             "example": generate_orders(1, name, seed=0)[0]["question"]} for name, lvl in JSON_LEVELS.items()]


# --------------------------------------------------------------------------- prompts


def describe_schema(schema: dict[str, Any]) -> str:
    """The schema's keys in words, for the system prompt: ``name (string), quantity (integer), ...``.

    Example:
        >>> describe_schema(make_schema(["quantity", "shipping"]))
        'quantity (integer), shipping ("standard" or "express")'
    """
    parts = []
    for key, spec in schema.get("properties", {}).items():
        if "enum" in spec:
            kind = " or ".join(json.dumps(v) for v in spec["enum"])
        elif spec.get("pattern") == FIELD_SCHEMAS["date"]["pattern"]:
            kind = "date as YYYY-MM-DD"
        else:
            kind = str(spec.get("type", "any value"))
        parts.append(f"{key} ({kind})")
    return ", ".join(parts)


def json_system_prompt(schema: dict[str, Any]) -> str:
    """The instruction every prompt of a schema carries: one JSON object, exactly these keys.

    Example:
        >>> json_system_prompt(make_schema(["name"]))
        'Extract the order from the message. Reply with one JSON object and nothing else, with exactly these keys: name (string).'
    """
    return ("Extract the order from the message. Reply with one JSON object and nothing else, with exactly these "
            f"keys: {describe_schema(schema)}.")


def json_prompt(text: str, schema: dict[str, Any], system_role: bool = True) -> list[dict[str, str]]:
    """The conversational prompt for one message (system + user, or one user turn without a system role).

    Example:
        >>> [m["role"] for m in json_prompt("Ava ordered 2 pens.", make_schema(["name"]))]
        ['system', 'user']
    """
    from .prompts import build_prompt

    return build_prompt(text, json_system_prompt(schema), system_role)


# --------------------------------------------------------------------------- a learner's own rows


class JsonDataError(ValueError):
    """A problem in a learner's rows; the message names every row, field and the fix."""


def _read_records(path: Path) -> list[dict[str, Any]]:
    if path.suffix.lower() == ".csv":
        with path.open(newline="", encoding="utf-8") as fh:
            return [dict(r) for r in csv.DictReader(fh)]
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        out = []
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise JsonDataError(f"{path.name} line {i + 1} is not JSON ({exc.msg}): write one object per line, "
                                    'e.g. {"text": "...", "expected": {...}}.') from None
        return out
    raise JsonDataError(f"{path.name}: use a .csv or .jsonl file with the columns 'text' and 'expected'.")


def load_json_rows(source: str | Path | Sequence[dict[str, Any]], schema: dict[str, Any],
                   strict: bool = True) -> tuple[list[dict[str, str]], list[str]]:
    """Rows of a learner's task from a CSV/JSONL file (or a list of dicts): ``(rows, problems)``.

    Each record needs ``text`` and ``expected`` (an object, or JSON text of one),
    and ``expected`` must satisfy ``schema`` (checked with ``jsonschema``).
    ``strict`` raises :class:`JsonDataError` listing every problem; otherwise
    the bad rows are left out and ``problems`` says which and why (nothing is
    dropped silently). Rows come back in the task's format.

    Example:
        >>> rows, problems = load_json_rows([{"text": "Ava ordered 2 pens.", "expected": '{"name": "Ava"}'},
        ...                                  {"text": "", "expected": "{}"}], make_schema(["name"]), strict=False)
        >>> len(rows), problems[0][:32]
        (1, "row 1, field 'text': it is empty")
    """
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise JsonDataError(f"The schema itself is invalid: {exc.message}. Fix the schema first.") from None
    validator = Draft202012Validator(schema)
    records = _read_records(Path(source)) if isinstance(source, (str, Path)) else [dict(r) for r in source]
    schema_text, rows, problems = json.dumps(schema), [], []
    seen: dict[str, int] = {}
    for i, rec in enumerate(records):
        missing = [c for c in ("text", "expected") if c not in rec]
        if missing:
            problems.append(f"row {i}: no {missing} column(s) (columns: {sorted(rec)}); name them 'text' and "
                            "'expected'")
            continue
        text, expected = str(rec["text"] or "").strip(), rec["expected"]
        if not text:
            problems.append(f"row {i}, field 'text': it is empty; write the message or delete the row")
            continue
        if text in seen:
            problems.append(f"row {i}, field 'text': the same text as row {seen[text]}; delete one")
            continue
        if isinstance(expected, str):
            try:
                expected = json.loads(expected)
            except json.JSONDecodeError as exc:
                problems.append(f"row {i}, field 'expected': not JSON ({exc.msg} at character {exc.pos}); write "
                                'an object such as {"name": "Ava"} with double quotes')
                continue
        errors = sorted(validator.iter_errors(expected), key=lambda e: list(e.path))
        if errors:
            where = "/".join(str(p) for p in errors[0].path) or "the object"
            problems.append(f"row {i}, field 'expected' ({where}): {errors[0].message}; make it match the schema "
                            "or change the schema")
            continue
        seen[text] = i
        rows.append({"question": text, "answer": canonical(expected), "schema": schema_text, "level": "custom"})
    if strict and problems:
        more = f"\n  ... and {len(problems) - 8} more" if len(problems) > 8 else ""
        raise JsonDataError(f"{len(problems)} problem(s) in {len(records)} rows:\n  - " + "\n  - ".join(problems[:8])
                            + more + "\n(load_json_rows(..., strict=False) keeps the good rows and lists the rest.)")
    return rows, problems


def json_dataset(rows: Sequence[dict[str, str]], eval_rows: int, seed: int, tokenizer: Any = None,
                 train_rows: int | None = None) -> Any:
    """A ``DatasetDict`` (``train``, ``eval``: no text in both) with TRL's ``prompt`` column added.

    ``tokenizer`` only decides whether the template has a system role (else it is assumed).

    Example:
        >>> d = json_dataset(generate_orders(12, "orders-easy"), eval_rows=2, seed=0)
        >>> d["train"].num_rows, d["eval"].num_rows, d["train"][0]["prompt"][0]["role"]
        (10, 2, 'system')
    """
    from .data import split_train_eval
    from .prompts import supports_system_role

    role = True if tokenizer is None else supports_system_role(tokenizer)
    with_prompts = [dict(r, prompt=json_prompt(r["question"], json.loads(r["schema"]), role)) for r in rows]
    splits, _ = split_train_eval(with_prompts, eval_rows, seed, train_rows)
    return splits


def json_warmup_dataset(n: int, level: str = "orders-easy", seed: int = 1, tokenizer: Any = None,
                        chat_template_kwargs: dict | None = None) -> Any:
    """Format warm-up rows as TRL prompt-completion conversations: ``n`` rows of an easier level.

    The completion is the whole expected object, opening brace included: ``SFTTrainer`` renders the
    prompt with the generation prompt (which ends with :data:`JSON_PREFILL` once installed) and
    prompt + completion as one conversation, and learns only what follows the prompt, so the model
    learns to continue the prefilled brace, as GRPO will ask it to.

    Example:
        >>> json_warmup_dataset(2)[0]["completion"][0]["content"][:9]
        '{"name": '
    """
    from datasets import Dataset

    from .prompts import supports_system_role

    role = True if tokenizer is None else supports_system_role(tokenizer)
    out = []
    for r in generate_orders(n, level, seed=seed):
        row = {"prompt": json_prompt(r["question"], json.loads(r["schema"]), role),
               "completion": [{"role": "assistant", "content": r["answer"]}]}
        if chat_template_kwargs:
            row["chat_template_kwargs"] = dict(chat_template_kwargs)
        out.append(row)
    return Dataset.from_list(out)


def json_task_profile(profile: Any, **overrides: Any) -> Any:
    """The profile's sizes and recipe, set for this task: its levels, the ``{"`` prefill, room for the object.

    CPU profiles train on ``orders`` after a format warm-up on ``orders-easy``; GPU profiles (which
    skip the warm-up) on ``orders-dated``. ``overrides`` go on top (``task_level="orders-dated"``).

    Example:
        >>> from helpers.config import get_profile
        >>> t = json_task_profile(get_profile("cpu-demo"))
        >>> t.task, t.task_level, t.warmup_level, t.prefill, t.max_completion_length
        ('json', 'orders', 'orders-easy', '{"', 40)
    """
    gpu = profile.backend == "unsloth"
    settings = dict(task="json", task_level="orders-dated" if gpu else "orders", warmup_level="orders-easy",
                    prefill=JSON_PREFILL, reward_preset="json",
                    max_completion_length=max(40, min(profile.max_completion_length, 64)) if not gpu else 96)
    return profile.with_overrides(**{**settings, **overrides})

"""Where a profile's rows come from: the synthetic ``arithmetic`` task, GSM8K, the course's data files.

The ``arithmetic`` task is generated offline from a seed (no download), so the
CPU profiles need no hub.

Each difficulty level is one entry of :data:`LEVELS`, a plain dict, so adding a
level is one line::

    LEVELS["add2-wide"] = Level("two-number sums, 10..99", 10, 99)

A level draws ``n_operands`` integers in ``[low, high]``, joins them with
operators from ``operators`` (or uses a word template's own formula) and
evaluates left to right. Results never go negative, at any step.

Every row has ``question``, ``answer`` (a number string), ``level`` and
``solution`` (the worked steps, e.g. ``"23 + 45 = 68"``), which the SFT
warm-up turns into format examples.

Example:
    >>> from helpers.tasks import generate_arithmetic
    >>> row = generate_arithmetic(1, "add2", seed=0)[0]
    >>> sorted(row)
    ['answer', 'level', 'question', 'solution']
    >>> int(row["answer"]) == sum(int(x) for x in row["solution"].split(" = ")[0].split(" + "))
    True
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: A folder with GSM8K's ``train.jsonl``/``test.jsonl`` (for machines without the Hub).
GSM8K_DIR_ENV = "COURSE_GSM8K_DIR"

OPERATORS = ("+", "-", "*")


@dataclass(frozen=True)
class Template:
    """A question text and, for word problems, its formula over ``a``, ``b``, ``c``.

    ``text`` may use ``{expr}`` (the arithmetic expression), ``{a}``..``{c}``
    (the operands), ``{name}`` and ``{item}``. ``formula`` is ``None`` for plain
    expressions (the level's operators are drawn at random) or a string such as
    ``"a + b - c"``, evaluated left to right.

    Example:
        >>> Template("{name} has {a} {item} and finds {b} more. How many now?", "a + b").n_operands
        2
    """

    text: str
    formula: str | None = None

    @property
    def n_operands(self) -> int | None:
        return None if self.formula is None else len(self.formula.split()[::2])


@dataclass(frozen=True)
class Level:
    """One difficulty level of the arithmetic task.

    Example:
        >>> Level("single-digit sums", 0, 9).operators
        ('+',)
    """

    description: str
    low: int
    high: int
    n_operands: int = 2
    operators: tuple[str, ...] = ("+",)
    templates: tuple[Template, ...] = (Template("What is {expr}?"),)


NAMES = ("Ava", "Ben", "Chloe", "Dev", "Emma", "Finn", "Grace", "Hugo", "Isla", "Jonah",
         "Kira", "Leo", "Maya", "Noah", "Omar", "Priya", "Ravi", "Sara", "Tom", "Zoe")
ITEMS = ("apples", "marbles", "stickers", "books", "pencils", "coins", "cookies", "stamps",
         "shells", "cards")

WORD_ONE_STEP = (
    Template("{name} has {a} {item}. {name} buys {b} more. How many {item} does {name} have now?",
             "a + b"),
    Template("There are {a} {item} in a box and {b} {item} in a bag. How many {item} are there "
             "in total?", "a + b"),
    Template("{name} collected {a} {item} on Monday and {b} on Tuesday. How many {item} did "
             "{name} collect in all?", "a + b"),
    Template("{name} had {a} {item} and gave {b} of them to a friend. How many {item} does "
             "{name} have left?", "a - b"),
    Template("A shelf holds {a} {item}. {name} takes {b} of them away. How many {item} are "
             "still on the shelf?", "a - b"),
)

WORD_TWO_STEP = (
    Template("{name} has {a} {item}, buys {b} more and then gives {c} away. How many {item} "
             "does {name} have now?", "a + b - c"),
    Template("{name} picked {a} {item} in the morning, {b} at noon and {c} in the evening. How "
             "many {item} did {name} pick altogether?", "a + b + c"),
    Template("A box holds {a} {item}. {name} takes out {b} and then puts {c} back. How many "
             "{item} are in the box now?", "a - b + c"),
    Template("{name} had {a} {item}, gave {b} to a friend and {c} to a cousin. How many {item} "
             "does {name} have left?", "a - b - c"),
)

#: The registry of difficulty levels, easiest first. Add a level with one line.
LEVELS: dict[str, Level] = {
    "add1": Level("single-digit sums, 0..9 (format-only warm-up)", 0, 9),
    "add2-small": Level("two-number sums, 1..20", 1, 20),
    "add2": Level("two-number sums, 10..60", 10, 60),
    "add3": Level("three-number sums, 1..30", 1, 30, n_operands=3),
    "sub": Level("two-number differences, 10..99, never negative", 10, 99, operators=("-",)),
    "mixed": Level("three numbers with + and -, 1..50, never negative", 1, 50, n_operands=3,
                   operators=("+", "-")),
    "mul1": Level("single-digit products, 2..9", 2, 9, operators=("*",)),
    "word1": Level("one-step word problems, 2..30", 2, 30, templates=WORD_ONE_STEP),
    "word": Level("one- and two-step word problems, 2..30", 2, 30,
                  templates=WORD_ONE_STEP + WORD_TWO_STEP),
}


def get_level(level: str | Level) -> Level:
    """The :class:`Level` for a name (or the level itself); unknown names list the valid ones.

    Example:
        >>> get_level("add3").n_operands
        3
    """
    if isinstance(level, Level):
        return level
    if level not in LEVELS:
        raise ValueError(
            f"Unknown arithmetic level {level!r}. Valid levels: {', '.join(LEVELS)}. "
            "Add your own with helpers.tasks.LEVELS['name'] = Level(...)."
        )
    return LEVELS[level]


def _apply(x: int, op: str, y: int) -> int:
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    raise ValueError(f"Unknown operator {op!r}; use one of {OPERATORS}.")


def _one_problem(rng: random.Random, level: Level) -> dict[str, str] | None:
    """One problem, or None when a step went negative (the caller draws again)."""
    template = rng.choice(level.templates)
    if template.formula is None:
        n = level.n_operands
        ops = [rng.choice(level.operators) for _ in range(n - 1)]
    else:
        tokens = template.formula.split()
        n, ops = len(tokens[::2]), tokens[1::2]
    nums = [rng.randint(level.low, level.high) for _ in range(n)]
    steps, value = [], nums[0]
    for op, y in zip(ops, nums[1:]):
        new = _apply(value, op, y)
        if new < 0:
            return None
        steps.append(f"{value} {op} {y} = {new}")
        value = new
    expr = " ".join([str(nums[0])] + [f"{op} {y}" for op, y in zip(ops, nums[1:])])
    fields: dict[str, Any] = dict(zip("abcdefgh", nums))
    fields.update(expr=expr, name=rng.choice(NAMES), item=rng.choice(ITEMS))
    return {"question": template.text.format(**fields), "answer": str(value),
            "solution": "\n".join(steps)}


def generate_arithmetic(n: int, level: str | Level = "add2", seed: int = 0) -> list[dict[str, str]]:
    """``n`` distinct problems of one level, the same for the same ``(level, seed)``.

    Raises ``ValueError`` when the level has fewer than ``n`` distinct problems.

    Example:
        >>> [r["question"] for r in generate_arithmetic(2, "add1", seed=1)]
        ['What is 3 + 6?', 'What is 3 + 2?']
    """
    spec = get_level(level)
    name = level if isinstance(level, str) else "custom"
    rng = random.Random(f"arithmetic:{name}:{seed}")
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    attempts, limit = 0, 50 * n + 1000
    while len(rows) < n:
        attempts += 1
        if attempts > limit:
            raise ValueError(
                f"Level {name!r} ({spec.description}) gave only {len(rows)} distinct problems "
                f"in {limit} draws, fewer than the {n} asked for. Ask for fewer rows or use a "
                "level with wider operand ranges."
            )
        row = _one_problem(rng, spec)
        if row is None or row["question"] in seen:
            continue
        seen.add(row["question"])
        row["level"] = name
        rows.append(row)
    return rows


def level_table() -> list[dict[str, Any]]:
    """One row per level (name, description, an example question) for display.

    Example:
        >>> level_table()[0]["level"]
        'add1'
    """
    return [
        {"level": name, "description": lvl.description,
         "example": generate_arithmetic(1, name, seed=0)[0]["question"]}
        for name, lvl in LEVELS.items()
    ]


def load_gsm8k(source: str | Path | None = None) -> Any:
    """GSM8K's ``train`` and ``test`` splits: from the Hub, or from a folder of ``train.jsonl``/``test.jsonl``.

    ``source`` defaults to ``$COURSE_GSM8K_DIR`` when set, else the Hub
    (``load_dataset("openai/gsm8k", "main")``, notebook 01's call).
    """
    from datasets import load_dataset

    source = source or os.environ.get(GSM8K_DIR_ENV, "").strip() or "hub"
    if source != "hub":
        files = {s: str(Path(source) / f"{s}.jsonl") for s in ("train", "test")}
        missing = [f for f in files.values() if not Path(f).is_file()]
        if missing:
            raise FileNotFoundError(f"No GSM8K file at {missing[0]}: give a folder holding train.jsonl and "
                                    "test.jsonl (one JSON object per line with 'question' and 'answer').")
        return load_dataset("json", data_files=files)
    try:
        return load_dataset("openai/gsm8k", "main")
    except Exception as exc:  # noqa: BLE001 - offline, auth or cache: the same advice
        raise ConnectionError(
            f"Could not load 'openai/gsm8k' from the Hugging Face Hub ({type(exc).__name__}: {exc}). Offline, "
            f"put train.jsonl and test.jsonl in a folder and set {GSM8K_DIR_ENV} to it, or use a CPU profile "
            "(COURSE_PROFILE=cpu-demo), whose arithmetic task needs no download.") from exc


def task_rows(profile: Any) -> tuple[Any, Any, dict[str, Any]]:
    """``(rows, eval_source, source)`` for a profile's task, before any checks."""
    if profile.task == "arithmetic":
        rows = generate_arithmetic(profile.train_rows + profile.eval_rows, profile.task_level, seed=profile.seed)
        return rows, None, {"task": "arithmetic", "level": profile.task_level, "seed": profile.seed}
    if profile.task == "gsm8k":
        from .data import solution_text

        gsm8k = load_gsm8k().map(lambda row: {"solution": solution_text(row["answer"])})
        return gsm8k["train"], gsm8k["test"], {"task": "gsm8k", "eval_from": "test split"}
    raise ValueError(f"Unknown task {profile.task!r} in profile {profile.name!r}: use 'arithmetic' or 'gsm8k' "
                     "(or prepare your own rows with prepare_dataset and save_prepared).")


def data_file(name: str) -> Path:
    """Path of a file shipped in the course's ``data/`` folder.

    Found in the checkout (editable install); on a bare install (Colab) fetched
    once from the course repository into the cache folder.

    Example:
        >>> data_file("custom_example.csv").name
        'custom_example.csv'
    """
    from .config import REPO_REF, REPO_URL, cache_dir, project_root

    root = project_root()
    if root is not None and (root / "data" / name).is_file():
        return root / "data" / name
    cached = cache_dir() / "data" / name
    if not cached.is_file():
        url = REPO_URL.replace("github.com", "raw.githubusercontent.com") + f"/{REPO_REF}/data/{name}"
        try:
            import urllib.request

            with urllib.request.urlopen(url, timeout=20) as resp:
                payload = resp.read()
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.with_name(cached.name + ".part").write_bytes(payload)
            os.replace(cached.with_name(cached.name + ".part"), cached)
        except Exception as exc:  # noqa: BLE001 - any failure gets the same advice
            raise FileNotFoundError(
                f"The course data file {name!r} is not in a checkout and could not be fetched from {url} ({exc}). "
                f"Clone the course repository and `pip install -e .` from it, or put the file at {cached}.") from exc
    return cached

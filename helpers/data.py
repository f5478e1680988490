"""From raw problems to a GRPO dataset: answers, validation, token budgets, a leak-free split.

Notebook 01 loads data with ``datasets.load_dataset`` and builds prompts with
``.map`` in its cells; this module holds what several notebooks reuse and
what would be noise in a cell. Everything returns plain ``datasets`` objects:
a ``DatasetDict`` with ``train`` and ``eval`` splits and the columns TRL's
``GRPOTrainer`` expects, ``prompt`` (system + user messages) and ``answer``
(a normalised number string), plus ``question`` and any extra column (reward
functions receive every column as a keyword).

Nothing is dropped silently: :func:`prepare_dataset` counts every row it
removes (invalid, duplicate, over the token budget, leaked into eval) in the
dataset card.

Example:
    >>> extract_hash_answer("48 + 24 = 72\\n#### 1,072")
    '1072'
    >>> [p.kind for p in validate([{"question": "", "answer": "3"}], strict=False)]
    ['empty_question']
"""

from __future__ import annotations

import random
import re
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .prompts import SYSTEM_PROMPT, build_prompt, encode, supports_system_role
from .rewards import normalize_number

CARD_NAME = "card.json"
REQUIRED_COLUMNS = ("prompt", "answer", "question")


class DataError(ValueError):
    """A dataset problem; the message names the row, field or setting and the fix."""


class DataValidationError(DataError):
    """:func:`validate` in strict mode found problems; ``.problems`` lists them all."""

    def __init__(self, problems: list["Problem"], n_rows: int):
        self.problems = problems
        lines = [f"{len(problems)} problem(s) in {n_rows} rows:"] + [f"  - {p}" for p in problems[:5]]
        if len(problems) > 5:
            lines.append(f"  ... and {len(problems) - 5} more: validate(rows, strict=False) lists them all.")
        super().__init__("\n".join(lines))


def _records(rows: Any) -> list[dict[str, Any]]:
    return rows.to_list() if hasattr(rows, "to_list") else [dict(r) for r in rows]


def _dataset(records: list[dict[str, Any]], columns: Sequence[str] = ()) -> Any:
    from datasets import Dataset

    return Dataset.from_list(records) if records else Dataset.from_dict({c: [] for c in columns})


# --------------------------------------------------------------------------- answers and questions


def extract_hash_answer(text: Any) -> str | None:
    """The final answer after the last ``####`` of a GSM8K solution, normalised.

    ``None`` without ``####`` (a row :func:`validate` reports, never a silent 0);
    text that is not a number comes back stripped, for :func:`validate` to name.

    Example:
        >>> [extract_hash_answer(t) for t in ["so 3 + 4 = 7\\n#### 7", "#### $1,080", "no marker"]]
        ['7', '1080', None]
    """
    if not isinstance(text, str) or "####" not in text:
        return None
    tail = text.rsplit("####", 1)[1].strip()
    return normalize_number(tail) or tail


def clean_answer(value: Any) -> str | None:
    """An answer cell as a number string: a ``####`` solution, a number, or the text as given.

    Example:
        >>> clean_answer("Half of 10 is 5.\\n#### 5"), clean_answer(1200), clean_answer(" 1,200 ")
        ('5', '1200', '1200')
    """
    text = "" if value is None else str(value).strip()
    if not text:
        return None
    return (extract_hash_answer(text) if "####" in text else normalize_number(text) or text) or None


def solution_text(gsm8k_answer: str) -> str:
    """The worked solution of a GSM8K answer: before ``####``, calculator notes removed.

    Example:
        >>> solution_text("48/2 = <<48/2=24>>24 clips.\\n#### 24")
        '48/2 = 24 clips.'
    """
    return re.sub(r"<<[^>]*>>", "", str(gsm8k_answer).rsplit("####", 1)[0]).strip()


def normalize_question(text: Any) -> str:
    """A question reduced for duplicate detection: case, spacing and end punctuation.

    Example:
        >>> normalize_question("  What is 2 +  3? ") == normalize_question("what is 2 + 3")
        True
    """
    s = " ".join(unicodedata.normalize("NFKC", str(text or "")).casefold().split())
    return s.rstrip(" ?.!")


# --------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one row (``index`` None: with the whole table). Rows count from 0."""

    index: int | None
    field: str
    kind: str  # missing_column | empty_question | missing_answer | not_a_number | duplicate
    message: str
    fix: str

    def __str__(self) -> str:
        where = "all rows" if self.index is None else f"row {self.index}"
        return f"{where}, field {self.field!r}: {self.message}. Fix: {self.fix}"


def validate(rows: Any, strict: bool = True, numeric_answer: bool = True,
             check_duplicates: bool = True) -> list[Problem]:
    """Every problem in task rows; raises :class:`DataValidationError` when ``strict``.

    Checks: the ``question`` and ``answer`` columns exist; no empty question; an
    answer on every row that is a number (when ``numeric_answer``; ``$``, ``%``,
    thousands commas and GSM8K ``####`` solutions are fine); no question twice
    (after :func:`normalize_question`).

    Example:
        >>> validate([{"question": "2+2?", "answer": "four"}], strict=False)[0].kind
        'not_a_number'
    """
    records = _records(rows)
    columns = list(getattr(rows, "column_names", None) or dict.fromkeys(k for r in records for k in r))
    problems = [Problem(None, c, "missing_column", f"there is no {c!r} column (columns: {columns})",
                        f"rename your column to {c!r}, e.g. dataset.rename_column('<yours>', {c!r})")
                for c in ("question", "answer") if c not in columns]
    seen: dict[str, int] = {}
    for i, row in enumerate(records):
        q, raw = row.get("question"), row.get("answer")
        if "question" in columns:
            if q is None or not str(q).strip():
                problems.append(Problem(i, "question", "empty_question", "the question is empty",
                                        "write the question text, or delete the row"))
            elif check_duplicates and normalize_question(q) in seen:
                problems.append(Problem(i, "question", "duplicate",
                                        f"same question as row {seen[normalize_question(q)]} ({str(q)[:60]!r})",
                                        "delete one of the two (prepare_dataset keeps the first and counts the rest)"))
            else:
                seen.setdefault(normalize_question(q), i)
        if "answer" in columns:
            value = clean_answer(raw)
            if value is None:
                what = "has no '####' final answer" if raw else "is missing"
                problems.append(Problem(i, "answer", "missing_answer", f"the answer {what}",
                                        "write the final answer, e.g. 42 (a GSM8K solution ends with '#### 42')"))
            elif numeric_answer and normalize_number(value) is None:
                problems.append(Problem(i, "answer", "not_a_number", f"{str(raw)[:40]!r} is not a number",
                                        "write the answer as digits, e.g. 12 ($, % and 1,000 are fine); for a "
                                        "task whose answers are not numbers pass numeric_answer=False"))
    if strict and problems:
        raise DataValidationError(problems, len(records))
    return problems


def dedupe(rows: Any) -> tuple[list[dict[str, Any]], list[int]]:
    """Rows without repeated questions (the first kept) and the indices removed.

    Example:
        >>> kept, removed = dedupe([{"question": "A?"}, {"question": "a"}, {"question": "B"}])
        >>> len(kept), removed
        (2, [1])
    """
    seen: set[str] = set()
    kept, removed = [], []
    for i, r in enumerate(_records(rows)):
        key = normalize_question(r.get("question"))
        if key in seen:
            removed.append(i)
        else:
            seen.add(key)
            kept.append(r)
    return kept, removed


# --------------------------------------------------------------------------- tokens and split


def count_prompt_tokens(prompts: Sequence[Any], tokenizer: Any, **chat_template_kwargs: Any) -> list[int]:
    """Tokens per prompt exactly as TRL feeds them (:func:`helpers.prompts.encode`).

    Example:
        count_prompt_tokens([build_prompt("What is 2 + 3?")], tok)
        # -> [44]
    """
    return [len(ids) for ids in encode(tokenizer, prompts, **chat_template_kwargs)]


def length_stats(lengths: Sequence[int]) -> dict[str, float]:
    """Count, mean, min, percentiles (50/90/95/99) and max of token lengths.

    Example:
        >>> length_stats([10, 20, 30])["p50"]
        20.0
    """
    import numpy as np

    if len(lengths) == 0:
        return {"n": 0}
    a = np.asarray(lengths, dtype=float)
    out = {"n": int(a.size), "mean": round(float(a.mean()), 1), "min": float(a.min())}
    out.update({f"p{q}": round(float(np.percentile(a, q)), 1) for q in (50, 90, 95, 99)})
    return {**out, "max": float(a.max())}


def split_train_eval(rows: Any, eval_rows: int, seed: int, train_rows: int | None = None,
                     eval_source: Any = None) -> tuple[Any, dict[str, int]]:
    """A seeded ``DatasetDict`` with ``train`` and ``eval`` and no question in both.

    Without ``eval_source`` the rows are shuffled with ``seed``; the first
    ``eval_rows`` become ``eval``, the next ``train_rows`` (all when None)
    ``train``. With ``eval_source`` (GSM8K's test split) ``eval`` comes from it
    and train rows that repeat one of its questions are removed and counted
    (``leaked_removed``). A pool with duplicates is refused: :func:`dedupe` first.

    Example:
        >>> splits, info = split_train_eval([{"question": f"q{i}", "answer": str(i)} for i in range(10)], 3, 0)
        >>> splits["train"].num_rows, splits["eval"].num_rows, info["leaked_removed"]
        (7, 3, 0)
    """
    from datasets import DatasetDict

    pool, source = _records(rows), _records(eval_source) if eval_source is not None else None
    for name, records in (("rows", pool), ("eval_source", source or [])):
        keys = [normalize_question(r.get("question")) for r in records]
        if len(set(keys)) != len(keys):
            raise DataError(f"{name} holds {len(keys) - len(set(keys))} duplicate question(s), which could leak "
                            "between train and eval. Fix: rows, removed = dedupe(rows) first.")
    if eval_rows < 1:
        raise DataError(f"eval_rows must be at least 1 (got {eval_rows}).")
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    shuffled = [pool[i] for i in order]
    if source is None:
        if len(pool) < eval_rows + 1:
            raise DataError(f"Only {len(pool)} rows: too few for {eval_rows} eval rows and a train split. "
                            "Lower eval_rows or give more rows.")
        ev, candidates = shuffled[:eval_rows], shuffled[eval_rows:]
    else:
        if not source:
            raise DataError("eval_source is empty.")
        ev = random.Random(seed + 1).sample(source, min(eval_rows, len(source)))
        held_out = {normalize_question(r["question"]) for r in ev}
        candidates = [r for r in shuffled if normalize_question(r["question"]) not in held_out]
    train = candidates if train_rows is None else candidates[:train_rows]
    info = {"train": len(train), "eval": len(ev), "leaked_removed": len(shuffled) - len(candidates)
            if source is not None else 0}
    columns = list(pool[0]) if pool else ["question", "answer"]
    return DatasetDict({"train": _dataset(train, columns), "eval": _dataset(ev, columns)}), info


# --------------------------------------------------------------------------- the pipeline


def prepare_dataset(rows: Any, tokenizer: Any, train_rows: int | None, eval_rows: int, max_prompt_tokens: int,
                    seed: int, eval_source: Any = None, numeric_answer: bool = True, strict: bool = True,
                    source: dict[str, Any] | None = None,
                    chat_template_kwargs: dict | None = None) -> tuple[Any, dict[str, Any]]:
    """Validate, normalise answers, dedupe, build prompts, measure them, filter to the budget, split.

    Returns ``(splits, card)``; the card counts every row removed and why.
    ``strict=False`` drops invalid rows (counted) instead of raising. The
    system prompt is folded into the user turn when the template has no
    system role (:func:`helpers.prompts.supports_system_role`).

    Example:
        splits, card = prepare_dataset(rows, tok, train_rows=64, eval_rows=16,
                                       max_prompt_tokens=256, seed=0)
    """
    t0 = time.perf_counter()
    system_role = supports_system_role(tokenizer)
    counts: dict[str, Any] = {}
    pools: dict[str, list[dict[str, Any]]] = {}
    lengths: list[int] = []
    for name, raw in (("rows", rows), ("eval_source", eval_source)):
        if raw is None:
            continue
        records = _records(raw)
        problems = validate(raw, strict=strict, numeric_answer=numeric_answer, check_duplicates=False)
        if any(p.index is None for p in problems):  # a missing column: no row can be used
            raise DataValidationError(problems, len(records))
        bad = {p.index for p in problems}
        records = [dict(r, answer=clean_answer(r["answer"])) for i, r in enumerate(records) if i not in bad]
        records, dups = dedupe(records)
        for r in records:
            r["prompt"] = build_prompt(str(r["question"]), SYSTEM_PROMPT, system_role)
        sizes = count_prompt_tokens([r["prompt"] for r in records], tokenizer, **(chat_template_kwargs or {}))
        lengths += sizes
        kept = [dict(r, prompt_tokens=n) for r, n in zip(records, sizes) if n <= max_prompt_tokens]
        pools[name] = kept
        counts[name] = {"loaded": len(_records(raw)), "invalid_removed": len(bad),
                        "duplicates_removed": len(dups), "over_budget_removed": len(records) - len(kept),
                        "kept": len(kept)}
    splits, info = split_train_eval(pools["rows"], eval_rows, seed, train_rows, pools.get("eval_source"))
    counts.update(info)
    card = {"source": source or {}, "seed": seed, "counts": counts,
            "filters": {"max_prompt_tokens": max_prompt_tokens, "dedupe": "normalize_question",
                        "invalid_rows": "raise" if strict else "drop",
                        "tokenizer": Path(str(getattr(tokenizer, "name_or_path", "") or "tokenizer")).name},
            "token_lengths": length_stats(lengths),
            "format": {"system_role": system_role, "system_prompt": SYSTEM_PROMPT,
                       "columns": list(splits["train"].column_names)},
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": round(time.perf_counter() - t0, 3)}
    return splits, card


def save_prepared(splits: Any, path: str | Path, card: dict[str, Any]) -> Path:
    """Save the splits and ``card.json`` into ``path``, atomically (replacing what was there)."""
    from .runs import atomic_folder, write_json

    for name in ("train", "eval"):
        if name not in splits:
            raise DataError(f"The prepared dataset needs a {name!r} split (has {list(splits)}).")
    with atomic_folder(path, overwrite=True) as tmp:
        splits.save_to_disk(str(tmp))
        write_json(tmp / CARD_NAME, card)
    return Path(path)


def read_card(path: str | Path) -> dict[str, Any]:
    """The ``card.json`` of a prepared dataset folder (``{}`` when it has none)."""
    from .runs import read_json

    card = Path(path) / CARD_NAME
    return read_json(card) if card.is_file() else {}


def load_prepared(path: str | Path) -> Any:
    """Load a prepared ``DatasetDict`` and check its splits and columns."""
    from datasets import load_from_disk

    path = Path(path)
    if not (path / "dataset_dict.json").is_file():
        raise DataError(f"No prepared dataset at {path}. Build it with helpers.data.ensure_prepared(PROFILE, "
                        "RUN) or run notebook 01_dataset_prep.")
    splits = load_from_disk(str(path))
    for name in ("train", "eval"):
        missing = [c for c in REQUIRED_COLUMNS if name in splits and c not in splits[name].column_names]
        if name not in splits or missing:
            raise DataError(f"{path} lacks the {name!r} split or its columns {missing or list(REQUIRED_COLUMNS)}. "
                            "Delete the folder and rebuild it with ensure_prepared(PROFILE, RUN).")
    return splits


def ensure_prepared(profile: Any, run: str | Path, tokenizer: Any = None, rebuild: bool = False,
                    verbose: bool = True) -> Any:
    """The run's prepared dataset: loaded from ``RUN/dataset``, built from the profile when missing.

    A dataset this function built for other profile settings is rebuilt; one
    you saved yourself (no ``origin`` in its card) is kept.

    Example:
        ds = ensure_prepared(get_profile("cpu-smoke"), RUN)
        ds["train"].num_rows, ds["eval"].num_rows
        # -> (64, 16)
    """
    from .config import get_model_spec

    path = Path(run) / "dataset"
    spec = {k: getattr(profile, k) for k in ("task", "task_level", "train_rows", "eval_rows",
                                              "max_prompt_tokens", "seed", "model", "prefill")}
    if path.exists() and not rebuild:
        card = read_card(path)
        if card.get("origin") != "ensure_prepared" or card.get("spec") == spec:
            return load_prepared(path)
        if verbose:
            changed = sorted(k for k in spec if card.get("spec", {}).get(k) != spec[k])
            print(f"Rebuilding {path}: it was prepared with other settings ({', '.join(changed)}).")
    if tokenizer is None:
        from .models import load_tokenizer

        tokenizer = load_tokenizer(profile)
    from .tasks import task_rows

    rows, eval_source, source = task_rows(profile)
    splits, card = prepare_dataset(rows, tokenizer, profile.train_rows, profile.eval_rows,
                                   profile.max_prompt_tokens, profile.seed, eval_source=eval_source,
                                   source=source,
                                   chat_template_kwargs=get_model_spec(profile.model).chat_template_kwargs)
    save_prepared(splits, path, dict(card, origin="ensure_prepared", spec=spec))
    if verbose:
        print(f"Prepared {source['task']} into {path}: {card['counts']['train']} train, "
              f"{card['counts']['eval']} eval rows.")
    return load_prepared(path)



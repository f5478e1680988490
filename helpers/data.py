"""From a task's rows to a GRPO dataset (notebook 01's save point): a leak-free split with TRL's ``prompt`` column.

Example:
    >>> dedupe([{"question": "What is 2+2?"}, {"question": " what is 2+2? "}, {"question": "1+1?"}])
    ([{'question': 'What is 2+2?'}, {'question': '1+1?'}], [1])
"""

from __future__ import annotations

import random
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .models import Resolved, load_tokenizer, resolve
from .profiles import Profile
from .prompts import build_prompt, encode, supports_system_role
from .runs import atomic_folder, read_json, write_json
from .tasks import Task
from .tasks.check import TaskCheckError, check_reference_lengths

CARD = "card.json"


class DataError(ValueError):
    """A dataset problem; the message names the row, field or setting and the fix."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one row (``index`` None: with the whole table); rows count from 0."""

    index: int | None
    field: str
    kind: str  # missing_column | empty_question | bad_answer | duplicate
    message: str

    def __str__(self) -> str:
        return f"{'all rows' if self.index is None else f'row {self.index}'}, field {self.field!r}: {self.message}"


class DataValidationError(DataError):
    """:func:`validate` found problems in strict mode; ``.problems`` lists them all."""

    def __init__(self, problems: list[Problem], n_rows: int):
        self.problems = problems
        more = [f"  ... and {len(problems) - 5} more: validate(rows, task, strict=False) lists them all."]
        super().__init__("\n".join([f"{len(problems)} problem(s) in {n_rows} rows:"]
                                   + [f"  - {p}" for p in problems[:5]] + (more if len(problems) > 5 else [])))


def records(rows: Any) -> list[dict[str, Any]]:
    """The rows (a ``Dataset`` or any iterable of mappings) as a list of dicts."""
    return rows.to_list() if hasattr(rows, "to_list") else [dict(r) for r in rows]


def normalize_question(text: Any) -> str:
    """A question reduced for duplicate detection: case, spacing and end punctuation."""
    return " ".join(unicodedata.normalize("NFKC", str(text or "")).casefold().split()).rstrip(" ?.!")


def validate(rows: Any, task: Task, strict: bool = True, check_duplicates: bool = True) -> list[Problem]:
    """Every problem in a task's rows (missing columns, empty, refused or repeated questions); raises if ``strict``."""
    table = records(rows)
    columns = list(getattr(rows, "column_names", None) or dict.fromkeys(k for r in table for k in r))
    problems = [Problem(None, c, "missing_column", f"there is no {c!r} column (columns: {columns}); rename yours, "
                        f"e.g. dataset.rename_column('<yours>', {c!r})") for c in ("question", "answer")
                if c not in columns]
    seen: dict[str, int] = {}
    for i, row in enumerate(table if not problems else []):
        key = normalize_question(row.get("question"))
        if not key:
            problems.append(Problem(i, "question", "empty_question",
                                    "the question is empty (write it, or delete the row)"))
        elif check_duplicates and key in seen:
            problems.append(Problem(i, "question", "duplicate", f"the same question as row {seen[key]} "
                                    "(delete one: prepare_dataset keeps the first and counts the rest)"))
        seen.setdefault(key, i)
        try:
            task.clean_answer(row)
        except ValueError as exc:
            problems.append(Problem(i, "answer", "bad_answer", str(exc)))
    if strict and problems:
        raise DataValidationError(problems, len(table))
    return problems


def dedupe(rows: Any) -> tuple[list[dict[str, Any]], list[int]]:
    """Rows without repeated questions (the first kept) and the indices removed."""
    import pandas as pd
    table = records(rows)
    repeated = pd.Series([normalize_question(r.get("question")) for r in table], dtype=object).duplicated().tolist()
    return [r for r, d in zip(table, repeated) if not d], [i for i, d in enumerate(repeated) if d]


def count_prompt_tokens(prompts: Sequence[Any], tokenizer: Any, **chat_template_kwargs: Any) -> list[int]:
    """Tokens per prompt exactly as TRL feeds them (:func:`helpers.prompts.encode`)."""
    return [len(ids) for ids in encode(tokenizer, prompts, **chat_template_kwargs)]


def length_stats(lengths: Sequence[int]) -> dict[str, float]:
    """Count, mean, min, p50/p90/p95/p99 and max of token lengths."""
    import pandas as pd
    if len(lengths) == 0:
        return {"n": 0}
    d = pd.Series(list(lengths), dtype=float).describe(percentiles=[0.5, 0.9, 0.95, 0.99])
    return {"n": int(d["count"]), "mean": round(float(d["mean"]), 1), "min": float(d["min"]),
            **{f"p{q}": round(float(d[f"{q}%"]), 1) for q in (50, 90, 95, 99)}, "max": float(d["max"])}


def split_train_eval(rows: Any, eval_rows: int, seed: int, train_rows: int | None = None,
                     eval_source: Any = None) -> tuple[Any, dict[str, int]]:
    """A seeded ``train``/``eval`` ``DatasetDict`` sharing no question; eval drawn from ``eval_source`` when given."""
    from datasets import Dataset, DatasetDict
    pool, source = records(rows), None if eval_source is None else records(eval_source)
    for name, part in (("rows", pool), ("eval_source", source or [])):
        if repeated := dedupe(part)[1]:
            raise DataError(f"{name} holds {len(repeated)} duplicate question(s), which could leak "
                            "between train and eval. Fix: rows, removed = dedupe(rows) first.")
    if eval_rows < 1:
        raise DataError(f"eval_rows must be at least 1 (got {eval_rows}).")
    shuffled = list(pool)
    random.Random(seed).shuffle(shuffled)
    if source is None:
        if len(pool) < eval_rows + 1:
            raise DataError(f"Only {len(pool)} rows: too few for {eval_rows} eval rows and a train split. "
                            "Lower eval_rows or give more rows.")
        held, candidates = shuffled[:eval_rows], shuffled[eval_rows:]
    else:
        if not source:
            raise DataError("eval_source is empty.")
        held = random.Random(seed + 1).sample(source, min(eval_rows, len(source)))
        keys = {normalize_question(r["question"]) for r in held}
        candidates = [r for r in shuffled if normalize_question(r["question"]) not in keys]
    train = candidates if train_rows is None else candidates[:train_rows]
    info = {"train": len(train), "eval": len(held), "leaked_removed": len(shuffled) - len(candidates) if source else 0}
    columns = list(pool[0]) if pool else ["question", "answer"]
    return DatasetDict({name: Dataset.from_list(part) if part else Dataset.from_dict({c: [] for c in columns})
                        for name, part in (("train", train), ("eval", held))}), info


def prepare_dataset(rows: Any, tokenizer: Any, task: Task, train_rows: int | None, eval_rows: int,
                    max_prompt_tokens: int, seed: int, eval_source: Any = None, strict: bool = True,
                    source: dict[str, Any] | None = None, chat_template_kwargs: dict | None = None) -> tuple[Any, dict]:
    """Validate, clean, dedupe, prompt, budget and split: ``(splits, card)``; ``strict=False`` drops invalid rows."""
    t0, role = time.perf_counter(), supports_system_role(tokenizer)
    counts: dict[str, Any] = {}
    pools: dict[str, list[dict[str, Any]]] = {}
    lengths: list[int] = []
    for name, raw in (("rows", rows), ("eval_source", eval_source)):
        if raw is None:
            continue
        table = records(raw)
        problems = validate(table, task, strict=strict, check_duplicates=False)
        if any(p.index is None for p in problems):  # a missing column: no row can be used
            raise DataValidationError(problems, len(table))
        bad = {p.index for p in problems}
        cleaned = [dict(r, answer=task.clean_answer(r)) for i, r in enumerate(table) if i not in bad]
        cleaned, dups = dedupe(cleaned)
        for r in cleaned:
            r["prompt"] = build_prompt(str(r["question"]), task.system_prompt_for(r), role)
        sizes = count_prompt_tokens([r["prompt"] for r in cleaned], tokenizer, **(chat_template_kwargs or {}))
        lengths += sizes
        pools[name] = [dict(r, prompt_tokens=n) for r, n in zip(cleaned, sizes) if n <= max_prompt_tokens]
        counts[name] = {"loaded": len(table), "invalid_removed": len(bad), "duplicates_removed": len(dups),
                        "over_budget_removed": len(cleaned) - len(pools[name]), "kept": len(pools[name])}
    splits, info = split_train_eval(pools["rows"], eval_rows, seed, train_rows, pools.get("eval_source"))
    counts.update(info)
    card = {"source": source or {"task": task.name}, "seed": seed, "counts": counts,
            "filters": {"max_prompt_tokens": max_prompt_tokens, "dedupe": "normalize_question",
                        "invalid_rows": "raise" if strict else "drop"},
            "token_lengths": length_stats(lengths), "system_role": role, "columns": list(splits["train"].column_names),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": round(time.perf_counter() - t0, 3)}
    return splits, card


def save_prepared(splits: Any, path: str | Path, card: dict[str, Any]) -> Path:
    """Save the splits and ``card.json`` into ``path``, atomically (replacing what was there)."""
    if {"train", "eval"} - set(splits):
        raise DataError(f"The prepared dataset needs 'train' and 'eval' splits (has {list(splits)}).")
    with atomic_folder(path, overwrite=True) as tmp:
        splits.save_to_disk(str(tmp))
        write_json(tmp / CARD, card)
    return Path(path)


def read_card(path: str | Path) -> dict[str, Any]:
    """The ``card.json`` of a prepared dataset folder (``{}`` when it has none)."""
    return read_json(Path(path) / CARD) if (Path(path) / CARD).is_file() else {}


def load_prepared(path: str | Path) -> Any:
    """Load a prepared ``DatasetDict`` and check its splits and columns."""
    from datasets import load_from_disk
    if not (Path(path) / "dataset_dict.json").is_file():
        raise DataError(f"No prepared dataset at {path}. Build it with helpers.data.ensure_prepared(PROFILE, RUN) "
                        "or run notebook 01_dataset_prep.")
    splits = load_from_disk(str(path))
    for name in ("train", "eval"):
        missing = [c for c in ("prompt", "answer", "question") if name in splits and c not in splits[name].column_names]
        if name not in splits or missing:
            raise DataError(f"{path} lacks the {name!r} split or its columns {missing or ['prompt', 'answer']}. "
                            "Delete the folder and rebuild it with ensure_prepared(PROFILE, RUN).")
    return splits


def ensure_prepared(profile: Profile | Resolved, run: str | Path, tokenizer: Any = None, rebuild: bool = False,
                    verbose: bool = True) -> Any:
    """``RUN/dataset``, built from the profile's task when missing or built for other settings.

    The rows and their train/held-out split come from ``profile.split_seed``, not ``profile.seed``: runs of two seeds
    train on the same rows (in another order) and are scored on the same held-out rows. ``profile`` may be the run's
    :class:`helpers.models.Resolved`: its task instance (a notebook's ``TASK``) builds the rows.
    """
    given, profile = profile, profile.profile if isinstance(profile, Resolved) else profile
    path = Path(run) / "dataset"
    spec = {k: getattr(profile, k) for k in ("task", "task_level", "train_rows", "eval_rows", "max_prompt_tokens",
                                             "split_seed", "model")}
    if path.exists() and not rebuild:
        card = read_card(path)
        if card.get("origin") != "ensure_prepared" or card.get("spec") == spec:
            return load_prepared(path)
        if verbose:
            changed = sorted(k for k in spec if card.get("spec", {}).get(k) != spec[k])
            print(f"Rebuilding {path}: it was prepared with other settings ({', '.join(changed)}).")
    r = resolve(given, probe=False)   # looked up only when the dataset is built
    task, tokenizer = r.task, tokenizer or load_tokenizer(r)
    made = task.make_rows(profile.task_level, profile.train_rows + profile.eval_rows, profile.split_seed)
    rows, held = (made["train"], made["eval"]) if isinstance(made, dict) else (made, None)
    too_long = reference_fit(profile, task, rows, tokenizer)
    splits, card = prepare_dataset(rows, tokenizer, task, profile.train_rows,
                                   profile.eval_rows, profile.max_prompt_tokens, profile.split_seed, eval_source=held,
                                   source={"task": profile.task, "level": profile.task_level},
                                   chat_template_kwargs=r.spec.chat_template_kwargs)
    save_prepared(splits, path, dict(card, origin="ensure_prepared", spec=spec, references_too_long=too_long))
    if verbose:
        print(f"Prepared {profile.task} ({profile.task_level}) into {path}: {card['counts']['train']} train, "
              f"{card['counts']['eval']} eval rows.")
    return load_prepared(path)


def reference_fit(profile: Profile, task: Task, rows: Any, tokenizer: Any, sample: int = 300) -> str | None:
    """Check the references fit ``max_completion_length``: an error for the warm-up's, a printed count for GRPO's.

    A warm-up on cut-off references teaches the model to be cut off; at the GRPO level a reference that does not fit
    is an answer the model cannot finish. Returns the GRPO level's finding (``None`` when every reference fits).
    """
    findings = check_reference_lengths(task, records(rows)[:sample], tokenizer, profile.max_completion_length,
                                       profile.task_level, kind="warning")
    if profile.warmup_examples:
        warm = task.make_rows(profile.warmup_level, profile.warmup_examples, profile.seed + 1)
        errors = check_reference_lengths(task, records(warm), tokenizer, profile.max_completion_length,
                                         profile.warmup_level)
        if errors:
            raise TaskCheckError(f"The warm-up would train on cut-off answers: {errors[0].where}: {errors[0].message}")
    for finding in findings:
        print(f"Note: {finding.where}: {finding.message}")
    return findings[0].message if findings else None

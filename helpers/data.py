"""From raw problems to GRPO-ready prompts: load, check, prompt, measure, split, save.

The prepared dataset is a ``datasets.DatasetDict`` with splits ``train`` and
``eval`` and the columns TRL's ``GRPOTrainer`` expects: ``prompt`` (a
conversation: system + user messages), ``answer`` (a normalised number
string), ``question`` (the raw text), plus extra columns (``solution``,
``level``, ``prompt_tokens``, ...) that reward functions receive as keywords.

Sources, all ending in rows with ``question`` and ``answer``:

* the synthetic ``arithmetic`` task (:mod:`helpers.tasks`), generated offline;
* GSM8K, from the hub (``openai/gsm8k``) or from local JSONL files with the
  same fields, through the same ``datasets.load_dataset`` call;
* your own CSV/JSONL with a column mapping (:func:`load_custom`).

Example:
    >>> from helpers.data import extract_hash_answer, build_prompt
    >>> extract_hash_answer("48 + 24 = 72\\n#### 1,072")
    '1072'
    >>> [m["role"] for m in build_prompt("What is 2 + 3?")]
    ['system', 'user']
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from .prompts import ANSWER_END, ANSWER_START, REASONING_END, REASONING_START, SYSTEM_PROMPT

#: Environment variable naming a folder with GSM8K's ``train.jsonl``/``test.jsonl``.
GSM8K_DIR_ENV = "COURSE_GSM8K_DIR"
GSM8K_HUB_ID = ("openai/gsm8k", "main")
#: The authored GSM8K-style sample shipped in ``data/`` (written for this course).
SAMPLE_DIR = "gsm8k_sample"
CARD_NAME = "card.json"
SPLITS = ("train", "eval")
REQUIRED_COLUMNS = ("prompt", "answer", "question")

Rows = Any  # a datasets.Dataset, a pandas DataFrame or a list of dicts


class DataError(ValueError):
    """A dataset problem; the message names the row, field or setting and the fix."""


class DataValidationError(DataError):
    """Raised by :func:`validate` in strict mode; ``.report`` holds every problem."""

    def __init__(self, report: "ValidationReport"):
        self.report = report
        super().__init__(report.summary(limit=5))


class GSM8KUnavailableError(DataError):
    """GSM8K could not be loaded from the hub or the given files."""


# ---------------------------------------------------------------- answers


def normalize_number(text: Any) -> str | None:
    """The canonical string of a single number, or ``None`` when ``text`` is not one.

    The rewards' rule (:func:`helpers.rewards.normalize_number`), so gold answers
    and the model's answers are normalised the same way: drops ``$``, ``%``,
    thousands commas, spaces and a trailing period, and trailing zeros after a
    decimal point.

    Example:
        >>> [normalize_number(x) for x in ["1,234", "$18", "-5", "18.00", "3.50", "12.", "ten"]]
        ['1234', '18', '-5', '18', '3.5', '12', None]
    """
    from .rewards import normalize_number as rewards_normalize_number

    if isinstance(text, bool):
        return None
    return rewards_normalize_number(text)


def extract_hash_answer(text: str | None) -> str | None:
    """The final answer after the last ``####`` of a GSM8K solution, normalised.

    ``None`` when there is no ``####``. When what follows is not a number the
    stripped text is returned unchanged, so :func:`validate` can name it.

    Example:
        >>> [extract_hash_answer(t) for t in ["so 3 + 4 = 7\\n#### 7", "#### $1,080", "#### -5", "no marker"]]
        ['7', '1080', '-5', None]
    """
    if not isinstance(text, str) or "####" not in text:
        return None
    tail = text.rsplit("####", 1)[1].strip()
    number = normalize_number(tail)
    return number if number is not None else tail


def clean_answer(value: Any) -> str | None:
    """An answer cell as a number string: a ``####`` solution, a number, or text as given.

    Example:
        >>> clean_answer("Half of 10 is 5.\\n#### 5"), clean_answer(1200), clean_answer(" 1,200 ")
        ('5', '1200', '1200')
    """
    if value is None:
        return None
    text = str(value).strip()
    if not text:
        return None
    if "####" in text:
        return extract_hash_answer(text)
    number = normalize_number(text)
    return number if number is not None else text


def solution_text(gsm8k_answer: str) -> str:
    """The worked solution of a GSM8K answer: before ``####``, calculator notes removed.

    Example:
        >>> solution_text("48/2 = <<48/2=24>>24 clips.\\n#### 24")
        '48/2 = 24 clips.'
    """
    body = gsm8k_answer.rsplit("####", 1)[0] if "####" in gsm8k_answer else gsm8k_answer
    return re.sub(r"<<[^>]*>>", "", body).strip()


def normalize_question(text: Any) -> str:
    """A question reduced for duplicate detection: case, spacing and end punctuation.

    Example:
        >>> normalize_question("  What is 2 +  3? ") == normalize_question("what is 2 + 3")
        True
    """
    s = unicodedata.normalize("NFKC", str(text or "")).casefold()
    s = " ".join(s.split())
    return s.rstrip(" ?.!")


# ---------------------------------------------------------------- loading


@contextlib.contextmanager
def _quiet_progress() -> Iterator[None]:
    """Hide ``datasets`` progress bars inside the block (restored afterwards)."""
    from datasets.utils import logging as dlog

    was = dlog.is_progress_bar_enabled()
    dlog.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            dlog.enable_progress_bar()


def _as_records(rows: Rows) -> list[dict[str, Any]]:
    if isinstance(rows, list):
        return [dict(r) for r in rows]
    if hasattr(rows, "to_dict") and hasattr(rows, "columns") and not hasattr(rows, "to_list"):
        return rows.to_dict("records")  # pandas
    if hasattr(rows, "to_list"):
        return rows.to_list()  # datasets.Dataset
    return [dict(r) for r in rows]


def _columns(rows: Rows) -> list[str]:
    names = getattr(rows, "column_names", None)
    if names is not None:
        return list(names)
    if hasattr(rows, "columns"):
        return [str(c) for c in rows.columns]
    records = rows if isinstance(rows, list) else list(rows)
    seen: dict[str, None] = {}
    for r in records:
        seen.update(dict.fromkeys(r))
    return list(seen)


def data_file(name: str) -> Path:
    """Path of a file shipped in the course's ``data/`` folder.

    Found in the checkout (editable install). On a bare install (Colab) it is
    fetched once from the course repository into the cache folder.

    Example:
        >>> data_file("custom_example.csv").name
        'custom_example.csv'
    """
    from .config import REPO_BRANCH, REPO_URL, cache_dir, project_root

    root = project_root()
    if root is not None and (root / "data" / name).is_file():
        return root / "data" / name
    cached = cache_dir() / "data" / name
    if cached.is_file():
        return cached
    url = REPO_URL.replace("github.com", "raw.githubusercontent.com") + f"/{REPO_BRANCH}/data/{name}"
    try:
        import urllib.request

        cached.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(url, timeout=20) as resp:
            payload = resp.read()
        tmp = cached.with_name(cached.name + ".part")
        tmp.write_bytes(payload)
        os.replace(tmp, cached)
    except Exception as exc:  # noqa: BLE001 - any failure gets the same advice
        raise FileNotFoundError(
            f"The course data file {name!r} is not in a checkout and could not be fetched from "
            f"{url} ({exc}). Clone the course repository and `pip install -e .` from it, or "
            f"put the file at {cached}."
        ) from exc
    return cached


def load_gsm8k(split: str = "train", source: str | Path | None = None) -> Any:
    """Raw GSM8K rows (``question``, ``answer`` with ``#### n``) as a ``datasets.Dataset``.

    ``source``:
      * ``None``: the folder in ``$COURSE_GSM8K_DIR`` when set, else the hub;
      * ``"hub"``: ``load_dataset("openai/gsm8k", "main")``;
      * ``"sample"``: the small GSM8K-style sample authored for this course;
      * a folder holding ``<split>.jsonl``, or one ``.jsonl``/``.json`` file.

    Local files go through ``load_dataset("json", ...)``, so they behave like the hub.

    Example:
        >>> ds = load_gsm8k("train", source="sample")
        >>> ds.column_names
        ['question', 'answer']
    """
    from datasets import load_dataset

    if split not in ("train", "test"):
        raise DataError(f"GSM8K has the splits 'train' and 'test', not {split!r}.")
    if source is None:
        source = os.environ.get(GSM8K_DIR_ENV, "").strip() or "hub"
    if source == "hub":
        try:
            with _quiet_progress():
                ds = load_dataset(*GSM8K_HUB_ID, split=split)
        except Exception as exc:  # noqa: BLE001 - network, auth, cache: same advice
            raise GSM8KUnavailableError(
                f"Could not load {GSM8K_HUB_ID[0]!r} ({GSM8K_HUB_ID[1]}) from the Hugging Face "
                f"Hub: {type(exc).__name__}: {exc}\n"
                "What to do: on a machine without internet, pass local files with the same "
                "'question'/'answer' fields: load_gsm8k(split, source='/path/to/folder') where "
                f"the folder holds train.jsonl and test.jsonl, or set {GSM8K_DIR_ENV} to that "
                "folder. To try the pipeline without GSM8K use source='sample' or the "
                "'arithmetic' task (COURSE_PROFILE=cpu-demo)."
            ) from exc
    else:
        if source == "sample":
            path = data_file(f"{SAMPLE_DIR}/{split}.jsonl")
        else:
            path = Path(source).expanduser()
            if path.is_dir():
                path = path / f"{split}.jsonl"
            if not path.is_file():
                raise GSM8KUnavailableError(
                    f"No GSM8K file at {path}. Give a folder holding {split}.jsonl (one JSON "
                    "object per line with 'question' and 'answer'), a .jsonl file, 'sample', "
                    "or 'hub'."
                )
        with _quiet_progress():
            ds = load_dataset("json", data_files=str(path), split="train")
    missing = [c for c in ("question", "answer") if c not in ds.column_names]
    if missing:
        raise DataError(
            f"GSM8K rows from {source} lack the column(s) {missing} (found {ds.column_names}). "
            "Each row needs 'question' and 'answer' (a solution ending in '#### <number>')."
        )
    return ds


def parse_gsm8k(rows: Rows, source: str = "gsm8k") -> Any:
    """GSM8K rows as task rows: ``question``, ``answer`` (the number), ``solution``, ``source``.

    Rows without ``####`` get ``answer=None``, which :func:`validate` reports.

    Example:
        >>> parse_gsm8k([{"question": "Q?", "answer": "2 + 2 = <<2+2=4>>4\\n#### 4"}])[0]
        {'question': 'Q?', 'answer': '4', 'solution': '2 + 2 = 4', 'source': 'gsm8k'}
    """
    from datasets import Dataset

    out = [
        {"question": r["question"], "answer": extract_hash_answer(r["answer"]),
         "solution": solution_text(r["answer"] or ""), "source": source}
        for r in _as_records(rows)
    ]
    return Dataset.from_list(out) if out else Dataset.from_dict(
        {"question": [], "answer": [], "solution": [], "source": []})


def load_custom(
    path: str | Path,
    question: str = "question",
    answer: str = "answer",
    keep: Sequence[str] | None = None,
) -> Any:
    """Your own CSV or JSONL as task rows, with a column mapping.

    ``question``/``answer`` name your columns; they are renamed to ``question``
    and ``answer``. Every other column is kept (reward functions receive them as
    keywords) unless ``keep`` lists the ones to keep. Cells are read as text;
    :func:`validate` then checks them.

    Example:
        >>> ds = load_custom(data_file("custom_example.csv"), question="problem", answer="result")
        >>> ds.column_names[:2]
        ['question', 'answer']
    """
    import pandas as pd
    from datasets import Dataset

    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"No file at {path}. Give the path of a .csv, .jsonl or .json file.")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    elif suffix in (".jsonl", ".json"):
        frame = pd.read_json(path, lines=suffix == ".jsonl", dtype=False)
    else:
        raise DataError(f"Cannot read {path.name}: use a .csv, .jsonl or .json file.")
    columns = [str(c) for c in frame.columns]
    for role, name in (("question", question), ("answer", answer)):
        if name not in columns:
            raise DataError(
                f"{path.name} has no column {name!r} for the {role} (columns: {columns}). "
                f"Fix: pass {role}='<your column>' to load_custom, e.g. {role}={columns[0]!r}."
            )
    extras = [c for c in columns if c not in (question, answer)]
    if keep is not None:
        unknown = [c for c in keep if c not in extras]
        if unknown:
            raise DataError(f"keep={list(keep)} names column(s) {unknown} not in {path.name} "
                            f"(other columns: {extras}).")
        extras = list(keep)
    records = []
    for r in frame.to_dict("records"):
        row = {"question": _cell(r[question]), "answer": _cell(r[answer])}
        row.update({c: _cell(r[c]) for c in extras})
        records.append(row)
    if not records:
        raise DataError(f"{path.name} has a header but no rows.")
    return Dataset.from_list(records)


def _cell(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and value != value):
        return None
    return str(value)


# ---------------------------------------------------------------- validation


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one row (``index`` None: with the whole table)."""

    index: int | None
    field: str
    kind: str  # missing_column | empty_question | missing_answer | not_a_number | duplicate
    message: str
    fix: str

    def __str__(self) -> str:
        where = "all rows" if self.index is None else f"row {self.index}"
        return f"{where}, field {self.field!r}: {self.message}. Fix: {self.fix}"


@dataclass
class ValidationReport:
    """Every problem found by :func:`validate`; ``ok`` when there is none.

    Example:
        >>> r = validate([{"question": "", "answer": "3"}], strict=False)
        >>> r.ok, r.counts()
        (False, {'empty_question': 1})
    """

    n_rows: int
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def bad_rows(self) -> list[int]:
        """Indices of rows with at least one problem (duplicates included)."""
        return sorted({p.index for p in self.problems if p.index is not None})

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.problems:
            out[p.kind] = out.get(p.kind, 0) + 1
        return out

    def summary(self, limit: int = 10) -> str:
        if self.ok:
            return f"{self.n_rows} rows, no problems."
        lines = [f"{len(self.problems)} problem(s) in {self.n_rows} rows "
                 f"({', '.join(f'{k}: {v}' for k, v in self.counts().items())}):"]
        lines += [f"  - {p}" for p in self.problems[:limit]]
        if len(self.problems) > limit:
            lines.append(f"  ... and {len(self.problems) - limit} more; "
                         "validate(rows, strict=False).problems lists them all.")
        return "\n".join(lines)

    def to_frame(self) -> Any:
        """The problems as a pandas DataFrame (one row per problem)."""
        import pandas as pd

        return pd.DataFrame([p.__dict__ for p in self.problems],
                            columns=["index", "field", "kind", "message", "fix"])

    def __str__(self) -> str:
        return self.summary()


def validate(
    rows: Rows,
    strict: bool = True,
    numeric_answer: bool = True,
    check_duplicates: bool = True,
    required: Sequence[str] = ("question", "answer"),
) -> ValidationReport:
    """Check task rows; raise :class:`DataValidationError` (strict) or return a report.

    Checks: required columns, empty questions, missing answers, answers that
    are not numbers (when ``numeric_answer``; GSM8K ``####`` solutions and
    ``$``/``,``/``%`` are accepted), and duplicate questions (after
    :func:`normalize_question`). Row indices are 0-based, as in pandas.

    Example:
        >>> validate([{"question": "2+2?", "answer": "four"}], strict=False).problems[0].kind
        'not_a_number'
    """
    columns = _columns(rows)
    records = _as_records(rows)
    report = ValidationReport(n_rows=len(records))
    missing = [c for c in required if c not in columns]
    for col in missing:
        report.problems.append(Problem(
            None, col, "missing_column", f"there is no {col!r} column (columns: {columns})",
            f"rename your column to {col!r}, or map it: load_custom(path, {col}='<your column>')"))
    seen: dict[str, int] = {}
    for i, row in enumerate(records):
        if "question" not in missing:
            q = row.get("question")
            if q is None or not str(q).strip():
                report.problems.append(Problem(
                    i, "question", "empty_question", "the question is empty",
                    "write the question text, or delete the row"))
            elif check_duplicates:
                key = normalize_question(q)
                if key in seen:
                    report.problems.append(Problem(
                        i, "question", "duplicate",
                        f"same question as row {seen[key]} ({str(q)[:60]!r})",
                        "delete one of the two rows (prepare_dataset keeps the first and "
                        "counts the rest)"))
                else:
                    seen[key] = i
        if "answer" not in missing:
            raw = row.get("answer")
            value = clean_answer(raw)
            if value is None:
                what = "has no '####' final answer" if raw else "is missing"
                report.problems.append(Problem(
                    i, "answer", "missing_answer", f"the answer {what}",
                    "write the final answer, e.g. 42 (a GSM8K-style solution ends with a line "
                    "'#### 42')"))
            elif numeric_answer and normalize_number(value) is None:
                report.problems.append(Problem(
                    i, "answer", "not_a_number", f"{str(raw)[:40]!r} is not a number",
                    "write the final answer as digits, e.g. 12 ($, % and thousands commas are "
                    "fine); for a task whose answers are not numbers pass numeric_answer=False"))
    if strict and not report.ok:
        raise DataValidationError(report)
    return report


def dedupe(rows: Rows) -> tuple[Any, list[int]]:
    """Rows without repeated questions (first kept) and the indices removed.

    Example:
        >>> kept, removed = dedupe([{"question": "A?"}, {"question": "a"}, {"question": "B"}])
        >>> len(kept), removed
        (2, [1])
    """
    from datasets import Dataset

    records = _as_records(rows)
    seen: set[str] = set()
    kept, removed = [], []
    for i, r in enumerate(records):
        key = normalize_question(r.get("question"))
        if key in seen:
            removed.append(i)
        else:
            seen.add(key)
            kept.append(r)
    if isinstance(rows, Dataset):
        return _to_dataset(kept, _columns(rows)), removed
    return kept, removed


def _to_dataset(records: list[dict[str, Any]], columns: Sequence[str] = ()) -> Any:
    from datasets import Dataset

    if records:
        return Dataset.from_list(records)
    return Dataset.from_dict({c: [] for c in columns})


# ---------------------------------------------------------------- prompts


def fold_system_prompt(messages: Sequence[dict[str, str]], sep: str = "\n\n") -> list[dict[str, str]]:
    """Move a leading system message into the first user message (for Gemma-like templates).

    Example:
        >>> fold_system_prompt([{"role": "system", "content": "Be brief."},
        ...                     {"role": "user", "content": "2+2?"}])
        [{'role': 'user', 'content': 'Be brief.\\n\\n2+2?'}]
    """
    msgs = [dict(m) for m in messages]
    if not msgs or msgs[0].get("role") != "system":
        return msgs
    system, rest = msgs[0], msgs[1:]
    for m in rest:
        if m.get("role") == "user":
            m["content"] = f"{system['content']}{sep}{m['content']}"
            return rest
    return [{"role": "user", "content": system["content"]}] + rest


def supports_system_role(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders a system message (Gemma 2's raises).

    A template that raises, or that silently drops the system text, gives False.

    Example:
        >>> supports_system_role(load_tokenizer())   # doctest: +SKIP
        True
    """
    probe = "SYSTEM-ROLE-PROBE-31"
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "system", "content": probe}, {"role": "user", "content": "hi"}],
            tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - jinja raises TemplateError, others ValueError
        return False
    return isinstance(text, str) and probe in text


def add_prefill(messages: Sequence[dict[str, str]], text: str = REASONING_START + "\n") -> list[dict[str, str]]:
    """Append an assistant turn that opens the answer (TRL continues it).

    The completion then starts *after* ``text``: a format reward must know the
    tag was prefilled. A prompt that already ends with an assistant turn is
    returned unchanged.

    Example:
        >>> add_prefill([{"role": "user", "content": "2+2?"}])[-1]
        {'role': 'assistant', 'content': '<reasoning>\\n'}
    """
    msgs = [dict(m) for m in messages]
    if msgs and msgs[-1].get("role") == "assistant":
        return msgs
    return msgs + [{"role": "assistant", "content": text}]


def build_prompt(
    question: str,
    system_prompt: str | None = SYSTEM_PROMPT,
    system_role: bool = True,
    prefill: bool = False,
) -> list[dict[str, str]]:
    """The conversational prompt for one question: system + user (+ prefilled assistant).

    ``system_role=False`` folds the system prompt into the user message.

    Example:
        >>> build_prompt("What is 2 + 3?", system_role=False, prefill=True)[-1]["role"]
        'assistant'
    """
    msgs: list[dict[str, str]] = []
    if system_prompt:
        msgs.append({"role": "system", "content": system_prompt})
    msgs.append({"role": "user", "content": question})
    if not system_role:
        msgs = fold_system_prompt(msgs)
    if prefill:
        msgs = add_prefill(msgs)
    return msgs


def build_text_prompt(question: str, system_prompt: str | None = SYSTEM_PROMPT, prefill: bool = False) -> str:
    """A plain-text prompt (no chat template): for base models, and for teaching the difference.

    Example:
        >>> print(build_text_prompt("What is 2 + 3?", system_prompt=None))
        Question: What is 2 + 3?
        Answer:
        <BLANKLINE>
    """
    head = f"{system_prompt}\n\n" if system_prompt else ""
    return f"{head}Question: {question}\nAnswer:\n" + (f"{REASONING_START}\n" if prefill else "")


def reference_completion(solution: str, answer: str, prefilled: bool = False) -> str:
    """A completion in the course format, e.g. for a format-only SFT warm-up.

    Example:
        >>> print(reference_completion("2 + 3 = 5", "5"))
        <reasoning>
        2 + 3 = 5
        </reasoning>
        <answer>
        5
        </answer>
    """
    text = f"{REASONING_START}\n{solution}\n{REASONING_END}\n{ANSWER_START}\n{answer}\n{ANSWER_END}"
    return text[len(REASONING_START) + 1:] if prefilled else text


def render(tokenizer: Any, prompt: Any) -> str:
    """The exact text the model sees for a prompt (its chat template applied).

    Example:
        >>> render(load_tokenizer(), build_prompt("Hi"))[:22]    # doctest: +SKIP
        '<|im_start|>system\\nRes'
    """
    from .generation import render_prompt

    return render_prompt(tokenizer, prompt)


def count_prompt_tokens(prompts: Sequence[Any], tokenizer: Any) -> list[int]:
    """Tokens per prompt as the model sees it (template applied, no extra special tokens).

    Example:
        >>> count_prompt_tokens([build_prompt("What is 2 + 3?")], load_tokenizer())  # doctest: +SKIP
        [44]
    """
    texts = [render(tokenizer, p) for p in prompts]
    if not texts:
        return []
    # A multimodal processor (e.g. Gemma 3 through Unsloth) wraps the text tokenizer.
    text_tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    ids = text_tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [len(x) for x in ids]


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
    for q in (50, 90, 95, 99):
        out[f"p{q}"] = round(float(np.percentile(a, q)), 1)
    out["max"] = float(a.max())
    return out


def plot_token_lengths(lengths: Sequence[int], budget: int | None = None, ax: Any = None,
                       title: str = "Prompt length in tokens") -> Any:
    """Histogram of prompt lengths with the budget (and p50/p99) marked; returns the Figure.

    Example:
        >>> fig = plot_token_lengths([40, 42, 45, 300], budget=256)   # doctest: +SKIP
    """
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 3.2))
    else:
        fig = ax.figure
    ax.hist(list(lengths), bins=min(50, max(5, len(set(lengths)))), color="#4c72b0")
    stats = length_stats(lengths)
    if stats["n"]:
        for key, style in (("p50", ":"), ("p99", "--")):
            ax.axvline(stats[key], color="gray", linestyle=style, label=f"{key} = {stats[key]:g}")
    if budget is not None:
        over = sum(1 for n in lengths if n > budget)
        ax.axvline(budget, color="#c44e52", linewidth=2, label=f"budget {budget} ({over} over)")
    ax.set_xlabel("tokens (chat template applied)")
    ax.set_ylabel("prompts")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def filter_by_budget(rows: Rows, max_tokens: int, column: str = "prompt_tokens") -> tuple[Any, int]:
    """Rows whose ``column`` is at most ``max_tokens``, and how many were removed.

    Example:
        >>> kept, removed = filter_by_budget([{"prompt_tokens": 10}, {"prompt_tokens": 99}], 50)
        >>> len(kept), removed
        (1, 1)
    """
    from datasets import Dataset

    if isinstance(rows, Dataset):
        if column not in rows.column_names:
            raise DataError(f"No {column!r} column to filter on; add it with add_prompts(..., "
                            "tokenizer=tok) first.")
        keep = [i for i, n in enumerate(rows[column]) if n <= max_tokens]
        return rows.select(keep), len(rows) - len(keep)
    records = _as_records(rows)
    if records and column not in records[0]:
        raise DataError(f"No {column!r} field to filter on; add it with add_prompts(..., "
                        "tokenizer=tok) first.")
    kept = [r for r in records if r[column] <= max_tokens]
    return kept, len(records) - len(kept)


def add_prompts(
    rows: Rows,
    tokenizer: Any = None,
    system_role: bool | None = None,
    prefill: bool = False,
    system_prompt: str | None = SYSTEM_PROMPT,
) -> Any:
    """A Dataset with a ``prompt`` column (and ``prompt_tokens`` when a tokenizer is given).

    ``system_role=None`` asks the tokenizer's template (:func:`supports_system_role`);
    without a tokenizer it keeps the system role.

    Example:
        >>> add_prompts([{"question": "2+2?", "answer": "4"}])[0]["prompt"][1]["content"]
        '2+2?'
    """
    records = _as_records(rows)
    if system_role is None:
        system_role = supports_system_role(tokenizer) if tokenizer is not None else True
    for r in records:
        r["prompt"] = build_prompt(str(r["question"]), system_prompt, system_role, prefill)
    if tokenizer is not None:
        for r, n in zip(records, count_prompt_tokens([r["prompt"] for r in records], tokenizer)):
            r["prompt_tokens"] = n
    return _to_dataset(records, _columns(rows) + ["prompt"])


# ---------------------------------------------------------------- split


def split_train_eval(
    rows: Rows,
    eval_rows: int,
    seed: int,
    train_rows: int | None = None,
    eval_source: Rows | None = None,
) -> tuple[Any, dict[str, int]]:
    """A seeded ``DatasetDict`` with ``train`` and ``eval`` and no question in both.

    Without ``eval_source`` the rows are shuffled with ``seed``; the first
    ``eval_rows`` become ``eval`` and the next ``train_rows`` (all when None)
    ``train``. With ``eval_source`` (e.g. GSM8K's test split) ``eval`` is drawn
    from it and train rows whose question appears there are removed and
    counted. Duplicate questions within a pool raise: run :func:`dedupe` first.

    Returns ``(splits, info)`` where ``info`` counts what was taken and removed.

    Example:
        >>> rows = [{"question": f"q{i}", "answer": str(i)} for i in range(10)]
        >>> splits, info = split_train_eval(rows, eval_rows=3, seed=0)
        >>> splits["train"].num_rows, splits["eval"].num_rows
        (7, 3)
    """
    import random

    from datasets import DatasetDict

    pool = _as_records(rows)
    columns = _columns(rows)
    for name, records in (("rows", pool), ("eval_source", _as_records(eval_source or []))):
        keys = [normalize_question(r.get("question")) for r in records]
        if len(set(keys)) != len(keys):
            raise DataError(
                f"{name} holds {len(keys) - len(set(keys))} duplicate question(s), which could "
                "leak between train and eval. Fix: rows, removed = dedupe(rows) first.")
    if eval_rows < 1:
        raise DataError(f"eval_rows must be at least 1 (got {eval_rows}).")
    info: dict[str, int] = {"leaked_removed": 0}
    rng = random.Random(seed)
    order = list(range(len(pool)))
    rng.shuffle(order)
    if eval_source is None:
        if len(pool) < eval_rows + 1:
            raise DataError(f"Only {len(pool)} rows: too few for {eval_rows} eval rows and a "
                            "train split. Lower eval_rows or give more rows.")
        ev = [pool[i] for i in order[:eval_rows]]
        tr_candidates = [pool[i] for i in order[eval_rows:]]
    else:
        source = _as_records(eval_source)
        if not source:
            raise DataError("eval_source is empty.")
        eorder = list(range(len(source)))
        random.Random(seed + 1).shuffle(eorder)
        ev = [source[i] for i in eorder[:eval_rows]]
        eval_keys = {normalize_question(r["question"]) for r in ev}
        ordered = [pool[i] for i in order]
        tr_candidates = [r for r in ordered if normalize_question(r["question"]) not in eval_keys]
        info["leaked_removed"] = len(ordered) - len(tr_candidates)
    tr = tr_candidates if train_rows is None else tr_candidates[:train_rows]
    info.update(train=len(tr), eval=len(ev), requested_train=train_rows if train_rows is not None else len(tr),
                requested_eval=eval_rows)
    splits = DatasetDict({"train": _to_dataset(tr, columns), "eval": _to_dataset(ev, columns)})
    return splits, info


# ---------------------------------------------------------------- save / load


def save_prepared(splits: Any, path: str | Path, card: dict[str, Any]) -> Path:
    """Save splits and ``card.json`` into ``path`` atomically (temporary folder, then rename).

    Example:
        >>> save_prepared(splits, RUN / "dataset", card)      # doctest: +SKIP
    """
    from .runs import write_json

    path = Path(path)
    for name in SPLITS:
        if name not in splits:
            raise DataError(f"The prepared dataset needs a {name!r} split (has {list(splits)}).")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        with _quiet_progress():
            splits.save_to_disk(str(tmp / "data"))
        for item in (tmp / "data").iterdir():
            os.replace(item, tmp / item.name)
        (tmp / "data").rmdir()
        write_json(tmp / CARD_NAME, card)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def read_card(path: str | Path) -> dict[str, Any]:
    """The ``card.json`` of a prepared dataset folder ({} when it has none)."""
    from .runs import read_json

    card = Path(path) / CARD_NAME
    return read_json(card) if card.is_file() else {}


def load_prepared(path: str | Path) -> Any:
    """Load a prepared ``DatasetDict`` and check its splits and columns.

    Example:
        >>> ds = load_prepared(RUN / "dataset")      # doctest: +SKIP
        >>> list(ds)                                 # doctest: +SKIP
        ['train', 'eval']
    """
    from datasets import load_from_disk

    path = Path(path)
    if not (path / "dataset_dict.json").is_file():
        raise DataError(
            f"No prepared dataset at {path}. Build it with helpers.data.ensure_prepared(PROFILE, "
            "RUN) or run notebook 01_dataset_prep.")
    with _quiet_progress():
        splits = load_from_disk(str(path))
    for name in SPLITS:
        if name not in splits:
            raise DataError(f"{path} has no {name!r} split (has {list(splits)}). Delete the "
                            "folder and rebuild it with ensure_prepared(PROFILE, RUN).")
        missing = [c for c in REQUIRED_COLUMNS if c not in splits[name].column_names]
        if missing:
            raise DataError(f"The {name!r} split in {path} lacks column(s) {missing}. Delete the "
                            "folder and rebuild it with ensure_prepared(PROFILE, RUN).")
    return splits


# ---------------------------------------------------------------- the pipeline


def prepare_dataset(
    rows: Rows,
    tokenizer: Any,
    train_rows: int | None,
    eval_rows: int,
    max_prompt_tokens: int,
    seed: int,
    eval_source: Rows | None = None,
    system_role: bool | None = None,
    prefill: bool = False,
    numeric_answer: bool = True,
    strict: bool = True,
    source: dict[str, Any] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Validate, normalise answers, dedupe, build prompts, measure, filter, split.

    Returns ``(splits, card)``; the card counts every row removed and why.
    ``strict=False`` drops invalid rows (counted) instead of raising.

    Example:
        >>> splits, card = prepare_dataset(rows, tok, train_rows=64, eval_rows=16,
        ...                                max_prompt_tokens=256, seed=0)   # doctest: +SKIP
    """
    t0 = time.perf_counter()
    if system_role is None:
        system_role = supports_system_role(tokenizer)
    counts: dict[str, Any] = {}
    pools: dict[str, list[dict[str, Any]]] = {}
    lengths: list[int] = []
    for name, raw in (("rows", rows), ("eval_source", eval_source)):
        if raw is None:
            continue
        report = validate(raw, strict=strict, numeric_answer=numeric_answer, check_duplicates=False)
        bad = set(report.bad_rows)
        records = [r for i, r in enumerate(_as_records(raw)) if i not in bad]
        for r in records:
            r["answer"] = clean_answer(r["answer"])
        records, dups = dedupe(records)
        with_prompts = add_prompts(records, tokenizer, system_role=system_role, prefill=prefill)
        lengths += with_prompts["prompt_tokens"]
        kept, over = filter_by_budget(with_prompts, max_prompt_tokens)
        pools[name] = kept.to_list()
        counts[name] = {"loaded": report.n_rows, "invalid_removed": len(bad),
                        "duplicates_removed": len(dups), "over_budget_removed": over,
                        "kept": len(kept)}
    splits, info = split_train_eval(pools["rows"], eval_rows, seed, train_rows=train_rows,
                                    eval_source=pools.get("eval_source"))
    counts.update(info)
    card = {
        "source": source or {},
        "seed": seed,
        "counts": counts,
        "filters": {"max_prompt_tokens": max_prompt_tokens,
                    "tokenizer": _tokenizer_name(tokenizer),
                    "dedupe": "normalize_question (case, spacing, end punctuation)",
                    "invalid_rows": "raise" if strict else "drop"},
        "token_lengths": length_stats(lengths),
        "format": {"prompt": "conversational", "system_role": system_role,
                   "folded_system_prompt": not system_role, "prefill": prefill,
                   "system_prompt": SYSTEM_PROMPT, "answer": "normalised number string",
                   "columns": list(splits["train"].column_names)},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "seconds": round(time.perf_counter() - t0, 3),
    }
    return splits, card


def _tokenizer_name(tokenizer: Any) -> str:
    name = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
    return Path(name).name if os.path.isdir(name) else name


def dataset_spec(profile: Any) -> dict[str, Any]:
    """The profile settings a prepared dataset depends on (stored in its card)."""
    return {"task": profile.task, "task_level": profile.task_level,
            "train_rows": profile.train_rows, "eval_rows": profile.eval_rows,
            "max_prompt_tokens": profile.max_prompt_tokens, "seed": profile.seed,
            "model": profile.model}


def task_rows(profile: Any, gsm8k_source: str | Path | None = None) -> tuple[Any, Any, dict[str, Any]]:
    """``(rows, eval_source, source)`` for a profile's task, before any checks.

    Example:
        >>> rows, eval_source, src = task_rows(get_profile("cpu-smoke"))   # doctest: +SKIP
    """
    from .tasks import generate_arithmetic

    if profile.task == "arithmetic":
        n = profile.train_rows + profile.eval_rows
        rows = generate_arithmetic(n, profile.task_level, seed=profile.seed)
        return rows, None, {"task": "arithmetic", "level": profile.task_level, "seed": profile.seed}
    if profile.task == "gsm8k":
        where = gsm8k_source or os.environ.get(GSM8K_DIR_ENV, "").strip() or "hub"
        train = parse_gsm8k(load_gsm8k("train", where))
        test = parse_gsm8k(load_gsm8k("test", where))
        origin = f"{GSM8K_HUB_ID[0]} ({GSM8K_HUB_ID[1]})" if where == "hub" else str(where)
        return train, test, {"task": "gsm8k", "from": origin, "eval_from": "test split"}
    raise DataError(f"Unknown task {profile.task!r} in profile {profile.name!r}: use 'arithmetic' "
                    "or 'gsm8k' (or prepare your own rows with prepare_dataset and save_prepared).")


def ensure_prepared(
    profile: Any,
    run: str | Path,
    tokenizer: Any = None,
    rebuild: bool = False,
    gsm8k_source: str | Path | None = None,
    verbose: bool = True,
) -> Any:
    """The run's prepared dataset: loaded from ``run/dataset``, built from the profile if missing.

    A dataset that this function built for other profile settings is rebuilt;
    one you saved yourself (another ``origin`` in its card) is kept.

    Example:
        >>> ds = ensure_prepared(get_profile("cpu-smoke"), RUN)    # doctest: +SKIP
        >>> ds["train"].num_rows, ds["eval"].num_rows              # doctest: +SKIP
        (64, 16)
    """
    path = Path(run) / "dataset"
    spec = dataset_spec(profile)
    if path.exists() and not rebuild:
        card = read_card(path)
        if card.get("origin") != "ensure_prepared" or card.get("spec") == spec:
            return load_prepared(path)
        if verbose:
            changed = sorted(k for k in spec if card.get("spec", {}).get(k) != spec[k])
            print(f"Rebuilding {path}: it was prepared with other settings ({', '.join(changed)}).")
    if tokenizer is None:
        from .models import load_tokenizer

        tokenizer = load_tokenizer(profile.model)
    rows, eval_source, source = task_rows(profile, gsm8k_source)
    splits, card = prepare_dataset(
        rows, tokenizer, train_rows=profile.train_rows, eval_rows=profile.eval_rows,
        max_prompt_tokens=profile.max_prompt_tokens, seed=profile.seed,
        eval_source=eval_source, source=source)
    card.update(origin="ensure_prepared", spec=spec)
    save_prepared(splits, path, card)
    if verbose:
        c = card["counts"]
        print(f"Prepared {source.get('task')} into {path}: {c['train']} train, {c['eval']} eval.")
    return load_prepared(path)

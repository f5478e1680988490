"""Check a task before any model loads: its rewards called the way TRL calls them, on strange completions too.

Serves notebook 05 (and every run's data preparation).

``get_profile(task="my_module:MyTask")`` runs :func:`check_task` on a task of your own, and the data preparation
checks that the references fit the completion length; ``python -m helpers.tasks check my_module:MyTask`` runs
every check and prints a report. A failure is a :class:`TaskCheckError` whose message names the function, the
completion and the row, and says what to write instead.

Example:
    >>> from helpers.tasks import get_task
    >>> [f.kind for f in check_task(get_task("arithmetic"), levels=["add1"])]
    []
"""

from __future__ import annotations

import inspect
import math
import numbers
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..rewards import clip
from . import Task

#: Completions a model writes sooner or later, after the prefill (``{reference}`` is the row's own answer).
STRANGE: dict[str, str] = {
    "empty": "",
    "only spaces": "  \n\t ",
    "no tags": "The answer is 42.",
    "nested tags": "<answer><answer>4</answer></answer>",
    "repeated tags": "<answer>\n1\n</answer>\n<answer>\n2\n</answer>",
    "a unit after the number": "<answer>\n42 km\n</answer>",
    "a stray brace": '{"a": [1, {"b": ',
    "10,000 characters": "9" * 4000 + " <answer> " + "x" * 5990,
    "non-ASCII": "r\u00e9ponse \u2212\uff14\uff12 \u00bd \u221e \u7b54\u6848 \U0001f680 \u200b",
    "the reference cut in half": "{half_reference}",
    "the reference twice": "{reference}{reference}",
}
#: What TRL 1.13 adds to every reward call beside the dataset's columns (trl/trainer/grpo_trainer.py:1640-1651).
TRL_EXTRAS = ("trainer_state", "log_extra", "log_metric")
SLOW_SECONDS = 1.0  # one call slower than this on one strange completion is bounded work gone wrong


class TaskCheckError(ValueError):
    """A task that would fail or mislead once training starts; the message says what to change."""


@dataclass(frozen=True)
class Finding:
    """One thing the check found: ``error`` stops training, ``warning`` is reported."""

    kind: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.where}: {self.message}"


def _name(func: Any) -> str:
    return getattr(func, "__name__", type(func).__name__)


def _rows(task: Task, level: str, n: int, seed: int) -> list[dict[str, Any]]:
    made = task.make_rows(level, n, seed)
    rows = made["train"] if isinstance(made, Mapping) else made
    return [dict(r) for r in (rows.to_list() if hasattr(rows, "to_list") else rows)][:n]


def strange_completions(task: Task, row: Mapping[str, Any]) -> dict[str, str]:
    """:data:`STRANGE` for one row, with its reference filled in (the text after the task's prefill)."""
    try:
        reference = str(task.reference(row))
    except Exception:  # noqa: BLE001 - reported by check_task as the reference's own error
        reference = ""
    body = reference[len(task.prefill):] if reference.startswith(task.prefill) else reference
    return {label: text.replace("{half_reference}", body[: len(body) // 2]).replace("{reference}", body)
            for label, text in STRANGE.items()}


def trl_call(reward: Callable, texts: Sequence[str], row: Mapping[str, Any], conversational: bool = True) -> Any:
    """Call ``reward`` as ``GRPOTrainer`` does: prompts, completions, completion_ids, every column, TRL's extras."""
    n = len(texts)
    columns = {k: [v] * n for k, v in row.items() if k not in ("prompt", "completion", "completion_ids")}
    prompt = row.get("prompt") or [{"role": "user", "content": str(row.get("question", ""))}]
    completions = [[{"role": "assistant", "content": t}] for t in texts] if conversational else list(texts)
    return reward(prompts=[prompt] * n, completions=completions,
                  completion_ids=[list(range(min(len(t), 8))) for t in texts], **columns,
                  trainer_state=SimpleNamespace(global_step=0, max_steps=1, epoch=0.0),
                  log_extra=lambda *a, **k: None, log_metric=lambda *a, **k: None)


def signature_problem(reward: Callable, columns: Iterable[str]) -> str | None:
    """Why TRL's call would fail on ``reward``'s signature alone (no ``**kwargs``, a parameter TRL never passes)."""
    try:
        params = inspect.signature(reward).parameters.values()
    except (TypeError, ValueError):
        return None  # a builtin or C callable: the call itself will tell
    passed = {"prompts", "completions", "completion_ids", *TRL_EXTRAS, *columns}
    has_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
    needed = [p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
              and p.name not in passed]
    if needed:
        return (f"it needs {needed}, which TRL never passes: TRL passes prompts, completions, completion_ids, "
                f"{', '.join(TRL_EXTRAS)} and one keyword per dataset column ({', '.join(sorted(columns))}). "
                f"Name the parameters after those, or give them defaults.")
    if not has_kwargs:
        return (f"its signature has no **kwargs, and TRL passes every dataset column ({', '.join(sorted(columns))}) "
                f"plus prompts, completion_ids, {', '.join(TRL_EXTRAS)} as keywords: write "
                f"`def {_name(reward)}(completions, <the columns you use>, **kwargs):`.")
    return None


def return_problem(value: Any, n: int) -> str | None:
    """Why TRL cannot use what a reward returned for ``n`` completions (None: it can)."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple)):
        return (f"it returned {clip(repr(value), 60)} ({type(value).__name__}); TRL needs a list of {n} floats, one "
                "per completion (None where the reward does not apply): `return [score(c) for c in completions]`.")
    if len(value) != n:
        return f"it returned {len(value)} values for {n} completions; TRL needs exactly one per completion."
    for v in value:
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
            return (f"it returned {clip(repr(v), 40)} ({type(v).__name__}) among its values; each must be a float "
                    "(or None where the reward does not apply).")
        if v is not None and not math.isfinite(float(v)):
            return f"it returned {v}: return None where a reward does not apply, never NaN or infinity."
    return None


def _where(row_index: int, row: Mapping[str, Any], label: str, text: str) -> str:
    return f"on the completion {label!r} ({clip(repr(text), 50)}) of row {row_index} ({clip(row.get('question'), 50)!r})"


def _timed(call: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = call()
    return out, time.perf_counter() - start


def check_reward(reward: Callable, rows: Sequence[Mapping[str, Any]], task: Task) -> list[Finding]:
    """One reward: its signature, then TRL's call on every row's strange completions (chat and plain text)."""
    where = f"reward {_name(reward)}"
    columns = {k for row in rows for k in row if k not in ("prompt", "completion", "completion_ids")}
    problem = signature_problem(reward, columns)
    if problem:
        return [Finding("error", where, problem)]
    findings: list[Finding] = []
    for i, row in enumerate(rows):
        cases = strange_completions(task, row)
        for conversational in (True, False):
            for label, text in cases.items():
                form = "" if conversational else " (as a plain string)"
                try:
                    value, seconds = _timed(lambda: trl_call(reward, [text], row, conversational))
                except Exception as exc:  # noqa: BLE001 - the point: report it with the row and the completion
                    return findings + [Finding("error", where, f"raised {type(exc).__name__}: {clip(exc, 120)} "
                                               f"{_where(i, row, label, text)}{form}. A reward must never raise: "
                                               "score a strange completion 0.0 (or None), e.g. with try/except.")]
                problem = return_problem(value, 1)
                if problem:
                    return findings + [Finding("error", where, f"{problem} (called {_where(i, row, label, text)})")]
                if seconds > SLOW_SECONDS:
                    findings.append(Finding("warning", where, f"took {seconds:.1f} s {_where(i, row, label, text)}: "
                                            "bound the work (cut the text, avoid nested regex repeats)."))
    try:
        value = trl_call(reward, [cases["empty"], cases["no tags"]], rows[-1])
    except Exception as exc:  # noqa: BLE001
        return findings + [Finding("error", where, f"raised {type(exc).__name__} on two completions at once: {exc}")]
    problem = return_problem(value, 2)
    return findings + ([Finding("error", where, f"{problem} (called with two completions)")] if problem else [])


def check_score(task: Task, rows: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """``task.score`` on every strange completion; its keys hold the headline and format metrics; the reference wins."""
    where = f"{type(task).__name__}.score"
    for i, row in enumerate(rows):
        for label, text in strange_completions(task, row).items():
            full = task.prefill + text
            try:
                scores = task.score(full, row)
            except Exception as exc:  # noqa: BLE001
                return [Finding("error", where, f"raised {type(exc).__name__}: {clip(exc, 120)} "
                                f"{_where(i, row, label, full)}. score() must never raise: a completion it cannot "
                                "read scores 0.0 on every metric.")]
            if not isinstance(scores, Mapping):
                return [Finding("error", where, f"returned {type(scores).__name__}, not a dict {{metric: value}}.")]
            missing = [m for m in (task.headline, task.format_metric) if m not in scores]
            if missing:
                return [Finding("error", where, f"returned the keys {sorted(scores)}, without {missing}: the task's "
                                "headline and format_metric must be among score()'s keys (or change those names).")]
            bad = {k: v for k, v in scores.items() if isinstance(v, bool) or not isinstance(v, numbers.Real)
                   or not math.isfinite(float(v))}
            if bad:
                return [Finding("error", where, f"returned non-numbers {bad} {_where(i, row, label, full)}: each "
                                "metric is a float (1.0 / 0.0 for yes / no).")]
    row = rows[0]
    try:
        best = task.score(task.reference(row), row)
    except Exception as exc:  # noqa: BLE001
        return [Finding("error", f"{type(task).__name__}.reference", f"raised {type(exc).__name__}: {exc} on row 0")]
    if best.get(task.headline) != 1.0:
        return [Finding("error", where, f"scores the task's own reference {best.get(task.headline)!r} on "
                        f"{task.headline!r}, not 1.0 (row 0, {clip(row.get('question'), 50)!r}): score() and "
                        "reference() disagree about what a right answer looks like.")]
    return []


def check_answers(task: Task, rows: Sequence[Mapping[str, Any]], level: str) -> list[Finding]:
    """Every row's answer is one the task accepts (``clean_answer``), with the row named."""
    for i, row in enumerate(rows):
        try:
            task.clean_answer(row)
        except Exception as exc:  # noqa: BLE001
            return [Finding("error", f"level {level!r}", f"make_rows gave row {i} an answer clean_answer refuses: "
                            f"{exc} ({clip(row.get('question'), 50)!r})")]
    return []


def reference_lengths(task: Task, rows: Sequence[Mapping[str, Any]], tokenizer: Any) -> list[int]:
    """Tokens of each row's reference after the prefill, plus the end-of-turn token the model must also write."""
    lengths = []
    for row in rows:
        text = str(task.reference(row))
        body = text[len(task.prefill):] if text.startswith(task.prefill) else text
        lengths.append(len(tokenizer(body, add_special_tokens=False)["input_ids"]) + 1)
    return lengths


def check_reference_lengths(task: Task, rows: Sequence[Mapping[str, Any]], tokenizer: Any, budget: int,
                            level: str, kind: str = "error") -> list[Finding]:
    """Do the references fit ``max_completion_length``? Counts and names the longest rows, and what would fit."""
    lengths = reference_lengths(task, rows, tokenizer)
    over = sorted(((n, i) for i, n in enumerate(lengths) if n > budget), reverse=True)
    if not over:
        return []
    longest = "; ".join(f"row {i} ({n} tokens): {clip(rows[i].get('question'), 40)!r}" for n, i in over[:3])
    return [Finding(kind, f"level {level!r}", f"{len(over)} of {len(rows)} references do not fit "
                    f"max_completion_length={budget} (they would be cut off, and a cut-off answer scores 0). Longest: "
                    f"{longest}. max_completion_length={max(lengths)} fits them all; or shorten the references.")]


def check_task(task: Task, profile: Any = None, tokenizer: Any = None, levels: Sequence[str] | None = None,
               rows_per_level: int = 2, length_rows: int = 300, raise_errors: bool = False) -> list[Finding]:
    """Every check: rows and answers, ``score`` and each reward on strange completions, the references' lengths.

    ``profile`` picks the levels it trains on (``task_level``, and ``warmup_level`` when it warms up) and gives
    ``max_completion_length``; ``tokenizer`` adds the length check. ``raise_errors``: a :class:`TaskCheckError`
    listing every error (with what to do) instead of returning them.
    """
    if levels is None:
        levels = list(task.levels) if profile is None else list(dict.fromkeys(
            [profile.task_level] + ([profile.warmup_level] if profile.warmup_examples else [])))
    findings: list[Finding] = []
    failed: set[str] = set()  # a function found broken on one level is not reported again for the next
    for level in levels:
        try:
            rows = _rows(task, level, rows_per_level, seed=0)
        except Exception as exc:  # noqa: BLE001
            loaded = getattr(task.levels.get(level), "source", None)  # rows from elsewhere: maybe not here
            findings.append(Finding("warning" if loaded else "error", f"{type(task).__name__}.make_rows",
                                    f"make_rows({level!r}, {rows_per_level}, seed=0) raised {type(exc).__name__}: "
                                    f"{clip(exc, 150)}" + (f" (level {level!r} loads {loaded}: not checked)"
                                                           if loaded else "")))
            continue
        if not rows:
            findings.append(Finding("error", f"{type(task).__name__}.make_rows", f"level {level!r} gave no rows."))
            continue
        found = check_answers(task, rows, level) or check_score(task, rows)
        for reward, _ in task.rewards_for(level):
            if f"reward {_name(reward)}" not in failed | {f.where for f in found}:
                found += check_reward(reward, rows, task)
        findings += [f for f in found if f.where not in failed]
        failed |= {f.where for f in found if f.kind == "error"}
        if tokenizer is not None and profile is not None:
            warm = profile.warmup_examples and level == profile.warmup_level
            many = _rows(task, level, profile.warmup_examples if warm else length_rows, seed=profile.seed)
            findings += check_reference_lengths(task, many, tokenizer, profile.max_completion_length, level,
                                                kind="error" if warm else "warning")
    errors = [f for f in findings if f.kind == "error"]
    if raise_errors and errors:
        key = f"{type(task).__module__}:{type(task).__name__}"
        raise TaskCheckError(f"Task {task.name!r} is not ready to train ({len(errors)} problem(s); `python -m "
                             f"helpers.tasks check {key}` prints the full report):\n"
                             + "\n".join(f"- {f.where}: {f.message}" for f in errors))
    return findings

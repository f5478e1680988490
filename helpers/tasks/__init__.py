"""The task interface :class:`Task`: subclass it, and ``get_profile(task="my_module:MyTask")`` runs the course on it.

Serves every notebook (00-08): the task a profile names.

Example:
    >>> get_task("arithmetic").score("<reasoning>\\n3 + 4 = 7\\n</reasoning>\\n<answer>\\n7\\n</answer>", {"answer": "7"})
    {'accuracy': 1.0, 'correct': 1.0, 'format': 1.0}
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..rewards import RewardFunc

BUILTIN = {"arithmetic": "helpers.tasks.arithmetic:ArithmeticTask", "json": "helpers.tasks.orders:OrdersTask",
           "tools": "helpers.tasks.tool_arithmetic:ToolArithmeticTask"}


class Task:
    """The interface. Subclass it and fill in the names below; the rest of the course reads nothing else."""

    name: str = "task"  #: a short name (logs, the dataset card)
    system_prompt: str = ""  #: every prompt's system message (or override system_prompt_for)
    prefill: str = ""  #: what the generation prompt ends with: the model writes after it ("" for none)
    levels: Mapping[str, Any] = {}  #: difficulty levels by name, easiest first, read by make_rows
    rewards: Sequence[tuple[RewardFunc, float]] = ()  #: [(reward, weight)]: TRL's reward_funcs, reward_weights
    headline: str = "correct"  #: the score() metric that means "solved" (the benchmarks', pass@k's)
    format_metric: str = "format"  #: the score() metric that means "in the format"
    min_completion_tokens: int = 16  #: the fewest completion tokens a full answer needs (fewer is refused)

    def make_rows(self, level: str, n: int, seed: int) -> Any:
        """``n`` distinct rows per seed: question, answer, reward columns (or ``{"train": rows, "eval": rows}``)."""
        raise NotImplementedError(f"Task {self.name!r} must define make_rows(level, n, seed).")

    def reference(self, row: Mapping[str, Any]) -> str:
        """The completion a perfect model writes for ``row``, prefill included (the warm-up's target)."""
        raise NotImplementedError(f"Task {self.name!r} must define reference(row) for the format warm-up.")

    def score(self, text: str, row: Mapping[str, Any]) -> dict[str, float]:
        """``{metric: value}`` of one completion (prefill included), :attr:`headline` and :attr:`format_metric` too."""
        raise NotImplementedError(f"Task {self.name!r} must define score(text, row).")

    # --- optional: override when the default does not fit

    def clean_answer(self, row: Mapping[str, Any]) -> str:
        """The row's gold answer as the rewards compare it; a ``ValueError`` says what is wrong."""
        value = "" if row.get("answer") is None else str(row["answer"]).strip()
        if not value:
            raise ValueError("the answer is missing: write it, or delete the row")
        return value

    def system_prompt_for(self, row: Mapping[str, Any]) -> str:
        """The system message for one row: :attr:`system_prompt` unless the task varies it."""
        return self.system_prompt

    def rewards_for(self, level: str) -> list[tuple[RewardFunc, float]]:
        """The rewards GRPO uses on ``level``: :attr:`rewards` unless the task varies them by level."""
        return list(self.rewards)

    def settings(self, profile: Any) -> dict[str, Any]:
        """Profile fields set when a profile switches to this task (default: its first level for GRPO and warm-up)."""
        first = next(iter(self.levels))
        return {"task_level": first, "warmup_level": first}


def distinct_rows(draw: Callable[[], dict | None], n: int, where: str) -> list[dict]:
    """``n`` rows of ``draw()`` with distinct questions (``None``: draw again), or an error when they run out."""
    rows, seen, attempts = [], set(), 0
    while len(rows) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(f"{where} gave only {len(rows)} distinct questions, fewer than the {n} asked for. Ask "
                             "for fewer rows, or make the level bigger (a wider range of numbers, more templates).")
        row = draw()
        if row is not None and row["question"] not in seen:
            seen.add(row["question"])
            rows.append(row)
    return rows


def level_table(task: Task) -> list[dict[str, Any]]:
    """One row per level: name, description and an example question (none for a level loaded from a ``source``)."""
    return [{"level": name, "description": getattr(spec, "description", str(spec)),
             "example": "" if getattr(spec, "source", None) else task.make_rows(name, 1, 0)[0]["question"]}
            for name, spec in task.levels.items()]


def get_task(key: str) -> Task:
    """The task a profile names: ``arithmetic``, ``json``, or ``"module:attribute"`` (a Task subclass or instance)."""
    path = BUILTIN.get(key, key)
    module, _, attribute = path.partition(":")
    if not attribute:
        raise ValueError(f"Unknown task {key!r}: use one of {sorted(BUILTIN)}, or 'module:TaskClass' for your own "
                         "(a subclass of helpers.tasks.Task in an importable module).")
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"Task {key!r} could not be imported ({exc}). Put the module where Python finds it "
                         "(beside the notebook, or on PYTHONPATH) and name the class after the colon.") from exc
    task = found() if isinstance(found, type) else found
    if not isinstance(task, Task):
        raise TypeError(f"{path} is a {type(task).__name__}, not a helpers.tasks.Task: subclass Task.")
    return task


def import_root(module: str) -> Path | None:
    """The folder another Python process needs on ``PYTHONPATH`` to import ``module`` (``None``: it is installed).

    ``trl grpo`` imports the rewards by name in a process of its own: a task module beside your notebook, or in a
    folder of yours, is found there only through ``PYTHONPATH``. (The course's ``helpers`` is installed.)

    Example:
        >>> import_root("helpers.tasks.arithmetic") is None
        True
    """
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top in importlib.metadata.packages_distributions():
        return None
    spec = importlib.util.find_spec(top)
    if spec is None:
        raise ValueError(f"Module {module!r} is not importable here: put its folder on PYTHONPATH (or run from it).")
    if spec.submodule_search_locations:  # a package (or a namespace package): the folder holding it
        return Path(next(iter(spec.submodule_search_locations))).resolve().parent
    return Path(spec.origin).resolve().parent if spec.origin else None

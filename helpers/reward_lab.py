"""Testing rewards before GRPO does: hand-written cases, each reward's score as TRL calls it, TRL's advantages.

Serves notebooks 02, 03 and 05.

Example:
    >>> group_advantages([1.0, 0.0, 1.0, 1.0], group_size=2).frac_zero_std
    0.5
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from .rewards import clip, completion_text, weighted


@dataclass
class RewardCase:
    """A completion and the score each named reward should give it (``None``: does not apply)."""

    completion: Any
    expected: dict[str, float | None]
    answer: Any = None
    note: str = ""
    columns: dict[str, Any] = field(default_factory=dict)


def _same(got: Any, want: Any, tol: float) -> bool:
    if want is None or got is None:
        return want is None and got is None
    try:
        return abs(float(got) - float(want)) <= tol
    except (TypeError, ValueError):
        return False


def check_cases(cases: Sequence[RewardCase], rewards: Any, tol: float = 1e-6) -> Any:
    """One row per (case, reward it names): expected, got, passed; a reward missing or raising fails its row."""
    import pandas as pd
    funcs = {name: f for name, f, _ in weighted(rewards)}
    rows = []
    for i, case in enumerate(cases):
        cols = {k: [v] for k, v in case.columns.items()}
        if case.answer is not None:
            cols["answer"] = [case.answer]
        for name, want in case.expected.items():
            got: Any = "missing"
            if name in funcs:
                try:
                    got = funcs[name](prompts=[None], completions=[case.completion], completion_ids=None, **cols)[0]
                except Exception as exc:  # noqa: BLE001 - shown as a failing row
                    got = f"raised {type(exc).__name__}: {exc}"
            rows.append(dict(case=i, note=case.note, completion=clip(completion_text(case.completion), 48),
                             reward=name, expected=want, got=got,
                             passed=not isinstance(got, str) and _same(got, want, tol)))
    return pd.DataFrame(rows, columns=["case", "note", "completion", "reward", "expected", "got", "passed"])


def assert_cases(cases: Sequence[RewardCase], rewards: Any, tol: float = 1e-6) -> Any:
    """:func:`check_cases`, raising ``AssertionError`` that lists every failing row."""
    table = check_cases(cases, rewards, tol)
    failed = table[~table["passed"]]
    if len(failed):
        raise AssertionError(f"{len(failed)} of {len(table)} reward checks failed:\n"
                             + failed.to_string(index=False, max_colwidth=60))
    return table


def score_table(completions: Sequence[Any], rewards: Any, prompts: Sequence[Any] | None = None,
                completion_ids: Sequence[Sequence[int]] | None = None, width: int | None = 60,
                **columns: Sequence[Any]) -> Any:
    """One row per completion, one column per reward, and ``total``: the weighted sum TRL logs (``None`` skipped)."""
    import pandas as pd
    comps = list(completions)
    n = len(comps)
    for key, values in columns.items():
        if len(values) != n:
            raise ValueError(f"Column {key!r} has {len(values)} values for {n} completions: repeat each "
                             "prompt's value for each of its completions, as TRL does.")
    data: dict[str, Any] = {"completion": [clip(completion_text(c), width) for c in comps]}
    total, seen = [0.0] * n, [False] * n
    for name, func, weight in weighted(rewards):
        scores = func(prompts=None if prompts is None else list(prompts), completions=comps,
                      completion_ids=None if completion_ids is None else [list(x) for x in completion_ids],
                      **{k: list(v) for k, v in columns.items()})
        if len(scores) != n:
            raise ValueError(f"Reward {name!r} returned {len(scores)} scores for {n} completions.")
        data[name] = [math.nan if s is None else float(s) for s in scores]
        for i, v in enumerate(data[name]):
            if not math.isnan(v):
                total[i] += weight * v
                seen[i] = True
    data["total"] = [t if s else math.nan for t, s in zip(total, seen)]
    return pd.DataFrame(data)


@dataclass
class GroupAdvantages:
    """Per completion rewards and advantages, per group mean and std, and the share in groups of equal rewards."""

    rewards: list[float]
    advantages: list[float]
    group_mean: list[float]
    group_std: list[float]
    frac_zero_std: float


def group_advantages(rewards: Sequence[Any], group_size: int) -> GroupAdvantages:
    """TRL's advantages (its default ``scale_rewards="group"``) from one total per completion, groups consecutive."""
    import torch
    totals = torch.tensor([math.nan if r is None else float(r) for r in rewards], dtype=torch.float32)
    if group_size < 2 or totals.numel() % group_size:
        raise ValueError(f"{totals.numel()} rewards do not split into groups of {group_size} (>= 2): pass every "
                         "completion of every prompt, grouped consecutively (num_generations per prompt).")
    grouped = totals.view(-1, group_size)
    mean, count = torch.nanmean(grouped, dim=1), torch.sum(~torch.isnan(grouped), dim=1)
    variance = torch.nanmean((grouped - mean[:, None]) ** 2, dim=1) * count / (count - 1)  # Bessel, NaNs left out
    std = torch.sqrt(torch.where(count > 1, variance, torch.full_like(variance, float("nan"))))  # TRL's nanstd
    each = std.repeat_interleave(group_size)  # every completion's group std
    adv = (totals - mean.repeat_interleave(group_size)) / (each + 1e-4)
    frac_zero = float(torch.isclose(each, torch.zeros_like(each)).float().mean())  # TRL's frac_reward_zero_std
    return GroupAdvantages(rewards=totals.tolist(), advantages=torch.nan_to_num(adv, nan=0.0).tolist(),
                           group_mean=mean.tolist(), group_std=std.tolist(), frac_zero_std=frac_zero)

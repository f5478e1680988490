"""Watching a GRPO run: named warnings for the known ways a run dies, read from its logs (notebook 03, section 8).

:func:`diagnose` reads a log history (``trainer.state.log_history``, ``metrics.jsonl``) and names what it sees;
:func:`group_diversity` measures how alike each group's completions are, a signal every trainer has (Unsloth's
logs no entropy). The callbacks that use them while training live in :mod:`helpers.callbacks` (they subclass
transformers' ``TrainerCallback``, so importing them loads torch; this module imports nothing of it).

Example:
    >>> history = [{"step": s, "reward": 0.1, "frac_reward_zero_std": 1.0} for s in range(1, 6)]
    >>> [w.name for w in diagnose(history)]
    ['no-reward-spread']
    >>> group_diversity(["a b", "a b", "a c", "d"], group_size=2)
    {'diversity/distinct': 0.75, 'diversity/overlap': 0.5}
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Sequence

#: transformers' trackio/wandb loggers show ``eval_x`` as ``eval/x`` (integration_utils.rewrite_logs)
EVAL_PREFIX = "eval_"


@dataclass(frozen=True)
class RunWarning:
    """A known failure seen in a run's logs: its ``name``, the ``step`` it was seen at, what was seen, what to do."""

    name: str
    step: int
    seen: str
    fix: str

    def __str__(self) -> str:
        return f"[{self.name}] step {self.step}: {self.seen} -> {self.fix}"


#: What each warning means and what to change (notebook 03's troubleshooting maps the same names).
FIXES: dict[str, str] = {
    "entropy-collapse": "the policy has become near-deterministic, so its groups no longer differ and learning stops. "
                        "Lower learning_rate (a third: on cpu-demo 3e-4 collapsed runs that 1e-4 did not), or set "
                        "beta > 0 to stay near the start model; a higher temperature, the other usual remedy, did not "
                        "help on cpu-demo (docs/measured.md). Restart from the warm-up adapter rather than this "
                        "checkpoint",
    "diversity-collapse": "each group's completions have become near copies, so its rewards no longer differ and "
                          "learning stops: entropy-collapse seen in the completions (Unsloth logs no entropy). "
                          "Lower learning_rate (a third), or set beta > 0; restart from the warm-up adapter",
    "no-reward-spread": "every completion of every group scored the same, so every advantage is 0 and the loss "
                        "gives no gradient. All wrong: an easier level, a warm-up, or partial-credit rewards. All "
                        "right: a harder level. More num_generations makes a differing group likelier",
    "all-truncated": "every completion hit max_completion_length, and mask_truncated_completions drops cut-off "
                     "completions from the loss, so the update is zero. Raise max_completion_length, or set "
                     "mask_truncated_completions=False until the model learns to stop",
    "heldout-falling": "held-out accuracy keeps falling while the training reward rises: the model is learning "
                       "something the reward pays for but the task does not want (reward hacking), or forgetting. "
                       "Read the completions (TRL's log), fix the reward, and keep the checkpoint of the best "
                       "held-out step",
}


def _series(history: Sequence[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """``[(step, value)]`` of the entries that hold a finite ``key``."""
    out = []
    for entry in history:
        value = entry.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value) and "step" in entry:
            out.append((int(entry["step"]), float(value)))
    return out


def _first(points: list[tuple[int, float]], n: int) -> float:
    return statistics.median(v for _, v in points[:n])


DISTINCT, OVERLAP = "diversity/distinct", "diversity/overlap"  #: the keys of :func:`group_diversity`


def group_diversity(completions: Sequence[str], group_size: int) -> dict[str, float]:
    """How alike each group's completions are, averaged over the groups (a group: ``group_size`` consecutive
    completions, as TRL orders them): ``diversity/distinct``, the share that differ (1/G: all one text), and
    ``diversity/overlap``, the mean word-set Jaccard similarity of a group's pairs (1: the same words)."""
    distinct, overlap = [], []
    for i in range(0, len(completions) - 1, max(2, int(group_size))):
        texts = [str(t).strip() for t in completions[i:i + max(2, int(group_size))]]
        words = [frozenset(t.split()) for t in texts]
        pairs = [len(a & b) / len(a | b) if a | b else 1.0 for j, a in enumerate(words) for b in words[j + 1:]]
        if pairs:
            distinct.append(len(set(texts)) / len(texts))
            overlap.append(sum(pairs) / len(pairs))
    if not distinct:
        return {}
    return {DISTINCT: round(statistics.fmean(distinct), 4), OVERLAP: round(statistics.fmean(overlap), 4)}


def _collapse(points: list[tuple[int, float]], spread: dict[int, float], heldout: list[tuple[int, float]],
              drop: float, window: int, alike: float) -> tuple[int, float, float, float, int] | None:
    """``(step, start, late, alike share, steps)`` where :func:`diagnose`'s collapse rule first holds for ``points``
    (median of the last ``window`` below ``drop`` x the first ``window``'s), or None."""
    for i in range(2 * window - 1, len(points)):
        start, late = _first(points, window), statistics.median(v for _, v in points[i - window + 1:i + 1])
        same = [spread[s] for s, _ in points[max(0, i - window):i + 1] if s in spread]
        if start > 0 and late < drop * start and same and statistics.fmean(same) >= alike:
            scored = [v for s, v in heldout if s <= points[i][0]]
            if len(scored) > 1 and scored[-1] >= max(scored) and scored[-1] > scored[0]:
                continue  # sure of answers the held-out slice says are right: converged, not collapsed
            return points[i][0], start, late, statistics.fmean(same), len(same)
    return None


def diagnose(history: Sequence[dict[str, Any]], mask_truncated_completions: bool = False, headline: str = "accuracy",
             entropy_drop: float = 0.3, entropy_window: int = 3, alike: float = 0.75, zero_spread_steps: int = 4,
             heldout_falls: int = 2, heldout_drop: float = 0.15, diversity_drop: float = 0.3) -> list[RunWarning]:
    """The known failures ``history`` (per-step log dicts with ``step``) shows, each once, at the first step seen.

    - ``entropy-collapse``: the median ``entropy`` of the last ``entropy_window`` steps is below ``entropy_drop``
      times that of the first ``entropy_window``, and most groups no longer differ (``frac_reward_zero_std`` at
      least ``alike`` on average over those steps and the one before), unless the held-out slice scored so far
      (``eval_<headline>``) stands at its best and above its first reading: a healthy run's entropy falls too, as
      the model grows sure of right answers, and once they are right its groups stop differing as well; the slice
      tells the two apart (0.3, not 0.25: with 0.25 a stored run that fell from 37% to 16.5% went unnamed);
    - ``diversity-collapse``: the same reading of how much a group's completions differ (1 - ``diversity/overlap``,
      :func:`group_diversity`) with ``diversity_drop``: on every trainer (Unsloth's logs no entropy);
    - ``no-reward-spread``: ``frac_reward_zero_std`` is 1 (every group's rewards all equal) ``zero_spread_steps``
      steps in a row;
    - ``all-truncated``: ``completions/clipped_ratio`` is 1 at a step while ``mask_truncated_completions`` is on;
    - ``heldout-falling``: ``eval_<headline>`` (:class:`HeldOutCallback`) fell at each of the last ``heldout_falls``
      evaluations, by ``heldout_drop`` in all, while the reward's mean since the first of them is above its mean
      before.
    """
    found: list[RunWarning] = []
    spread, heldout = dict(_series(history, "frac_reward_zero_std")), _series(history, EVAL_PREFIX + headline)
    seen = _collapse(_series(history, "entropy"), spread, heldout, entropy_drop, entropy_window, alike)
    if seen:
        step, start, late, same, n = seen
        found.append(RunWarning("entropy-collapse", step, f"entropy {late:.3f}, down from {start:.3f} "
                                f"({late / start:.0%} of the first {entropy_window} steps), and {same:.0%} of the "
                                f"completions in groups that all scored the same over the last {n} steps",
                                FIXES["entropy-collapse"]))
    differ = [(s, 1.0 - v) for s, v in _series(history, OVERLAP)]
    seen = _collapse(differ, spread, heldout, diversity_drop, entropy_window, alike)
    if seen:
        step, start, late, same, n = seen
        found.append(RunWarning("diversity-collapse", step, f"a group's completions share {1 - late:.0%} of their "
                                f"words, up from {1 - start:.0%} over the first {entropy_window} steps, and {same:.0%} "
                                f"of the completions in groups that all scored the same over the last {n} steps",
                                FIXES["diversity-collapse"]))
    zero = _series(history, "frac_reward_zero_std")
    run = 0
    for step, value in zero:
        run = run + 1 if value >= 1.0 else 0
        if run >= zero_spread_steps:
            reward = dict(_series(history, "reward")).get(step)
            found.append(RunWarning("no-reward-spread", step, f"every group had zero reward spread for {run} steps "
                                    "in a row" + ("" if reward is None else f" (reward {reward:.2f})"),
                                    FIXES["no-reward-spread"]))
            break
    if mask_truncated_completions:
        for step, value in _series(history, "completions/clipped_ratio"):
            if value >= 1.0:
                found.append(RunWarning("all-truncated", step, "every completion was cut off at "
                                        "max_completion_length, with mask_truncated_completions=True",
                                        FIXES["all-truncated"]))
                break
    reward = _series(history, "reward")
    for i in range(heldout_falls, len(heldout)):
        window = heldout[i - heldout_falls:i + 1]
        falling = all(b[1] < a[1] for a, b in zip(window, window[1:]))
        since = window[0][0]
        before = [v for s, v in reward if s <= since]
        after = [v for s, v in reward if s > since and s <= window[-1][0]]
        if (falling and window[0][1] - window[-1][1] >= heldout_drop - 1e-9 and before and after
                and statistics.fmean(after) > statistics.fmean(before)):
            found.append(RunWarning("heldout-falling", window[-1][0], f"held-out {headline} "
                                    + " -> ".join(f"{v:.0%}" for _, v in window)
                                    + f" (steps {', '.join(str(s) for s, _ in window)}) while the reward rose "
                                    f"({statistics.fmean(before):.2f} -> {statistics.fmean(after):.2f})",
                                    FIXES["heldout-falling"]))
            break
    return sorted(found, key=lambda w: w.step)


def watch_every(max_steps: int, evaluations: int) -> int:
    """Steps between held-out evaluations: ``evaluations`` of them over ``max_steps`` (at least every step).

    Example:
        >>> watch_every(20, 5), watch_every(250, 5), watch_every(2, 5)
        (4, 50, 1)
    """
    return max(1, int(max_steps) // max(1, int(evaluations)))


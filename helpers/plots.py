"""Figures of a GRPO run, drawn from its logged metrics (``metrics.jsonl`` rows).

Example:
    >>> rows = [{"step": 1, "reward": 0.2, "reward_std": 0.4, "frac_reward_zero_std": 0.5,
    ...          "completions/mean_length": 20, "completions/clipped_ratio": 0.0,
    ...          "rewards/correctness_reward/mean": 0.1}]
    >>> fig = dashboard_figure(rows)
    >>> [ax.get_title() for ax in fig.axes][:2]
    ['Rewards (mean per step)', 'Signal: reward spread inside groups']
"""

from __future__ import annotations

from typing import Any, Sequence

REWARD_PREFIX = "rewards/"


def reward_names_in(records: Sequence[dict[str, Any]]) -> list[str]:
    """Reward function names that appear as ``rewards/<name>/mean`` in the logs.

    Example:
        >>> reward_names_in([{"rewards/a/mean": 1, "rewards/a/std": 0}])
        ['a']
    """
    names: list[str] = []
    for rec in records:
        for key in rec:
            if key.startswith(REWARD_PREFIX) and key.endswith("/mean"):
                name = key[len(REWARD_PREFIX) : -len("/mean")]
                if name not in names:
                    names.append(name)
    return names


def _series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for rec in records:
        v = rec.get(key)
        if v is not None and "step" in rec:
            xs.append(int(rec["step"]))
            ys.append(float(v))
    return xs, ys


def smooth(values: Sequence[float], window: int = 5) -> list[float]:
    """Trailing moving average (the first points average what exists so far).

    Example:
        >>> smooth([0, 2, 4], window=2)
        [0.0, 1.0, 3.0]
    """
    out, acc = [], []
    for v in values:
        acc.append(float(v))
        if len(acc) > window:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def _legend(ax: Any, loc: str = "best") -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc=loc)


def dashboard_figure(records: Sequence[dict[str, Any]], reward_names: list[str] | None = None,
                     window: int = 5) -> Any:
    """Four panels: total and per-reward means; reward_std and zero-std groups;
    completion length and clipped ratio; KL (when beta > 0) or the loss.

    Thin lines are the raw per-step values, thick lines a moving average.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 6.5))  # not registered with pyplot: nothing leaks between redraws
    axes = fig.subplots(2, 2).ravel()
    names = reward_names or reward_names_in(records)

    def line(ax: Any, key: str, label: str, color: str | None = None) -> bool:
        xs, ys = _series(records, key)
        if not xs:
            return False
        (raw,) = ax.plot(xs, ys, alpha=0.3, lw=1, color=color)
        ax.plot(xs, smooth(ys, window), lw=2, color=raw.get_color(), label=label)
        return True

    ax = axes[0]
    line(ax, "reward", "total (weighted)", "black")
    for name in names:
        line(ax, f"{REWARD_PREFIX}{name}/mean", name)
    ax.set_title("Rewards (mean per step)")
    _legend(ax)

    ax = axes[1]
    line(ax, "reward_std", "reward_std")
    line(ax, "frac_reward_zero_std", "groups with equal rewards")
    ax.set_title("Signal: reward spread inside groups")
    ax.set_ylim(bottom=0)
    _legend(ax)

    ax = axes[2]
    line(ax, "completions/mean_length", "mean length (tokens)")
    ax.set_title("Completion length")
    twin = ax.twinx()
    xs, ys = _series(records, "completions/clipped_ratio")
    if xs:
        twin.plot(xs, ys, color="tab:red", alpha=0.6, lw=1, label="clipped ratio")
        twin.set_ylim(0, 1.05)
        twin.set_ylabel("clipped ratio", color="tab:red")
    _legend(ax, "upper left")

    ax = axes[3]
    if line(ax, "kl", "KL to reference"):
        ax.set_title("KL (beta > 0)")
    else:
        line(ax, "loss", "loss")
        ax.set_title("Loss (near 0 is normal for GRPO)")
    _legend(ax)

    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig

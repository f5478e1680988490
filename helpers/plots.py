"""The course's figures: matplotlib ``Figure``s built without pyplot's global state, shown as PNGs on any backend
(notebooks 01-04 and 06)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from .runs import write_bytes


def _figure(size: tuple[float, float], *grid: int, **kwargs: Any) -> tuple[Any, Any]:
    from matplotlib.figure import Figure
    fig = Figure(figsize=size, layout="tight")
    return fig, fig.subplots(*grid, **kwargs)


def smooth(values: Sequence[float], window: int = 5) -> list[float]:
    """Trailing moving average (pandas' ``rolling``; the first points average what exists so far)."""
    import pandas as pd
    return pd.Series(list(values), dtype=float).rolling(window, min_periods=1).mean().tolist()


def dashboard_figure(records: Sequence[dict[str, Any]], window: int = 5, warnings: Sequence[Any] = ()) -> Any:
    """Six panels of TRL's per-step logs, raw thin and smoothed thick: rewards, spread in groups, entropy and group
    diversity (``diversity/*``: Unsloth logs no entropy), length, held-out accuracy (``eval_*``, HeldOutCallback) and
    KL or loss; ``warnings`` named in the title."""
    fig, axes = _figure((13, 6.5), 2, 3)
    (reward_ax, signal_ax, entropy_ax), (length_ax, heldout_ax, last_ax) = axes

    def line(ax: Any, key: str, label: str, color: str | None = None, smoothed: bool = True) -> bool:
        pts = [(int(r["step"]), float(r[key])) for r in records if r.get(key) is not None and "step" in r]
        if not pts:
            return False
        xs, ys = zip(*pts)
        if not smoothed:  # a few evaluations: points joined, nothing to average
            ax.plot(xs, ys, marker="o", lw=2, color=color, label=label)
            return True
        (raw,) = ax.plot(xs, ys, alpha=0.3, lw=1, color=color)
        ax.plot(xs, smooth(list(ys), window), lw=2, color=raw.get_color(), label=label)
        return True

    line(reward_ax, "reward", "total (weighted)", "black")
    for name in dict.fromkeys(k[len("rewards/"):-len("/mean")] for r in records for k in r
                              if k.startswith("rewards/") and k.endswith("/mean")):
        line(reward_ax, f"rewards/{name}/mean", name)
    reward_ax.set_title("Rewards (mean per step)")
    line(signal_ax, "reward_std", "reward_std")
    line(signal_ax, "frac_reward_zero_std", "groups with equal rewards")
    signal_ax.set_title("Signal: reward spread inside groups")
    signal_ax.set_ylim(bottom=0)
    entropy = line(entropy_ax, "entropy", "entropy (nats per token)", "tab:purple")
    line(entropy_ax, "diversity/distinct", "different completions in a group (share)", "tab:green")
    line(entropy_ax, "diversity/overlap", "words a group's completions share", "tab:orange")
    entropy_ax.set_title("Entropy and group diversity" if entropy else "Group diversity (no entropy logged)")
    entropy_ax.set_ylim(bottom=0)
    line(length_ax, "completions/mean_length", "mean length (tokens)")
    line(length_ax, "completions/clipped_ratio", "clipped ratio (0..1)", "tab:red")
    length_ax.set_title("Completion length")
    for key in dict.fromkeys(k for r in records for k in r if k.startswith("eval_") and k != "eval_mean_length"):
        line(heldout_ax, key, key[len("eval_"):].replace("_", " "), smoothed=False)
    heldout_ax.set_title("Held-out slice (greedy)")
    heldout_ax.set_ylim(-0.02, 1.02)
    kl = any(r.get("kl") for r in records)  # Unsloth's trainer logs kl 0.0 at every step, beta = 0 too
    if kl and line(last_ax, "kl", "KL to the reference"):
        last_ax.set_title("KL (beta > 0)")
    else:
        line(last_ax, "loss", "loss")
        last_ax.set_title("Loss (not a progress measure in GRPO)")
    for ax in fig.axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    if warnings:
        fig.suptitle("WARNING: " + ", ".join(f"{w.name} (step {w.step})" for w in warnings), color="#c44e52",
                     fontsize=11)
    return fig


def token_lengths_figure(lengths: Sequence[int], budget: int | None = None, title: str = "Prompt tokens") -> Any:
    """Histogram of prompt lengths, the median and p99 marked, and the budget with how many are over it."""
    import pandas as pd
    fig, ax = _figure((7, 3.2))
    ax.hist(list(lengths), bins=min(50, max(5, len(set(lengths)))), color="#4c72b0")
    for q, style in ((50, ":"), (99, "--")):
        if len(lengths):
            value = round(float(pd.Series(list(lengths)).quantile(q / 100)), 1)
            ax.axvline(value, color="gray", linestyle=style, label=f"p{q} = {value:g}")
    if budget is not None:
        over = sum(1 for n in lengths if n > budget)
        ax.axvline(budget, color="#c44e52", lw=2, label=f"budget {budget} ({over} over)")
    ax.set(xlabel="tokens (chat template applied)", ylabel="prompts", title=title)
    ax.legend(fontsize=8)
    return fig


def reward_spread_figure(table: Any, title: str | None = None) -> Any:
    """One histogram per reward column of a :func:`helpers.reward_lab.score_table`, the total last."""
    columns = [c for c in table.columns if c != "completion" and str(table[c].dtype).startswith("float")]
    fig, (axes,) = _figure((3.0 * len(columns), 2.6), 1, len(columns), squeeze=False)
    for ax, col in zip(axes, columns):
        ok, missing = table[col].dropna(), int(table[col].isna().sum())
        lo, hi = (float(ok.min()), float(ok.max())) if len(ok) else (0.0, 1.0)
        pad = 0.05 * (hi - lo) if hi > lo else 0.5
        ax.hist(ok, bins=21, range=(lo - pad, hi + pad), color="tab:orange" if col == "total" else "tab:blue",
                edgecolor="white")
        ax.set_title(col.removesuffix("_reward") + (f"\n({missing} n/a)" if missing else ""), fontsize=9)
        ax.tick_params(labelsize=8)
    axes[0].set_ylabel("completions", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def evaluation_figure(table: Any, metrics: Sequence[str], n_prompts: int | None = None) -> Any:
    """The ``metrics`` (rates) of every side of a :func:`helpers.evaluation.comparison_table`, and the mean lengths."""
    sides = [c for c in table.columns if not str(c).startswith("gain")]
    rates = [k for k in metrics if k in table.index]
    fig, (ax1, ax2) = _figure((10, 3.6), 1, 2, gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / len(sides)
    colours = ["#9aa5b1", "#8fb8de", "#2f6fdf", "#1b3f8b"]
    for j, side in enumerate(sides):
        vals = [float(table.loc[k, side] or 0.0) for k in rates]
        bars = ax1.bar([i + (j - (len(sides) - 1) / 2) * width for i in range(len(rates))], vals, width,
                       label=side, color=colours[j % len(colours)])
        ax1.bar_label(bars, labels=[f"{v:.0%}" for v in vals], fontsize=8)
    ax1.set_xticks(range(len(rates)), [r.replace("_", " ") for r in rates])
    ax1.set(ylim=(0, 1.15), ylabel="fraction of completions",
            title=f"Held-out evaluation ({n_prompts} prompts)" if n_prompts else "Held-out evaluation")
    ax1.legend(loc="upper left", fontsize=8)
    if "mean_length" in table.index:
        vals = [float(table.loc["mean_length", s] or 0.0) for s in sides]
        bars = ax2.bar(range(len(sides)), vals, color=colours[: len(sides)])
        ax2.set_xticks(range(len(sides)), sides, fontsize=7)
        ax2.bar_label(bars, labels=[f"{v:.0f}" for v in vals], fontsize=8)
        ax2.set_title("mean length (tokens)")
    return fig


def pass_at_k_figure(curves: dict[str, dict[int, float]], title: str = "pass@k") -> Any:
    """One line per side: pass@k against k (:func:`helpers.evaluation.pass_at_k_curve`)."""
    fig, ax = _figure((6, 3.6))
    for side, curve in curves.items():
        ax.plot(list(curve), list(curve.values()), marker="o", label=side)
    ax.set(xlabel="k (samples per prompt)", ylabel="pass@k", ylim=(0, 1.05), title=title)
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def png_bytes(fig: Any, dpi: int = 100) -> bytes:
    """The figure as PNG bytes (a PNG shows on any backend, Agg included)."""
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def show_figure(fig: Any, path: str | Path | None = None) -> None:
    """Display a figure as a PNG (any backend, headless too); with ``path`` also save it there."""
    png = png_bytes(fig)
    if path is not None:
        write_bytes(path, png)
    try:
        from IPython.display import Image, display
        display(Image(png))
    except ImportError:  # plain Python: nothing to display on
        pass


def learning_curves_figure(runs: dict[str, dict[str, Any]], extra: dict[str, Sequence[Sequence[float]]] | None = None,
                           title: str = "Held-out accuracy while GRPO trains", note: str = "") -> Any:
    """Held-out accuracy against GRPO step, one line per run: ``runs[label] = {"start", "end", "steps", "curve"}``,
    the start (after the warm-up) and end (after GRPO) on the full held-out set as diamonds at step 0 and
    ``steps``, the ``curve`` (``[[step, value], ...]``, a smaller slice scored while training) between them;
    ``extra``: other curves (``[[step, value, ...], ...]``, another task's), dashed; ``note`` under the axis.

    Example:
        >>> fig = learning_curves_figure({"seed 1": {"start": 0.3, "end": 0.8, "steps": 20, "curve": [[10, 0.5]]}})
        >>> [[int(x) for x in line.get_xdata()] for line in fig.axes[0].lines]
        [[0, 10, 20], [0, 20]]
    """
    from matplotlib.ticker import MaxNLocator, PercentFormatter
    fig, ax = _figure((9.5, 4.6))
    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#7f7f7f"]
    for i, (label, run) in enumerate(runs.items()):
        colour, steps = colours[i % len(colours)], run["steps"]
        middle = [(s, v) for s, v in run.get("curve") or [] if 0 < s < steps]
        pts = [(0, run["start"])] + sorted(middle) + [(steps, run["end"])]
        ax.plot([x for x, _ in pts], [y for _, y in pts], lw=1.8, color=colour, marker="o", ms=4, label=label)
        ax.plot([0, steps], [run["start"], run["end"]], ls="none", marker="D", ms=7, color=colour)
    for label, curve in (extra or {}).items():
        ax.plot([c[0] for c in curve], [c[1] for c in curve], lw=2, ls="--", color="#d62728", marker="s",
                label=label)
    ax.set(xlabel="GRPO step" + (f"\n{note}" if note else ""), ylabel="held-out accuracy", ylim=(0, 1), title=title)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig

"""helpers.plots: the training dashboard, prompt lengths, reward spreads, the evaluation, pass@k, showing a figure."""

from __future__ import annotations

import math

import pytest

from helpers.plots import (
    dashboard_figure,
    evaluation_figure,
    pass_at_k_figure,
    reward_spread_figure,
    show_figure,
    smooth,
    token_lengths_figure,
)

ROWS = [
    {"step": s, "reward": 0.1 * s, "reward_std": 0.3, "frac_reward_zero_std": 0.5 - 0.1 * s,
     "completions/mean_length": 20 - s, "completions/clipped_ratio": 0.0, "loss": 0.0,
     "rewards/correctness_reward/mean": 0.05 * s, "rewards/fmt_reward/mean": 1.0, "rewards/fmt_reward/std": 0.0}
    for s in (1, 2, 3)
]


def _labels(ax):
    return ax.get_legend_handles_labels()[1]


def test_smooth():
    assert smooth([1, 3, 5, 7], window=2) == [1.0, 2.0, 4.0, 6.0]
    assert smooth([0, 2, 4], window=5) == [0.0, 1.0, 2.0]
    assert smooth((x for x in [2, 4])) == [2.0, 3.0]
    assert smooth([]) == []


TITLES = ["Rewards (mean per step)", "Signal: reward spread inside groups", "Group diversity (no entropy logged)",
          "Completion length", "Held-out slice (greedy)", "Loss (not a progress measure in GRPO)"]


def test_dashboard_panels_and_lines():
    fig = dashboard_figure(ROWS, window=2)
    assert [ax.get_title() for ax in fig.axes] == TITLES
    rewards_ax = fig.axes[0]
    assert _labels(rewards_ax) == ["total (weighted)", "correctness_reward", "fmt_reward"]  # std keys are not lines
    raw, smoothed = rewards_ax.lines[:2]  # each series: the raw values, then the moving average
    assert list(raw.get_xdata()) == [1, 2, 3] and list(smoothed.get_ydata()) == pytest.approx([0.1, 0.15, 0.25])
    assert _labels(fig.axes[1]) == ["reward_std", "groups with equal rewards"] and fig.axes[1].get_ylim()[0] == 0
    assert _labels(fig.axes[3]) == ["mean length (tokens)", "clipped ratio (0..1)"]
    assert not fig.axes[2].lines and not fig.axes[4].lines  # no entropy, no held-out scores logged
    assert all(ax.get_xlabel() == "step" for ax in fig.axes) and fig._suptitle is None


def test_dashboard_shows_entropy_and_the_held_out_points():
    rows = [dict(r, entropy=0.5 / r["step"]) for r in ROWS]
    rows[1].update(eval_accuracy=0.25, eval_format=1.0, eval_mean_length=20.0)
    rows[2].update(eval_accuracy=0.5, eval_format=1.0, eval_mean_length=19.0)
    fig = dashboard_figure(rows, window=2)
    assert _labels(fig.axes[2]) == ["entropy (nats per token)"] and fig.axes[2].get_title() == (
        "Entropy and group diversity")
    held = fig.axes[4]
    assert _labels(held) == ["accuracy", "format"]  # rates only: the length has its own panel
    assert list(held.lines[0].get_xdata()) == [2, 3] and list(held.lines[0].get_ydata()) == [0.25, 0.5]


def test_dashboard_shows_the_group_diversity_where_no_entropy_is_logged():
    """Unsloth's trainer logs no entropy: the panel then holds the group diversity alone, and says so."""
    rows = [dict(r, **{"diversity/distinct": 1.0 - 0.2 * r["step"], "diversity/overlap": 0.3 * r["step"]})
            for r in ROWS]
    ax = dashboard_figure(rows, window=2).axes[2]
    assert ax.get_title() == "Group diversity (no entropy logged)"
    assert _labels(ax) == ["different completions in a group (share)", "words a group's completions share"]
    assert list(ax.lines[0].get_ydata()) == pytest.approx([0.8, 0.6, 0.4])  # raw, then smoothed, per series
    both = dashboard_figure([dict(r, entropy=0.5) for r in rows], window=2).axes[2]
    assert both.get_title() == "Entropy and group diversity" and len(_labels(both)) == 3


def test_dashboard_names_warnings_in_its_title():
    from helpers.watch import RunWarning
    fig = dashboard_figure(ROWS, warnings=[RunWarning("entropy-collapse", 7, "seen", "fix")])
    assert fig._suptitle.get_text() == "WARNING: entropy-collapse (step 7)"


def test_dashboard_shows_kl_when_logged():
    fig = dashboard_figure([dict(r, kl=0.01 * r["step"]) for r in ROWS])
    assert fig.axes[5].get_title() == "KL (beta > 0)" and _labels(fig.axes[5]) == ["KL to the reference"]
    # Unsloth's trainer logs kl 0.0 at every step with beta = 0 (rl_replacements.py:3270-3276): the loss, then
    fig = dashboard_figure([dict(r, kl=0.0) for r in ROWS])
    assert fig.axes[5].get_title() == "Loss (not a progress measure in GRPO)" and _labels(fig.axes[5]) == ["loss"]


def test_dashboard_copes_with_missing_and_null_values():
    fig = dashboard_figure([{"step": 1, "reward": None}, {"step": 2}, {"reward": 1.0}])
    assert len(fig.axes) == 6 and all(not ax.lines for ax in fig.axes)
    fig = dashboard_figure([{"step": 1, "reward": 0.5}, {"step": 2, "reward": None}, {"step": 3, "reward": 1.5}])
    assert list(fig.axes[0].lines[0].get_xdata()) == [1, 3]


def test_token_lengths_figure():
    fig = token_lengths_figure([10, 20, 30, 400], budget=256, title="Prompts")
    ax = fig.axes[0]
    assert ax.get_title() == "Prompts" and ax.get_xlabel() == "tokens (chat template applied)"
    assert _labels(ax) == ["p50 = 25", "p99 = 388.9", "budget 256 (1 over)"]
    assert sum(p.get_height() for p in ax.patches) == 4
    assert _labels(token_lengths_figure([5, 5]).axes[0]) == ["p50 = 5", "p99 = 5"]


def _table():
    import pandas as pd

    return pd.DataFrame({"completion": ["a", "b", "c"], "correctness_reward": [2.0, 0.0, 2.0],
                         "partial_correctness_reward": [1.0, math.nan, math.nan], "total": [3.0, 0.0, 2.0]})


def test_reward_spread_figure():
    fig = reward_spread_figure(_table(), title="demo")
    assert [ax.get_title() for ax in fig.axes] == ["correctness", "partial_correctness\n(2 n/a)", "total"]
    assert [sum(p.get_height() for p in ax.patches) for ax in fig.axes] == [3, 1, 3]  # each score counted once
    assert fig.get_suptitle() == "demo"
    assert reward_spread_figure(_table()[["completion", "total"]]).get_suptitle() == ""


def test_evaluation_figure_from_a_comparison_table():
    from helpers.evaluation import comparison_table

    table = comparison_table({"sides": {
        "base": {"summary": {"accuracy": 0.25, "correct": 0.25, "format": 0.5, "mean_length": 40.0, "n_prompts": 16}},
        "after GRPO": {"summary": {"accuracy": 0.75, "correct": 0.75, "format": 1.0, "mean_length": 30.0,
                                   "n_prompts": 16}}}})
    fig = evaluation_figure(table, ["accuracy", "format", "correct", "not_a_metric"], n_prompts=16)
    rates, lengths = fig.axes
    assert rates.get_title() == "Held-out evaluation (16 prompts)" and _labels(rates) == ["base", "after GRPO"]
    assert [t.get_text() for t in rates.get_xticklabels()] == ["accuracy", "format", "correct"]  # in the order asked
    assert [round(p.get_height(), 2) for p in rates.patches] == [0.25, 0.5, 0.25, 0.75, 1.0, 0.75]
    assert [t.get_text() for t in rates.texts] == ["25%", "50%", "25%", "75%", "100%", "75%"]
    assert [p.get_height() for p in lengths.patches] == [40.0, 30.0] and lengths.get_title() == "mean length (tokens)"
    assert evaluation_figure(table, ["accuracy"]).axes[0].get_title() == "Held-out evaluation"


def test_evaluation_figure_of_the_json_tasks_metrics():
    from helpers.evaluation import comparison_table

    table = comparison_table({"sides": {"warm-up": {"summary": {"exact_match": 0.5, "field: name": 0.9}},
                                        "GRPO": {"summary": {"exact_match": 0.8, "field: name": 1.0}}}})
    rates, lengths = evaluation_figure(table, ["exact_match", "field: name"]).axes
    assert [t.get_text() for t in rates.get_xticklabels()] == ["exact match", "field: name"]
    assert [round(p.get_height(), 2) for p in rates.patches] == [0.5, 0.9, 0.8, 1.0]
    assert [t.get_text() for t in rates.texts] == ["50%", "90%", "80%", "100%"]
    assert not lengths.patches  # no mean length in the table: the panel stays empty


def test_pass_at_k_figure():
    fig = pass_at_k_figure({"base": {1: 0.2, 2: 0.35, 4: 0.5}, "after GRPO": {1: 0.5, 2: 0.6, 4: 0.7}}, title="t")
    ax = fig.axes[0]
    assert ax.get_title() == "t" and _labels(ax) == ["base", "after GRPO"] and ax.get_xscale() == "log"
    assert list(ax.lines[1].get_xdata()) == [1, 2, 4] and list(ax.lines[1].get_ydata()) == [0.5, 0.6, 0.7]
    assert ax.get_ylim() == (0, 1.05) and ax.get_xlabel() == "k (samples per prompt)"


def test_show_figure_displays_a_png_and_saves_it(tmp_path, monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    out = tmp_path / "figures" / "dashboard.png"
    show_figure(dashboard_figure(ROWS), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(shown) == 1 and shown[0].data == out.read_bytes()
    show_figure(token_lengths_figure([1, 2, 3]))  # without a path: only displayed
    assert len(shown) == 2 and list(tmp_path.rglob("*.png")) == [out]


def test_learning_curves_mark_the_full_evaluations_and_join_the_slice_between():
    from helpers.plots import learning_curves_figure

    runs = {"seed 1": {"start": 0.2, "end": 0.6, "steps": 20, "curve": [[15, 0.5], [5, 0.3], [20, 0.55], [0, 0.1]]},
            "seed 2": {"start": 0.3, "end": 0.5, "steps": 20, "curve": None}}
    fig = learning_curves_figure(runs, {"JSON task": [[0, 0.3], [10, 0.6]]}, title="t")
    ax = fig.axes[0]
    line1, marks1, line2, marks2, json_line = ax.lines
    # the slice's points inside the run, in step order, between the full evaluations (its own 0 and 20 are dropped)
    assert [int(x) for x in line1.get_xdata()] == [0, 5, 15, 20] and list(line1.get_ydata()) == [0.2, 0.3, 0.5, 0.6]
    assert marks1.get_marker() == "D" and list(marks1.get_ydata()) == [0.2, 0.6]
    assert [int(x) for x in line2.get_xdata()] == [0, 20]  # no slice stored: the two full evaluations
    assert json_line.get_linestyle() == "--" and list(json_line.get_ydata()) == [0.3, 0.6]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["seed 1", "seed 2", "JSON task"]
    assert ax.get_title() == "t" and ax.get_ylim() == (0, 1)

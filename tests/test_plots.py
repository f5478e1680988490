"""The training dashboard figure."""

from helpers.plots import dashboard_figure, reward_names_in, smooth

ROWS = [
    {"step": s, "reward": 0.1 * s, "reward_std": 0.3, "frac_reward_zero_std": 0.5 - 0.1 * s,
     "completions/mean_length": 20 - s, "completions/clipped_ratio": 0.0, "loss": 0.0,
     "rewards/correctness_reward/mean": 0.05 * s, "rewards/fmt_reward/mean": 1.0}
    for s in (1, 2, 3)
]


def test_reward_names_and_smoothing():
    assert reward_names_in(ROWS) == ["correctness_reward", "fmt_reward"]
    assert smooth([1, 3, 5, 7], window=2) == [1.0, 2.0, 4.0, 6.0]


def test_dashboard_panels_and_lines():
    fig = dashboard_figure(ROWS)
    titles = [ax.get_title() for ax in fig.axes]
    assert "Rewards (mean per step)" in titles and "Completion length" in titles
    reward_ax = fig.axes[0]
    labels = reward_ax.get_legend_handles_labels()[1]
    assert labels == ["total (weighted)", "correctness_reward", "fmt_reward"]
    # without a kl key the last panel shows the loss; with one it shows KL
    assert any("Loss" in t for t in titles)
    fig_kl = dashboard_figure([dict(r, kl=0.01) for r in ROWS])
    assert any(ax.get_title() == "KL (beta > 0)" for ax in fig_kl.axes)


def test_dashboard_copes_with_missing_and_null_values():
    fig = dashboard_figure([{"step": 1, "reward": None}, {"step": 2}])
    assert len(fig.axes) >= 4

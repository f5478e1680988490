"""The completions explorer on the small authored fixture run."""

import json
from pathlib import Path

import pytest

from helpers.explorer import (
    best_of_step,
    completions_at,
    early_vs_late,
    explorer,
    load_completions,
    prompts_by_steps,
    render_html,
    render_text,
    reward_columns,
    step_summary,
)

FIXTURE = Path(__file__).parent / "fixtures" / "run" / "completions.jsonl"
P1, P2 = "What is 23 + 19?", "What is 40 + 15?"


@pytest.fixture()
def df():
    return load_completions(FIXTURE)


def test_load_flattens_rewards_and_counts_nothing_skipped(df):
    assert len(df) == 6
    assert reward_columns(df) == ["reward/correctness_reward", "reward/prefilled_strict_format_reward"]
    assert df.attrs["skipped"] == 0
    assert df.loc[df["step"] == 2, "reward/correctness_reward"].tolist() == [2.0, 0.0]


def test_bad_lines_are_counted_not_silently_dropped(tmp_path):
    path = tmp_path / "completions.jsonl"
    good = FIXTURE.read_text().splitlines()[0]
    path.write_text("\n".join([good, "{not json", json.dumps({"step": 1}), good]) + "\n")
    df = load_completions(path)
    assert len(df) == 2
    assert df.attrs["skipped"] == 2
    assert df.attrs["skipped_lines"] == [2, 3]


def test_missing_log_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="ensure_adapter"):
        load_completions(tmp_path / "completions.jsonl")


def test_prompts_by_steps_puts_repeated_prompts_first(df):
    table = prompts_by_steps(df)
    assert table["prompt"].tolist() == [P1, P2]
    assert table.iloc[0][["first_step", "last_step", "n_steps"]].tolist() == [1, 3, 2]


def test_completions_at_sorts_best_first(df):
    rows = completions_at(df, P1, 1)
    assert rows["reward"].tolist() == [0.5, 0.0]


def test_best_of_latest_step(df):
    best = best_of_step(df)
    assert best["step"] == 3 and best["reward"] == 2.5
    assert best_of_step(df, 2)["prompt"] == P2
    with pytest.raises(ValueError, match="steps present"):
        best_of_step(df, 7)


def test_step_summary_means(df):
    s = step_summary(df).set_index("step")
    assert s.loc[1, "reward"] == pytest.approx(0.25)
    assert s.loc[3, "reward/correctness_reward"] == pytest.approx(2.0)
    assert s["n"].tolist() == [2, 2, 2]


def test_early_vs_late_on_a_repeated_prompt(df):
    table = early_vs_late(df)
    assert len(table) == 1
    row = table.iloc[0]
    assert (row["early step"], row["late step"]) == (1, 3)
    assert row["early mean reward"] == 0.25 and row["late mean reward"] == 2.5
    assert "41" in row["early best"] and "42" in row["late best"]


def test_early_vs_late_without_repeats_compares_first_and_last_steps(df):
    table = early_vs_late(df[df["step"] != 3])
    assert table["when"].tolist() == ["early", "late"]
    assert table["mean reward"].tolist() == [0.25, 1.25]


def test_render_html_escapes_and_shows_both_sides(df):
    html = render_html(df, P1, 1)
    assert "Step 1: 2 completions" in html
    assert "&lt;/reasoning&gt;" in html and "</reasoning>\n" not in html
    assert "Best of the latest step (3)" in html
    assert "correctness_reward" in html


def test_render_text_lists_completions(df):
    text = render_text(df, P2)
    assert text.splitlines()[1] == "step 2:"
    assert "total=2.50" in text and "best of the latest step (3)" in text


def test_explorer_widget_follows_prompt_and_step(df):
    box = explorer(df)
    prompt_box, slider, view = box.children
    assert list(slider.options) == [1, 3] and slider.value == 3
    slider.value = 1
    assert "Step 1:" in view.value
    prompt_box.value = P2
    assert list(slider.options) == [2]
    assert "Step 2:" in view.value


def test_empty_log_renders_a_message(tmp_path):
    path = tmp_path / "completions.jsonl"
    path.write_text("")
    df = load_completions(path)
    assert "empty" in render_html(df)
    assert early_vs_late(df).empty


def test_conversational_completions_and_missing_rewards(tmp_path):
    path = tmp_path / "completions.jsonl"
    rows = [
        {"step": 1, "prompt": "q", "completion": [{"role": "assistant", "content": "hi <answer>2</answer>"}],
         "answer": "2", "rewards": {"a_reward": None}, "reward": None, "advantage": None},
        {"step": 1, "prompt": "q", "completion": "plain", "answer": "2",
         "rewards": {"a_reward": 1.0}, "reward": 1.0, "advantage": 0.5},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    df = load_completions(path)
    assert df["completion"].tolist() == ["hi <answer>2</answer>", "plain"]
    text = render_text(df)
    assert "total=1.00" in text and "total=-" in text
    assert "&ndash;" in render_html(df)

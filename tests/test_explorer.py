"""helpers.explorer: reading TRL 1.13's completion logs (``<output_dir>/completions/completions_<step>.parquet``)."""

import json
from pathlib import Path

import pandas as pd
import pytest

from helpers.explorer import (early_vs_late, format_turns, load_completions, render_step, reward_columns, step_summary,
                              turns_html, turns_of)

PROMPT = "system\nRespond in the following format: ...\nuser\nWhat is {q}?\nassistant\n<reasoning>\n"
REWARDS = ["correctness_reward", "prefilled_strict_format_reward"]


def write_step(output_dir, step, rows):
    """A completions file with the columns TRL writes, in its order: step, prompt, completion,
    one column per reward function, the extra columns rewards logged, advantage."""
    table = {"step": [step] * len(rows), "prompt": [r["prompt"] for r in rows],
             "completion": [r["completion"] for r in rows],
             **{name: [r[name] for r in rows] for name in REWARDS},
             "answer": [r["answer"] for r in rows], "extracted": [r.get("extracted", "") for r in rows],
             "advantage": [r["advantage"] for r in rows]}
    folder = output_dir / "completions"
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(table).to_parquet(folder / f"completions_{step:05d}.parquet")


def row(q, completion, correct, fmt, advantage=0.0, answer="5"):
    return {"prompt": PROMPT.format(q=q), "completion": completion, "correctness_reward": correct,
            "prefilled_strict_format_reward": fmt, "answer": answer, "advantage": advantage}


@pytest.fixture()
def run(tmp_path):
    """RUN with RUN/grpo/completions holding steps 1, 2 and 10, and the weights of train_config.json."""
    grpo = tmp_path / "grpo"
    write_step(grpo, 1, [row("2 + 3", "2 + 3 = 6", 0.0, 0.0, -0.7), row("2 + 3", "five", 0.0, 1.0, 0.7)])
    write_step(grpo, 2, [row("2 + 3", "2 + 3 = 5\n</reasoning>\n<answer>\n5\n</answer>", 2.0, 1.0, 0.7),
                         row("2 + 3", "<b>5</b>", 0.0, None, -0.7)])
    write_step(grpo, 10, [row("1 + 1", "x", 2.0, 1.0, 0.0, answer="2"), row("1 + 1", "y", 2.0, 1.0, 0.0, answer="2")])
    (tmp_path / "train_config.json").write_text(json.dumps(
        {"rewards": [{"name": "correctness_reward", "weight": 1.0},
                     {"name": "prefilled_strict_format_reward", "weight": 0.5}]}))
    return tmp_path


def test_loads_every_step_in_order_with_trl_columns(run):
    df = load_completions(run / "grpo")
    assert df["step"].tolist() == [1, 1, 2, 2, 10, 10]  # step 10 after step 2
    assert list(df.columns) == ["step", "prompt", "completion", *REWARDS, "answer", "extracted", "advantage",
                                "reward"]
    assert df.attrs["rewards"] == REWARDS == reward_columns(df)
    assert load_completions(run / "grpo" / "completions").equals(df)  # the folder itself works too


def test_reward_is_the_weighted_total_trl_ranked(run):
    df = load_completions(run / "grpo")
    # 1.0 x correctness + 0.5 x format, a None (not applicable) counting 0 as in TRL's nansum
    assert df["reward"].tolist() == [0.0, 0.5, 2.5, 0.0, 2.5, 2.5]
    (run / "train_config.json").unlink()  # no config: every weight 1.0
    assert load_completions(run / "grpo")["reward"].tolist() == [0.0, 1.0, 3.0, 0.0, 3.0, 3.0]


def test_max_step_drops_files_of_later_steps(run):
    df = load_completions(run / "grpo", max_step=2)
    assert sorted(df["step"].unique()) == [1, 2] and df.index.tolist() == [0, 1, 2, 3]


def test_no_logs_says_how_to_get_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="log_completions=True"):
        load_completions(tmp_path / "grpo")


def test_step_summary_is_the_training_curve_from_the_completions(run):
    table = step_summary(load_completions(run / "grpo"))
    assert table["step"].tolist() == [1, 2, 10]
    assert table["completions"].tolist() == [2, 2, 2]
    assert table["reward"].tolist() == [0.25, 1.25, 2.5]
    assert table["correctness_reward"].tolist() == [0.0, 1.0, 2.0]
    assert table["prefilled_strict_format_reward"].tolist() == [0.5, 1.0, 1.0]  # the None left out
    assert table["words"].tolist() == [(5 + 1) / 2, (9 + 1) / 2, 1.0]


def test_early_vs_late_compares_mean_reward_and_the_best_completion(run):
    table = early_vs_late(load_completions(run / "grpo"), steps=2, max_chars=20)
    first, last = table.to_dict("records")
    assert (first["when"], first["steps"], first["mean reward"]) == ("early", "1-2", 0.75)
    assert first["best completion"] == "2 + 3 = 5 \u21b5 </reaso\u2026" and first["its reward"] == 2.5
    assert (last["when"], last["steps"], last["mean reward"]) == ("late", "2-10", 1.875)


def test_render_step_escapes_html_and_shows_the_best_first(run):
    df = load_completions(run / "grpo")
    page = render_step(df, step=2)
    assert page.startswith("<div><h4>Step 2: 2 completions</h4>")
    assert "&lt;answer&gt;\n5\n&lt;/answer&gt;" in page and "&lt;b&gt;5&lt;/b&gt;" in page
    assert "<b>5</b>" not in page.replace("gold answer <b>5</b>", "")  # the only raw <b>5</b> is ours
    assert "&lt;reasoning&gt;" in page  # the prompt's prefill, escaped
    assert page.index("&lt;answer&gt;") < page.index("&lt;b&gt;5")  # reward 2.5 before reward 0.0
    assert "total <b>2.50</b> &middot; advantage 0.70" in page
    assert "prefilled_strict_format=&ndash;" in page  # the None
    latest = render_step(df, max_completions=1)
    assert latest.startswith("<div><h4>Step 10:") and latest.count("<pre") == 1
    assert "gold answer <b>2</b>" in latest
    assert render_step(df.iloc[0:0]) == "<p>The completion log is empty: nothing to show yet.</p>"


@pytest.mark.slow
def test_a_real_tiny_grpo_run_is_read_as_trl_wrote_and_logged_it(tmp_path_factory):
    """The shared 2-step cpu-smoke run (tests/shared.py, run once per session)."""
    from helpers.profiles import get_profile
    from helpers.tasks import get_task

    from .shared import smoke_run

    profile = get_profile("cpu-smoke")
    tmp_path = Path(smoke_run(tmp_path_factory)["run"])
    df = load_completions(tmp_path / "grpo")
    task = get_task(profile.task)
    assert df.attrs["rewards"] == [f.__name__ for f, _ in task.rewards_for(profile.task_level)]
    assert {"step", "prompt", "completion", "advantage", "answer", "extracted"} <= set(df.columns)
    assert df.groupby("step").size().to_dict() == {1: 2, 2: 2}  # one group of num_generations per step
    assert df["prompt"].str.endswith("assistant\n" + task.prefill).all()  # what the model saw, prefill included

    logged = {m["step"]: m for m in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())}
    for step, group in df.groupby("step"):
        assert group["reward"].mean() == pytest.approx(logged[step]["reward"], abs=1e-5)
        std = group["reward"].std()  # Bessel's correction, as TRL
        expected = (group["reward"] - group["reward"].mean()) / (std + 1e-4)
        assert group["advantage"].tolist() == pytest.approx(expected.tolist(), abs=1e-4)
    assert step_summary(df)["step"].tolist() == [1, 2]
    assert "Step 2: 2 completions" in render_step(df)
    # the group diversity logged at each step (GroupDiversityCallback, from the completions the trainer held) is the
    # one of the completions TRL wrote to its log
    from helpers.watch import group_diversity
    for step, group in df.groupby("step"):
        measured = group_diversity(list(group["completion"]), profile.num_generations)
        assert measured == pytest.approx({k: logged[step][k] for k in measured}) and len(measured) == 2


# --------------------------------------------------------------------------- tool-calling runs (notebook 07)

CALL = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "347 * 58"}}}
TURNS = [{"role": "assistant", "content": "", "tool_calls": [CALL]},
         {"role": "tool", "name": "calculator", "content": "20126"},
         {"role": "assistant", "content": "20126"}]


def test_format_turns_shows_the_call_the_reply_and_the_answer():
    assert format_turns(TURNS).splitlines() == [
        'model  calls calculator(expression="347 * 58")',
        "tool   20126   (its reply: the loss masks it)",
        "model  20126"]
    assert format_turns([{"role": "assistant", "content": "a\nb"}]) == "model  a\n       b"
    assert format_turns([]) == "" and format_turns(None) == ""


@pytest.fixture()
def tool_run(tmp_path):
    """A tool run's log as TRL writes it: the decoded completion, the reward, the `turns` and `answer` the
    course's tool reward logs with log_extra, the advantage."""
    folder = tmp_path / "grpo" / "completions"
    folder.mkdir(parents=True)
    decoded = '<tool_call>\n{"name": "calculator", ...}\n</tool_call>\ntool\n20126\nassistant\n20126'
    pd.DataFrame({"step": [1, 1], "prompt": ["system\n...\nuser\nWhat is 347 * 58?\nassistant\n"] * 2,
                  "completion": [decoded, "19986"], "tool_answer_reward": [1.0, 0.0],
                  "turns": [json.dumps(TURNS), json.dumps([{"role": "assistant", "content": "19986"}])],
                  "answer": ["20126", "20126"], "advantage": [0.7, -0.7]}
                 ).to_parquet(folder / "completions_00001.parquet")
    return tmp_path


def test_render_step_shows_a_tool_runs_completions_turn_by_turn(tool_run):
    df = load_completions(tool_run / "grpo")
    assert df.attrs["rewards"] == ["tool_answer_reward"]
    assert turns_of(df.iloc[0]) == TURNS and turns_of(pd.Series({"turns": "not json"})) is None
    page = render_step(df, step=1)
    assert "calculator(expression=&quot;347 * 58&quot;)" in page and "tool reply (masked from the loss)" in page
    assert page.index("calculator(expression") < page.index("19986")  # the right rollout first
    assert "&lt;tool_call&gt;" not in page  # the turns replace the decoded text
    assert turns_html(TURNS).count("<small>model</small>") == 2
    # a log without the column is shown as before
    assert "&lt;tool_call&gt;" in render_step(df.drop(columns=["turns"]), step=1)

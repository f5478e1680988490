"""Evaluation: scoring on hand-written completions, eval.json, and base vs trained on the model."""

import json
from pathlib import Path

import pytest

from helpers.config import get_profile
from helpers.evaluation import (
    SUMMARY_KEYS,
    comparison_table,
    default_reward_funcs,
    eval_record,
    eval_settings,
    eval_split,
    evaluate,
    evaluate_before_after,
    plot_comparison,
    score_completions,
    side_by_side,
    write_eval,
)
from helpers.explorer import load_completions

from .adapters import PROMPTS, perturbed_lora_model

GOOD = "<reasoning>\n23 + 19 = 42\n</reasoning>\n<answer>\n42\n</answer>"
WRONG = "<reasoning>\n23 + 19 = 41\n</reasoning>\n<answer>\n41\n</answer>"
PREFILL = [{"role": "user", "content": "What is 23 + 19?"},
           {"role": "assistant", "content": "<reasoning>\n"}]
PLAIN = [{"role": "user", "content": "What is 23 + 19?"}]


def test_accuracy_needs_correct_answer_and_format():
    res = score_completions([[GOOD], [WRONG], ["The answer is <answer>42</answer>"]],
                            ["42", "42", "42"], prompts=[PLAIN, PLAIN, PLAIN])
    s = res["summary"]
    assert s["accuracy"] == pytest.approx(1 / 3)
    assert s["format_rate"] == pytest.approx(2 / 3)
    assert s["correct_rate"] == pytest.approx(2 / 3)  # the third is right but badly formatted
    assert s["n_prompts"] == 3 and s["n_completions"] == 3
    assert [r["accurate"] for r in res["rows"]] == [True, False, False]
    assert [r["extracted"] for r in res["rows"]] == ["42", "41", "42"]


def test_a_prefilled_opening_tag_counts_toward_the_format():
    body = GOOD[len("<reasoning>\n"):]
    with_prefill = score_completions([[body]], ["42"], prompts=[PREFILL])["summary"]
    without = score_completions([[body]], ["42"], prompts=[PLAIN])["summary"]
    assert with_prefill["accuracy"] == 1.0 and with_prefill["format_rate"] == 1.0
    assert without["format_rate"] == 0.0
    assert with_prefill["rewards"]["prefilled_strict_format_reward"] == 1.0


def test_per_reward_means_use_trl_calling_convention():
    s = score_completions([[GOOD, WRONG]], ["42"], prompts=[PLAIN])["summary"]
    assert s["rewards"]["correctness_reward"] == pytest.approx(1.0)  # (2.0 + 0.0) / 2
    assert s["rewards"]["prefilled_strict_format_reward"] == pytest.approx(1.0)
    assert s["n_prompts"] == 1 and s["n_completions"] == 2


def test_task_preset_rewards_are_reported_under_training_names():
    names = [f.__name__ for f in default_reward_funcs("arithmetic")]
    s = score_completions([[GOOD]], ["42"], prompts=[PLAIN],
                          reward_funcs=default_reward_funcs("arithmetic"))["summary"]
    assert sorted(s["rewards"]) == sorted(names)


def test_a_broken_reward_is_recorded_not_raised():
    def broken_reward(**_):
        raise RuntimeError("boom")

    s = score_completions([[GOOD]], ["42"], reward_funcs=[broken_reward])["summary"]
    assert s["rewards"] == {"broken_reward": None}
    assert "boom" in s["reward_errors"]["broken_reward"]
    assert s["accuracy"] == 1.0


def test_lengths_in_tokens_with_a_tokenizer():
    class Tok:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": list(text)}

    s = score_completions([["abc"], ["abcde"]], ["1", "2"], reward_funcs=[], tokenizer=Tok())
    assert s["summary"]["mean_length"] == 4.0 and s["summary"]["length_unit"] == "tokens"


def test_mismatched_inputs_are_an_error():
    with pytest.raises(ValueError, match="one list of completions per prompt"):
        score_completions([[GOOD]], ["42", "1"])


def test_eval_split_from_rows_and_missing_columns():
    rows = [{"prompt": PLAIN, "answer": 42, "question": "What is 23 + 19?"},
            {"prompt": PREFILL, "answer": "7"}]
    split = eval_split({"eval": rows}, n=2)
    assert split["answers"] == ["42", "7"]
    assert split["questions"] == ["What is 23 + 19?", "What is 23 + 19?"]
    assert len(eval_split(rows, n=1)["prompts"]) == 1
    with pytest.raises(ValueError, match="'prompt' or 'answer'"):
        eval_split([{"prompt": PLAIN}])


def _fake_results():
    base = score_completions([[WRONG], ["42"]], ["42", "42"], prompts=[PLAIN, PLAIN])
    trained = score_completions([[GOOD], [GOOD]], ["42", "42"], prompts=[PLAIN, PLAIN])
    return {"base": base, "trained": trained, "settings": {"temperature": 0.0}}


def test_eval_json_has_the_interface_keys(tmp_path):
    path = write_eval(tmp_path, _fake_results(), profile="cpu-smoke")
    data = json.loads(path.read_text())
    assert path == tmp_path / "eval.json"
    for side in ("base", "trained"):
        assert set(SUMMARY_KEYS) <= set(data[side])
        assert "rewards" in data[side]
    assert data["base"]["accuracy"] == 0.0 and data["trained"]["accuracy"] == 1.0
    assert data["profile"] == "cpu-smoke" and data["settings"] == {"temperature": 0.0}


def test_comparison_table_and_side_by_side():
    res = _fake_results()
    table = comparison_table(res)
    assert table.loc["accuracy", "change"] == 1.0
    assert table.loc["n_prompts", "base"] == 2
    assert "reward: correctness_reward" in table.index
    # the same table from a loaded eval.json
    assert comparison_table(eval_record(res)).equals(table)
    sbs = side_by_side(res, ["q1", "q2"], n=2)
    assert sbs["base ok"].tolist() == [False, False]
    assert sbs["trained ok"].tolist() == [True, True]


def test_plot_writes_a_png(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    fig = plot_comparison(_fake_results(), tmp_path / "figures" / "eval.png")
    assert (tmp_path / "figures" / "eval.png").stat().st_size > 1000
    assert len(fig.axes) == 2


def test_fixture_completions_score_like_the_training_log():
    """The authored fixture's correctness scores agree with the evaluation's checks."""
    df = load_completions(Path(__file__).parent / "fixtures" / "run" / "completions.jsonl")
    res = score_completions([[c] for c in df["completion"]], df["answer"].tolist(),
                            prompts=[PREFILL] * len(df), reward_funcs=default_reward_funcs())
    got = [r["rewards"]["correctness_reward"] for r in res["rows"]]
    assert got == df["reward/correctness_reward"].tolist()
    fmt = [r["rewards"]["prefilled_strict_format_reward"] for r in res["rows"]]
    assert fmt == df["reward/prefilled_strict_format_reward"].tolist()


def test_eval_settings_follow_the_profile():
    s = eval_settings(get_profile("cpu-demo"))
    assert (s.max_new_tokens, s.temperature, s.seed) == (get_profile("cpu-demo").max_completion_length, 0.0, get_profile("cpu-demo").seed)


@pytest.mark.slow
def test_before_after_uses_one_model_and_the_same_prompts():
    from helpers.generation import generate
    from helpers.models import load_model

    profile = get_profile("cpu-smoke")
    settings = eval_settings(profile, max_new_tokens=12)
    model, tok = perturbed_lora_model(profile)
    answers = ["42", "12", "red", "55"]
    res = evaluate_before_after(model, tok, PROMPTS, answers, settings, progress=None)
    base_out = [r["completion"] for r in res["base"]["rows"]]
    trained_out = [r["completion"] for r in res["trained"]["rows"]]
    # the base side is the plain model: same text as a model loaded without LoRA
    plain, plain_tok = load_model(profile, lora=False)
    assert base_out == [o[0] for o in generate(plain, plain_tok, PROMPTS, settings)]
    # the trained side is the adapter (the perturbed LoRA changes greedy outputs)
    assert trained_out != base_out
    assert trained_out == [o[0] for o in generate(model, tok, PROMPTS, settings)]
    assert res["base"]["summary"]["n_prompts"] == 4
    assert 0 < res["trained"]["summary"]["mean_length"] <= 12
    again = evaluate(model, tok, PROMPTS[:1], answers[:1], settings)
    assert again["rows"][0]["completion"] == trained_out[0]


def test_before_after_refuses_a_model_without_adapter():
    class Plain:
        pass

    with pytest.raises(TypeError, match="disable_adapter"):
        evaluate_before_after(Plain(), None, PROMPTS, ["1"] * 4, eval_settings(get_profile("cpu-smoke")))

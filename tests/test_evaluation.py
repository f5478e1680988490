"""helpers.evaluation: scoring hand-written completions, every side of one PEFT model, the tables, eval.json."""

import contextlib
import math

import pytest

from helpers.config import get_profile
from helpers.evaluation import (
    SUMMARY_KEYS,
    comparison_table,
    eval_settings,
    evaluate_adapters,
    score_completions,
    side_by_side,
    write_eval,
)
from helpers.generation import SamplingSettings
from helpers.rewards import correctness_reward, get_preset, prefilled_strict_format_reward
from helpers.runs import read_json

from .adapters import ANSWERS, PROMPTS, add_perturbed_adapter, perturbed_lora_model

GOOD = "<reasoning>\n23 + 19 = 42\n</reasoning>\n<answer>\n42\n</answer>"
WRONG = "<reasoning>\n23 + 19 = 41\n</reasoning>\n<answer>\n41\n</answer>"
UNFORMATTED = "The answer is <answer>42</answer>"
PREFILL = "<reasoning>\n"


def test_accuracy_needs_the_right_answer_in_the_format():
    res = score_completions([[GOOD], [WRONG], [UNFORMATTED]], ["42", "42", "42"])
    s = res["summary"]
    assert set(SUMMARY_KEYS) <= set(s)
    assert s["accuracy"] == pytest.approx(1 / 3)
    assert s["format_rate"] == pytest.approx(2 / 3)
    assert s["correct_rate"] == pytest.approx(2 / 3)  # the third is right, badly formatted
    assert (s["n_prompts"], s["n_completions"]) == (3, 3)
    assert [r["extracted"] for r in res["rows"]] == ["42", "41", "42"]
    assert [(r["correct"], r["format"], r["accurate"]) for r in res["rows"]] == [
        (True, True, True), (False, True, False), (True, False, False)]


def test_the_prefill_counts_toward_format_and_answer():
    body = GOOD[len(PREFILL):]  # what the model generates after the template's prefill
    with_prefill = score_completions([[body]], ["42"], prefill=PREFILL)
    assert with_prefill["summary"]["accuracy"] == 1.0
    assert with_prefill["rows"][0]["completion"] == body  # the row keeps what the model wrote
    without = score_completions([[body]], ["42"])["summary"]
    assert without["format_rate"] == 0.0 and without["correct_rate"] == 1.0
    twice = score_completions([[GOOD]], ["42"], prefill=PREFILL)["summary"]  # the tag written again
    assert twice["format_rate"] == 0.0


def test_answers_match_by_the_rewards_rule():
    res = score_completions([["<answer>$1,080.00</answer>"], ["<answer>Paris</answer>"], ["<answer>42"]],
                            ["1080", "Paris", "42"])
    assert [r["correct"] for r in res["rows"]] == [True, True, False]  # the last answer block is cut off


def test_rewards_see_trl_completions_and_their_means_skip_none():
    seen = []

    def recording_reward(completions, answer, **kwargs):
        seen.append((completions, answer))
        return [None, 1.0]

    def never_applies_reward(completions, **kwargs):
        return [None] * len(completions)

    body = GOOD[len(PREFILL):]
    s = score_completions([[body, "x"]], ["42"], prefill=PREFILL,
                          reward_funcs=[recording_reward, never_applies_reward, prefilled_strict_format_reward,
                                        correctness_reward])["summary"]
    assert seen == [([[{"role": "assistant", "content": body}], [{"role": "assistant", "content": "x"}]],
                     ["42", "42"])]  # conversational, without the prefill, one answer per completion
    assert s["rewards"] == {"recording_reward": 1.0, "never_applies_reward": None,
                            "prefilled_strict_format_reward": 0.5, "correctness_reward": 1.0}


def test_lengths_are_tokens_with_a_tokenizer_else_words():
    from helpers.models import load_tokenizer

    tok = load_tokenizer(get_profile("cpu-smoke"))
    rows = score_completions([[GOOD, "two words"]], ["42"], tokenizer=tok)["rows"]
    assert [r["length"] for r in rows] == [len(tok(GOOD, add_special_tokens=False)["input_ids"]), 2]
    assert [r["length"] for r in score_completions([[GOOD]], ["42"])["rows"]] == [len(GOOD.split())]


def test_one_completion_list_per_answer():
    with pytest.raises(ValueError, match="2 completion lists for 1 answers"):
        score_completions([[GOOD], [GOOD]], ["42"])


def test_eval_settings_are_greedy_with_the_profile_length_and_seed():
    p = get_profile("cpu-smoke")
    assert eval_settings(p) == SamplingSettings(max_new_tokens=p.max_completion_length, temperature=0.0,
                                                num_return_sequences=1, seed=p.seed)
    assert eval_settings(p, temperature=0.7, num_return_sequences=4).num_return_sequences == 4


# --------------------------------------------------------------------------- sides, with a fake PEFT model


class FakePeft:
    """Records which adapter is live when generation runs; PEFT's calls only."""

    def __init__(self):
        self.active, self.disabled = "default", False

    @property
    def active_adapter(self):
        return self.active

    def set_adapter(self, name):
        self.active = name

    @contextlib.contextmanager
    def disable_adapter(self):
        self.disabled = True
        try:
            yield
        finally:
            self.disabled = False


def test_each_side_runs_with_its_adapter_and_the_base_with_lora_off(monkeypatch):
    calls = []

    def fake_generate(model, tok, prompts, settings, batch_size=16, adapter=None, chat_template_kwargs=None):
        live = "base" if model.disabled else model.active
        calls.append((live, adapter, chat_template_kwargs))
        return [[f"<answer>{42 if live == 'default' else 0}</answer>"] for _ in prompts]

    monkeypatch.setattr("helpers.evaluation.generate", fake_generate)
    lines = []
    model = FakePeft()
    res = evaluate_adapters(model, None, PROMPTS[:2], ["42", "42"], SamplingSettings(max_new_tokens=4),
                            {"after GRPO": "default", "base": None, "after warm-up": "warmup"},
                            chat_template_kwargs={"enable_thinking": False}, progress=lines.append)
    assert calls == [("default", None, {"enable_thinking": False}), ("base", None, {"enable_thinking": False}),
                     ("warmup", None, {"enable_thinking": False})]
    assert list(res["sides"]) == ["after GRPO", "base", "after warm-up"]
    assert [res["sides"][k]["summary"]["correct_rate"] for k in res["sides"]] == [1.0, 0.0, 0.0]
    assert res["settings"]["max_new_tokens"] == 4 and set(res["seconds"]) == set(res["sides"])
    assert len(lines) == 3 and lines[1].startswith("base: accuracy 0%")
    assert model.active == "default"  # the adapter that was active before is active again


def test_a_vllm_engine_gets_each_adapter_folder_as_a_lora_request(monkeypatch):
    seen = []

    def fake_generate(model, tok, prompts, settings, batch_size=16, adapter=None, chat_template_kwargs=None):
        seen.append(adapter)
        return [["x"] for _ in prompts]

    monkeypatch.setattr("helpers.evaluation.generate", fake_generate)

    class UnslothFast:
        vllm_engine = object()

        def set_adapter(self, name):
            raise AssertionError("a vLLM engine switches adapters per request")

    evaluate_adapters(UnslothFast(), None, PROMPTS[:1], ["42"], SamplingSettings(),
                      {"base": None, "GRPO": "default"}, folders={"default": "/run/adapter"}, progress=None)
    assert seen == [None, "/run/adapter"]


def test_a_model_without_adapters_is_refused_with_the_fix():
    with pytest.raises(TypeError, match="PeftModel.from_pretrained"):
        evaluate_adapters(object(), None, PROMPTS, ANSWERS, SamplingSettings(), {"base": None})


# --------------------------------------------------------------------------- tables and eval.json


def _results(**accuracies):
    return {"sides": {side: {"summary": {"accuracy": acc, "format_rate": acc / 2, "correct_rate": acc,
                                         "mean_length": 10.0 * acc, "rewards": {"correctness_reward": 2 * acc}},
                             "rows": [{"index": i, "completion": f"{side} line\nnext", "accurate": i % 2 == 0}
                                      for i in range(3)]}
                      for side, acc in accuracies.items()},
            "settings": {"max_new_tokens": 8}, "seconds": {side: 1.0 for side in accuracies}}


def test_comparison_table_has_one_column_per_side_and_the_gain_over_the_side_before():
    table = comparison_table(_results(base=0.1, warm=0.3, grpo=0.8))
    assert list(table.columns) == ["base", "warm", "grpo", "gain: warm", "gain: grpo"]
    assert list(table.index) == ["accuracy", "format_rate", "correct_rate", "mean_length",
                                 "reward: correctness_reward"]
    assert table.loc["accuracy", "gain: warm"] == pytest.approx(0.2)
    assert table.loc["accuracy", "gain: grpo"] == pytest.approx(0.5)
    assert table.loc["reward: correctness_reward", "gain: grpo"] == pytest.approx(1.0)


def test_comparison_table_reads_eval_json_and_leaves_missing_values_empty(tmp_path):
    results = _results(base=0.25, grpo=0.75)
    path = write_eval(tmp_path, results, profile="cpu-smoke")
    assert comparison_table(read_json(path)).equals(comparison_table(results))
    partial = {"sides": {"base": {"accuracy": 0.5}, "grpo": {"accuracy": 0.75, "format_rate": 1.0}}}
    table = comparison_table(partial)
    assert table.loc["accuracy", "gain: grpo"] == pytest.approx(0.25)
    assert table.loc["format_rate", "gain: grpo"] is None or math.isnan(table.loc["format_rate", "gain: grpo"])


def test_write_eval_keeps_summaries_settings_timings_and_extra(tmp_path):
    path = write_eval(tmp_path, _results(base=0.5), profile="cpu-smoke", model="smollm2-135m")
    assert path == tmp_path / "eval.json"
    record = read_json(path)
    assert record["sides"]["base"]["accuracy"] == 0.5 and "rows" not in record["sides"]["base"]
    assert record["settings"] == {"max_new_tokens": 8} and record["seconds"] == {"base": 1.0}
    assert (record["profile"], record["model"]) == ("cpu-smoke", "smollm2-135m")


def test_side_by_side_shows_the_first_completion_of_each_side_marked():
    table = side_by_side(_results(base=0.0, grpo=1.0), ["What is 1 + 1?", "Q2\nsecond line", "Q3"], n=2,
                         max_chars=12)
    assert list(table.columns) == ["question", "base", "grpo"] and len(table) == 2
    assert table.loc[0, "base"] == "\u2713 base line \u21b5\u2026"
    assert table.loc[1, "grpo"].startswith("\u2717 grpo line")
    assert table.loc[1, "question"] == "Q2 \u21b5 second line"[:11] + "\u2026"


# --------------------------------------------------------------------------- slow: one PEFT model, two adapters


@pytest.mark.slow
def test_evaluate_adapters_on_a_peft_model_with_two_adapters():
    from helpers.generation import generate
    from helpers.models import load_model

    profile = get_profile("cpu-smoke")
    model, tok = perturbed_lora_model(profile, seed=0)
    add_perturbed_adapter(model, "warmup", seed=1)
    settings = eval_settings(profile)
    rewards = [f for f, _ in get_preset(profile.reward_preset, prefill=profile.prefill)]
    sides = {"base": None, "after warm-up": "warmup", "after GRPO": "default"}
    res = evaluate_adapters(model, tok, PROMPTS, ANSWERS, settings, sides, reward_funcs=rewards, progress=None)

    texts = {side: [r["completion"] for r in res["sides"][side]["rows"]] for side in sides}
    assert len({tuple(t) for t in texts.values()}) == 3  # the three sides differ
    bare, _ = load_model(profile, lora=False)  # the base side is the model without any LoRA
    assert texts["base"] == [o[0] for o in generate(bare, tok, PROMPTS, settings)]
    for side, name in (("after warm-up", "warmup"), ("after GRPO", "default")):
        model.set_adapter(name)
        assert texts[side] == [o[0] for o in generate(model, tok, PROMPTS, settings)]
    for side in sides:
        summary = res["sides"][side]["summary"]
        assert summary["n_completions"] == len(PROMPTS) and summary["mean_length"] > 0
        assert set(summary["rewards"]) == {f.__name__ for f in rewards}

    again = evaluate_adapters(model, tok, PROMPTS, ANSWERS, settings, dict(reversed(sides.items())),
                              progress=None)  # the order of the sides changes nothing
    assert {s: [r["completion"] for r in again["sides"][s]["rows"]] for s in sides} == texts

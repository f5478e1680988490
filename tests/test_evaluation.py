"""helpers.evaluation: one path for every task. Scoring hand-written completions with the task's own metrics
(arithmetic and JSON orders), every side of one PEFT model, the tables, pass@k, eval.json."""

import contextlib
import itertools
import json
import math
import types
from fractions import Fraction

import pytest

from helpers.evaluation import (
    comparison_table,
    eval_settings,
    evaluate,
    evaluate_adapters,
    mergeable,
    pass_at_k,
    pass_at_k_curve,
    score,
    side_by_side,
    write_eval,
)
from helpers.generation import SamplingSettings
from helpers.profiles import get_profile
from helpers.runs import read_json
from helpers.tasks import get_task
from helpers.tasks.orders import JSON_PREFILL, make_schema
from helpers.tasks.reasoning import PREFILL, correctness_reward, extract_answer, prefilled_strict_format_reward

from .adapters import PROMPTS, ROWS, add_perturbed_adapter, perturbed_lora_model

ARITHMETIC, ORDERS = get_task("arithmetic"), get_task("json")
GOOD = "<reasoning>\n23 + 19 = 42\n</reasoning>\n<answer>\n42\n</answer>"
WRONG = "<reasoning>\n23 + 19 = 41\n</reasoning>\n<answer>\n41\n</answer>"
UNFORMATTED = "The answer is <answer>42</answer>"
SCHEMA = json.dumps(make_schema(["name", "quantity"]))
GOLD = '{"name": "Ava", "quantity": 2}'


def rows(*answers, **columns):
    return [{"answer": a, **{k: v for k, v in columns.items()}} for a in answers]


# --------------------------------------------------------------------------- score: the arithmetic task


def test_accuracy_needs_the_right_answer_in_the_format():
    res = score([[GOOD], [WRONG], [UNFORMATTED]], rows("42", "42", "42"), ARITHMETIC)
    s = res["summary"]
    assert s["accuracy"] == pytest.approx(1 / 3)
    assert s["format"] == pytest.approx(2 / 3)
    assert s["correct"] == pytest.approx(2 / 3)  # the third is right, badly formatted
    assert (s["n_prompts"], s["n_completions"]) == (3, 3)
    assert list(s) == ["accuracy", "correct", "format", "mean_length", "n_prompts", "n_completions", "rewards"]
    assert [(r["correct"], r["format"], r["accuracy"]) for r in res["rows"]] == [
        (1.0, 1.0, 1.0), (0.0, 1.0, 0.0), (1.0, 0.0, 0.0)]
    assert [extract_answer(r["completion"]) for r in res["rows"]] == ["42", "41", "42"]
    assert [(r["index"], r["answer"]) for r in res["rows"]] == [(0, "42"), (1, "42"), (2, "42")]


def test_the_prefill_counts_toward_format_and_answer():
    body = GOOD[len(PREFILL):]  # what the model generates after the template's prefill
    with_prefill = score([[body]], rows("42"), ARITHMETIC, prefill=PREFILL)
    assert with_prefill["summary"]["accuracy"] == 1.0
    assert with_prefill["rows"][0]["completion"] == body  # the row keeps what the model wrote
    without = score([[body]], rows("42"), ARITHMETIC)["summary"]
    assert without["format"] == 0.0 and without["correct"] == 1.0
    twice = score([[GOOD]], rows("42"), ARITHMETIC, prefill=PREFILL)["summary"]  # the tag written again
    assert twice["format"] == 0.0


def test_answers_match_by_the_rewards_rule():
    res = score([["<answer>$1,080.00</answer>"], ["<answer>Paris</answer>"], ["<answer>42"]],
                rows("1080", "Paris", "42"), ARITHMETIC)
    assert [r["correct"] for r in res["rows"]] == [1.0, 1.0, 0.0]  # the last answer block is cut off
    gold = [2.0 if r["correct"] else 0.0 for r in res["rows"]]  # the same rule as the correctness reward
    assert correctness_reward([r["completion"] for r in res["rows"]], answer=["1080", "Paris", "42"]) == gold


def test_rewards_see_trl_completions_and_every_column_and_their_means_skip_none():
    seen = []

    def recording_reward(completions, answer, **kwargs):
        seen.append((completions, answer, kwargs))
        return [None, 1.0]

    def never_applies_reward(completions, **kwargs):
        return [None] * len(completions)

    body = GOOD[len(PREFILL):]
    data = [{"answer": "42", "question": "What is 23 + 19?", "level": "add2", "prompt": [{"role": "user"}]}]
    s = score([[body, "x"]], data, ARITHMETIC, prefill=PREFILL,
              rewards=[recording_reward, never_applies_reward, prefilled_strict_format_reward,
                       correctness_reward])["summary"]
    # conversational, without the prefill, one value of every column but the prompt per completion
    assert seen == [([[{"role": "assistant", "content": body}], [{"role": "assistant", "content": "x"}]],
                     ["42", "42"], {"question": ["What is 23 + 19?"] * 2, "level": ["add2"] * 2})]
    assert s["rewards"] == {"recording_reward": 1.0, "never_applies_reward": None,
                            "prefilled_strict_format_reward": 0.5, "correctness_reward": 1.0}


def test_lengths_are_tokens_with_a_tokenizer_else_words():
    from helpers.models import load_tokenizer

    tok = load_tokenizer(get_profile("cpu-smoke"))
    out = score([[GOOD, "two words"]], rows("42"), ARITHMETIC, tokenizer=tok)
    assert [r["length"] for r in out["rows"]] == [len(tok(GOOD, add_special_tokens=False)["input_ids"]), 2]
    assert out["summary"]["mean_length"] == pytest.approx((out["rows"][0]["length"] + 2) / 2)
    assert [r["length"] for r in score([[GOOD]], rows("42"), ARITHMETIC)["rows"]] == [len(GOOD.split())]


def test_one_completion_list_per_row():
    with pytest.raises(ValueError, match="2 completion lists for 1 rows"):
        score([[GOOD], [GOOD]], rows("42"), ARITHMETIC)


def test_rows_may_be_a_dataset_split():
    from datasets import Dataset

    split = Dataset.from_list(rows("42", "41"))
    assert score([[GOOD], [GOOD]], split, ARITHMETIC)["summary"]["accuracy"] == 0.5


def test_eval_settings_are_greedy_with_the_profile_length_and_seed():
    p = get_profile("cpu-smoke")
    assert eval_settings(p) == SamplingSettings(max_new_tokens=p.max_completion_length, temperature=0.0,
                                                num_return_sequences=1, seed=p.seed)
    assert eval_settings(p, temperature=0.7, num_return_sequences=4).num_return_sequences == 4
    assert eval_settings(get_profile("cpu-smoke", task="json")).max_new_tokens == 40  # the task's own length


# --------------------------------------------------------------------------- score: the JSON orders task


def test_json_metrics_judge_prefill_plus_completion():
    completions = [['name": "Ava", "quantity": 2}'],          # exact
                   ['name": "Ava", "quantity": "2"}'],        # valid JSON, fails the schema, one field right
                   ['name": "Ava", "quantity": 2} thanks'],   # exact, but not clean
                   ['name": "Ava", "quantity": 2']]           # cut off
    res = score(completions, rows(*[GOLD] * 4, schema=SCHEMA), ORDERS, prefill=JSON_PREFILL)
    s = res["summary"]
    assert s["valid_json"] == 0.75 and s["clean_json"] == 0.5
    assert s["schema_valid"] == 0.5 and s["exact_match"] == 0.5
    assert (s["field: name"], s["field: quantity"]) == (0.75, 0.5)
    assert s["field_rate"] == pytest.approx((1 + 0.5 + 1 + 0) / 4)
    assert (s["n_prompts"], s["n_completions"]) == (4, 4)
    assert [r["exact_match"] for r in res["rows"]] == [1.0, 0.0, 1.0, 0.0]
    # without the prefill nothing parses: the template wrote the '{"' the completion continues
    assert score(completions, rows(*[GOLD] * 4, schema=SCHEMA), ORDERS)["summary"]["valid_json"] == 0.0


def test_json_rewards_get_the_schema_column_and_several_completions_per_prompt():
    body = GOLD[len(JSON_PREFILL):]
    res = score([[body, '"}']], rows(GOLD, schema=SCHEMA), ORDERS, prefill=JSON_PREFILL,
                rewards=[f for f, _ in ORDERS.rewards])
    s = res["summary"]
    assert s["n_completions"] == 2 and [r["exact_match"] for r in res["rows"]] == [1.0, 0.0]
    assert s["rewards"]["prefilled_schema_valid_reward"] == 0.5  # 1.0 and 0.0: the schema reached the reward
    assert s["rewards"]["prefilled_exact_match_reward"] == 0.5
    assert [r["rewards"]["prefilled_field_match_reward"] for r in res["rows"]] == [1.0, 0.0]


# --------------------------------------------------------------------------- evaluate, evaluate_adapters: faked model


def fake_generate_from(answer_of):
    """A stand-in for helpers.generation.generate: what ``answer_of(model)`` says, for every prompt."""
    calls = []

    def fake_generate(model, tok, prompts, settings, batch_size=16, adapter=None, chat_template_kwargs=None):
        calls.append((answer_of(model), adapter, chat_template_kwargs, list(prompts)))
        return [[answer_of(model)] * settings.num_return_sequences for _ in prompts]

    return fake_generate, calls


def test_evaluate_samples_every_rows_prompt_and_scores_after_the_templates_prefill(monkeypatch):
    from helpers.models import load_tokenizer

    fake, calls = fake_generate_from(lambda model: GOOD[len(PREFILL):])
    monkeypatch.setattr("helpers.evaluation.generate", fake)
    tok = load_tokenizer(get_profile("cpu-smoke"))  # its template prefills "<reasoning>\n"
    res = evaluate(object(), tok, ROWS, ARITHMETIC, SamplingSettings(num_return_sequences=2), adapter="/a",
                   rewards=[correctness_reward], chat_template_kwargs={"enable_thinking": False})
    assert calls[0][1:] == ("/a", {"enable_thinking": False}, PROMPTS)
    assert res["summary"]["accuracy"] == 0.25  # right for the first row (42) only
    assert res["summary"]["n_completions"] == 2 * len(ROWS) and res["summary"]["rewards"]["correctness_reward"] == 0.5


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


def live(model):
    return "base" if model.disabled else model.active


def test_each_side_runs_with_its_adapter_and_the_base_with_lora_off(monkeypatch):
    fake, calls = fake_generate_from(lambda m: f"<answer>{42 if live(m) == 'default' else 0}</answer>")
    monkeypatch.setattr("helpers.evaluation.generate", fake)
    lines = []
    model = FakePeft()
    res = evaluate_adapters(model, None, ROWS[:2], ARITHMETIC, SamplingSettings(max_new_tokens=4),
                            {"after GRPO": "default", "base": None, "after warm-up": "warmup"},
                            chat_template_kwargs={"enable_thinking": False}, progress=lines.append)
    assert [c[:3] for c in calls] == [("<answer>42</answer>", None, {"enable_thinking": False}),
                                      ("<answer>0</answer>", None, {"enable_thinking": False}),
                                      ("<answer>0</answer>", None, {"enable_thinking": False})]
    assert list(res["sides"]) == ["after GRPO", "base", "after warm-up"]
    assert [res["sides"][k]["summary"]["correct"] for k in res["sides"]] == [0.5, 0.0, 0.0]  # 42 is row 0's
    assert res["settings"]["max_new_tokens"] == 4 and set(res["seconds"]) == set(res["sides"])
    assert len(lines) == 3 and lines[1].startswith("base: accuracy 0%, format 0% (2 prompts")
    assert model.active == "default"  # the adapter that was active before is active again


def test_the_json_task_goes_through_the_same_path_with_its_own_headline(monkeypatch):
    fake, _ = fake_generate_from(lambda m: GOLD if live(m) == "default" else "no idea")
    monkeypatch.setattr("helpers.evaluation.generate", fake)
    lines = []
    data = rows(GOLD, schema=SCHEMA)
    res = evaluate_adapters(FakePeft(), None, [dict(r, prompt=[]) for r in data], ORDERS, SamplingSettings(),
                            {"base": None, "after GRPO": "default"}, rewards=[f for f, _ in ORDERS.rewards],
                            progress=lines.append)
    assert lines[0].startswith("base: exact_match 0%, schema_valid 0%")
    assert lines[1].startswith("after GRPO: exact_match 100%, schema_valid 100%")
    table = comparison_table(res)
    assert table.loc["exact_match", "gain: after GRPO"] == 1.0
    assert table.loc["reward: prefilled_exact_match_reward", "base"] == 0.0


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

    evaluate_adapters(UnslothFast(), None, ROWS[:1], ARITHMETIC, SamplingSettings(),
                      {"base": None, "GRPO": "default"}, folders={"default": "/run/adapter"}, progress=None)
    assert seen == [None, "/run/adapter"]


def test_a_cache_is_read_back_only_while_rows_settings_and_adapter_files_are_unchanged(monkeypatch, tmp_path):
    fake, calls = fake_generate_from(lambda m: f"<answer>{42 if live(m) == 'default' else 0}</answer>")
    monkeypatch.setattr("helpers.evaluation.generate", fake)
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    cache, lines, sides = tmp_path / "pass_at_k.json", [], {"base": None, "after GRPO": "default"}

    def run(rows=ROWS[:2], settings=SamplingSettings(num_return_sequences=2)):
        return evaluate_adapters(FakePeft(), None, rows, ARITHMETIC, settings, sides, folders={"default": folder},
                                 progress=lines.append, cache=cache)

    first = run()
    assert len(calls) == 2 and cache.is_file()
    again = run()  # nothing sampled: the same rows, settings and adapter file
    assert len(calls) == 2 and again["sides"] == first["sides"] and lines[-1].startswith(f"read {cache}")
    run(settings=SamplingSettings(num_return_sequences=3))  # other settings: sampled again
    run(rows=ROWS[:1])  # other rows
    assert len(calls) == 6
    (folder / "adapter_model.safetensors").write_bytes(b"retrained")  # notebook 03 ran again
    run(rows=ROWS[:1])
    assert len(calls) == 8
    with pytest.raises(ValueError, match=r"folders= to name the folder of adapter\(s\) \['default'\]"):
        evaluate_adapters(FakePeft(), None, ROWS, ARITHMETIC, SamplingSettings(), sides, cache=cache)


def test_a_model_without_adapters_is_refused_with_the_fix():
    with pytest.raises(TypeError, match="PeftModel.from_pretrained"):
        evaluate_adapters(object(), None, ROWS, ARITHMETIC, SamplingSettings(), {"base": None})


# --------------------------------------------------------------------------- tables and eval.json


def _results(**accuracies):
    return {"sides": {side: {"summary": {"accuracy": acc, "correct": acc, "format": acc / 2,
                                         "mean_length": 10.0 * acc, "n_prompts": 3, "n_completions": 3,
                                         "rewards": {"correctness_reward": 2 * acc}},
                             "rows": [{"index": i, "completion": f"{side} line\nnext", "accuracy": float(i % 2 == 0)}
                                      for i in range(3)]}
                      for side, acc in accuracies.items()},
            "settings": {"max_new_tokens": 8}, "seconds": {side: 1.0 for side in accuracies}}


def test_comparison_table_has_one_column_per_side_and_the_gain_over_the_side_before():
    table = comparison_table(_results(base=0.1, warm=0.3, grpo=0.8))
    assert list(table.columns) == ["base", "warm", "grpo", "gain: warm", "gain: grpo"]
    assert list(table.index) == ["accuracy", "correct", "format", "mean_length", "reward: correctness_reward"]
    assert table.loc["accuracy", "gain: warm"] == pytest.approx(0.2)
    assert table.loc["accuracy", "gain: grpo"] == pytest.approx(0.5)
    assert table.loc["reward: correctness_reward", "gain: grpo"] == pytest.approx(1.0)


def test_comparison_table_of_the_json_metrics_lists_every_field():
    a = score([['{"name": "x", "quantity": 2}']], rows(GOLD, schema=SCHEMA), ORDERS)
    b = score([[GOLD]], rows(GOLD, schema=SCHEMA), ORDERS)
    table = comparison_table({"sides": {"warm-up": a, "GRPO": b}})
    assert list(table.index) == ["exact_match", "schema_valid", "valid_json", "clean_json", "field_rate",
                                 "field: name", "field: quantity", "mean_length"]
    assert table.loc["exact_match", "gain: GRPO"] == 1.0
    assert table.loc["field: quantity", "warm-up"] == 1.0 and table.loc["field: name", "warm-up"] == 0.0


def test_comparison_table_reads_eval_json_and_leaves_missing_values_empty(tmp_path):
    results = _results(base=0.25, grpo=0.75)
    path = write_eval(tmp_path, results, profile="cpu-smoke")
    assert comparison_table(read_json(path)).equals(comparison_table(results))
    partial = {"sides": {"base": {"accuracy": 0.5}, "grpo": {"accuracy": 0.75, "format": 1.0}}}
    table = comparison_table(partial)
    assert table.loc["accuracy", "gain: grpo"] == pytest.approx(0.25)
    assert table.loc["format", "gain: grpo"] is None or math.isnan(table.loc["format", "gain: grpo"])
    never = comparison_table({"sides": {"base": {"accuracy": 0.5, "rewards": {"r": None}},
                                        "grpo": {"accuracy": 0.5, "rewards": {"r": 1.0}}}})
    gain = never.loc["reward: r", "gain: grpo"]  # a reward that never applied on one side: no gain
    assert gain is None or math.isnan(gain)


def test_write_eval_keeps_summaries_settings_timings_and_extra(tmp_path):
    path = write_eval(tmp_path, _results(base=0.5), profile="cpu-smoke", model="smollm2-135m")
    assert path == tmp_path / "eval.json"
    record = read_json(path)
    assert record["sides"]["base"]["accuracy"] == 0.5 and "rows" not in record["sides"]["base"]
    assert record["settings"] == {"max_new_tokens": 8} and record["seconds"] == {"base": 1.0}
    assert (record["profile"], record["model"]) == ("cpu-smoke", "smollm2-135m")


def test_side_by_side_shows_the_first_completion_of_each_side_marked_by_the_metric():
    table = side_by_side(_results(base=0.0, grpo=1.0), ["What is 1 + 1?", "Q2\nsecond line", "Q3"], "accuracy",
                         n=2, max_chars=12)
    assert list(table.columns) == ["question", "base", "grpo"] and len(table) == 2
    assert table.loc[0, "base"] == "\u2713 base line \u21b5\u2026"
    assert table.loc[1, "grpo"].startswith("\u2717 grpo line")
    assert table.loc[1, "question"] == "Q2 \u21b5 second line"[:11] + "\u2026"
    results = score([[UNFORMATTED, GOOD]], rows("42"), ARITHMETIC)  # the first completion of the prompt is shown
    assert side_by_side({"sides": {"s": results}}, ["q"], "correct").loc[0, "s"].startswith("\u2713 The answer")
    assert side_by_side({"sides": {"s": results}}, ["q"], "accuracy").loc[0, "s"].startswith("\u2717 The answer")


# --------------------------------------------------------------------------- pass@k


def brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """The share of all k-subsets of n samples (c of them right) holding at least one right sample."""
    right = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(right[i] for i in s) for s in subsets), len(subsets))


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_is_the_share_of_k_subsets_with_a_right_sample(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(brute_force_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


def test_pass_at_k_refuses_impossible_arguments():
    for n, c, k in [(4, 1, 0), (4, 1, 5), (4, 5, 1), (4, -1, 1)]:
        with pytest.raises(ValueError, match="1 <= k <= n"):
            pass_at_k(n, c, k)


def test_pass_at_k_curve_averages_over_prompts_by_the_chosen_metric():
    groups = [[GOOD, WRONG, WRONG, UNFORMATTED], [WRONG] * 4, [GOOD, GOOD, UNFORMATTED, WRONG]]
    side = score(groups, rows("42", "42", "42"), ARITHMETIC)
    accuracy = pass_at_k_curve(side, "accuracy")  # right and in the format: 1, 0 and 2 of 4
    assert list(accuracy) == [1, 2, 3, 4]
    for k, value in accuracy.items():
        expected = sum(brute_force_pass_at_k(4, c, k) for c in (1, 0, 2)) / 3
        assert value == pytest.approx(float(expected))
    assert accuracy[1] == pytest.approx(side["summary"]["accuracy"])  # pass@1 is the mean
    correct = pass_at_k_curve(side, "correct")  # the unformatted answers count: 2, 0 and 3 of 4
    assert correct[4] == pytest.approx(2 / 3) and correct[2] > accuracy[2]
    uneven = score([[GOOD, WRONG, WRONG], [WRONG, GOOD]], rows("42", "42"), ARITHMETIC)
    assert list(pass_at_k_curve(uneven, "accuracy")) == [1, 2]  # k up to the smallest group


def test_only_a_float32_peft_model_on_a_cpu_is_evaluated_with_its_adapter_merged():
    import torch

    def peft(device="cpu", dtype=torch.float32, params=135_000_000):
        return types.SimpleNamespace(merge_adapter=lambda **kw: None, device=types.SimpleNamespace(type=device),
                                     dtype=dtype, config=types.SimpleNamespace(quantization_config=None),
                                     get_nb_trainable_parameters=lambda: (1_000, params))

    assert mergeable(peft())
    assert not mergeable(peft(device="cuda"))  # vLLM or Unsloth's kernels sample there
    assert not mergeable(peft(dtype=torch.bfloat16))  # a bf16 base (notebook 05 on an AMX CPU) would round the update
    assert not mergeable(peft(params=1_500_000_000))  # a copy of its weights could exhaust a laptop's memory
    assert not mergeable(types.SimpleNamespace(device=types.SimpleNamespace(type="cpu"), dtype=torch.float32,
                                               config=types.SimpleNamespace()))  # not a PEFT model
    quantized = peft()
    quantized.config.quantization_config = {"load_in_4bit": True}
    assert not mergeable(quantized)  # merging into 4-bit weights quantizes the adapter too
    assert not mergeable(FakePeft())


# --------------------------------------------------------------------------- slow: one PEFT model, two adapters


@pytest.mark.slow
def test_evaluate_adapters_on_a_peft_model_with_two_adapters():
    import torch

    from helpers.generation import generate
    from helpers.models import load_model

    profile = get_profile("cpu-smoke")
    model, tok = perturbed_lora_model(profile, seed=0)
    add_perturbed_adapter(model, "warmup", seed=1)
    settings = eval_settings(profile)
    rewards = [f for f, _ in ARITHMETIC.rewards_for(profile.task_level)]
    sides = {"base": None, "after warm-up": "warmup", "after GRPO": "default"}
    inner = model.get_base_model()
    original = inner.forward  # a trainer may rebind forward on the instance (transformers' chunked loss does)
    inner.forward = types.MethodType(lambda self, *a, **kw: original(*a, **kw), inner)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    assert mergeable(model)  # so each adapter is merged while its side is sampled
    res = evaluate_adapters(model, tok, ROWS, ARITHMETIC, settings, sides, rewards=rewards, progress=None)
    assert model.active_adapter == "default" and sorted(model.peft_config) == ["default", "warmup"]
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())  # unmerged bit for bit

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
        for row in res["sides"][side]["rows"]:  # scored on the prefill + what the model wrote
            assert {k: row[k] for k in ("accuracy", "correct", "format")} == ARITHMETIC.score(
                PREFILL + row["completion"], ROWS[row["index"]])

    again = evaluate_adapters(model, tok, ROWS, ARITHMETIC, settings, dict(reversed(sides.items())),
                              progress=None)  # the order of the sides changes nothing
    assert {s: [r["completion"] for r in again["sides"][s]["rows"]] for s in sides} == texts


@pytest.mark.slow
def test_evaluate_the_json_task_on_the_bundled_model():
    from helpers.generation import generate
    from helpers.models import load_model
    from helpers.prompts import build_prompt

    profile = get_profile("cpu-smoke", task="json")
    model, tok = load_model(profile, lora=False)
    data = [dict(r, prompt=build_prompt(r["question"], ORDERS.system_prompt_for(r)))
            for r in ORDERS.make_rows(profile.task_level, 2, seed=0)]
    settings = eval_settings(profile)
    res = evaluate(model, tok, data, ORDERS, settings, rewards=[f for f, _ in ORDERS.rewards])
    assert [r["completion"] for r in res["rows"]] == [o[0] for o in generate(model, tok, [r["prompt"] for r in data],
                                                                             settings)]
    for row in res["rows"]:
        metrics = ORDERS.score(JSON_PREFILL + row["completion"], data[row["index"]])
        assert {k: row[k] for k in metrics} == metrics
    assert set(res["summary"]["rewards"]) == {f.__name__ for f, _ in ORDERS.rewards}
    assert 0 <= res["summary"]["exact_match"] <= res["summary"]["valid_json"] <= 1

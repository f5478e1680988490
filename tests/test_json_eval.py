"""helpers.json_eval: the held-out rates of the JSON task, per field, and the side-by-side table."""

from __future__ import annotations

import json

import pytest

from helpers.json_eval import JSON_METRICS, evaluate_json_adapters, json_comparison, score_json
from helpers.json_task import make_schema

SCHEMA = json.dumps(make_schema(["name", "quantity"]))
GOLD = '{"name": "Ava", "quantity": 2}'


def test_rates_judge_prefill_plus_completion():
    completions = [['"name": "Ava", "quantity": 2}'],          # exact
                   ['"name": "Ava", "quantity": "2"}'],        # valid JSON, fails the schema, one field right
                   ['"name": "Ava", "quantity": 2} thanks'],   # exact, but not clean
                   ['"name": "Ava", "quantity": 2']]           # cut off
    s = score_json(completions, [GOLD] * 4, [SCHEMA] * 4, prefill="{")["summary"]
    assert s["valid_json_rate"] == 0.75 and s["clean_json_rate"] == 0.5
    assert s["schema_valid_rate"] == 0.5 and s["exact_match_rate"] == 0.5
    assert s["fields"] == {"name": 0.75, "quantity": 0.5}
    assert s["field_rate"] == pytest.approx((1 + 0.5 + 1 + 0) / 4)
    assert (s["n_prompts"], s["n_completions"]) == (4, 4)


def test_several_completions_per_prompt_and_no_schema():
    out = score_json([[GOLD, "{}"]], [GOLD])
    assert out["summary"]["n_completions"] == 2 and out["summary"]["schema_valid_rate"] is None
    assert [r["exact_match"] for r in out["rows"]] == [True, False]


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="one of each per prompt"):
        score_json([[GOLD]], [GOLD, GOLD])


def test_the_comparison_table_has_every_metric_field_and_gain():
    a = score_json([['{"name": "x", "quantity": 2}']], [GOLD], [SCHEMA])
    b = score_json([[GOLD]], [GOLD], [SCHEMA])
    table = json_comparison({"sides": {"warm-up": a, "GRPO": b}})
    assert list(table.index) == list(JSON_METRICS) + ["field: name", "field: quantity"]
    assert table.loc["exact_match_rate", "gain: GRPO"] == 1.0
    assert table.loc["field: quantity", "warm-up"] == 1.0


def test_adapters_need_a_peft_model():
    with pytest.raises(TypeError, match="PeftModel.from_pretrained"):
        evaluate_json_adapters(object(), None, {"prompt": []}, None, {"base": None})

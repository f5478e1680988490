"""helpers.tasks.json_rewards: finding the object, the field rule, every reward, the prefilled versions and weights.

Hand-written cases go through the harness of notebook 02 (helpers.reward_lab.assert_cases);
property-based tests throw generated, huge, cut-off and deeply nested JSON at every reward.
"""

from __future__ import annotations

import json
import pickle
import time

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from helpers.reward_lab import RewardCase, assert_cases, score_table
from helpers.rewards import Prefilled
from helpers.tasks import json_rewards as JR
from helpers.tasks.json_rewards import (
    MAX_CHARS,
    MAX_DEPTH,
    as_object,
    exact_match_reward,
    field_match_reward,
    find_json_object,
    is_exact_match,
    json_extras_penalty,
    json_format_reward,
    same_value,
    schema_errors,
    schema_valid_reward,
)
from helpers.tasks.orders import JSON_PREFILL, OrdersTask, make_schema

SCHEMA = json.dumps(make_schema(["name", "item", "quantity", "shipping"]))
GOLD = '{"name": "Maya", "item": "lamps", "quantity": 3, "shipping": "express"}'
LAX = json.dumps({"type": "object"})
ALL = [json_format_reward, schema_valid_reward, field_match_reward, exact_match_reward, json_extras_penalty]
#: The task's rewards with their weights: ALL, prefilled with '{"'.
PRESET = OrdersTask.rewards


def case(completion, note, fmt, valid, fields, exact, extras, schema=SCHEMA):
    return RewardCase(completion, {"json_format_reward": fmt, "schema_valid_reward": valid,
                                   "field_match_reward": fields, "exact_match_reward": exact,
                                   "json_extras_penalty": extras},
                      answer=GOLD, note=note, columns={"schema": schema})


CASES = [
    case(GOLD, "the answer", 1.0, 1.0, 1.0, 1.0, 0.0),
    case('{\n  "name": "maya",\n  "item": "lamps",\n  "quantity": 3,\n  "shipping": "express"\n}',
         "pretty-printed, name in lower case", 1.0, 1.0, 1.0, 1.0, 0.0),
    case("```json\n" + GOLD + "\n```", "in a code fence", 0.5, 1.0, 1.0, 1.0, -0.25),
    case("Sure! " + GOLD + " Anything else?", "prose around it", 0.5, 1.0, 1.0, 1.0, -0.25),
    case('{"name": "Maya", "item": "lamps", "quantity": "three", "shipping": "express"}',
         "a number as a word: fails the schema", 1.0, 0.0, 0.75, 0.0, 0.0),
    case('{"name": "Maya", "item": "lamps", "quantity": 3, "shipping": "next-day"}',
         "not one of the enum's values", 1.0, 0.0, 0.75, 0.0, 0.0),
    case('{"name": "Maya", "item": "lamps", "quantity": 3}', "a field missing", 1.0, 0.0, 0.75, 0.0, 0.0),
    case('{"name": "Maya", "item": "lamps", "quantity": 3, "shipping": "express", "price": 12}',
         "an extra key", 1.0, 0.0, 1.0, 0.0, -0.25),
    case('{"name": "Maya", "item": "lamps", "quantity": 3, "shipping": "express"', "cut off: no closing brace",
         0.0, 0.0, 0.0, 0.0, 0.0),
    case("name: Maya, item: lamps", "no JSON at all", 0.0, 0.0, 0.0, 0.0, 0.0),
    case("{'name': 'Maya'}", "Python, not JSON (single quotes)", 0.0, 0.0, 0.0, 0.0, 0.0),
    case("{}", "reward hacking: the empty object, strict schema", 1.0, 0.0, 0.0, 0.0, 0.0),
    case("{}", "reward hacking: the empty object passes a lax schema", 1.0, 1.0, 0.0, 0.0, 0.0, schema=LAX),
    case('{"a": {"b": 1}} ' + GOLD, "the first object counts, and the rest is extra text", 0.5, 0.0, 0.0, 0.0, -0.5),
    case([{"role": "assistant", "content": GOLD}], "a conversational completion", 1.0, 1.0, 1.0, 1.0, 0.0),
]


def test_hand_written_cases():
    assert_cases(CASES, ALL)


def test_prefilled_rewards_read_the_brace_the_template_wrote():
    body = GOLD[len(JSON_PREFILL):]
    cases = [RewardCase(body, {f"prefilled_{f.__name__}": v for f, v in zip(ALL, (1.0, 1.0, 1.0, 1.0, 0.0))},
                        answer=GOLD, columns={"schema": SCHEMA}, note="the completion after the prefill"),
             RewardCase(GOLD, {"prefilled_json_format_reward": 0.5, "prefilled_json_extras_penalty": -0.25},
                        answer=GOLD, columns={"schema": SCHEMA}, note="the prefill written again")]
    assert_cases(cases, [f for f, _ in PRESET])
    assert [f(completions=[body], answer=[GOLD], schema=[SCHEMA]) for f in ALL][0] == [0.0]  # unprefilled: none


def test_the_task_weights_and_names():
    assert [f.__name__ for f, _ in PRESET] == [f"prefilled_{f.__name__}" for f in ALL]
    assert [(f.reward, f.prefill) for f, _ in PRESET] == [(f, JSON_PREFILL) for f in ALL]
    assert [w for _, w in PRESET] == [0.5, 0.5, 2.0, 1.0, 1.0]
    assert sum(w for f, w in PRESET if f.reward is not json_extras_penalty) == pytest.approx(4.0)  # at most 4.0
    for f, _ in PRESET:  # TRL pickles reward functions for some launchers
        assert isinstance(f, Prefilled)
        back = pickle.loads(pickle.dumps(f))
        assert back.__name__ == f.__name__ and back(completions=[GOLD[2:]], answer=[GOLD], schema=[SCHEMA]) == f(
            completions=[GOLD[2:]], answer=[GOLD], schema=[SCHEMA])


def test_score_table_total_is_the_weighted_sum():
    table = score_table([GOLD[2:], 'name": "Maya"}'], PRESET, answer=[GOLD] * 2, schema=[SCHEMA] * 2)
    assert table["total"].tolist() == pytest.approx([0.5 + 0.5 + 2.0 + 1.0, 0.5 + 2.0 * 0.25])


def test_field_rule():
    assert same_value("Lamps ", "lamps") and same_value(3, 3.0) and not same_value("3", 3)
    assert not same_value(1, True) and not same_value(True, 1) and same_value(False, False)
    assert same_value([1, 2], [1, 2]) and not same_value([1, 2], [2, 1]) and same_value(None, None)
    assert not same_value(None, "x") and not same_value(2.5, 2) and same_value({"a": 1}, {"a": 1})


def test_the_expected_object_and_the_exact_match():
    assert as_object(GOLD) == json.loads(GOLD) and as_object({"a": 1}) == {"a": 1}
    assert as_object(b'{"a": 1}') == {"a": 1}
    assert [as_object(v) for v in ("[1]", "not json", None, 3, "{" * 10, '"x"')] == [None] * 6
    assert as_object('{"k": "' + "x" * MAX_CHARS + '"}') is None  # too long to be an answer: not parsed
    assert is_exact_match({"name": "maya ", "item": "lamps", "quantity": 3.0, "shipping": "express"}, GOLD)
    assert not is_exact_match({"name": "Maya", "item": "lamps", "quantity": 3}, GOLD)  # a key missing
    assert not is_exact_match(dict(json.loads(GOLD), extra=1), GOLD)  # a key too many
    assert not is_exact_match(json.loads(GOLD), "not json") and not is_exact_match(None, GOLD)


def test_rewards_without_their_columns_do_not_apply_rather_than_guess():
    assert schema_valid_reward([GOLD]) == [None]
    assert field_match_reward([GOLD]) == [None] and exact_match_reward([GOLD], answer=["not json"]) == [None]
    assert schema_valid_reward([GOLD], schema=['{"type": "objekt"}']) == [None]  # an unusable schema
    assert json_extras_penalty(['{"a": 1, "b": 2}']) == [0.0]  # nothing to compare the keys with


def test_field_match_logs_what_it_read_for_trls_table():
    logged = {}
    field_match_reward([GOLD, "nothing"], answer=[GOLD] * 2, log_extra=lambda k, v: logged.setdefault(k, v))
    assert logged["expected"] == [GOLD, GOLD] and json.loads(logged["extracted"][0])["name"] == "Maya"
    assert logged["extracted"][1] == ""


def test_schema_errors_name_what_is_wrong():
    errors = schema_errors({"name": "Maya", "quantity": "three"}, SCHEMA)
    assert any("'three' is not of type 'integer'" in e for e in errors)
    assert any("'item' is a required property" in e for e in errors)


# --------------------------------------------------------------------------- pathological text, fuzzed


def _timed(text: str) -> list[list]:
    start = time.perf_counter()
    scores = [f(completions=[text], answer=[GOLD], schema=[SCHEMA]) for f in ALL]
    assert time.perf_counter() - start < 2.0, "a reward took too long"
    return scores


@pytest.mark.parametrize("text", [
    "{" * 100_000,
    "[" * 50_000 + "]" * 50_000,
    '{"a":' * 5_000 + "1" + "}" * 5_000,
    '{"a":' * (MAX_DEPTH + 5) + "1" + "}" * (MAX_DEPTH + 5),
    '{"q": ' + "9" * 10_000 + "}",
    '{"q": NaN, "r": Infinity}',
    GOLD * 2_000,
    "{" + '"k": "' + "x" * (MAX_CHARS + 10) + '"}',
    '{"name": "\ud800"}',
    "\x00{\x00}\x00",
    '{"name": "Maya", ' * 3_000,
])
def test_pathological_json_is_scored_quickly_and_never_raises(text):
    for scores in _timed(text):
        assert len(scores) == 1 and (scores[0] is None or isinstance(scores[0], float))
    assert find_json_object(text).obj is None or len(text) <= MAX_CHARS


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
                           lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                           max_leaves=20)
COMPLETION = st.one_of(
    st.text(max_size=300),
    st.text(alphabet='{}[]":,0123456789 abcnulltrue\\\n', max_size=400),
    JSON_VALUES.map(json.dumps),
    JSON_VALUES.map(json.dumps).map(lambda s: s[: len(s) // 2]),  # cut off mid-object
    st.builds(lambda a, b: a + "```json\n" + b + "\n```", st.text(max_size=30), JSON_VALUES.map(json.dumps)),
    st.builds(lambda s: [{"role": "assistant", "content": s}], st.text(max_size=100)),
    st.just(None), st.integers(), st.just([{"role": "assistant"}]),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(comps=st.lists(COMPLETION, max_size=6), answers=st.lists(st.one_of(st.just(GOLD), st.text(max_size=20),
                                                                             st.none()), max_size=6))
def test_every_reward_returns_one_float_or_none_per_completion_and_never_raises(comps, answers):
    n = len(comps)
    answer = (answers + [GOLD] * n)[:n]
    for func in ALL + [f for f, _ in PRESET]:
        scores = func(prompts=[None] * n, completions=comps, answer=answer, schema=[SCHEMA] * n)
        assert len(scores) == n
        assert all(s is None or (isinstance(s, float) and -1.0 <= s <= 1.0) for s in scores)


@settings(max_examples=300, deadline=None)
@given(obj=st.dictionaries(st.sampled_from(["name", "item", "quantity", "shipping", "extra"]), JSON_VALUES, max_size=5),
       before=st.text(alphabet="abc .!\n", max_size=20), after=st.text(alphabet="abc .!\n", max_size=20))
def test_an_object_is_found_whatever_surrounds_it(obj, before, after):
    assume(not JR._too_deep(obj))
    found = find_json_object(before + json.dumps(obj) + after)
    assert found.obj == obj
    assert found.clean == (not (before + after).strip())
    assert field_match_reward([json.dumps(obj)], answer=[GOLD])[0] == pytest.approx(
        sum(k in obj and same_value(obj[k], v) for k, v in json.loads(GOLD).items()) / 4)


def test_the_work_is_bounded_by_the_module_limits():
    assert JR.MAX_STARTS * MAX_CHARS <= 1_000_000  # at most 16 parses of 20k characters per completion
    assert find_json_object("x" * (MAX_CHARS + 1)).error.startswith("longer than")
    deep = '{"a":' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1)
    assert find_json_object(deep).error.startswith("nested deeper")

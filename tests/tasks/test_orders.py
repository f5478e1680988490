"""helpers.tasks.orders: the JSON orders task: generated levels, schemas, prompts, a learner's own rows checked
against a schema, OrdersTask's score, answers and settings.

The pipeline by profile alone is tested where it runs: data prep in test_data.py, ensure_adapter/train_grpo in
test_training.py, the recipe in test_recipe.py (all with ``get_profile(..., task="json")``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.data import DataValidationError, validate
from helpers.evaluation import comparison_table, score
from helpers.profiles import PROFILES, get_profile
from helpers.prompts import build_prompt
from helpers.runs import data_file
from helpers.tasks import get_task, level_table
from helpers.tasks import orders as O
from helpers.tasks.json_rewards import schema_errors
from helpers.tasks.orders import (
    CPU_GROUP,
    CPU_LEARNING_RATE,
    CPU_MAX_STEPS,
    FIELD_SCHEMAS,
    JSON_PREFILL,
    LEVELS,
    Level,
    OrdersTask,
    make_schema,
)

TASK = OrdersTask()
FOUR = ["name", "item", "quantity", "shipping"]
SCHEMA = json.dumps(make_schema(["name", "quantity"]))
GOLD = '{"name": "Ava", "quantity": 2}'


def learner_rows(name: str, schema: dict | None = None):
    """A learner's file as notebook 05 loads it: ``load_dataset``, renamed columns, the schema added to each row."""
    from datasets import load_dataset

    ds = load_dataset(Path(name).suffix.lstrip(".").replace("jsonl", "json"), data_files=str(data_file(name)),
                      split="train").rename_columns({"text": "question", "expected": "answer"})
    return ds.add_column("schema", [json.dumps(schema or make_schema(FOUR))] * ds.num_rows)


# --------------------------------------------------------------------------- generated levels


@pytest.mark.parametrize("level", list(LEVELS))
def test_every_row_is_distinct_and_its_answer_satisfies_its_schema(level):
    rows = TASK.make_rows(level, 300, 3)
    assert len({r["question"] for r in rows}) == 300
    for r in rows:
        obj, schema = json.loads(r["answer"]), json.loads(r["schema"])
        assert list(obj) == list(LEVELS[level].fields) and r["level"] == level and set(r) == {
            "question", "answer", "schema", "level"}
        assert schema_errors(obj, schema) == []
    assert validate(rows, TASK) == []


def test_the_same_seed_gives_the_same_rows_and_another_seed_others():
    assert TASK.make_rows("orders", 20, 1) == TASK.make_rows("orders", 20, 1)
    assert TASK.make_rows("orders", 20, 1) != TASK.make_rows("orders", 20, 2)
    assert TASK.make_rows("orders", 30, 1)[:10] == TASK.make_rows("orders", 10, 1)


def test_the_text_holds_what_the_answer_says():
    for r in TASK.make_rows("orders", 200, 0):
        obj = json.loads(r["answer"])
        text = r["question"].lower()
        assert obj["name"].lower() in text and obj["item"] in text
        assert str(obj["quantity"]) in text.split() or O.NUMBER_WORDS[obj["quantity"]] in text.split()
        assert any(p in text for p in O.SHIPPING_PHRASES[obj["shipping"]])


def test_the_levels_get_harder_as_described():
    easy = TASK.make_rows("orders-easy", 200, 0)
    main = TASK.make_rows("orders", 200, 0)
    assert all(any(c.isdigit() for c in r["question"]) for r in easy)
    assert all("standard shipping" in r["question"] or "express shipping" in r["question"] for r in easy)
    assert sum(O.NUMBER_WORDS[json.loads(r["answer"])["quantity"]] in r["question"].lower().split() for r in main) > 50
    assert sum("$" in r["question"] or "number" in r["question"] or "minutes" in r["question"] for r in main) > 50
    dated = TASK.make_rows("orders-dated", 50, 0)
    assert all(json.loads(r["answer"])["date"].startswith(f"{O.YEAR}-") for r in dated)
    for r in dated:  # the date is written in words, answered as YYYY-MM-DD
        month, day = map(int, json.loads(r["answer"])["date"].split("-")[1:])
        assert f"{O.MONTHS[month - 1]} {day}, {O.YEAR}" in r["question"]


def test_unknown_level_and_field_name_the_valid_ones():
    with pytest.raises(ValueError, match="Unknown level 'nope'. Valid levels: orders-easy, orders, orders-dated"):
        TASK.make_rows("nope", 1, 0)
    with pytest.raises(ValueError, match=r"Unknown field\(s\) \['colour'\].*FIELD_SCHEMAS"):
        make_schema(["name", "colour"])


def test_a_level_too_small_for_the_rows_asked_says_so(monkeypatch):
    monkeypatch.setitem(LEVELS, "tiny", Level("one sentence", ("name",), ("Hello.",)))
    with pytest.raises(ValueError, match=r"'tiny' gave only 1 distinct questions, fewer than the 3 asked for\. Ask for "
                                         "fewer rows, or make the level bigger"):
        TASK.make_rows("tiny", 3, 0)


def test_a_new_level_is_one_line(monkeypatch):
    monkeypatch.setitem(LEVELS, "names-only", Level("just the name", ("name",), ("{name} ordered {qty} {item}.",)))
    row = TASK.make_rows("names-only", 1, 0)[0]
    assert list(json.loads(row["answer"])) == ["name"] and json.loads(row["schema"])["required"] == ["name"]


def test_level_table_shows_an_example_of_each_level():
    table = level_table(TASK)
    assert [t["level"] for t in table] == list(LEVELS)
    assert all(t["example"] == TASK.make_rows(t["level"], 1, 0)[0]["question"] for t in table)


# --------------------------------------------------------------------------- schemas and the prompt


def test_the_schema_is_strict():
    schema = make_schema(FOUR)
    assert schema["required"] == FOUR and schema["additionalProperties"] is False
    assert schema["properties"]["quantity"] == FIELD_SCHEMAS["quantity"]
    schema["properties"]["quantity"]["minimum"] = 99
    assert FIELD_SCHEMAS["quantity"]["minimum"] == 1  # a copy: the field schemas are not changed
    assert schema_errors({"name": "Ava", "item": "x", "quantity": 0, "shipping": "express"}, schema)
    assert schema_errors({"name": "Ava", "item": "x", "quantity": 2, "shipping": "express", "more": 1}, schema)


def test_the_prompt_lists_every_key_with_its_type():
    row = TASK.make_rows("orders-dated", 1, 0)[0]
    system = TASK.system_prompt_for(row)
    for piece in ("name (string)", "quantity (integer)", '"standard" or "express"', "date as YYYY-MM-DD",
                  "one JSON object"):
        assert piece in system
    assert system.endswith('these keys: name (string), item (string), quantity (integer), shipping ("standard" or '
                           '"express"), date (date as YYYY-MM-DD).')
    assert TASK.system_prompt_for({"schema": json.dumps({"properties": {"x": {}}})}).endswith("keys: x (any value).")
    assert build_prompt(row["question"], system, system_role=False)[0]["content"].endswith("\n\n" + row["question"])
    assert TASK.system_prompt_for(TASK.make_rows("orders", 1, 0)[0]) != system  # the prompt follows the row


# --------------------------------------------------------------------------- a learner's own rows


@pytest.mark.parametrize("name", ["json_orders_example.jsonl", "json_orders_example.csv"])
def test_the_shipped_example_files_load_cleanly(name):
    rows = learner_rows(name)
    assert validate(rows, TASK) == [] and rows.num_rows >= 8
    assert all(json.loads(TASK.clean_answer(r)) for r in rows)


def test_the_broken_example_names_every_problem_by_row_and_field():
    with pytest.raises(DataValidationError) as err:
        validate(learner_rows("json_orders_broken.csv"), TASK)
    problems = err.value.problems
    assert [(p.index, p.field, p.kind) for p in problems] == [
        (1, "answer", "bad_answer"), (2, "question", "empty_question"), (3, "question", "duplicate"),
        (4, "answer", "bad_answer"), (5, "answer", "bad_answer"), (6, "answer", "bad_answer")]
    message = str(err.value)
    assert message.startswith("6 problem(s) in 7 rows:") and "... and 1 more: validate(rows, task, strict=False)" in message
    assert "'shipping' is a required property" in problems[5].message
    for piece in ("row 1, field 'answer': 'four' is not of type 'integer'", "row 2, field 'question': the question "
                  "is empty", "row 3, field 'question': the same question as row 0", "row 4, field 'answer': ",
                  "is not a JSON object: write one such as", "row 5, field 'answer': 'by sea' is not one of "
                  "['standard', 'express']: make the object match the schema, or change the schema"):
        assert piece in message, piece


def test_a_lax_schema_accepts_what_a_strict_one_refuses():
    rows = learner_rows("json_orders_broken.csv", schema={"type": "object"})
    assert [p.index for p in validate(rows, TASK, strict=False, check_duplicates=False)] == [2, 4]


def test_clean_answer_is_compact_json_checked_against_the_rows_schema():
    want = '{"name": "Ava", "quantity": 2}'
    assert TASK.clean_answer({"answer": '{\n "name": "Ava",\n "quantity": 2\n}', "schema": SCHEMA}) == want
    assert TASK.clean_answer({"answer": {"name": "Ava", "quantity": 2}, "schema": SCHEMA}) == want  # a dict too
    assert TASK.clean_answer({"answer": '{"name": "Zoë"}'}) == '{"name": "Zoë"}'  # no schema: any object
    with pytest.raises(ValueError, match=r"'\[1, 2\]' is not a JSON object: write one such as"):
        TASK.clean_answer({"answer": "[1, 2]", "schema": SCHEMA})
    with pytest.raises(ValueError, match="'quantity' is a required property: make the object match the schema"):
        TASK.clean_answer({"answer": '{"name": "Ava"}', "schema": SCHEMA})
    with pytest.raises(ValueError, match="the row's schema is not a valid JSON Schema: fix the schema first"):
        TASK.clean_answer({"answer": GOLD, "schema": '{"type": "objekt"}'})


def test_bad_rows_are_listed_not_raised_when_not_strict():
    rows = [{"question": "Ava ordered 2 pens.", "answer": GOLD, "schema": SCHEMA},
            {"question": "Ben ordered 3.", "answer": '{"name": "Ben", "quantity": "3"}', "schema": SCHEMA},
            {"question": "Cy ordered 1.", "answer": '{"name": "Cy", "quantity": 1, "colour": "red"}', "schema": SCHEMA},
            {"question": "No expected", "answer": None, "schema": SCHEMA}]
    problems = validate(rows, TASK, strict=False)
    assert [(p.index, p.field) for p in problems] == [(1, "answer"), (2, "answer"), (3, "answer")]
    assert "'3' is not of type 'integer'" in problems[0].message and "colour" in problems[1].message
    assert "None" in problems[2].message and "is not a JSON object" in problems[2].message


# --------------------------------------------------------------------------- the task


def test_the_task_is_the_builtin_json_task():
    task = get_task("json")
    assert isinstance(task, OrdersTask) and task.name == "json" and task.prefill == JSON_PREFILL == '{"'
    assert (task.headline, task.format_metric, task.min_completion_tokens) == ("exact_match", "schema_valid", 32)
    assert task.levels is LEVELS and task.rewards_for("orders") == list(task.rewards)


def test_make_rows_and_the_reference():
    rows = TASK.make_rows("orders", 5, 1)
    for r in rows:
        text = TASK.reference(r)
        assert text == r["answer"] and text.startswith(JSON_PREFILL)  # the prefill is the start of the object
        assert TASK.score(text, r)["exact_match"] == 1.0


def _rows(n: int = 1, schema: str | None = SCHEMA) -> list[dict]:
    return [{"question": "q", "answer": GOLD, "schema": schema}] * n


def test_score_judges_prefill_plus_completion():
    completions = [['name": "Ava", "quantity": 2}'],          # exact
                   ['name": "ava ", "quantity": 2.0}'],       # exact: the field rule forgives case and 2.0
                   ['name": "Ava", "quantity": "2"}'],        # valid JSON, fails the schema, one field right
                   ['name": "Ava", "quantity": 2} thanks'],   # exact, but not clean
                   ['name": "Ava", "quantity": 2']]           # cut off
    s = score(completions, _rows(5), TASK, prefill=JSON_PREFILL)["summary"]
    assert (s["valid_json"], s["clean_json"], s["schema_valid"], s["exact_match"]) == (0.8, 0.6, 0.6, 0.6)
    assert (s["field: name"], s["field: quantity"]) == (0.8, 0.6)
    assert s["field_rate"] == pytest.approx((1 + 1 + 0.5 + 1 + 0) / 5)
    assert (s["n_prompts"], s["n_completions"]) == (5, 5)
    row = TASK.score(JSON_PREFILL + completions[2][0], _rows()[0])
    assert row == {"exact_match": 0.0, "schema_valid": 0.0, "valid_json": 1.0, "clean_json": 1.0, "field_rate": 0.5,
                   "field: name": 1.0, "field: quantity": 0.0}


def test_score_uses_the_field_rule_of_the_rewards():
    from helpers.tasks.json_rewards import exact_match_reward, field_match_reward

    texts = ['{"name": "AVA", "quantity": 2}', '{"name": "Ava", "quantity": true}', '{"name": "Ava"}', "no"]
    for t in texts:
        metrics = TASK.score(t, _rows()[0])
        assert metrics["exact_match"] == exact_match_reward([t], answer=[GOLD])[0], t
        assert metrics["field_rate"] == field_match_reward([t], answer=[GOLD])[0], t


def test_several_completions_per_prompt():
    out = score([[GOLD, "{}"]], _rows(), TASK)
    assert out["summary"]["n_completions"] == 2 and out["summary"]["exact_match"] == 0.5
    assert [r["exact_match"] for r in out["rows"]] == [1.0, 0.0] and [r["index"] for r in out["rows"]] == [0, 0]
    with pytest.raises(ValueError, match="one list per row"):
        score([[GOLD]], _rows(2), TASK)


def test_without_a_schema_the_object_is_checked_against_none():
    """A learner's rows with no schema column: validate accepts any object, and so does the evaluation."""
    s = score([[GOLD], ["nothing"]], [{"question": "q", "answer": GOLD}] * 2, TASK)["summary"]
    assert (s["schema_valid"], s["exact_match"], s["valid_json"]) == (0.5, 0.5, 0.5)


def test_the_comparison_table_has_every_metric_field_and_gain():
    a = score([['{"name": "x", "quantity": 2}']], _rows(), TASK)
    b = score([[GOLD]], _rows(), TASK)
    table = comparison_table({"sides": {"warm-up": a, "GRPO": b}})
    assert list(table.index)[:7] == ["exact_match", "schema_valid", "valid_json", "clean_json", "field_rate",
                                     "field: name", "field: quantity"]
    assert table.loc["exact_match", "gain: GRPO"] == 1.0 and table.loc["field: name", "gain: GRPO"] == 1.0
    assert table.loc["field: quantity", "warm-up"] == 1.0 and table.loc["field: quantity", "gain: GRPO"] == 0.0


def test_settings_when_a_profile_switches_to_json():
    assert TASK.settings(PROFILES["cpu-smoke"]) == {"task_level": "orders", "warmup_level": "orders-easy",
                                                    "max_completion_length": 40, "max_steps": 2,
                                                    "learning_rate": CPU_LEARNING_RATE, "num_generations": 2}
    longer = PROFILES["cpu-demo"].with_overrides(max_steps=CPU_MAX_STEPS + 30)  # a CPU run longer than the cap
    assert TASK.settings(longer)["max_steps"] == CPU_MAX_STEPS
    assert TASK.settings(PROFILES["cpu-demo"])["max_steps"] == min(CPU_MAX_STEPS, PROFILES["cpu-demo"].max_steps)
    demo = get_profile("cpu-demo", task="json")  # more orders a step in smaller groups, the same 16 completions
    assert (demo.num_generations, demo.learning_rate) == (CPU_GROUP, CPU_LEARNING_RATE) != (
        PROFILES["cpu-demo"].num_generations, PROFILES["cpu-demo"].learning_rate)
    assert demo.per_device_train_batch_size // demo.num_generations == 4
    assert get_profile("cpu-demo", task="json", learning_rate=3e-4).learning_rate == 3e-4  # your override wins
    assert TASK.settings(PROFILES["gpu-large"]) == {"task_level": "orders-dated", "warmup_level": "orders-easy",
                                                    "max_completion_length": 96}  # the GPU profiles' own recipe
    for name in ("cpu-smoke", "cpu-demo", "colab-t4"):
        p = get_profile(name, task="json", use_vllm=False)
        assert p.max_completion_length >= TASK.min_completion_tokens and p.task_level in LEVELS, name
        assert p.max_prompt_tokens + p.max_completion_length <= p.max_seq_length, name

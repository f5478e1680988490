"""helpers.json_task: the orders task, its levels and schemas, prompts, a learner's own rows, the warm-up rows."""

from __future__ import annotations

import json

import pytest

from helpers import json_task as J
from helpers.config import get_profile
from helpers.json_task import (
    JSON_LEVELS,
    JSON_PREFILL,
    JsonDataError,
    JsonLevel,
    generate_orders,
    json_dataset,
    json_prompt,
    json_system_prompt,
    json_task_profile,
    json_warmup_dataset,
    load_json_rows,
    make_schema,
)
from helpers.json_rewards import schema_errors
from helpers.tasks import data_file


@pytest.mark.parametrize("level", list(JSON_LEVELS))
def test_every_row_is_distinct_and_its_answer_satisfies_its_schema(level):
    rows = generate_orders(300, level, seed=3)
    assert len({r["question"] for r in rows}) == 300
    for r in rows:
        obj, schema = json.loads(r["answer"]), json.loads(r["schema"])
        assert list(obj) == list(JSON_LEVELS[level].fields) and r["level"] == level
        assert schema_errors(obj, schema) == []


def test_the_same_seed_gives_the_same_rows_and_another_seed_others():
    assert generate_orders(20, "orders", seed=1) == generate_orders(20, "orders", seed=1)
    assert generate_orders(20, "orders", seed=1) != generate_orders(20, "orders", seed=2)


def test_the_text_holds_what_the_answer_says():
    for r in generate_orders(200, "orders", seed=0):
        obj = json.loads(r["answer"])
        text = r["question"].lower()
        assert obj["name"].lower() in text and obj["item"] in text
        assert str(obj["quantity"]) in text.split() or J.NUMBER_WORDS[obj["quantity"]] in text.split()
        assert any(p in text for p in J.SHIPPING_PHRASES[obj["shipping"]])


def test_the_levels_get_harder_as_described():
    easy = generate_orders(200, "orders-easy", seed=0)
    main = generate_orders(200, "orders", seed=0)
    assert all(any(c.isdigit() for c in r["question"]) for r in easy)
    assert all("standard shipping" in r["question"] or "express shipping" in r["question"] for r in easy)
    assert sum(J.NUMBER_WORDS[json.loads(r["answer"])["quantity"]] in r["question"].lower().split() for r in main) > 50
    assert sum("$" in r["question"] or "number" in r["question"] or "minutes" in r["question"] for r in main) > 50
    dated = generate_orders(50, "orders-dated", seed=0)
    assert all(json.loads(r["answer"])["date"].startswith(f"{J.YEAR}-") for r in dated)


def test_unknown_level_and_field_name_the_valid_ones():
    with pytest.raises(ValueError, match="Valid levels: orders-easy"):
        generate_orders(1, "nope")
    with pytest.raises(ValueError, match="Unknown field"):
        make_schema(["name", "colour"])


def test_a_level_too_small_for_the_rows_asked_says_so():
    tiny = JsonLevel("one sentence", ("name",), ("Hello.",))
    with pytest.raises(ValueError, match="distinct messages"):
        generate_orders(3, tiny)


def test_a_new_level_is_one_line():
    JSON_LEVELS["names-only"] = JsonLevel("just the name", ("name",), ("{name} ordered {qty} {item}.",))
    try:
        row = generate_orders(1, "names-only", seed=0)[0]
        assert list(json.loads(row["answer"])) == ["name"]
    finally:
        del JSON_LEVELS["names-only"]


def test_the_prompt_lists_every_key_with_its_type():
    schema = make_schema(JSON_LEVELS["orders-dated"].fields)
    system = json_system_prompt(schema)
    for piece in ("name (string)", "quantity (integer)", '"standard" or "express"', "YYYY-MM-DD", "one JSON object"):
        assert piece in system
    assert json_prompt("Hi.", schema, system_role=False)[0]["content"].endswith("\n\nHi.")


def test_the_dataset_split_has_prompts_and_no_text_in_both():
    d = json_dataset(generate_orders(60, "orders", seed=0), eval_rows=10, seed=0)
    train, ev = d["train"], d["eval"]
    assert (train.num_rows, ev.num_rows) == (50, 10)
    assert not set(train["question"]) & set(ev["question"])
    assert {"prompt", "question", "answer", "schema", "level"} <= set(train.column_names)


def test_the_warmup_rows_are_whole_objects_of_the_easier_level():
    rows = json_warmup_dataset(4, seed=9)
    for r in rows:
        content = r["completion"][0]["content"]
        assert content.startswith(JSON_PREFILL) and json.loads(content)
        assert r["prompt"][-1]["role"] == "user"
    assert "chat_template_kwargs" in json_warmup_dataset(1, chat_template_kwargs={"enable_thinking": False})[0]


def test_the_task_profile_keeps_the_sizes_and_sets_the_task():
    for name in ("cpu-smoke", "cpu-demo", "colab-t4"):
        base = get_profile(name, use_vllm=False)
        task = json_task_profile(base)
        assert (task.num_generations, task.max_steps, task.seed) == (base.num_generations, base.max_steps, base.seed)
        assert task.prefill == JSON_PREFILL and task.task == "json"
        assert task.max_completion_length >= 40
    assert json_task_profile(get_profile("colab-t4")).task_level == "orders-dated"
    assert json_task_profile(get_profile("cpu-demo"), task_level="orders-dated").task_level == "orders-dated"


# --------------------------------------------------------------------------- a learner's own rows


SCHEMA = make_schema(["name", "quantity"])


def test_the_shipped_example_files_load_cleanly():
    for name in ("json_orders_example.jsonl", "json_orders_example.csv"):
        rows, problems = load_json_rows(data_file(name), make_schema(["name", "item", "quantity", "shipping"]))
        assert problems == [] and len(rows) >= 8
        assert all(json.loads(r["answer"]) for r in rows)


def test_the_broken_example_names_every_problem():
    with pytest.raises(JsonDataError) as err:
        load_json_rows(data_file("json_orders_broken.jsonl"), make_schema(["name", "item", "quantity", "shipping"]))
    message = str(err.value)
    for piece in ("row 1", "'expected'", "not of type 'integer'", "is empty", "same text as row 0", "not JSON"):
        assert piece in message, piece


def test_bad_rows_are_dropped_and_counted_when_not_strict():
    records = [{"text": "Ava ordered 2 pens.", "expected": {"name": "Ava", "quantity": 2}},
               {"text": "Ben ordered 3.", "expected": {"name": "Ben", "quantity": "3"}},
               {"text": "Cy ordered 1.", "expected": {"name": "Cy", "quantity": 1, "colour": "red"}},
               {"text": "No expected"}]
    rows, problems = load_json_rows(records, SCHEMA, strict=False)
    assert [r["question"] for r in rows] == ["Ava ordered 2 pens."]
    assert len(problems) == 3
    assert "row 2" in problems[1] and "colour" in problems[1]
    assert "row 3" in problems[2] and "'expected'" in problems[2]


def test_an_invalid_schema_and_an_unknown_file_type_are_explained(tmp_path):
    with pytest.raises(JsonDataError, match="schema itself is invalid"):
        load_json_rows([], {"type": "objekt"})
    other = tmp_path / "rows.txt"
    other.write_text("x")
    with pytest.raises(JsonDataError, match=".csv or .jsonl"):
        load_json_rows(other, SCHEMA)
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"text": "a", "expected": {}}\n{oops\n')
    with pytest.raises(JsonDataError, match="line 2 is not JSON"):
        load_json_rows(bad, SCHEMA)

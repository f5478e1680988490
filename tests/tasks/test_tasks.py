"""helpers.tasks: the task interface, get_task, level_table; issue 17's acceptance test: a new task written in
this file alone runs through data prep, GRPO, the evaluation and the recipe unchanged (slow)."""

from __future__ import annotations

import json
import random
import sys
import types

import pytest
import yaml

from helpers.rewards import completion_texts
from helpers.tasks import BUILTIN, Task, get_task, level_table
from helpers.tasks.arithmetic import ArithmeticTask
from helpers.tasks.orders import OrdersTask

# --------------------------------------------------------------------------- a learner's task, from the interface alone
# What notebook 05 asks of a learner: count the letters of a made-up word. Levels, the prompt, the warm-up's
# reference, rewards with weights (module-level functions: `trl grpo` imports them by path) and the scoring.


def count_reward(completions, answer, **kwargs):
    """1.0 when the completion's first word is the right count."""
    return [float(t.split()[:1] == [a]) for t, a in zip(completion_texts(completions), answer)]


def brevity_reward(completions, **kwargs):
    """0.5 for a bare number and nothing else, 0.0 otherwise."""
    return [0.5 if t.strip().isdigit() else 0.0 for t in completion_texts(completions)]


class ToyTask(Task):
    name = "letter-count"
    system_prompt = "Count the letters of the word. Reply with the number only."
    prefill = ""
    levels = {"short": "words of 3 to 5 letters", "long": "words of 6 to 8 letters"}
    rewards = [(count_reward, 1.0), (brevity_reward, 0.5)]
    headline, format_metric = "correct", "bare"
    min_completion_tokens = 4

    def make_rows(self, level, n, seed):
        rng, low = random.Random(f"{level}:{seed}"), 3 if level == "short" else 6
        words = []
        while len(words) < n:
            word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(low, low + 2)))
            words += [word] if word not in words else []
        return [{"question": f"How many letters are in '{w}'?", "answer": str(len(w)), "level": level} for w in words]

    def reference(self, row):
        return row["answer"]

    def score(self, text, row):
        return {"correct": count_reward([text], [row["answer"]])[0], "bare": brevity_reward([text])[0] * 2}


TOY = "tests.tasks.test_tasks:ToyTask"


# --------------------------------------------------------------------------- get_task


def test_the_builtin_tasks_by_name():
    assert BUILTIN == {"arithmetic": "helpers.tasks.arithmetic:ArithmeticTask", "json": "helpers.tasks.orders:OrdersTask",
                       "tools": "helpers.tasks.tool_arithmetic:ToolArithmeticTask"}
    assert isinstance(get_task("arithmetic"), ArithmeticTask) and isinstance(get_task("json"), OrdersTask)
    assert get_task("helpers.tasks.orders:OrdersTask").name == "json"  # a builtin by its path, too


def test_a_learners_task_by_module_and_class():
    task = get_task(TOY)
    assert isinstance(task, ToyTask) and task.name == "letter-count"


def test_a_module_level_instance_is_used_as_it_is(monkeypatch):
    module = types.ModuleType("my_task_module")
    module.TASK = ToyTask()
    monkeypatch.setitem(sys.modules, "my_task_module", module)
    assert get_task("my_task_module:TASK") is module.TASK


@pytest.mark.parametrize("key, error, message", [
    ("poetry", ValueError, r"Unknown task 'poetry': use one of \['arithmetic', 'json', 'tools'\], or 'module:TaskClass'"),
    ("no_such_module_xyz:Task", ValueError, r"could not be imported \(No module named 'no_such_module_xyz'\)"
                                            r".*beside the notebook, or on PYTHONPATH"),
    ("tests.tasks.test_tasks:NoSuchTask", ValueError, "could not be imported .*NoSuchTask"),
    ("tests.tasks.test_tasks:count_reward", TypeError, "is a function, not a helpers.tasks.Task: subclass Task"),
])
def test_what_is_not_a_task_is_refused_with_the_fix(key, error, message):
    with pytest.raises(error, match=message):
        get_task(key)


# --------------------------------------------------------------------------- the interface and its defaults


class Bare(Task):
    name = "bare"
    levels = {"one": "the only level", "two": "another"}


def test_the_required_methods_say_what_to_define():
    for call, method in ((lambda t: t.make_rows("one", 1, 0), "make_rows"), (lambda t: t.reference({}), "reference"),
                         (lambda t: t.score("x", {}), "score")):
        with pytest.raises(NotImplementedError, match=f"Task 'bare' must define {method}"):
            call(Bare())


def test_the_defaults():
    bare = Bare()
    assert bare.system_prompt_for({"question": "q"}) == "" and bare.prefill == ""
    assert (bare.headline, bare.format_metric, bare.min_completion_tokens) == ("correct", "format", 16)
    assert bare.settings(object()) == {"task_level": "one", "warmup_level": "one"}
    toy = ToyTask()
    assert toy.rewards_for("long") == toy.rewards and toy.rewards_for("long") is not toy.rewards  # a copy
    assert toy.system_prompt_for({}) == toy.system_prompt


@pytest.mark.parametrize("answer, expected", [(" 42 ", "42"), (7, "7"), ("blue", "blue"), (0, "0")])
def test_the_default_clean_answer_strips_the_text(answer, expected):
    assert Bare().clean_answer({"answer": answer}) == expected


@pytest.mark.parametrize("row", [{"answer": None}, {"answer": "  "}, {}])
def test_the_default_clean_answer_refuses_a_missing_answer(row):
    with pytest.raises(ValueError, match="the answer is missing: write it, or delete the row"):
        Bare().clean_answer(row)


def test_level_table_shows_each_level_with_an_example():
    table = level_table(ToyTask())
    assert [t["level"] for t in table] == ["short", "long"]
    assert table[0] == {"level": "short", "description": "words of 3 to 5 letters",
                        "example": ToyTask().make_rows("short", 1, 0)[0]["question"]}


def test_the_toy_task_keeps_its_promises():
    """The toy is a task like the course's: distinct seeded rows, a reference that scores perfectly."""
    toy = ToyTask()
    rows = toy.make_rows("long", 80, 3)
    assert rows == toy.make_rows("long", 80, 3) and len({r["question"] for r in rows}) == 80
    assert all(6 <= int(r["answer"]) <= 8 for r in rows)
    for r in rows[:5]:
        assert toy.score(toy.reference(r), r) == {"correct": 1.0, "bare": 1.0}
    assert toy.score("5 letters", {"answer": "5"}) == {"correct": 1.0, "bare": 0.0}
    from helpers.data import validate

    assert validate(rows, toy) == []


# --------------------------------------------------------------------------- acceptance: the whole pipeline


@pytest.mark.slow
def test_a_new_task_in_this_file_runs_data_prep_grpo_evaluation_and_the_recipe(tmp_path):
    """Issue 17: select the toy task by profile and call only the public pipeline; nothing is passed by hand."""
    from helpers.data import ensure_prepared, read_card
    from helpers.evaluation import eval_settings, evaluate_adapters
    from helpers.models import load_model
    from helpers.profiles import get_profile
    from helpers.recipe import write_recipe
    from helpers.runs import read_json
    from helpers.training import train_grpo

    profile = get_profile("cpu-smoke", task=TOY, time_budget_minutes=None)  # two steps, however busy the machine
    assert (profile.task_level, profile.warmup_level) == ("short", "short")
    run = tmp_path / "run"

    ds = ensure_prepared(profile, run, verbose=False)
    assert (ds["train"].num_rows, ds["eval"].num_rows) == (profile.train_rows, profile.eval_rows)
    row = ds["train"][0]
    assert row["question"].startswith("How many letters") and row["level"] == "short"
    assert row["prompt"] == [{"role": "system", "content": ToyTask.system_prompt}, {"role": "user", "content":
                                                                                    row["question"]}]
    assert read_card(run / "dataset")["source"] == {"task": TOY, "level": "short"}

    out = train_grpo(profile, run)
    assert out["summary"]["global_step"] == 2 and out["summary"]["warmup"]["examples"] == profile.warmup_examples
    assert (run / "adapter" / "adapter_config.json").is_file()
    config = read_json(run / "train_config.json")
    assert [(r["name"], r["weight"]) for r in config["rewards"]] == [("count_reward", 1.0), ("brevity_reward", 0.5)]
    assert config["prefill"] == "" and config["profile"]["task"] == TOY
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and "rewards/count_reward/mean" in metrics[-1]

    model, tok = load_model(profile, adapter=run / "adapter")
    rows = ds["eval"].select(range(4))
    result = evaluate_adapters(model, tok, rows, get_task(profile.task), eval_settings(profile),
                               {"base": None, "after GRPO": "default"}, rewards=[f for f, _ in ToyTask.rewards],
                               progress=None)
    for side in ("base", "after GRPO"):
        summary = result["sides"][side]["summary"]
        assert {"correct", "bare", "mean_length"} <= set(summary) and summary["n_prompts"] == 4
        assert set(summary["rewards"]) == {"count_reward", "brevity_reward"}
        assert summary["rewards"]["count_reward"] == summary["correct"]  # the metric is the reward's rule

    recipe = write_recipe(profile, run)
    grpo = yaml.safe_load(recipe.grpo.read_text())
    assert grpo["reward_funcs"] == ["tests.tasks.test_tasks.count_reward", "tests.tasks.test_tasks.brevity_reward"]
    assert grpo["reward_weights"] == [1.0, 0.5] and grpo["max_steps"] == 2
    warm = [json.loads(line) for line in (recipe.folder / "warmup.jsonl").read_text().splitlines()]
    assert len(warm) == profile.warmup_examples and all(r["completion"][0]["content"].isdigit() for r in warm)

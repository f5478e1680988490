"""helpers.tasks.arithmetic: the generated levels, GSM8K (its real-data level), the reward presets, ArithmeticTask."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

import pytest

from helpers.data import validate
from helpers.profiles import PROFILES, profile_delta
from helpers.reward_lab import score_table
from helpers.tasks import get_task, level_table
from helpers.tasks.arithmetic import (
    GSM8K_DIR_ENV,
    LEVELS,
    PRESETS,
    ArithmeticTask,
    Level,
    extract_hash_answer,
    generate_arithmetic,
    load_gsm8k,
    solution_text,
)
from helpers.tasks.orders import CPU_GROUP, CPU_LEARNING_RATE, CPU_MAX_STEPS
from helpers.tasks.reasoning import (
    PREFILL,
    SYSTEM_PROMPT,
    normalize_number,
    soft_format_reward,
    strict_format_reward,
    xmlcount_reward,
)

ROOT = Path(__file__).resolve().parents[2]
#: The real GSM8K files of the project's shared folder: not in a learner's checkout, so every test that reads
#: them has a twin on the authored sample (data/gsm8k_sample) that always runs.
REAL_GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"
SAMPLE = ROOT / "data" / "gsm8k_sample"
needs_real_gsm8k = pytest.mark.skipif(not (REAL_GSM8K / "train.jsonl").is_file(),
                                      reason=f"the real GSM8K files are not at {REAL_GSM8K} (only the project's "
                                             "shared folder has them); data/gsm8k_sample covers the same checks")
TASK = ArithmeticTask()
#: What TRL hands a reward when the template prefilled "<reasoning>\n": the text after it.
GENERATED = "15 + 27 = 42\n</reasoning>\n<answer>\n42\n</answer>"


def _replay(solution: str) -> int:
    """Check each step 'x op y = z' and return the last result."""
    value = None
    for line in solution.splitlines():
        m = re.fullmatch(r"(\d+) ([-+*]) (\d+) = (-?\d+)", line)
        assert m, f"bad step {line!r}"
        x, op, y, z = int(m[1]), m[2], int(m[3]), int(m[4])
        if value is not None:
            assert x == value, "steps must chain"
        assert z == {"+": x + y, "-": x - y, "*": x * y}[op]
        value = z
    assert value is not None
    return value


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open()]


# --------------------------------------------------------------------------- generated levels


def test_same_seed_same_rows_other_seed_other_rows():
    a = generate_arithmetic(20, "add2", seed=7)
    assert a == generate_arithmetic(20, "add2", seed=7)
    assert a != generate_arithmetic(20, "add2", seed=8)
    assert a != generate_arithmetic(20, "add3", seed=7)  # each level draws its own problems


def test_more_rows_extend_fewer_rows():
    assert generate_arithmetic(30, "mixed", seed=1)[:10] == generate_arithmetic(10, "mixed", seed=1)


@pytest.mark.parametrize("name", [n for n in LEVELS if n != "gsm8k"])
def test_every_level_gives_correct_distinct_nonnegative_problems(name):
    level = LEVELS[name]
    rows = generate_arithmetic(60, name, seed=3)
    assert len({r["question"] for r in rows}) == 60
    for r in rows:
        assert set(r) == {"question", "answer", "solution", "level"} and r["level"] == name
        assert int(r["answer"]) == _replay(r["solution"]) >= 0
        for line in r["solution"].splitlines():  # no negative intermediate step
            assert not line.split(" = ")[1].startswith("-")
        numbers = [int(x) for x in re.findall(r"\d+", r["question"])]
        assert numbers and all(level.low <= n <= level.high for n in numbers)
        assert "{" not in r["question"]
        if level.templates[0][1] is None:  # a plain expression: Python agrees
            expr = re.fullmatch(r"What is (.*)\?", r["question"])[1]
            assert eval(expr) == int(r["answer"])  # left to right == precedence for these levels
    assert validate(rows, TASK) == []


def test_word_problems_use_their_formula():
    rows = generate_arithmetic(40, "word", seed=0)
    steps = {len(r["solution"].splitlines()) for r in rows}
    assert steps == {1, 2}, "the 'word' level mixes one- and two-step problems"
    for text, formula in LEVELS["word"].templates:
        assert formula is not None and len(formula.split()) in (3, 5) and "{expr}" not in text


def test_a_level_is_one_line(monkeypatch):
    monkeypatch.setitem(LEVELS, "add2-wide", Level("two-number sums, 10..99", 10, 99))
    rows = generate_arithmetic(5, "add2-wide", seed=0)
    assert all(r["level"] == "add2-wide" for r in rows)
    monkeypatch.setitem(LEVELS, "custom", Level("custom words", 1, 5, templates=(("{a} and {b} make?", "a + b"),)))
    row = generate_arithmetic(1, "custom", seed=0)[0]
    assert row["level"] == "custom" and int(row["answer"]) == sum(map(int, re.findall(r"\d", row["question"])))
    assert TASK.make_rows("custom", 1, 0) == [row]  # the task sees the new level too


def test_too_many_rows_for_a_level_says_so():
    assert len(generate_arithmetic(100, "add1", seed=0)) == 100  # 10 x 10 sums
    with pytest.raises(ValueError, match=r"'add1'.*only 100 distinct.*fewer than the 101 asked for"):
        generate_arithmetic(101, "add1", seed=0)


def test_unknown_and_loaded_levels_are_not_generated():
    with pytest.raises(ValueError, match=r"Unknown generated level 'add9'. Levels: add1, add2-small, .*gsm8k"):
        generate_arithmetic(1, "add9")
    with pytest.raises(ValueError, match="'gsm8k' is loaded, not generated"):
        generate_arithmetic(1, "gsm8k")


def test_level_table_covers_every_level():
    table = level_table(TASK)
    assert [t["level"] for t in table] == list(LEVELS)
    for t in table:
        assert t["description"] == LEVELS[t["level"]].description
        want = "" if t["level"] == "gsm8k" else generate_arithmetic(1, t["level"], seed=0)[0]["question"]
        assert t["example"] == want  # the loaded level shows no example (no download for a table)


# --------------------------------------------------------------------------- GSM8K answers


@pytest.mark.parametrize("text, expected", [
    ("Half of 48 is 24.\n#### 72", "72"),
    ("#### 1,234", "1234"),
    ("#### $18", "18"),
    ("#### -5", "-5"),
    ("a #### 3 then b\n#### 4", "4"),  # the last marker wins
    ("####    10.50  ", "10.5"),
    ("#### twelve", "twelve"),  # returned as text so validate() can name it
    ("no marker here 5", None),
    ("", None),
    (None, None),
    (72, None),
])
def test_extract_hash_answer(text, expected):
    assert extract_hash_answer(text) == expected


def test_solution_text():
    assert solution_text("a = <<1+2=3>>3\nb\n#### 3") == "a = 3\nb"
    assert solution_text("no marker <<2*3=6>>6") == "no marker 6"
    assert solution_text("  #### 5") == ""


def _calc(expr: str) -> Fraction:
    return eval(re.sub(r"(\d+(?:\.\d+)?)", r"Fraction('\1')", expr), {"Fraction": Fraction})


@pytest.mark.parametrize("split", ["train", "test"])
def test_the_authored_gsm8k_sample_is_gsm8k_shaped_and_its_arithmetic_is_right(split):
    rows = _jsonl(SAMPLE / f"{split}.jsonl")
    assert len(rows) >= 10 and validate(rows, TASK) == []
    for r in rows:
        assert set(r) == {"question", "answer"}
        assert normalize_number(extract_hash_answer(r["answer"])) is not None
        assert solution_text(r["answer"]) and "<<" not in solution_text(r["answer"])
        notes = re.findall(r"<<([^=>]+)=([^>]+)>>", r["answer"])
        assert notes, r["question"]
        for expr, value in notes:
            assert _calc(expr) == Fraction(value), (expr, value)


@needs_real_gsm8k
@pytest.mark.parametrize("split, n", [("train", 7473), ("test", 1319)])
def test_every_real_gsm8k_answer_parses_to_a_number(split, n):
    rows = _jsonl(REAL_GSM8K / f"{split}.jsonl")
    assert len(rows) == n
    bad = [i for i, r in enumerate(rows) if normalize_number(extract_hash_answer(r["answer"])) is None]
    assert bad == []
    assert validate(rows, TASK) == []  # strict: no problem at all, duplicates included
    assert all(solution_text(r["answer"]) and "<<" not in solution_text(r["answer"]) for r in rows)


# --------------------------------------------------------------------------- loading GSM8K


def test_load_gsm8k_from_a_folder_or_the_env(monkeypatch):
    ds = load_gsm8k(SAMPLE)
    assert (ds["train"].num_rows, ds["test"].num_rows) == (30, 10)
    assert ds["train"].column_names == ["question", "answer"]
    monkeypatch.setenv(GSM8K_DIR_ENV, str(SAMPLE))
    assert load_gsm8k()["test"]["question"][0] == _jsonl(SAMPLE / "test.jsonl")[0]["question"]


def test_load_gsm8k_errors_say_what_to_do(monkeypatch, tmp_path):
    import datasets

    (tmp_path / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    with pytest.raises(FileNotFoundError, match="No GSM8K file at .*test.jsonl.*train.jsonl and test.jsonl"):
        load_gsm8k(tmp_path)

    calls = []

    def offline(*args, **kwargs):
        calls.append(args)
        raise OSError("Couldn't reach the Hub")

    monkeypatch.delenv(GSM8K_DIR_ENV, raising=False)
    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ConnectionError) as err:
        load_gsm8k()
    assert calls == [("openai/gsm8k", "main")]
    msg = str(err.value)
    assert "OSError: Couldn't reach the Hub" in msg and GSM8K_DIR_ENV in msg and "COURSE_PROFILE=cpu-demo" in msg


def test_the_gsm8k_level_gives_train_rows_and_the_test_split_for_eval(monkeypatch):
    monkeypatch.setenv(GSM8K_DIR_ENV, str(SAMPLE))
    made = TASK.make_rows("gsm8k", 5, 0)
    assert set(made) == {"train", "eval"} and (len(made["train"]), len(made["eval"])) == (30, 10)
    first, raw = made["eval"][0], _jsonl(SAMPLE / "test.jsonl")[0]
    assert first == {"question": raw["question"], "answer": extract_hash_answer(raw["answer"]), "level": "gsm8k",
                     "solution": solution_text(raw["answer"])}
    assert all(normalize_number(r["answer"]) == r["answer"] for r in made["train"] + made["eval"])
    assert TASK.reference(first).endswith(f"<answer>\n{first['answer']}\n</answer>")


@needs_real_gsm8k
def test_the_gsm8k_level_reads_the_real_files(monkeypatch):
    monkeypatch.setenv(GSM8K_DIR_ENV, str(REAL_GSM8K))
    made = TASK.make_rows("gsm8k", 0, 0)
    assert (len(made["train"]), len(made["eval"])) == (7473, 1319)
    assert all(normalize_number(r["answer"]) == r["answer"] and r["solution"] for r in made["train"] + made["eval"])


# --------------------------------------------------------------------------- reward presets


#: The most a completion can earn under each preset: every reward at its best, weighted.
BEST = {"arithmetic": 2.0 * 1.0 + 1.0 * 0.5 + 1.0 * 0.5 + 1.0 * 0.25,
        "gsm8k": 2.0 * 1.0 + 0.5 * 1.0 + 1.0 * 0.5 + 1.0 * 0.5 + 1.0 * 0.5,
        "format-only": 1.0 + 0.5 + 0.5}


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_is_named_prefilled_and_earns_its_best_on_a_perfect_completion(name):
    preset = PRESETS[name]
    names = [f.__name__ for f, _ in preset]
    assert len(set(names)) == len(names) and all(w > 0 for _, w in preset)
    for f, _ in preset:  # format rewards are prefilled: they see the tag the template wrote
        assert not f.__name__.startswith(("strict_", "soft_", "xmlcount_")), f.__name__
    assert score_table([GENERATED], preset, answer=["42"])["total"][0] == pytest.approx(BEST[name])
    assert score_table([PREFILL + GENERATED], preset, answer=["42"])["total"][0] < BEST[name]  # the tag twice


def test_preset_weights():
    assert [(f.__name__, w) for f, w in PRESETS["arithmetic"]] == [
        ("correctness_reward", 1.0), ("partial_correctness_reward", 0.5),
        ("prefilled_strict_format_reward", 0.5), ("prefilled_xmlcount_reward", 0.25)]
    assert "correctness_reward" not in [f.__name__ for f, _ in PRESETS["format-only"]]
    assert [f.reward for f, _ in PRESETS["format-only"]] == [strict_format_reward, soft_format_reward, xmlcount_reward]


# --------------------------------------------------------------------------- the task


def test_the_task_is_the_builtin_arithmetic_task():
    task = get_task("arithmetic")
    assert isinstance(task, ArithmeticTask) and task.name == "arithmetic"
    assert (task.system_prompt, task.prefill, task.levels) == (SYSTEM_PROMPT, PREFILL, LEVELS)
    assert (task.headline, task.format_metric, task.min_completion_tokens) == ("accuracy", "format", 20)
    assert task.rewards == PRESETS["arithmetic"] and task.system_prompt_for({"question": "x"}) == SYSTEM_PROMPT


def test_make_rows_generates_a_level():
    assert TASK.make_rows("add3", 7, 5) == generate_arithmetic(7, "add3", 5)


def test_rewards_for_a_level():
    assert TASK.rewards_for("add2") == PRESETS["arithmetic"] and TASK.rewards_for("gsm8k") == PRESETS["gsm8k"]
    rewards = TASK.rewards_for("add2")
    rewards.append(("x", 1.0))
    assert TASK.rewards_for("add2") == PRESETS["arithmetic"]  # a copy: the preset is not changed


def test_the_reference_is_a_perfect_completion():
    row = generate_arithmetic(1, "add3", seed=2)[0]
    text = TASK.reference(row)
    assert text.startswith(PREFILL) and row["solution"] in text
    assert TASK.score(text, row) == {"accuracy": 1.0, "correct": 1.0, "format": 1.0}
    assert score_table([text[len(PREFILL):]], TASK.rewards, answer=[row["answer"]])["total"][0] == BEST["arithmetic"]
    # a row without worked steps (a learner's file): the answer stands as the reasoning
    assert TASK.reference({"question": "q", "answer": "7"}) == "<reasoning>\n7\n</reasoning>\n<answer>\n7\n</answer>"


def test_score_is_the_rewards_rule():
    row = {"question": "What is 15 + 27?", "answer": "42"}
    assert TASK.score(PREFILL + GENERATED, row) == {"accuracy": 1.0, "correct": 1.0, "format": 1.0}
    assert TASK.score("<answer>$42.00</answer>", row) == {"accuracy": 0.0, "correct": 1.0, "format": 0.0}
    assert TASK.score(PREFILL + GENERATED.replace("42", "41"), row)["correct"] == 0.0


@pytest.mark.parametrize("value, expected", [
    (" $1,200 ", "1200"), (1200, "1200"), (3.50, "3.5"), ("so 2 + 2 = 4\n#### 4", "4"), ("#### $1,080", "1080"),
    ("-7", "-7"), ("12%", "12"),
])
def test_clean_answer_normalises_a_number(value, expected):
    assert TASK.clean_answer({"answer": value}) == expected


@pytest.mark.parametrize("value, message", [
    ("blue", r"'blue' is not a number: write the answer as digits"),
    ("#### twelve", r"'#### twelve' is not a number.*'#### 42'"),
    ("1 2", "is not a number"),
    ("  ", "the answer is missing: write the final answer"),
    (None, "the answer is missing"),
    ("", "the answer is missing"),
    ("so the answer is\n#### ", "is not a number"),  # a marker with nothing after it
])
def test_clean_answer_refuses_what_is_not_a_number_and_says_how_to_write_it(value, message):
    with pytest.raises(ValueError, match=message):
        TASK.clean_answer({"answer": value})


def test_settings_when_a_profile_switches_to_arithmetic():
    assert TASK.settings(PROFILES["cpu-smoke"]) == {"task_level": "add2", "warmup_level": "add1",
                                                    "max_completion_length": 32}
    assert TASK.settings(PROFILES["colab-t4"]) == {"task_level": "gsm8k", "warmup_level": "add1",
                                                   "max_completion_length": 256}
    # a CPU run longer than the JSON task's cap, at a rate other than its own
    longer = PROFILES["cpu-demo"].with_overrides(max_steps=CPU_MAX_STEPS + 30, learning_rate=3e-4)
    json_profile = longer.with_overrides(task="json", **get_task("json").settings(longer))
    back = json_profile.with_overrides(task="arithmetic", **TASK.settings(json_profile))
    # switching back restores the profile's own arithmetic settings; not the JSON task's CPU recipe, which
    # arithmetic does not set (get_profile always starts from the named profile, so it never meets this case)
    assert profile_delta(back, longer) == {"max_steps": (CPU_MAX_STEPS, longer.max_steps),
                                           "learning_rate": (CPU_LEARNING_RATE, longer.learning_rate),
                                           "num_generations": (CPU_GROUP, longer.num_generations)}

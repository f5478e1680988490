"""helpers.tasks: the synthetic arithmetic task, GSM8K loading, a profile's rows, the course's data files."""

from __future__ import annotations

import io
import json
import re
import urllib.request
from pathlib import Path

import pytest

from helpers import tasks
from helpers.config import REPO_REF, get_profile, project_root
from helpers.data import validate
from helpers.tasks import (
    GSM8K_DIR_ENV,
    LEVELS,
    Level,
    Template,
    data_file,
    generate_arithmetic,
    get_level,
    level_table,
    load_gsm8k,
    task_rows,
)

ROOT = project_root() or Path(__file__).resolve().parents[1]
REAL_GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"
SAMPLE = ROOT / "data" / "gsm8k_sample"


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


# --------------------------------------------------------------------------- the arithmetic task


def test_same_seed_same_rows_other_seed_other_rows():
    a = generate_arithmetic(20, "add2", seed=7)
    assert a == generate_arithmetic(20, "add2", seed=7)
    assert a != generate_arithmetic(20, "add2", seed=8)


def test_more_rows_extend_fewer_rows():
    assert generate_arithmetic(30, "mixed", seed=1)[:10] == generate_arithmetic(10, "mixed", seed=1)


@pytest.mark.parametrize("name", list(LEVELS))
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
        if level.templates[0].formula is None:  # a plain expression: Python agrees
            expr = re.fullmatch(r"What is (.*)\?", r["question"])[1]
            assert eval(expr) == int(r["answer"])  # left to right == precedence for these levels
    assert validate(rows) == []


def test_word_problems_use_their_formula():
    rows = generate_arithmetic(40, "word", seed=0)
    steps = {len(r["solution"].splitlines()) for r in rows}
    assert steps == {1, 2}, "the 'word' level mixes one- and two-step problems"
    assert Template("{a} and {b} and {c}?", "a + b - c").n_operands == 3
    assert Template("What is {expr}?").n_operands is None


def test_a_level_is_one_line(monkeypatch):
    monkeypatch.setitem(LEVELS, "add2-wide", Level("two-number sums, 10..99", 10, 99))
    rows = generate_arithmetic(5, "add2-wide", seed=0)
    assert all(r["level"] == "add2-wide" for r in rows)
    custom = Level("custom words", 1, 5, templates=(Template("{a} and {b} make?", "a + b"),))
    row = generate_arithmetic(1, custom, seed=0)[0]
    assert row["level"] == "custom" and int(row["answer"]) == sum(map(int, re.findall(r"\d", row["question"])))


def test_too_many_rows_for_a_level_says_so():
    assert len(generate_arithmetic(100, "add1", seed=0)) == 100  # 10 x 10 sums
    with pytest.raises(ValueError, match=r"'add1'.*only 100 distinct.*fewer rows"):
        generate_arithmetic(101, "add1", seed=0)


def test_unknown_level_and_operator():
    with pytest.raises(ValueError, match="Unknown arithmetic level 'add9'. Valid levels: add1, add2-small"):
        get_level("add9")
    assert get_level(LEVELS["add3"]) is LEVELS["add3"] and get_level("add3").n_operands == 3
    with pytest.raises(ValueError, match="Unknown operator '/'"):
        tasks._apply(1, "/", 2)


def test_level_table_covers_every_level():
    table = level_table()
    assert [t["level"] for t in table] == list(LEVELS)
    assert all(t["example"] == generate_arithmetic(1, t["level"], seed=0)[0]["question"] for t in table)


# --------------------------------------------------------------------------- GSM8K


def test_load_gsm8k_from_a_folder_or_the_env(monkeypatch):
    ds = load_gsm8k(SAMPLE)
    assert (ds["train"].num_rows, ds["test"].num_rows) == (30, 10)
    assert ds["train"].column_names == ["question", "answer"]
    monkeypatch.setenv(GSM8K_DIR_ENV, str(SAMPLE))
    assert load_gsm8k()["test"]["question"][0] == json.loads((SAMPLE / "test.jsonl").open().readline())["question"]


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


@pytest.mark.skipif(not REAL_GSM8K.is_dir(), reason="the real GSM8K files are not on this machine")
def test_load_gsm8k_reads_the_real_files():
    ds = load_gsm8k(REAL_GSM8K)
    assert (ds["train"].num_rows, ds["test"].num_rows) == (7473, 1319)
    assert validate(ds["test"]) == []


# --------------------------------------------------------------------------- a profile's rows


def test_task_rows_for_the_arithmetic_task():
    smoke = get_profile("cpu-smoke")
    rows, eval_source, source = task_rows(smoke)
    assert rows == generate_arithmetic(smoke.train_rows + smoke.eval_rows, smoke.task_level, seed=smoke.seed)
    assert eval_source is None
    assert source == {"task": "arithmetic", "level": smoke.task_level, "seed": smoke.seed}


def test_task_rows_for_gsm8k_evaluate_on_the_test_split(monkeypatch):
    monkeypatch.setenv(GSM8K_DIR_ENV, str(SAMPLE))
    rows, eval_source, source = task_rows(get_profile("colab-t4"))
    assert (rows.num_rows, eval_source.num_rows) == (30, 10)
    assert source == {"task": "gsm8k", "eval_from": "test split"}


def test_task_rows_unknown_task():
    with pytest.raises(ValueError, match="Unknown task 'poetry' in profile 'cpu-smoke': use 'arithmetic' or 'gsm8k'"):
        task_rows(get_profile("cpu-smoke", task="poetry"))


# --------------------------------------------------------------------------- data files


def test_data_file_finds_the_checkout_copy():
    assert data_file("custom_example.csv") == ROOT / "data" / "custom_example.csv"
    assert data_file("gsm8k_sample/test.jsonl").is_file()


def test_data_file_on_a_bare_install_fetches_once_or_says_what_to_do(tmp_path, monkeypatch):
    import helpers.config

    monkeypatch.setattr(helpers.config, "project_root", lambda: None)
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    urls = []

    def fake_urlopen(url, timeout=None):
        urls.append(url)
        return io.BytesIO(b"question,answer\n")

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    path = data_file("custom_example.csv")
    assert path == tmp_path / "data" / "custom_example.csv" and path.read_text() == "question,answer\n"
    assert urls == [f"https://raw.githubusercontent.com/grpo-course/grpo-course/{REPO_REF}/data/custom_example.csv"]
    assert data_file("custom_example.csv") == path and len(urls) == 1  # cached
    assert not list(path.parent.glob("*.part"))

    def offline(url, timeout=None):
        raise OSError("no network")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(FileNotFoundError, match="could not be fetched.*no network.*pip install -e"):
        data_file("custom_broken.csv")
    assert not (tmp_path / "data" / "custom_broken.csv").exists()

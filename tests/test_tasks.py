"""helpers.tasks: the synthetic arithmetic task."""

from __future__ import annotations

import re

import pytest

from helpers import tasks
from helpers.data import validate
from helpers.tasks import LEVELS, Level, Template, generate_arithmetic, get_level, level_table


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
        assert set(r) == {"question", "answer", "solution", "level"}
        assert r["level"] == name
        assert int(r["answer"]) == _replay(r["solution"])
        assert int(r["answer"]) >= 0
        for line in r["solution"].splitlines():  # no negative intermediate step
            assert not line.split(" = ")[1].startswith("-")
        numbers = [int(x) for x in re.findall(r"\d+", r["question"])]
        assert numbers and all(level.low <= n <= level.high for n in numbers)
        if level.templates[0].formula is None:  # plain expression: Python agrees
            expr = re.fullmatch(r"What is (.*)\?", r["question"])[1]
            assert eval(expr) == int(r["answer"])  # left-to-right == precedence for these levels
    assert validate(rows).ok


def test_word_problems_use_their_formula():
    rows = generate_arithmetic(40, "word", seed=0)
    two_step = [r for r in rows if len(r["solution"].splitlines()) == 2]
    assert two_step, "the 'word' level mixes in two-step problems"
    assert all("{" not in r["question"] for r in rows)


def test_a_level_is_one_line(monkeypatch):
    monkeypatch.setitem(LEVELS, "add2-wide", Level("two-number sums, 10..99", 10, 99))
    rows = generate_arithmetic(5, "add2-wide", seed=0)
    assert all(r["level"] == "add2-wide" for r in rows)
    custom = Level("custom words", 1, 5, templates=(Template("{a} and {b} make?", "a + b"),))
    assert generate_arithmetic(1, custom, seed=0)[0]["level"] == "custom"


def test_too_many_rows_for_a_level_says_so():
    assert len(generate_arithmetic(100, "add1", seed=0)) == 100  # 10 x 10 sums
    with pytest.raises(ValueError, match=r"'add1'.*only 100 distinct.*fewer rows"):
        generate_arithmetic(101, "add1", seed=0)


def test_unknown_level_lists_the_valid_ones():
    with pytest.raises(ValueError, match="add2-small"):
        get_level("add9")
    assert get_level(LEVELS["add3"]) is LEVELS["add3"]


def test_unknown_operator_is_an_error():
    with pytest.raises(ValueError, match="operator"):
        tasks._apply(1, "/", 2)


def test_level_table_covers_every_level():
    table = level_table()
    assert [t["level"] for t in table] == list(LEVELS)
    assert all(t["example"].endswith("?") for t in table)

"""helpers.calculator: the tool a model calls during training. Its input is whatever the model wrote, so it is
tested as hostile: it must answer every call with a string, never raise, never run the text, and bound its work."""

from __future__ import annotations

import builtins
import time

import pytest
from transformers.utils import get_json_schema

from helpers.calculator import MAX_ABS, MAX_CHARS, CalculatorError, calculate, calculator, evaluate, format_number


@pytest.mark.parametrize("expression, value", [
    ("347 * 58", "20126"), ("4821 + 3907", "8728"), ("10 - 25", "-15"), ("(1 + 2) * 3", "9"), ("7 / 2", "3.5"),
    ("2 / 3", "0.666667"), ("-(-4)", "4"), ("+5", "5"), ("0.1 + 0.2", "0.3"), ("  12  ", "12"), ("8 / 4", "2"),
    ("1.50 * 2", "3"), (12, "12"), (2.5, "2.5"), ("((((((((((1))))))))))", "1"),
])
def test_arithmetic(expression, value):
    assert calculate(expression) == value


HOSTILE = {
    "an import": "__import__('os').system('touch /tmp/pwned')",
    "a builtin call": "abs(-3)",
    "an attribute": "(1).__class__",
    "a name": "x",
    "a lambda": "(lambda: 1)()",
    "a string literal": "'a' * 3",
    "a comprehension": "[1 for _ in range(10**9)]",
    "a huge power": "9 ** 9 ** 9",
    "a power": "2 ** 100000000",
    "floor division": "7 // 2",
    "a modulo": "7 % 2",
    "a comparison": "1 < 2",
    "a boolean operator": "1 and 2",
    "a scientific literal": "1e400",
    "a hex literal": "0x10",
    "an underscore literal": "1_000_000",
    "commas": "1,000 + 2",
    "an x for times": "347 x 58",
    "a multiplication sign": "347 × 58",
    "deep nesting": "(" * 150 + "1" + ")" * 150,
    "nesting past the parser": "(" * 5000 + "1" + ")" * 5000,
    "a chain of signs": "-" * 180 + "1",
    "many terms": "+".join(["1"] * 90),
    "a huge number": "9" * 150,
    "a huge product": "999999999 * 999999999",
    "growing products": "99999 * 99999 * 99999 * 99999",
    "empty": "",
    "blank": "   ",
    "10k characters": "1+" * 5000 + "1",
    "a NUL byte": "1\x00+1",
    "a newline statement": "1\nimport os",
    "a semicolon": "1; 2",
    "unbalanced": "(1 + 2",
    "only an operator": "*",
    "division by zero": "1 / 0",
    "division by a zero expression": "1 / (2 - 2)",
    "None": None,
    "a bool": True,
    "a list": [1, 2],
    "a dict": {"expression": "1 + 1"},
    "bytes": b"1 + 1",
    "infinity": float("inf"),
    "not a number": float("nan"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_input_gets_an_error_string_and_runs_nothing(name, monkeypatch, tmp_path):
    called = []
    real_import, real_eval, real_exec = builtins.__import__, builtins.eval, builtins.exec
    monkeypatch.setattr(builtins, "eval", lambda *a, **k: called.append("eval") or real_eval(*a, **k))
    monkeypatch.setattr(builtins, "exec", lambda *a, **k: called.append("exec") or real_exec(*a, **k))
    monkeypatch.setattr(builtins, "__import__",
                        lambda n, *a, **k: called.append(f"import {n}") or real_import(n, *a, **k))
    start = time.perf_counter()
    result = calculate(HOSTILE[name])
    assert time.perf_counter() - start < 0.5, "bounded work: every call returns at once"
    assert isinstance(result, str) and result.startswith("Error: "), result
    assert not [c for c in called if c in ("eval", "exec") or c == "import os"], called
    assert len(result) < 200  # the reply goes into the model's context: short
    assert not (tmp_path / "pwned").exists()


def test_the_errors_say_what_to_write_instead():
    assert "use * to multiply" in calculate("347 x 58")
    assert "without commas" in calculate("1,000 + 2")
    assert "** and // are not accepted" in calculate("2 ** 3")
    assert f"at most {MAX_CHARS}" in calculate("1+" * 5000 + "1")
    assert calculate("1 / 0") == "Error: division by zero."
    assert "empty" in calculate("")


def test_numbers_and_results_are_bounded():
    assert calculate(str(MAX_ABS)) == str(MAX_ABS)
    assert calculate(str(MAX_ABS + 1)).startswith("Error: a number is larger")
    assert calculate(f"{MAX_ABS} + 1").startswith("Error: a number is larger")  # a result too


def test_evaluate_raises_the_error_calculate_returns():
    with pytest.raises(CalculatorError, match="division by zero"):
        evaluate("1 / 0")
    assert evaluate("2 * (3 + 4)") == 14


def test_format_number():
    assert [format_number(v) for v in (14.0, 2 / 3, -5, 0.5, 1e-9)] == ["14", "0.666667", "-5", "0.5", "0"]


def test_the_tool_is_what_trl_reads_a_schema_from():
    """TRL passes the function to the chat template, which reads its name, type hints and docstring."""
    schema = get_json_schema(calculator)["function"]
    assert schema["name"] == "calculator" and schema["parameters"]["required"] == ["expression"]
    assert schema["parameters"]["properties"]["expression"]["type"] == "string"
    assert "+ - * /" in schema["parameters"]["properties"]["expression"]["description"]
    assert calculator(expression="12 * 34") == "408"


"""A calculator a model may call during training: safe by construction, every bad call answered with a message.

Serves notebook 07 (through the tool task, helpers.tasks.tool_arithmetic).

The model's call is text it wrote, so it is hostile input. :func:`calculate` never runs it: it parses it with
:mod:`ast` and walks the tree itself, accepting numbers, ``+ - * /``, a sign and parentheses, and nothing else (no
name, no call, no attribute, no power). The size of the text, of every number and of the work is bounded, and
anything refused comes back as a string starting with ``Error:`` that the model reads as the tool's reply, so a
bad call never raises inside the trainer.

Example:
    >>> calculate("347 * 58"), calculate("(1 + 2) / 4"), calculate("7 / 0")
    ('20126', '0.75', 'Error: division by zero.')
    >>> calculate("__import__('os')")
    "Error: '_' is not allowed: write numbers, + - * / and parentheses, e.g. (12 + 3) / 5."
"""

from __future__ import annotations

import ast
import operator
import re
from typing import Any, Callable

MAX_CHARS = 200  #: longest expression accepted (the model's calls are one line)
MAX_NODES = 64  #: numbers, operators and signs in one expression: bounds the work
MAX_DEPTH = 32  #: nesting of parentheses and operators: bounds the recursion
MAX_ABS = 10**15  #: largest magnitude of a number, written or computed
ALLOWED = set("0123456789.+-*/() \t")
#: Operations written as words, and the sign the calculator wants instead (the error says so).
WORDS = {"plus": "+", "add": "+", "sum": "+", "minus": "-", "subtract": "-", "times": "*", "multiply": "*",
         "multiplied": "*", "product": "*", "divided": "/", "divide": "/", "over": "/"}
_BINARY: dict[type, Callable[[Any, Any], Any]] = {ast.Add: operator.add, ast.Sub: operator.sub,
                                                  ast.Mult: operator.mul, ast.Div: operator.truediv}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """An expression the calculator refuses; the message is what the model reads after ``Error:``."""


def calculate(expression: Any) -> str:
    """The value of ``expression`` as text (``"20126"``, ``"0.75"``), or ``"Error: ..."`` saying what is wrong.

    Never raises and never executes the text: see the module's docstring for what is accepted."""
    try:
        return format_number(evaluate(expression))
    except CalculatorError as err:
        return f"Error: {err}"


def evaluate(expression: Any) -> int | float:
    """The value of ``expression``; a :class:`CalculatorError` says why it is refused.

    Example:
        >>> evaluate("2 * (3 + 4)"), evaluate(12)
        (14, 12)
    """
    if isinstance(expression, bool) or not isinstance(expression, (str, int, float)):
        raise CalculatorError(f"the expression must be text such as \"(12 + 3) / 5\", not {type(expression).__name__}.")
    text = str(expression).strip()
    if not text:
        raise CalculatorError("the expression is empty: write one such as (12 + 3) / 5.")
    if len(text) > MAX_CHARS:
        raise CalculatorError(f"the expression is {len(text)} characters long; at most {MAX_CHARS} are accepted.")
    bad = next((c for c in text if c not in ALLOWED), None)
    if bad is not None:
        word = next((w for w in re.findall(r"[A-Za-z]+", text) if w.lower() in WORDS), None)
        if word is not None:
            raise CalculatorError(f"{word!r} is not allowed: write it as {WORDS[word.lower()]}, e.g. (12 + 3) / 5.")
        hint = " (use * to multiply)" if bad in "x×X" else " (write numbers without commas)" if bad == "," else ""
        raise CalculatorError(f"{bad!r} is not allowed{hint}: write numbers, + - * / and parentheses, "
                              "e.g. (12 + 3) / 5.")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalculatorError(f"{text!r} is not a complete expression, e.g. (12 + 3) / 5.") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_NODES:
        raise CalculatorError(f"the expression has {nodes} parts; at most {MAX_NODES} are accepted.")
    return _value(tree.body, 0)


def _value(node: ast.AST, depth: int) -> int | float:
    if depth > MAX_DEPTH:
        raise CalculatorError(f"the expression is nested more than {MAX_DEPTH} levels deep.")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand, depth + 1))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left, depth + 1), _value(node.right, depth + 1)
        if isinstance(node.op, ast.Div) and right == 0:
            raise CalculatorError("division by zero.")
        return _bounded(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Pow, ast.FloorDiv)):
        raise CalculatorError("** and // are not accepted: write the multiplication or division out with * or /.")
    raise CalculatorError("only numbers, + - * / and parentheses are allowed, e.g. (12 + 3) / 5.")


def _bounded(value: int | float) -> int | float:
    if not abs(value) <= MAX_ABS:  # `not <=` also catches NaN
        raise CalculatorError(f"a number is larger than {MAX_ABS:.0e} in size.")
    return value


def format_number(value: int | float) -> str:
    """``value`` as the model should copy it: an integer without ``.0``, else at most 6 decimals.

    Example:
        >>> format_number(14.0), format_number(2 / 3), format_number(-5)
        ('14', '0.666667', '-5')
    """
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value) if isinstance(value, int) else f"{value:.6f}".rstrip("0").rstrip(".")


def calculator(expression: str) -> str:
    """Evaluates an arithmetic expression and returns its value.

    Args:
        expression: The arithmetic to evaluate, with numbers, + - * / and parentheses, e.g. "(12 + 3) / 5".

    Returns:
        The value of the expression, or an error message that says what is wrong with it.
    """
    return calculate(expression)

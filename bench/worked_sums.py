"""Two variants of the course's sums for ``bench/warmup_probe.py`` (issue 37): warmed up on the task's own level.

``WorkedSums`` writes each sum worked in tens and ones (``40 + 50 = 90``, ``6 + 3 = 9``, ``90 + 9 = 99``), a
chance for a small model to carry; ``OneLineAdd2Warmup`` keeps the course's one-line solution, as its control.

Example:
    >>> worked(46, 53)
    '40 + 50 = 90\\n6 + 3 = 9\\n90 + 9 = 99'
"""

from __future__ import annotations

from typing import Any

from helpers.tasks.arithmetic import ArithmeticTask, generate_arithmetic


def worked(a: int, b: int) -> str:
    """``a + b`` in three lines: the tens, the ones, the two added."""
    tens, ones = (a // 10 + b // 10) * 10, a % 10 + b % 10
    return f"{a // 10 * 10} + {b // 10 * 10} = {tens}\n{a % 10} + {b % 10} = {ones}\n{tens} + {ones} = {tens + ones}"


class WorkedSums(ArithmeticTask):
    """The course's sums, solved in tens and ones, warmed up on sums of the same level (56 tokens fit them)."""

    name = "worked-sums"
    min_completion_tokens = 40

    def make_rows(self, level: str, n: int, seed: int) -> Any:
        rows = generate_arithmetic(n, level, seed)
        for row in rows:
            a, b = (int(x) for x in row["solution"].split(" = ")[0].split(" + "))
            row["solution"] = worked(a, b)
        return rows

    def settings(self, profile: Any) -> dict[str, Any]:
        return {**super().settings(profile), "warmup_level": "add2", "max_completion_length": 56}


class OneLineAdd2Warmup(ArithmeticTask):
    """The control: the course's one-line solution, warmed up on the same sums."""

    def settings(self, profile: Any) -> dict[str, Any]:
        return {**super().settings(profile), "warmup_level": "add2"}

"""The course's response format, stated once and shared by data and rewards.

A completion the course rewards looks like::

    <reasoning>
    15 + 27 = 42
    </reasoning>
    <answer>
    42
    </answer>

Example:
    >>> from helpers.prompts import REASONING_START, ANSWER_START
    >>> REASONING_START, ANSWER_START
    ('<reasoning>', '<answer>')
"""

from __future__ import annotations

REASONING_START = "<reasoning>"
REASONING_END = "</reasoning>"
ANSWER_START = "<answer>"
ANSWER_END = "</answer>"

SYSTEM_PROMPT = (
    "Respond in the following format:\n"
    f"{REASONING_START}\n...\n{REASONING_END}\n"
    f"{ANSWER_START}\n...\n{ANSWER_END}"
)

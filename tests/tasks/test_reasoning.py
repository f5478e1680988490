"""helpers.tasks.reasoning: the <reasoning>/<answer> format, the answer rule, every reward, the prefilled rewards,
the evaluation's score.

Hand-written cases go through the harness notebook 02 teaches (helpers.reward_lab.assert_cases); property-based
tests throw generated, megabyte and tag-soup completions at every reward.
"""

from __future__ import annotations

import pickle
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.reward_lab import RewardCase, assert_cases
from helpers.rewards import Prefilled, completion_text
from helpers.tasks import reasoning as R
from helpers.tasks.arithmetic import ArithmeticTask
from helpers.tasks.reasoning import (
    ANSWER_END,
    ANSWER_START,
    PREFILL,
    REASONING_END,
    REASONING_START,
    SYSTEM_PROMPT,
    TAGS,
    answer_matches,
    correctness_reward,
    extract_answer,
    extract_reasoning,
    find_numbers,
    has_strict_format,
    normalize_number,
    numeric_answer_reward,
    partial_correctness_reward,
    prefilled_soft_format_reward,
    prefilled_strict_format_reward,
    prefilled_xmlcount_reward,
    reference_completion,
    soft_format_reward,
    strict_format_reward,
    xmlcount_reward,
)

GOOD = "<reasoning>\n15 + 27 = 42\n</reasoning>\n<answer>\n42\n</answer>"
MULTILINE = ("<reasoning>\nFirst, 15 + 20 = 35.\nThen 35 + 7 = 42.\n\nSo the sum is 42.\n</reasoning>\n"
             "<answer>\n42\n</answer>\n")
#: What TRL hands a reward when the template prefilled "<reasoning>\n": the text after it.
GENERATED = "15 + 27 = 42\n</reasoning>\n<answer>\n42\n</answer>"


def conv(text):
    return [{"role": "assistant", "content": text}]


class Unprintable:
    def __str__(self):
        raise RuntimeError("no text")


# --------------------------------------------------------------------------- the format


def test_the_format():
    assert PREFILL == REASONING_START + "\n" and TAGS == (REASONING_START, REASONING_END, ANSWER_START, ANSWER_END)
    assert all(tag in SYSTEM_PROMPT for tag in TAGS)
    text = reference_completion("2 + 3 = 5", "5")
    assert text == "<reasoning>\n2 + 3 = 5\n</reasoning>\n<answer>\n5\n</answer>"
    assert has_strict_format(text) and correctness_reward([text], answer=["5"]) == [2.0]
    assert text.startswith(PREFILL)


# --------------------------------------------------------------------------- reading the answer


@pytest.mark.parametrize("text, expected", [
    (GOOD, "42"),
    ("<answer>  7 </answer>", "7"),
    ("<answer>\n1\n</answer> and later <answer>\n2\n</answer>", "2"),  # the last block
    ("<answer>1</answer><answer>2", "1"),  # the last *complete* block
    ("<answer><answer>5</answer>", "5"),
    ("<answer>\nmulti\nline\n</answer>", "multi\nline"),
    ("<answer></answer>", ""),
    ("no tags at all", None),
    ("<answer>42", None),  # cut at max_completion_length
    ("42</answer>", None),
    ("", None),
    (None, None),
    (conv(GOOD), "42"),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_reasoning():
    assert extract_reasoning(MULTILINE).startswith("First, 15 + 20 = 35.\nThen")
    assert extract_reasoning(conv(GOOD)) == "15 + 27 = 42"
    assert extract_reasoning("<reasoning>\nnot closed") is None


@pytest.mark.parametrize("text, expected", [
    ("18.00", "18"), ("3.50", "3.5"), ("-7", "-7"), ("$18", "18"), ("1,234", "1234"),
    ("$1,234,567.10", "1234567.1"), ("50%", "50"), (" 42. ", "42"), ("+5", "5"), ("007", "7"),
    (".5", "0.5"), ("-0.0", "0"), ("$ 18", "18"), ("\u22127", "-7"), ("0", "0"), ("10", "10"),
    ("100.0", "100"), (42, "42"), (3.5, "3.5"),
    # not a single number
    ("1 2", None), ("1,2", None), ("12,34", None), ("abc", None), ("", None), ("5 apples", None),
    ("1/2", None), ("1e3", None), ("--5", None), ("1.2.3", None), ("..", None), (None, None),
    (True, None), ("9" * 500, None),
])
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


def test_find_numbers():
    assert find_numbers("Tom has 3 apples, buys 1,200 more: 1203. Then -4.50 off") == ["3", "1200", "1203", "-4.5"]
    assert find_numbers(conv("costs $5 or 6%")) == ["5", "6"]
    assert find_numbers("a2b x3") == []  # digits glued to words are not numbers
    assert find_numbers(" ".join(["7"] * 50), limit=3) == ["7", "7", "7"]


@pytest.mark.parametrize("pred, gold, expected", [
    ("$1,080.00", "1080", True),
    ("42", "$42.0", True),
    ("  42 ", "42", True),
    ("-7", "-7", True),
    ("7", "-7", False),
    ("1080.5", "1080", False),
    ("42 apples", "42", False),  # a numeric gold needs a single number
    ("forty-two", "42", False),
    (42, "42", True),
    # a gold answer that is not a number: the stripped text must be equal
    ("Paris", "Paris", True),
    (" Paris\n", "Paris", True),
    ("paris", "Paris", False),
    ("1/2", "1/2", True),
    ("0.5", "1/2", False),
    # nothing to compare
    (None, "4", False),
    ("4", None, False),
    ("", "", False),
    ("  ", "0", False),
])
def test_answer_matches_is_the_one_definition_of_right(pred, gold, expected):
    assert answer_matches(pred, gold) is expected
    assert correctness_reward(completions=[f"<answer>{'' if pred is None else pred}</answer>"],
                              answer=[gold]) == [2.0 if expected else 0.0]


def test_has_strict_format():
    assert has_strict_format(GOOD) and has_strict_format(MULTILINE) and has_strict_format(conv(GOOD))
    assert has_strict_format("<reasoning>  \nx\n\t</reasoning>\n\n<answer>\n4\n</answer>")
    assert not has_strict_format("<reasoning>\n \n</reasoning>\n<answer>\n4\n</answer>")  # empty reasoning
    assert not has_strict_format("<reasoning>\nx\n</reasoning>\n<answer>\n\n</answer>")  # empty answer
    assert not has_strict_format("<reasoning>x</reasoning>\n<answer>\n4\n</answer>")  # tags not on own lines
    assert not has_strict_format(None)


# --------------------------------------------------------------------------- format rewards, case by case

ALL_FORMAT = [strict_format_reward, soft_format_reward, xmlcount_reward]

FORMAT_CASES = [
    RewardCase(GOOD, {"strict_format_reward": 1.0, "soft_format_reward": 1.0, "xmlcount_reward": 1.0},
               note="canonical"),
    RewardCase(MULTILINE, {"strict_format_reward": 1.0, "soft_format_reward": 1.0, "xmlcount_reward": 1.0},
               note="multi-line reasoning (DOTALL) and a final newline"),
    RewardCase("  \n" + GOOD + "\n\n  ", {"strict_format_reward": 1.0}, note="outer whitespace"),
    RewardCase(conv(GOOD), {"strict_format_reward": 1.0, "soft_format_reward": 1.0}, note="conversational"),
    RewardCase("<reasoning>15 + 27 = 42</reasoning><answer>42</answer>",
               {"strict_format_reward": 0.0, "soft_format_reward": 1.0, "xmlcount_reward": 1.0}, note="one line"),
    RewardCase("Sure! " + GOOD, {"strict_format_reward": 0.0, "soft_format_reward": 1.0}, note="text before"),
    RewardCase(GOOD + "\nHope that helps!",
               {"strict_format_reward": 0.0, "soft_format_reward": 1.0,
                "xmlcount_reward": 1.0 - 0.001 * len("Hope that helps!")}, note="text after"),
    RewardCase("<answer>\n42\n</answer>\n<reasoning>\nx\n</reasoning>",
               {"strict_format_reward": 0.0, "soft_format_reward": 0.0,
                "xmlcount_reward": 1.0 - 0.001 * len("<reasoning>\nx\n</reasoning>")}, note="wrong order"),
    RewardCase("<reasoning>\na\n</reasoning>\n<reasoning>\nb\n</reasoning>\n<answer>\n42\n</answer>",
               {"strict_format_reward": 0.0, "soft_format_reward": 1.0, "xmlcount_reward": 0.5 - 0.25},
               note="repeated reasoning block"),
    RewardCase("<reasoning>\n15 + 27 = 42",
               {"strict_format_reward": 0.0, "soft_format_reward": 0.0, "xmlcount_reward": 0.25}, note="truncated"),
    RewardCase("", {"strict_format_reward": 0.0, "soft_format_reward": 0.0, "xmlcount_reward": 0.0}, note="empty"),
    RewardCase(None, {"strict_format_reward": 0.0, "soft_format_reward": 0.0, "xmlcount_reward": 0.0},
               note="None"),
    RewardCase(conv(None), {"strict_format_reward": 0.0}, note="None content"),
    RewardCase(GOOD + "x" * 5000, {"xmlcount_reward": 0.5}, note="trailing penalty capped at 0.5"),
    RewardCase(GOOD * 3, {"strict_format_reward": 0.0, "soft_format_reward": 1.0, "xmlcount_reward": -0.5},
               note="everything three times"),
    RewardCase(GENERATED, {"strict_format_reward": 0.0, "soft_format_reward": 0.0, "xmlcount_reward": 0.75},
               note="prefilled: the plain rewards do not see the opening tag"),
]


def test_format_reward_cases():
    assert_cases(FORMAT_CASES, ALL_FORMAT)


def test_prefilled_rewards_score_the_prefill_plus_the_completion():
    cases = [
        RewardCase(GENERATED, {"prefilled_strict_format_reward": 1.0, "prefilled_soft_format_reward": 1.0,
                               "prefilled_xmlcount_reward": 1.0}, note="what the model generated"),
        RewardCase(conv(GENERATED), {"prefilled_strict_format_reward": 1.0}, note="conversational"),
        RewardCase("Step 1: 15 + 20 = 35\nStep 2: 35 + 7 = 42\n</reasoning>\n<answer>\n42\n</answer>",
                   {"prefilled_strict_format_reward": 1.0}, note="multi-line after the prefill"),
        RewardCase(PREFILL + GENERATED, {"prefilled_strict_format_reward": 0.0, "prefilled_soft_format_reward": 1.0,
                                         "prefilled_xmlcount_reward": 0.75 - 0.125},
                   note="the model wrote the prefilled tag again: shown twice, counted as the error it is"),
        RewardCase("15 + 27 = 42 </reasoning>", {"prefilled_strict_format_reward": 0.0,
                                                "prefilled_soft_format_reward": 0.0},
                   note="closes the reasoning, no answer"),
        RewardCase(None, {"prefilled_strict_format_reward": 0.0, "prefilled_xmlcount_reward": 0.25}),
    ]
    assert_cases(cases, [prefilled_strict_format_reward, prefilled_soft_format_reward, prefilled_xmlcount_reward])


def test_the_prefilled_rewards_use_the_course_prefill_and_are_importable():
    for f in (prefilled_strict_format_reward, prefilled_soft_format_reward, prefilled_xmlcount_reward):
        assert isinstance(f, Prefilled) and f.prefill == PREFILL and f.__name__.startswith("prefilled_")
        assert getattr(R, f.__name__) is f  # trl grpo: a reward by import path
        plain = getattr(R, f.__name__.removeprefix("prefilled_"))
        assert f.reward is plain
        assert f(completions=[GENERATED, "x"]) == plain(completions=[PREFILL + GENERATED, PREFILL + "x"])
        assert pickle.loads(pickle.dumps(f))(completions=[GENERATED]) == f(completions=[GENERATED])


# --------------------------------------------------------------------------- answer rewards

ANSWER_REWARDS = [correctness_reward, numeric_answer_reward, partial_correctness_reward]

ANSWER_CASES = [
    RewardCase(GOOD, {"correctness_reward": 2.0, "numeric_answer_reward": 0.5, "partial_correctness_reward": 1.0},
               answer="42"),
    RewardCase(conv(MULTILINE), {"correctness_reward": 2.0}, answer="42", note="multi-line, conversational"),
    RewardCase("<answer>$42.00</answer>", {"correctness_reward": 2.0, "numeric_answer_reward": 0.5}, answer="42"),
    RewardCase("<answer>1,234</answer>", {"correctness_reward": 2.0}, answer="1234"),
    RewardCase("<answer>41</answer>", {"correctness_reward": 0.0, "numeric_answer_reward": 0.5,
                                       "partial_correctness_reward": 0.0}, answer="42", note="wrong but a number"),
    RewardCase("<answer>15 + 27 = 42</answer>", {"correctness_reward": 0.0, "numeric_answer_reward": 0.0,
                                                 "partial_correctness_reward": 0.5}, answer="42",
               note="the right number among others"),
    RewardCase("15 + 27 = 42", {"correctness_reward": 0.0, "numeric_answer_reward": 0.0,
                                "partial_correctness_reward": 0.25}, answer="42", note="no tags, last number right"),
    RewardCase("42 is close to 40", {"partial_correctness_reward": 0.0}, answer="42", note="right, not last"),
    RewardCase("<answer>41</answer> I mean 42", {"partial_correctness_reward": 0.25}, answer="42"),
    RewardCase(" ".join(str(i) for i in range(100)), {"partial_correctness_reward": 0.0}, answer="42",
               note="listing numbers does not pay"),
    RewardCase("<answer>42", {"correctness_reward": 0.0, "numeric_answer_reward": 0.0}, answer="42", note="unclosed"),
    RewardCase("<answer>1</answer><answer>42</answer>", {"correctness_reward": 2.0}, answer="42",
               note="the last block counts"),
    RewardCase("<answer>42</answer>", {"correctness_reward": 0.0}, columns={"answer": None}, note="no gold"),
    RewardCase("<answer>Paris</answer>", {"correctness_reward": 2.0, "numeric_answer_reward": 0.0,
                                          "partial_correctness_reward": None}, answer="Paris",
               note="non-numeric gold: text match; partial credit does not apply"),
    RewardCase("<answer>-7</answer>", {"correctness_reward": 2.0}, answer="-7"),
    RewardCase("<answer>7</answer>", {"correctness_reward": 0.0}, answer="-7"),
]


def test_answer_reward_cases():
    assert_cases(ANSWER_CASES, ANSWER_REWARDS)


def test_partial_credit_reads_the_last_number_of_a_long_completion():
    listing = " ".join(str(i) for i in range(3000))  # more numbers than find_numbers' default limit
    assert partial_correctness_reward([listing], answer=["2999"]) == [0.25]
    assert partial_correctness_reward([listing], answer=["999"]) == [0.0]
    assert partial_correctness_reward([listing + " 1,2"], answer=["2999"]) == [0.25]  # "1,2" is not a number


def test_correctness_reward_logs_the_gold_and_extracted_answers():
    logged = []
    scores = correctness_reward(completions=[GOOD, "no answer", conv("<answer> 7 </answer>")], answer=["42", 42, "8"],
                                log_extra=lambda column, values: logged.append((column, values)))
    assert scores == [2.0, 0.0, 0.0]
    assert logged == [("answer", ["42", "42", "8"]), ("extracted", ["42", "", "7"])]


def test_rewards_take_trl_call_shapes():
    """Exactly how GRPOTrainer calls a reward: keywords, every column as a list, trainer extras."""
    comps = [conv(GOOD), conv("nope")]
    kw = dict(prompts=[[{"role": "user", "content": "q"}]] * 2, completions=comps, completion_ids=[[1, 2], [3]],
              answer=["42", "42"], question=["q", "q"], trainer_state=object(), log_extra=lambda c, v: None,
              log_metric=lambda name, value: None)
    for f, want in [(correctness_reward, [2.0, 0.0]), (strict_format_reward, [1.0, 0.0]),
                    (prefilled_strict_format_reward, [0.0, 0.0]), (partial_correctness_reward, [1.0, 0.0]),
                    (numeric_answer_reward, [0.5, 0.0])]:
        assert f(**kw) == want, f.__name__
    assert strict_format_reward([GOOD]) == [1.0]  # positional, as notebook 02 calls them
    assert strict_format_reward(completions=[GOOD], text=["other"]) == [1.0]  # a column named "text"
    assert correctness_reward(completions=[], answer=[]) == []


# --------------------------------------------------------------------------- the evaluation's score


@pytest.mark.parametrize("text, answer, expected", [
    (GOOD, "42", {"accuracy": 1.0, "correct": 1.0, "format": 1.0}),
    (MULTILINE, "42", {"accuracy": 1.0, "correct": 1.0, "format": 1.0}),
    (GOOD, "41", {"accuracy": 0.0, "correct": 0.0, "format": 1.0}),
    ("<answer>42</answer>", "42", {"accuracy": 0.0, "correct": 1.0, "format": 0.0}),  # right, not in the format
    ("Sure! " + GOOD, "$42.00", {"accuracy": 0.0, "correct": 1.0, "format": 0.0}),
    (GENERATED, "42", {"accuracy": 0.0, "correct": 1.0, "format": 0.0}),  # the prefill missing
    (PREFILL + GENERATED, "42", {"accuracy": 1.0, "correct": 1.0, "format": 1.0}),
    ("<answer>42", "42", {"accuracy": 0.0, "correct": 0.0, "format": 0.0}),
    ("", "42", {"accuracy": 0.0, "correct": 0.0, "format": 0.0}),
])
def test_the_arithmetic_score_uses_the_rewards_rule(text, answer, expected):
    assert ArithmeticTask().score(text, {"answer": answer}) == expected
    # the same rule as the correctness and strict format rewards
    assert expected["correct"] * 2.0 == correctness_reward([text], answer=[answer])[0]
    assert expected["format"] == strict_format_reward([text])[0]


# --------------------------------------------------------------------------- never raise, on anything

TAG = st.sampled_from([REASONING_START, REASONING_END, ANSWER_START, ANSWER_END, "\n", " ", "42", "-3.5",
                       "$1,234", "1,2", "\\frac{1}{2}", "<answer", "answer>", "</", "<", PREFILL])
TEXT = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(TAG, st.text(max_size=8)), max_size=40).map("".join),
    st.builds(lambda a, n: a * n, st.sampled_from([REASONING_START, ANSWER_END, "(", "9^", "<answer>1", "1,"]),
              st.integers(0, 3000)),
)
COMPLETION = st.one_of(TEXT, TEXT.map(conv), st.none(), st.just(conv(None)), st.just([{"role": "assistant"}]),
                       st.just([]), st.just(Unprintable()), st.integers())

FAST_REWARDS = [
    strict_format_reward, soft_format_reward, xmlcount_reward, correctness_reward, numeric_answer_reward,
    partial_correctness_reward, prefilled_strict_format_reward, prefilled_soft_format_reward,
    prefilled_xmlcount_reward, Prefilled(xmlcount_reward, "<think>"), Prefilled(correctness_reward, "<answer>"),
]
NONE_ALLOWED = {"partial_correctness_reward"}


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(comps=st.lists(COMPLETION, max_size=8),
       answers=st.lists(st.one_of(st.none(), st.text(max_size=12), st.integers(),
                                  st.sampled_from(["42", "-7", "3.5", "1,234", "#### 5"])), min_size=8, max_size=8),
       with_ids=st.booleans())
def test_rewards_never_raise_on_generated_completions(comps, answers, with_ids):
    n = len(comps)
    ids = [list(range(len(completion_text(c)) % 40)) for c in comps] if with_ids else None
    for f in FAST_REWARDS:
        out = f(prompts=[None] * n, completions=comps, completion_ids=ids, answer=answers[:n],
                log_extra=lambda column, values: None)
        assert isinstance(out, list) and len(out) == n, f.__name__
        for v in out:
            assert (v is None and f.__name__ in NONE_ALLOWED) or isinstance(v, float), (f.__name__, v)
        if "xmlcount" in f.__name__:
            assert all(-1.0 <= v <= 1.0 for v in out)
        if "format" in f.__name__:
            assert set(out) <= {0.0, 1.0}


@settings(max_examples=1000, deadline=None)
@given(st.text(max_size=60))
def test_parsers_are_total_and_normalize_number_is_idempotent(text):
    a = extract_answer(text)
    assert a is None or isinstance(a, str)
    n = normalize_number(text)
    assert n is None or re.fullmatch(r"-?\d+(\.\d*[1-9])?", n)
    if n is not None:
        assert normalize_number(n) == n
        assert answer_matches(text, n)


@settings(max_examples=200, deadline=None)
@given(st.integers(-10**9, 10**9), st.integers(0, 3))
def test_normalize_number_reads_formatted_numbers(value, zeros):
    s = f"{value:,}" + ("." + "0" * zeros if zeros else "")
    assert normalize_number(s) == str(value)
    assert normalize_number(f"${s}") == str(value)


def test_megabyte_and_tag_soup_completions():
    """Linear-time parsing: right shape, no error, sensible scores on huge adversarial texts."""
    huge = [
        "<reasoning>\n" + "x" * 1_000_000,
        "<reasoning>" * 100_000,
        "<answer>1</answer>" * 50_000,
        GOOD + "\n" + "y " * 500_000,
        "\u202e\u0000" * 10_000 + GOOD,
        "1 " * 200_000,
    ]
    for f in FAST_REWARDS:
        out = f(completions=huge, answer=["42"] * len(huge), completion_ids=[[1] * 10] * len(huge))
        assert len(out) == len(huge) and all(v is None or isinstance(v, float) for v in out), f.__name__
    assert strict_format_reward(completions=huge) == [0.0] * 6
    assert soft_format_reward(completions=huge)[3:5] == [1.0, 1.0]
    assert correctness_reward(completions=huge, answer=["1"] * 6)[2] == 2.0
    assert xmlcount_reward(completions=huge)[3] == 0.5  # trailing text: penalty capped
    assert partial_correctness_reward(completions=huge, answer=["1"] * 6)[5] == 0.25

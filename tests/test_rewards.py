"""Tests for helpers.rewards: parsing, every reward, factories, presets, the math-verify guard.

Hand-written cases go through the same harness the notebook teaches
(helpers.reward_tools.assert_cases); property-based tests throw thousands of
generated texts at every reward.
"""

from __future__ import annotations

import pickle
import re
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import rewards as R
from helpers.prompts import ANSWER_END, ANSWER_START, REASONING_END, REASONING_START
from helpers.reward_tools import RewardCase, assert_cases
from helpers.rewards import (
    completion_text,
    completion_texts,
    correctness_reward,
    extract_answer,
    extract_reasoning,
    find_numbers,
    get_math_verify_reward,
    get_partial_correctness_reward,
    get_prefilled_format_reward,
    get_preset,
    get_repetition_penalty_reward,
    get_soft_overlong_punishment_reward,
    get_target_length_reward,
    make_reward,
    normalize_number,
    numeric_answer_reward,
    partial_correctness_reward,
    prefill_of,
    soft_format_reward,
    split_preset,
    strict_format_reward,
    with_prefill,
    xmlcount_reward,
)

GOOD = "<reasoning>\n15 + 27 = 42\n</reasoning>\n<answer>\n42\n</answer>"
MULTILINE = (
    "<reasoning>\nFirst, 15 + 20 = 35.\nThen 35 + 7 = 42.\n\nSo the sum is 42.\n</reasoning>\n"
    "<answer>\n42\n</answer>\n"
)
PREFILL = REASONING_START + "\n"
PREFILLED_PROMPT = [
    {"role": "system", "content": "Respond in the format."},
    {"role": "user", "content": "What is 15 + 27?"},
    {"role": "assistant", "content": PREFILL},
]
PREFILLED_COMPLETION = "15 + 27 = 42\n</reasoning>\n<answer>\n42\n</answer>"


def conv(text):
    return [{"role": "assistant", "content": text}]


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text, expected",
    [
        (GOOD, "42"),
        ("<answer>  7 </answer>", "7"),
        ("<answer>\n1\n</answer> and later <answer>\n2\n</answer>", "2"),
        ("<answer>1</answer><answer>2", "1"),  # the second block is not complete
        ("<answer><answer>5</answer>", "5"),  # innermost opening tag of the last block
        ("<answer>\nmulti\nline\n</answer>", "multi\nline"),
        ("no tags at all", None),
        ("<answer>42", None),
        ("42</answer>", None),
        ("", None),
        ("<answer></answer>", ""),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extract_answer_accepts_conversational_and_none():
    assert extract_answer(conv(GOOD)) == "42"
    assert extract_answer(None) is None
    assert extract_reasoning(MULTILINE).startswith("First, 15 + 20 = 35.\nThen")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("18.00", "18"),
        ("3.50", "3.5"),
        ("-7", "-7"),
        ("$18", "18"),
        ("1,234", "1234"),
        ("$1,234,567.10", "1234567.1"),
        ("50%", "50"),
        (" 42. ", "42"),
        ("+5", "5"),
        ("007", "7"),
        (".5", "0.5"),
        ("-0.0", "0"),
        ("$ 18", "18"),
        ("\u22127", "-7"),
        ("0", "0"),
        ("10", "10"),
        ("100.0", "100"),
        # not a single number
        ("1 2", None),
        ("1,2", None),
        ("12,34", None),
        ("abc", None),
        ("", None),
        ("5 apples", None),
        ("1/2", None),
        ("1e3", None),
        ("--5", None),
        (None, None),
        ("9" * 500, None),
    ],
)
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


def test_find_numbers_and_completion_text():
    assert find_numbers("Tom has 3 apples, buys 1,200 more: 1203. Then -4.50 off") == ["3", "1200", "1203", "-4.5"]
    assert completion_text("plain") == "plain"
    assert completion_text(conv("hi")) == "hi"
    assert completion_text([{"role": "assistant", "content": None}]) == ""
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]) == "ab"
    assert completion_text({"role": "assistant", "content": "d"}) == "d"
    assert completion_texts(None) == []
    assert completion_texts("one") == ["one"]


def test_prefill_of():
    assert prefill_of(PREFILLED_PROMPT) == PREFILL
    assert prefill_of(PREFILLED_PROMPT[:2]) == ""
    assert prefill_of("<|im_start|>assistant\n<reasoning>\n") == PREFILL
    assert prefill_of("<|im_start|>assistant\n") == ""
    assert prefill_of(None) == ""


# --------------------------------------------------------------------------- rewards, case by case

ALL_FORMAT = [strict_format_reward, soft_format_reward, xmlcount_reward]

FORMAT_CASES = [
    RewardCase(GOOD, {"strict_format_reward": 1.0, "soft_format_reward": 1.0, "xmlcount_reward": 1.0}, note="canonical"),
    RewardCase(MULTILINE, {"strict_format_reward": 1.0, "soft_format_reward": 1.0, "xmlcount_reward": 1.0},
               note="multi-line reasoning (DOTALL) and a final newline"),
    RewardCase("  \n" + GOOD + "\n\n  ", {"strict_format_reward": 1.0}, note="outer whitespace"),
    RewardCase(conv(GOOD), {"strict_format_reward": 1.0, "soft_format_reward": 1.0}, note="conversational"),
    RewardCase("<reasoning>15 + 27 = 42</reasoning><answer>42</answer>",
               {"strict_format_reward": 0.0, "soft_format_reward": 1.0, "xmlcount_reward": 1.0}, note="one line"),
    RewardCase("Sure! " + GOOD, {"strict_format_reward": 0.0, "soft_format_reward": 1.0}, note="text before"),
    RewardCase(GOOD + "\nHope that helps!", {"strict_format_reward": 0.0, "soft_format_reward": 1.0,
               "xmlcount_reward": 1.0 - 0.001 * len("Hope that helps!")}, note="text after"),
    RewardCase("<answer>\n42\n</answer>\n<reasoning>\nx\n</reasoning>",
               {"strict_format_reward": 0.0, "soft_format_reward": 0.0, "xmlcount_reward": 1.0 - 0.001 * len("<reasoning>\nx\n</reasoning>")},
               note="blocks in the wrong order"),
    RewardCase("<reasoning>\n\n</reasoning>\n<answer>\n42\n</answer>", {"strict_format_reward": 0.0},
               note="empty reasoning"),
    RewardCase("<reasoning>\na\n</reasoning>\n<reasoning>\nb\n</reasoning>\n<answer>\n42\n</answer>",
               {"strict_format_reward": 0.0, "soft_format_reward": 1.0, "xmlcount_reward": 0.5 - 0.25},
               note="repeated reasoning block"),
    RewardCase("<reasoning>\n15 + 27 = 42", {"strict_format_reward": 0.0, "soft_format_reward": 0.0,
               "xmlcount_reward": 0.25}, note="truncated"),
    RewardCase("", {"strict_format_reward": 0.0, "soft_format_reward": 0.0, "xmlcount_reward": 0.0}, note="empty"),
    RewardCase(None, {"strict_format_reward": 0.0, "xmlcount_reward": 0.0}, note="None"),
    RewardCase(conv(None), {"strict_format_reward": 0.0}, note="None content"),
    RewardCase(GOOD + "x" * 5000, {"xmlcount_reward": 0.5}, note="trailing penalty capped at 0.5"),
    RewardCase(GOOD * 3, {"strict_format_reward": 0.0, "soft_format_reward": 1.0, "xmlcount_reward": -0.5},
               note="everything three times: 4 repeated tags, nothing after the last </answer>"),
    RewardCase(PREFILLED_COMPLETION, {"strict_format_reward": 0.0, "soft_format_reward": 0.0,
               "xmlcount_reward": 0.75}, prompt=PREFILLED_PROMPT,
               note="prefilled: plain rewards do not see the opening tag"),
]


def test_format_rewards_cases():
    assert_cases(FORMAT_CASES, ALL_FORMAT)


def test_prefilled_format_reward_knows_the_prefill():
    auto = get_prefilled_format_reward()
    forced = get_prefilled_format_reward(prefill=PREFILL)
    soft = get_prefilled_format_reward(prefill=PREFILL, strict=False)
    assert auto.__name__ == "prefilled_strict_format_reward"
    assert soft.__name__ == "prefilled_soft_format_reward"
    cases = [
        RewardCase(PREFILLED_COMPLETION, {"auto": 1.0, "forced": 1.0, "soft": 1.0}, prompt=PREFILLED_PROMPT),
        RewardCase(conv(PREFILLED_COMPLETION), {"auto": 1.0}, prompt=PREFILLED_PROMPT, note="conversational"),
        RewardCase("Step 1: 15 + 20 = 35\nStep 2: 35 + 7 = 42\n</reasoning>\n<answer>\n42\n</answer>",
                   {"auto": 1.0}, prompt=PREFILLED_PROMPT, note="multi-line after prefill"),
        RewardCase(PREFILLED_COMPLETION, {"auto": 0.0, "forced": 1.0}, prompt=PREFILLED_PROMPT[:2],
                   note="no prefill in this prompt: auto scores the text as is"),
        RewardCase(GOOD, {"auto": 1.0, "forced": 0.0}, prompt=PREFILLED_PROMPT[:2],
                   note="not prefilled and complete: auto fine, forced sees two opening tags"),
        RewardCase("<reasoning>\n" + PREFILLED_COMPLETION, {"auto": 0.0}, prompt=PREFILLED_PROMPT,
                   note="the model repeated the prefilled tag"),
        RewardCase("15 + 27 = 42 </reasoning>", {"auto": 0.0, "soft": 0.0}, prompt=PREFILLED_PROMPT,
                   note="the base model's typical: closes reasoning, no answer"),
        RewardCase("<|im_start|>assistant\n", {"auto": 0.0}, prompt="<|im_start|>assistant\n<reasoning>\n"),
    ]
    assert_cases(cases, {"auto": auto, "forced": forced, "soft": soft})
    # the same completion in a plain-text prompt ending with the tag
    assert auto(prompts=["...assistant\n<reasoning>\n"], completions=[PREFILLED_COMPLETION]) == [1.0]
    wx = with_prefill(xmlcount_reward)
    assert wx(prompts=[PREFILLED_PROMPT], completions=[PREFILLED_COMPLETION]) == [1.0]
    assert wx.__name__ == "prefilled_xmlcount_reward"


ANSWER_CASES = [
    RewardCase(GOOD, {"correctness_reward": 2.0, "numeric_answer_reward": 0.5, "partial_correctness_reward": 1.0}, answer="42"),
    RewardCase(conv(MULTILINE), {"correctness_reward": 2.0}, answer="42", note="multi-line, conversational"),
    RewardCase("<answer>$42.00</answer>", {"correctness_reward": 2.0, "numeric_answer_reward": 0.5}, answer="42"),
    RewardCase("<answer>1,234</answer>", {"correctness_reward": 2.0}, answer="1234"),
    RewardCase("<answer>42</answer>", {"correctness_reward": 2.0}, answer="$42.0"),
    RewardCase("<answer>41</answer>", {"correctness_reward": 0.0, "numeric_answer_reward": 0.5,
               "partial_correctness_reward": 0.0}, answer="42"),
    RewardCase("<answer>15 + 27 = 42</answer>", {"correctness_reward": 0.0, "numeric_answer_reward": 0.0,
               "partial_correctness_reward": 0.5}, answer="42", note="right number among others"),
    RewardCase("15 + 27 = 42", {"correctness_reward": 0.0, "numeric_answer_reward": 0.0,
               "partial_correctness_reward": 0.25}, answer="42", note="no tags, last number right"),
    RewardCase("42 is close to 40", {"partial_correctness_reward": 0.0}, answer="42", note="right number, not last"),
    RewardCase("<answer>41</answer> I mean 42", {"partial_correctness_reward": 0.25}, answer="42"),
    RewardCase(" ".join(str(i) for i in range(100)), {"partial_correctness_reward": 0.0}, answer="42",
               note="listing numbers does not pay"),
    RewardCase("<answer>42", {"correctness_reward": 0.0, "numeric_answer_reward": 0.0}, answer="42", note="unclosed"),
    RewardCase("<answer>1</answer><answer>42</answer>", {"correctness_reward": 2.0}, answer="42", note="last block wins"),
    RewardCase("<answer>42</answer>", {"correctness_reward": 0.0}, answer=None, note="no gold"),
    RewardCase("<answer></answer>", {"correctness_reward": 0.0}, answer="", note="empty both"),
    RewardCase("<answer>Paris</answer>", {"correctness_reward": 2.0, "numeric_answer_reward": 0.0,
               "partial_correctness_reward": None}, answer="Paris", note="non-numeric gold: text match; partial n/a"),
    RewardCase("<answer>-7</answer>", {"correctness_reward": 2.0}, answer="-7"),
    RewardCase("<answer>7</answer>", {"correctness_reward": 0.0}, answer="-7"),
]


def test_answer_rewards_cases():
    assert_cases(ANSWER_CASES, [correctness_reward, numeric_answer_reward, partial_correctness_reward])


def test_trl_call_shapes():
    """Exactly how GRPOTrainer calls rewards: keywords, list columns, trainer kwargs."""
    comps = [conv(GOOD), conv("nope")]
    kw = dict(prompts=[PREFILLED_PROMPT[:2]] * 2, completions=comps, completion_ids=[[1, 2], [3]],
              answer=["42", "42"], question=["q", "q"], trainer_state=object(), log_extra=None,
              log_metric=lambda *a: None)
    assert correctness_reward(**kw) == [2.0, 0.0]
    assert strict_format_reward(**kw) == [1.0, 0.0]
    # positional use as in many tutorials: f(completions, **kwargs)
    assert correctness_reward(None, [GOOD], answer=["42"]) == [2.0]
    # a dataset column literally named "text" does not shadow the completion
    assert strict_format_reward(completions=[GOOD], text=["other"]) == [1.0]
    assert correctness_reward(completions=[], answer=[]) == []


def test_make_reward_never_raises_and_counts_errors():
    def boom(text, **_):
        raise ZeroDivisionError("x")

    r = make_reward(boom, name="boom")
    assert r.__name__ == "boom_reward"
    assert r(completions=["a", "b"]) == [0.0, 0.0]
    assert r.errors == 2 and "ZeroDivisionError" in r.last_error
    assert make_reward(boom, on_error=None)(completions=["a"]) == [None]
    # an unusable completions container still does not raise
    assert strict_format_reward(completions=42) == []


# --------------------------------------------------------------------------- factories


def test_target_length_reward():
    r = get_target_length_reward(10, unit="words")
    assert r.__name__ == "target_length_10_words_reward"
    assert r(completions=["w " * 10, "w " * 5, "w " * 20, "w " * 40, ""]) == [1.0, 0.5, 0.0, 0.0, 0.0]
    tok = get_target_length_reward(4)
    assert tok(completions=["a", "b"], completion_ids=[[1, 2, 3, 4], [1, 2]]) == [1.0, 0.5]
    assert tok(completions=["a"]) == [None]  # no token ids: not applicable
    assert get_target_length_reward(5, unit="chars")(completions=["abcde"]) == [1.0]
    with pytest.raises(ValueError, match="unit"):
        get_target_length_reward(5, unit="lines")
    with pytest.raises(ValueError, match="positive"):
        get_target_length_reward(0)


def test_repetition_penalty_matches_trl():
    from trl.rewards import get_repetition_penalty_reward as trl_penalty

    r = get_repetition_penalty_reward(ngram_size=2)
    assert r.__name__ == "repetition_penalty_2gram_reward"
    assert r(completions=["a b c d", "a a a a a", "", "one"]) == [0.0, -0.75, 0.0, 0.0]
    ids = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7]]
    rt = get_repetition_penalty_reward(ngram_size=3, unit="tokens")
    assert rt(completions=["x", "y"], completion_ids=ids) == trl_penalty(3)(completion_ids=ids)
    assert rt(completions=["x"]) == [None]
    with pytest.raises(ValueError, match="penalty"):
        get_repetition_penalty_reward(max_penalty=0.5)


def test_soft_overlong_punishment_matches_trl_and_dapo():
    from trl.rewards import get_soft_overlong_punishment

    r = get_soft_overlong_punishment_reward(max_completion_len=100, soft_punish_cache=20)
    ids = [[0] * n for n in (0, 80, 90, 100, 101, 500)]
    got = r(completions=[""] * len(ids), completion_ids=ids)
    assert got == [0.0, 0.0, -0.5, -1.0, -1.0, -1.0]
    assert got == get_soft_overlong_punishment(100, 20)(completion_ids=ids)
    assert r(completions=["a"]) == [None]
    assert r.__name__ == "soft_overlong_punishment_reward"
    with pytest.raises(ValueError, match="soft_punish_cache"):
        get_soft_overlong_punishment_reward(10, 20)


def test_partial_correctness_factory_weights():
    r = get_partial_correctness_reward(exact=3.0, in_answer=2.0, final_number=1.0, name="partial_x_reward")
    got = r(completions=["<answer>5</answer>", "<answer>2+3=5</answer>", "so 5", "6"], answer=["5"] * 4)
    assert got == [3.0, 2.0, 1.0, 0.0]
    assert r.__name__ == "partial_x_reward"


def test_presets():
    for name in R.PRESETS:
        preset = get_preset(name)
        funcs, weights = split_preset(preset)
        names = [f.__name__ for f in funcs]
        assert len(set(names)) == len(names), names
        assert all(w > 0 for w in weights)
        assert all(n.endswith("_reward") for n in names)
        # every preset is prefill-aware: a perfect prefilled completion gets every format point
        scores = {f.__name__: f(prompts=[PREFILLED_PROMPT], completions=[PREFILLED_COMPLETION], answer=["42"])[0]
                  for f in funcs}
        assert scores.get("prefilled_strict_format_reward", 1.0) == 1.0
    assert "correctness_reward" not in [f.__name__ for f, _ in get_preset("format-only")]
    assert [f.__name__ for f, _ in get_preset("arithmetic")][0] == "correctness_reward"
    with pytest.raises(ValueError, match="format-only"):
        get_preset("nope")


def test_rewards_are_picklable():
    """TRL's async rollout worker sends reward functions to a spawned process."""
    for f in [strict_format_reward, correctness_reward, partial_correctness_reward, R.math_verify_reward,
              get_target_length_reward(5, unit="words"), get_repetition_penalty_reward(),
              get_soft_overlong_punishment_reward(10, 2), get_prefilled_format_reward()]:
        g = pickle.loads(pickle.dumps(f))
        assert g.__name__ == f.__name__
        assert g(completions=[GOOD], answer=["42"], completion_ids=[[1, 2]]) == f(
            completions=[GOOD], answer=["42"], completion_ids=[[1, 2]])


# --------------------------------------------------------------------------- math-verify


def test_math_verify_reward_equivalences():
    mv = get_math_verify_reward()
    comps = ["<answer>\\frac{1}{2}</answer>", "<answer>0.5</answer>", "<answer>$\\boxed{\\frac{2}{4}}$</answer>",
             "<answer>1/3</answer>", "no answer block 1/2", "<answer>18</answer>", "<answer>18</answer>"]
    golds = ["1/2"] * 5 + ["18", "not a math answer ??"]
    assert mv(completions=comps, answer=golds) == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0, None]
    assert mv.stats["gold_unparsed"] == 1
    whole = get_math_verify_reward(use_answer_block=False, name="mv_whole_reward")
    assert whole(completions=["The answer is $\\boxed{\\frac{1}{2}}$."], answer=["0.5"]) == [1.0]
    assert mv(completions=[GOOD], answer=[None]) == [None]


def test_math_verify_screens_bombs_without_parsing():
    mv = get_math_verify_reward()
    t0 = time.perf_counter()
    got = mv(completions=["<answer>9**9**9**9</answer>", "<answer>9^{9^{9^{9}}}</answer>",
                          "<answer>" + "1" * 5000 + "</answer>"], answer=["18"] * 3)
    assert got == [0.0, 0.0, 0.0]
    assert time.perf_counter() - t0 < 2.0
    assert mv.stats["dangerous"] == 2 and mv.stats["too_long"] == 1


def test_math_verify_time_limit_main_thread(monkeypatch):
    """With the screen off, the SIGALRM guard stops a power tower at the time limit."""
    monkeypatch.setattr(R, "_DANGEROUS", re.compile(r"(?!x)x"))
    mv = get_math_verify_reward(time_limit=0.3)
    t0 = time.perf_counter()
    assert mv(completions=["<answer>9**9**9**9</answer>", "<answer>18</answer>"], answer=["18", "18"]) == [0.0, 1.0]
    assert time.perf_counter() - t0 < 2.5
    assert mv.stats["timeouts"] == 1


def test_math_verify_outside_main_thread_uses_a_killable_worker(monkeypatch):
    monkeypatch.setattr(R, "_DANGEROUS", re.compile(r"(?!x)x"))
    mv = get_math_verify_reward(time_limit=0.5)
    out = {}

    def run():
        t0 = time.perf_counter()
        out["scores"] = mv(completions=["<answer>2**(2**(2**20))</answer>", "<answer>\\frac{36}{2}</answer>"],
                           answer=["18", "18"])
        out["seconds"] = time.perf_counter() - t0

    th = threading.Thread(target=run)
    th.start()
    th.join(120)
    mv.worker.close()
    assert out["scores"] == [0.0, 1.0]
    assert mv.stats["timeouts"] == 1
    assert out["seconds"] < 30  # two worker starts (~1-3 s each) + 0.5 s limit, never the bomb's hours


def test_run_with_time_limit_refuses_other_threads():
    err = {}

    def run():
        try:
            R.run_with_time_limit(lambda: 1, 1.0)
        except RuntimeError as exc:
            err["msg"] = str(exc)

    th = threading.Thread(target=run)
    th.start()
    th.join()
    assert "TimeLimitedWorker" in err["msg"]


# --------------------------------------------------------------------------- property-based

TAG = st.sampled_from([REASONING_START, REASONING_END, ANSWER_START, ANSWER_END, "\n", " ", "42", "-3.5",
                       "$1,234", "\\frac{1}{2}", "<answer", "answer>", "</", "<"])
TEXT = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(TAG, st.text(max_size=8)), max_size=40).map("".join),
    st.builds(lambda a, n: a * n, st.sampled_from([REASONING_START, ANSWER_END, "(", "9^", "<answer>1"]),
              st.integers(0, 3000)),
)
COMPLETION = st.one_of(TEXT, TEXT.map(conv), st.none(), st.just(conv(None)),
                       st.just([{"role": "assistant"}]), st.just([]))

FAST_REWARDS = [
    strict_format_reward, soft_format_reward, xmlcount_reward, correctness_reward, numeric_answer_reward,
    partial_correctness_reward, get_target_length_reward(20, unit="words"), get_target_length_reward(8),
    get_repetition_penalty_reward(), get_repetition_penalty_reward(unit="tokens"),
    get_soft_overlong_punishment_reward(16, 4), get_prefilled_format_reward(),
    with_prefill(xmlcount_reward, prefill=PREFILL),
] + [f for f, _ in get_preset("arithmetic")]

NONE_ALLOWED = {"partial_correctness_reward", "target_length_8_tokens_reward",
                "repetition_penalty_3gram_reward", "soft_overlong_punishment_reward"}


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    comps=st.lists(COMPLETION, min_size=0, max_size=8),
    answers=st.lists(st.one_of(st.none(), st.text(max_size=12), st.sampled_from(["42", "-7", "3.5", "1,234"])),
                     min_size=8, max_size=8),
    with_ids=st.booleans(),
    prompt=st.sampled_from([None, PREFILLED_PROMPT, PREFILLED_PROMPT[:2], "x<reasoning>\n", 7]),
)
def test_rewards_never_raise_on_generated_text(comps, answers, with_ids, prompt):
    n = len(comps)
    errors_before = {id(f): getattr(f, "errors", 0) for f in FAST_REWARDS}
    ids = [list(range(len(completion_text(c)) % 40)) for c in comps] if with_ids else None
    for f in FAST_REWARDS:
        out = f(prompts=[prompt] * n, completions=comps, completion_ids=ids, answer=answers[:n])
        assert isinstance(out, list) and len(out) == n, f.__name__
        for v in out:
            assert v is None or isinstance(v, float), (f.__name__, v)
            if v is None:
                assert f.__name__ in NONE_ALLOWED, f.__name__
        if f is xmlcount_reward:
            assert all(-1.0 <= v <= 1.0 for v in out)
        if f in (strict_format_reward, soft_format_reward):
            assert set(out) <= {0.0, 1.0}
        assert getattr(f, "errors", 0) == errors_before[id(f)], (f.__name__, f.last_error)


@settings(max_examples=1000, deadline=None)
@given(st.text(max_size=60))
def test_parsers_total_on_any_text(text):
    a = extract_answer(text)
    assert a is None or isinstance(a, str)
    n = normalize_number(text)
    assert n is None or re.fullmatch(r"-?\d+(\.\d*[1-9])?", n)
    if n is not None:
        assert normalize_number(n) == n  # idempotent


@settings(max_examples=200, deadline=None)
@given(st.integers(-10**9, 10**9), st.integers(0, 3))
def test_normalize_number_roundtrips_formatted_numbers(value, zeros):
    s = f"{value:,}" + ("." + "0" * zeros if zeros else "")
    assert normalize_number(s) == str(value)
    assert normalize_number("$" + s + ".") == str(value) if zeros == 0 else True


@settings(max_examples=40, deadline=None)
@given(st.lists(TEXT, min_size=1, max_size=4))
def test_math_verify_never_raises(texts):
    mv = R.math_verify_reward
    comps = [ANSWER_START + t[:100] + ANSWER_END for t in texts]
    out = mv(completions=comps, answer=["1/2"] * len(comps))
    assert len(out) == len(comps) and all(v in (0.0, 1.0) for v in out)


def test_huge_and_adversarial_completions():
    """Megabyte completions and tag soups: linear-time parsing, right shape, no error."""
    huge = [
        "<reasoning>\n" + "x" * 1_000_000,
        "<reasoning>" * 100_000,
        ("<answer>1</answer>" * 50_000),
        GOOD + "\n" + "y " * 500_000,
        "\u202e\u0000" * 10_000 + GOOD,
    ]
    for f in FAST_REWARDS + [R.math_verify_reward]:
        out = f(prompts=[PREFILLED_PROMPT] * len(huge), completions=huge, answer=["42"] * len(huge),
                completion_ids=[[1] * 10] * len(huge))
        assert len(out) == len(huge) and all(v is None or isinstance(v, float) for v in out), f.__name__
    assert strict_format_reward(completions=huge)[3] == 0.0
    assert soft_format_reward(completions=huge)[4] == 1.0
    assert correctness_reward(completions=huge, answer=["1"] * 5)[2] == 2.0

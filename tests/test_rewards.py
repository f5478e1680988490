"""helpers.rewards: reading completions as TRL hands them over, the Prefilled wrapper, reward lists with weights.

The rewards of each task are tested beside the task (tests/tasks/)."""

from __future__ import annotations

import importlib
import pickle

import pytest

from helpers.rewards import Prefilled, clip, completion_text, completion_texts, weighted
from helpers.tasks import get_task
from helpers.tasks.reasoning import (
    PREFILL,
    correctness_reward,
    prefilled_strict_format_reward,
    strict_format_reward,
    xmlcount_reward,
)

GENERATED = "15 + 27 = 42\n</reasoning>\n<answer>\n42\n</answer>"


def conv(text):
    return [{"role": "assistant", "content": text}]


class Unprintable:
    def __str__(self):
        raise RuntimeError("no text")


def spy_reward(completions, answer=None, **kwargs):
    """A module-level reward (so it pickles) that returns the texts it was given."""
    return [f"{c}|{a}|{sorted(kwargs)}" for c, a in zip(completions, answer or [None] * len(completions))]


def starts_with_hi(completions, **kwargs):
    return [float(t.startswith("HI")) for t in completions]


# --------------------------------------------------------------------------- reading completions


@pytest.mark.parametrize("completion, text", [
    ("plain", "plain"),
    (conv("hi"), "hi"),
    ({"role": "assistant", "content": "one message"}, "one message"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "a"),
    ([{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}], "a\nb"),
    ([{"role": "tool", "content": "x"}], "x"),  # no assistant message: every message
    (conv(None), ""),
    (conv([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]), "ab"),
    (conv(["a", {"type": "image"}, "b"]), "ab"),
    ([{"role": "assistant"}], ""),
    (["not a message"], ""),
    ([], ""),
    ((), ""),
    (None, ""),
    (42, "42"),
    (Unprintable(), ""),
])
def test_completion_text(completion, text):
    assert completion_text(completion) == text


def test_completion_texts():
    assert completion_texts(None) == []
    assert completion_texts("one") == ["one"]
    assert completion_texts(["a", conv("b"), None]) == ["a", "b", ""]
    assert completion_texts(42) == ["42"]  # not iterable: one completion
    assert completion_texts(iter(["a"])) == ["a"]
    assert completion_texts([Unprintable(), "x"]) == ["", "x"]


def test_clip_shows_one_line_cut_to_the_width():
    assert clip("a\nb", 9) == "a \u21b5 b" and clip("abcdef", 4) == "abc\u2026" and clip("abcd", 4) == "abcd"
    assert clip(42, 10) == "42" and clip("x" * 100 + "\ny", None) == "x" * 100 + " \u21b5 y"


# --------------------------------------------------------------------------- Prefilled


def test_prefilled_scores_the_prefill_plus_the_completion():
    wrapped = Prefilled(spy_reward, "[P]")
    assert wrapped(completions=["a", conv("b")], answer=["1", "2"], trainer_state=None) == [
        "[P]a|1|['trainer_state']", "[P]b|2|['trainer_state']"]  # every other column passes through untouched
    assert wrapped(completions=None) == []
    assert wrapped(completions=[None]) == ["[P]|None|[]"]
    assert wrapped(["x"]) == ["[P]x|None|[]"]  # positional, as notebook 02 calls rewards
    assert Prefilled(strict_format_reward, PREFILL)(completions=[GENERATED, PREFILL + GENERATED]) == [1.0, 0.0]


def test_prefilled_is_named_and_documented_for_trls_logs():
    shout = Prefilled(starts_with_hi, "HI")
    assert shout.__name__ == "prefilled_starts_with_hi"
    assert shout.__doc__ == "starts_with_hi on 'HI' + completion (the chat template wrote the prefill)."
    assert repr(shout) == "Prefilled(starts_with_hi, 'HI')"
    assert (shout.reward, shout.prefill) == (starts_with_hi, "HI")
    assert Prefilled(lambda completions, **kw: [], "x").__name__ == "prefilled_<lambda>"

    class Scorer:
        def __call__(self, completions, **kwargs):
            return [1.0] * len(completions)

    assert Prefilled(Scorer(), "x").__name__ == "prefilled_Scorer"  # an object without a __name__


def test_a_prefilled_reward_pickles_and_keeps_its_behaviour():
    """Launchers that spawn processes pickle reward functions: a Prefilled is a plain module-level class."""
    shout = Prefilled(starts_with_hi, "H")
    back = pickle.loads(pickle.dumps(shout))
    assert isinstance(back, Prefilled) and back.__name__ == shout.__name__ and back.prefill == "H"
    assert back.reward is starts_with_hi and back(completions=["I there", "x"]) == [1.0, 0.0]
    module_level = pickle.loads(pickle.dumps(prefilled_strict_format_reward))
    assert module_level(completions=[GENERATED]) == [1.0] and module_level.reward is strict_format_reward


def test_a_module_level_prefilled_reward_is_importable_by_name():
    """`trl grpo` loads rewards by dotted path: each task's Prefilled rewards are module-level names, beside the
    reward they wrap or in the task's module."""
    for key in ("arithmetic", "json"):
        task = get_task(key)
        for func, _ in task.rewards:
            if isinstance(func, Prefilled):
                homes = [importlib.import_module(m) for m in (func.reward.__module__, type(task).__module__)]
                assert any(getattr(m, func.__name__, None) is func for m in homes), func.__name__


def test_the_prefill_written_twice_is_shown_twice():
    """A model that writes the prefilled tag again is scored on the text with it twice: an error, counted."""
    wrapped = Prefilled(xmlcount_reward, PREFILL)
    assert wrapped(completions=[GENERATED]) == [1.0]
    assert wrapped(completions=[PREFILL + GENERATED]) == [0.75 - 0.125]


# --------------------------------------------------------------------------- reward lists and weights


def test_weighted_accepts_a_function_a_list_and_pairs():
    assert weighted(correctness_reward) == [("correctness_reward", correctness_reward, 1.0)]
    assert [(n, w) for n, _, w in weighted([correctness_reward, (strict_format_reward, 0.5)])] == [
        ("correctness_reward", 1.0), ("strict_format_reward", 0.5)]
    assert [w for _, _, w in weighted(get_task("arithmetic").rewards)] == [1.0, 0.5, 0.5, 0.25]
    assert isinstance(weighted([(correctness_reward, 2)])[0][2], float)
    assert weighted((f for f in [correctness_reward]))[0][0] == "correctness_reward"  # any iterable
    assert [n for n, _, _ in weighted([Prefilled(starts_with_hi, "HI")])] == ["prefilled_starts_with_hi"]


def test_weighted_refuses_shared_names_and_non_functions():
    with pytest.raises(ValueError, match=r"share the name\(s\) \['correctness_reward'\].*__name__"):
        weighted([correctness_reward, (correctness_reward, 0.5)])
    with pytest.raises(ValueError, match=r"\['prefilled_starts_with_hi'\]"):
        weighted([Prefilled(starts_with_hi, "a"), Prefilled(starts_with_hi, "b")])  # two prefills, one name
    with pytest.raises(TypeError, match="reward function or a \\(function, weight\\) pair, got 42"):
        weighted([42])
    with pytest.raises(TypeError, match=r"got \('correctness_reward', 1.0\)"):
        weighted([("correctness_reward", 1.0)])

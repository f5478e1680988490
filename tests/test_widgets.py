"""helpers.widgets: the reward playground, the completions explorer and the chat box (with a fake model)."""

from __future__ import annotations

import html
import re

import pytest

from helpers.explorer import render_step
from helpers.tasks import get_task
from helpers.tasks.reasoning import SYSTEM_PROMPT, correctness_reward, strict_format_reward
from helpers.widgets import chat_box, completions_explorer, reward_playground

GENERATED = "18 + 17 = 35\n</reasoning>\n<answer>\n35\n</answer>"


def scores(out) -> dict[str, str]:
    """The playground's table, ``{row name: shown value}``."""
    text = html.unescape(re.fullmatch(r"<pre[^>]*>(.*)</pre>", out.value, re.DOTALL)[1])
    return dict(line.split() for line in text.splitlines())


def test_reward_playground_scores_as_you_type():
    box = reward_playground(get_task("arithmetic").rewards, text=GENERATED, answer="35")
    gold, text, out = box.children
    assert (gold.value, text.value) == ("35", GENERATED)
    assert scores(out) == {"correctness_reward": "2.000", "partial_correctness_reward": "1.000",
                           "prefilled_strict_format_reward": "1.000", "prefilled_xmlcount_reward": "1.000",
                           "total": "3.250"}
    text.value = "<answer>35</answer>"
    assert scores(out)["prefilled_strict_format_reward"] == "0.000" and scores(out)["correctness_reward"] == "2.000"
    gold.value = "36"
    assert scores(out)["correctness_reward"] == "0.000"
    gold.value = ""  # no gold answer: nothing is right
    assert scores(out)["correctness_reward"] == "0.000" and scores(out)["partial_correctness_reward"] == "NaN"


def test_reward_playground_escapes_what_it_shows():
    def odd_reward(completions, **kwargs):
        return [float(len(c)) for c in completions]

    odd_reward.__name__ = "<b>odd</b>_reward"
    out = reward_playground([odd_reward, strict_format_reward], text="<x>").children[2]
    assert "<b>" not in out.value and "&lt;b&gt;odd&lt;/b&gt;_reward" in out.value
    assert scores(out)["<b>odd</b>_reward"] == "3.000"


def test_reward_playground_passes_other_columns_to_the_rewards():
    """The JSON task's rewards read the row's schema too: it is given once and passed as TRL passes it."""
    schema = '{"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}'
    box = reward_playground(get_task("json").rewards, text='name": "Ava"}', answer='{"name": "Ava"}', schema=schema)
    gold, text, out = box.children
    assert scores(out)["prefilled_schema_valid_reward"] == "1.000" and scores(out)["prefilled_exact_match_reward"] == (
        "1.000")
    text.value = 'name": 3}'
    assert scores(out)["prefilled_schema_valid_reward"] == "0.000" and scores(out)["prefilled_field_match_reward"] == (
        "0.000")
    assert scores(reward_playground(get_task("json").rewards, text="x").children[2])[
        "prefilled_schema_valid_reward"] == "NaN"  # no schema given: the reward does not apply


def _completions():
    import pandas as pd

    rows = []
    for step in (1, 2):
        for i, (text, ok) in enumerate([("<answer>4</answer>", 2.0), ("no idea", 0.0)]):
            rows.append(dict(step=step, prompt="...user\nWhat is 2 + 2?", completion=f"{text} (step {step})",
                             answer="4", correctness_reward=ok, advantage=1.0 if ok else -1.0))
    df = pd.DataFrame(rows)
    df["reward"] = df["correctness_reward"]
    return df


def test_completions_explorer_shows_the_latest_step_and_follows_the_slider():
    df = _completions()
    box = completions_explorer(df)
    slider, view = box.children
    assert list(slider.options) == [1, 2] and slider.value == 2
    assert view.value == render_step(df, 2) and "(step 2)" in view.value and "(step 1)" not in view.value
    slider.value = 1
    assert view.value == render_step(df, 1) and "(step 1)" in view.value


class FakeTranscript:
    """Stands in for helpers.generation.transcript: records each call, answers with markup to escape."""

    def __init__(self):
        self.calls = []

    def __call__(self, model, tokenizer, questions, settings, system_prompt=None, adapter=None,
                 chat_template_kwargs=None):
        self.calls.append(dict(model=model, tokenizer=tokenizer, questions=questions, settings=settings,
                               system_prompt=system_prompt, adapter=adapter, chat_template_kwargs=chat_template_kwargs))
        return [m for q in questions for m in ({"role": "user", "content": q},
                                              {"role": "assistant", "content": "<reasoning>\n7 + 5 = 12 <ok>"})]


@pytest.fixture()
def fake_transcript(monkeypatch):
    fake = FakeTranscript()
    monkeypatch.setattr("helpers.widgets.transcript", fake)
    return fake


def test_chat_box_asks_a_fresh_question_and_shows_the_turns(fake_transcript):
    box = chat_box("MODEL", "TOK", "SETTINGS", system_prompt=SYSTEM_PROMPT, adapter="adapter/",
                   chat_template_kwargs={"enable_thinking": False})
    (text, send), view = box.children[0].children, box.children[1]
    text.value = "  What is 7 + 5?  "
    send.click()
    assert fake_transcript.calls == [dict(model="MODEL", tokenizer="TOK", questions=["What is 7 + 5?"],
                                          settings="SETTINGS", system_prompt=SYSTEM_PROMPT, adapter="adapter/",
                                          chat_template_kwargs={"enable_thinking": False})]
    assert text.value == ""
    assert "<b>you:</b>" in view.value and "What is 7 + 5?" in view.value
    assert "<b>model:</b>" in view.value and "&lt;reasoning&gt;\n7 + 5 = 12 &lt;ok&gt;" in view.value
    text.value = "And 1 + 1?"
    send.click()
    assert view.value.count("<b>you:</b>") == 2 and fake_transcript.calls[-1]["questions"] == ["And 1 + 1?"]


def test_chat_box_ignores_an_empty_question(fake_transcript):
    box = chat_box(None, None, None)
    (text, send), view = box.children[0].children, box.children[1]
    text.value = "   "
    send.click()
    assert fake_transcript.calls == [] and view.value == ""
    text.value = "hi"
    send.click()
    assert fake_transcript.calls[0]["system_prompt"] is None  # no system prompt unless one is given


def test_correctness_reward_is_what_the_playground_scores():
    # the playground passes the gold answer as TRL does (one per completion)
    out = reward_playground([correctness_reward], text="<answer>$35.00</answer>", answer="35").children[2]
    assert scores(out) == {"correctness_reward": "2.000", "total": "2.000"}

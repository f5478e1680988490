"""Chat helpers: conversations, prefill, transcript text and the widget (a fake generator)."""

import pytest

from helpers import chat
from helpers.chat import (
    chat_widget,
    format_transcript,
    reply,
    reply_with_prefill,
    start_conversation,
    transcript,
)
from helpers.prompts import SYSTEM_PROMPT


@pytest.fixture()
def fake_generate(monkeypatch):
    """Replace generation with an echo that records the prompts it was given."""
    seen = []

    def fake(model, tok, prompts, settings, batch_size=16, adapter=None):
        seen.append({"prompts": prompts, "adapter": adapter, "settings": settings})
        return [[f"echo:{p[-1]['content']}"] for p in prompts]

    monkeypatch.setattr("helpers.generation.generate", fake)
    return seen


def test_start_conversation_respects_the_system_role():
    assert start_conversation() == [{"role": "system", "content": SYSTEM_PROMPT}]
    assert start_conversation(system_role=False) == []
    assert start_conversation(system_prompt=None) == []


def test_reply_needs_a_user_turn_last(fake_generate):
    with pytest.raises(ValueError, match="user message"):
        reply(None, None, [{"role": "system", "content": "x"}])
    assert reply(None, None, [{"role": "user", "content": "hi"}], adapter="a") == "echo:hi"
    assert fake_generate[0]["adapter"] == "a"
    assert fake_generate[0]["settings"].temperature == 0.0


def test_prefill_is_sent_as_an_assistant_turn_and_kept_in_the_answer(fake_generate):
    out = reply_with_prefill(None, None, [{"role": "user", "content": "2+2?"}], prefill="<reasoning>\n")
    sent = fake_generate[0]["prompts"][0]
    assert sent[-1] == {"role": "assistant", "content": "<reasoning>\n"}
    assert out == "<reasoning>\necho:<reasoning>\n"


def test_transcript_fresh_conversations_by_default(fake_generate):
    msgs = transcript(None, None, ["a?", "b?"])
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert [len(call["prompts"][0]) for call in fake_generate] == [2, 2]  # system + user each time
    transcript(None, None, ["a?", "b?"], multi_turn=True)
    assert len(fake_generate[-1]["prompts"][0]) == 4  # system, a, answer, b
    assert format_transcript(msgs).splitlines()[0] == "you: a?"


def test_widget_send_and_reset(fake_generate):
    box = chat_widget(None, None, prefill="<r>")
    (text, send, reset), view = box.children[0].children, box.children[1]
    text.value = "What is 7 + 5?"
    send.click()
    assert "What is 7 + 5?" in view.value and "echo:&lt;r&gt;" in view.value
    assert text.value == ""
    reset.click()
    assert view.value == ""

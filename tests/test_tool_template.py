"""helpers.tool_template: the bundled model gets a chat template TRL's tool loop accepts, renders and parses; the GPU
profiles' models are checked with TRL's shipped copies of their own templates (no hub here)."""

from __future__ import annotations

import json

import pytest
import trl.chat_template_utils as ctu
from transformers.utils import get_json_schema

from helpers.calculator import calculator
from helpers.models import load_tokenizer
from helpers.profiles import get_profile
from helpers.tool_template import (COMPACT_TOOL_TEMPLATE, example_tool_conversation, is_chatml, needs_tool_template,
                                   use_tool_template)


@pytest.fixture()
def tok():
    """A fresh SmolLM2 tokenizer, prepared as the course loads it (end of turn <|im_end|> as EOS)."""
    return load_tokenizer(get_profile("cpu-smoke", task="tools"))


def test_the_bundled_models_own_template_cannot_render_tool_calls(tok):
    assert needs_tool_template(tok) and not ctu.supports_tool_calling(tok) and is_chatml(tok)
    rendered = tok.apply_chat_template(example_tool_conversation(), tokenize=False)
    assert "expression" not in rendered  # the call is silently dropped: why TRL refuses this template


def test_the_compact_template_renders_a_full_tool_conversation(tok):
    assert use_tool_template(tok) is tok and tok.chat_template == COMPACT_TOOL_TEMPLATE
    assert not needs_tool_template(tok) and ctu.is_chat_template_prefix_preserving(tok)
    text = tok.apply_chat_template(example_tool_conversation("347 * 58", "20126"), tools=[calculator],
                                   tokenize=False)
    assert text == (
        "<|im_start|>system\nUse the calculator for arithmetic.\nTools:\n"
        "- calculator(expression): Evaluates an arithmetic expression and returns its value.\n"
        'Call a tool with <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWhat is 347 * 58?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "347 * 58"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>tool\n20126<|im_end|>\n"
        "<|im_start|>assistant\n20126<|im_end|>\n")
    # every turn marker is one token of SmolLM2's vocabulary, and <|im_end|> is what the model stops on
    ids = tok.apply_chat_template(example_tool_conversation(), tokenize=True, return_dict=False)
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 5 and tok.eos_token == "<|im_end|>"
    # the prompt the model reads, four times shorter than with Qwen2.5's tool preamble
    prompt = example_tool_conversation()[:2]
    short = tok.apply_chat_template(prompt, tools=[calculator], add_generation_prompt=True, return_dict=False)
    qwen = tok.apply_chat_template(prompt, tools=[calculator], add_generation_prompt=True, return_dict=False,
                                   chat_template=ctu.qwen2_5_chat_template)
    assert len(short) < 80 < 3 * len(short) < len(qwen)


def test_the_warm_up_trains_the_models_turns_and_not_the_tools_reply(tok):
    """SFTTrainer(assistant_only_loss=True) masks by the template's {% generation %} markers."""
    use_tool_template(tok)
    assert ctu.has_generation_markers(tok.chat_template) and ctu.is_chat_template_stop_token_trained(tok)
    out = tok.apply_chat_template(example_tool_conversation(), tools=[calculator], tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    trained = tok.decode([i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m])
    assert trained == ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call>'
                       "<|im_end|>\n408<|im_end|>\n")  # the call and the answer; the tool's 408 is not in it


def test_trls_copy_of_qwen25s_template_is_the_other_choice(tok):
    use_tool_template(tok, "qwen2.5")
    assert tok.chat_template == ctu.qwen2_5_chat_template and getattr(tok, "response_template", None) is None
    text = tok.apply_chat_template(example_tool_conversation(), tools=[calculator], tokenize=False)
    assert "<tool_response>\n408\n</tool_response>" in text and "<tools>\n" + json.dumps(
        get_json_schema(calculator)) + "\n</tools>" in text
    ctu.add_response_schema(tok)  # what GRPOTrainer(tools=...) does at init (grpo_trainer.py 729-733)
    assert tok.response_template is ctu.qwen3_template
    with pytest.raises(ValueError, match="template='qwen3'"):
        use_tool_template(load_tokenizer(get_profile("cpu-smoke")), "qwen3")


@pytest.mark.parametrize("template", ["compact", "qwen2.5"])
def test_trl_parses_the_models_call(tok, template):
    use_tool_template(tok, template)
    if template == "qwen2.5":
        ctu.add_response_schema(tok)  # TRL recognises its own copy of the template (GRPOTrainer does this at init)
    prompt = tok.apply_chat_template(example_tool_conversation()[:2], tools=[calculator], add_generation_prompt=True,
                                     tokenize=True, return_dict=False)
    written = tok('<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call><|im_end|>',
                  add_special_tokens=False)["input_ids"]
    assert ctu.parse_response(tok, written, prefix=prompt) == {
        "role": "assistant", "content": "",
        "tool_calls": [{"type": "function",
                        "function": {"name": "calculator", "arguments": {"expression": "12 * 34"}}}]}
    # a malformed call (the expression not quoted: not JSON) falls back to plain text: no tool runs
    broken = tok('<tool_call>\n{"name": "calculator", "arguments": {"expression": 12 * 34}}\n</tool_call><|im_end|>',
                 add_special_tokens=False)["input_ids"]
    parsed = ctu.parse_response(tok, broken, prefix=prompt)
    assert "tool_calls" not in parsed and parsed["content"].startswith("<tool_call>")


@pytest.mark.parametrize("name, renders", [("qwen2_5", True), ("qwen3", True), ("gemma3", False)])
def test_the_gpu_profiles_templates(tok, name, renders):
    """Qwen2.5 (colab-t4) and Qwen3 (gpu-large) render tool calls with their own templates; Gemma 3's refuses a
    tool message, so TRL refuses it and the course's tool notebook needs a Qwen model on a GPU."""
    tok.chat_template = getattr(ctu, f"{name}_chat_template")  # TRL's copies of the models' original templates
    assert ctu.supports_tool_calling(tok) is renders
    if renders:
        text = tok.apply_chat_template(example_tool_conversation(), tools=[calculator], tokenize=False)
        assert '"name": "calculator"' in text and "<tool_response>\n408\n</tool_response>" in text
        ctu.add_response_schema(tok)  # TRL knows how to parse their calls
        assert getattr(tok, "response_template", None) is not None
    else:
        with pytest.raises(ValueError, match="Use a model whose template renders tools"):
            use_tool_template(_not_chatml(tok))


def _not_chatml(tok):
    class NotChatML:
        chat_template = tok.chat_template
        apply_chat_template = tok.apply_chat_template

        def get_vocab(self):
            return {"<start_of_turn>": 1}
    return NotChatML()


def test_a_template_that_already_renders_tools_is_kept_and_gets_trls_parser(tok):
    tok.chat_template = ctu.qwen3_chat_template
    assert use_tool_template(tok).chat_template == ctu.qwen3_chat_template
    assert tok.response_template is ctu.qwen3_template  # what GRPOTrainer would set: TRL recognises the text


def test_an_edited_qwen_template_gets_the_qwen_parser(tok):
    """A library or a checkpoint may edit a Qwen template (Unsloth patches some): TRL no longer recognises its text,
    but its calls are Qwen's, so TRL's Qwen parser reads them."""
    tok.chat_template = ctu.qwen2_5_chat_template + "{#- edited #}"
    assert use_tool_template(tok).chat_template.endswith("{#- edited #}")
    assert tok.response_template is ctu.qwen3_template
    other = load_tokenizer(get_profile("cpu-smoke"))
    other.chat_template = ctu.qwen2_5_chat_template.replace("<tool_call>", "<call>").replace("</tool_call>", "</call>")
    with pytest.raises(ValueError, match="set tokenizer.response_template"):
        use_tool_template(other)

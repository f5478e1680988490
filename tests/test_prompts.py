"""helpers.prompts: prompts, the prefill in the chat template, rendering and encoding as TRL does, the system role.

The prefills here are the course tasks' (``<reasoning>\n``, ``{"``) and odd ones: the module names no task."""

from __future__ import annotations

import copy

import pytest

from helpers.prompts import (
    build_prompt,
    encode,
    install_prefill,
    installed_prefill,
    render,
    supports_system_role,
    text_tokenizer,
)
from helpers.tasks.orders import JSON_PREFILL
from helpers.tasks.reasoning import PREFILL, SYSTEM_PROMPT, reference_completion

GEMMA_LIKE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
DROPS_SYSTEM = (
    "{% for m in messages %}{% if m['role'] != 'system' %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
THINKING = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not enable_thinking %}"
    "<think></think>{% endif %}{% endif %}")
Q = build_prompt("What is 2 + 3?", SYSTEM_PROMPT)


@pytest.fixture(scope="module")
def bundled():
    from transformers import AutoTokenizer

    from helpers.models import bundled_model_path

    return AutoTokenizer.from_pretrained(bundled_model_path(build=False))


@pytest.fixture()
def tok(bundled):
    """A fresh copy per test: install_prefill changes the tokenizer it is given."""
    return copy.deepcopy(bundled)


def with_template(tokenizer, template):
    tokenizer.chat_template = template
    return tokenizer


class Processor:
    """Like a multimodal processor (Gemma 3 through Unsloth): its own template, a text tokenizer inside."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.chat_template = tokenizer.chat_template

    def apply_chat_template(self, conversation, **kwargs):
        saved, self.tokenizer.chat_template = self.tokenizer.chat_template, self.chat_template
        try:
            return self.tokenizer.apply_chat_template(conversation, **kwargs)
        finally:
            self.tokenizer.chat_template = saved

    def __call__(self, images=None, text=None, **kwargs):
        if images is not None:
            raise AssertionError("a processor's first argument is images: pass text=")
        return self.tokenizer(text=text, **kwargs)


# --------------------------------------------------------------------------- prompts


def test_build_prompt():
    assert Q == [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "What is 2 + 3?"}]
    assert build_prompt("Q", SYSTEM_PROMPT, system_role=False) == [{"role": "user", "content": f"{SYSTEM_PROMPT}\n\nQ"}]
    assert build_prompt("Q") == build_prompt("Q", system_prompt=None) == build_prompt("Q", system_prompt="") == [
        {"role": "user", "content": "Q"}]
    assert build_prompt("Q", system_prompt=None, system_role=False) == [{"role": "user", "content": "Q"}]
    assert build_prompt("Q", system_prompt="Be brief.")[0] == {"role": "system", "content": "Be brief."}


def test_text_tokenizer_unwraps_a_processor(bundled):
    assert text_tokenizer(bundled) is bundled
    assert text_tokenizer(Processor(bundled)) is bundled


# --------------------------------------------------------------------------- the prefill in the template


def test_install_prefill_ends_every_generation_prompt_with_it(tok):
    assert render(tok, Q).endswith("<|im_start|>assistant\n")
    assert install_prefill(tok, PREFILL) is tok
    assert render(tok, Q) == (f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n"
                              "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n<reasoning>\n")
    assert installed_prefill(tok) == PREFILL


def test_install_prefill_leaves_a_rendered_conversation_unchanged(tok, bundled):
    """SFTTrainer renders prompt + answer without a generation prompt: the answer carries the tag itself."""
    chat = Q + [{"role": "assistant", "content": reference_completion("2 + 3 = 5", "5")}]
    install_prefill(tok, PREFILL)
    assert tok.apply_chat_template(chat, tokenize=False) == bundled.apply_chat_template(chat, tokenize=False)


def test_install_prefill_is_idempotent_replaceable_and_removable(tok, bundled):
    once = install_prefill(tok, PREFILL).chat_template
    assert install_prefill(tok, PREFILL).chat_template == once
    install_prefill(tok, "<think>\n")
    assert render(tok, Q).endswith("assistant\n<think>\n") and "<reasoning>\n" not in render(tok, Q)[-30:]
    assert installed_prefill(tok) == "<think>\n"
    for removed in ("", None):
        install_prefill(tok, PREFILL)
        install_prefill(tok, removed)
        assert tok.chat_template == bundled.chat_template
        assert installed_prefill(tok) == "" and render(tok, Q) == render(bundled, Q)


@pytest.mark.parametrize("prefill, answer", [(PREFILL, reference_completion("2 + 3 = 5", "5")),
                                             (JSON_PREFILL, '{"name": "Ava", "quantity": 2}')])
def test_a_prompt_is_a_token_prefix_of_prompt_plus_answer(tok, prefill, answer):
    """What SFTTrainer trains on (the rendered conversation) starts with exactly the tokens GRPO generates after:
    the prefill must not be split differently once the answer follows it (why the JSON prefill is '{"')."""
    install_prefill(tok, prefill)
    chat = Q + [{"role": "assistant", "content": answer}]
    full = tok(tok.apply_chat_template(chat, tokenize=False), add_special_tokens=False)["input_ids"]
    prompt = encode(tok, [Q])[0]
    assert render(tok, Q).endswith(prefill) and full[:len(prompt)] == prompt


def test_install_prefill_keeps_quotes_backslashes_and_unicode(tok):
    odd = 'He said "hi" \\ {{ x }} {% raw %} \u00e9\u2192\n'
    install_prefill(tok, odd)
    assert render(tok, Q).endswith("<|im_start|>assistant\n" + odd)
    assert installed_prefill(tok) == odd


def test_installed_prefill_without_one(tok):
    assert installed_prefill(tok) == ""
    assert installed_prefill(object()) == ""


def test_the_prefill_survives_save_and_reload(tok, tmp_path):
    from transformers import AutoTokenizer

    install_prefill(tok, PREFILL)
    tok.save_pretrained(tmp_path)
    back = AutoTokenizer.from_pretrained(tmp_path)
    assert installed_prefill(back) == PREFILL
    assert render(back, Q) == render(tok, Q) and encode(back, [Q]) == encode(tok, [Q])
    assert install_prefill(back, PREFILL).chat_template == tok.chat_template  # still idempotent after a reload


def test_install_prefill_on_a_gemma_like_template(tok):
    gemma = with_template(tok, GEMMA_LIKE)
    install_prefill(gemma, PREFILL)
    text = render(gemma, build_prompt("Q", SYSTEM_PROMPT, system_role=False))
    assert text == (f"{gemma.bos_token}<start_of_turn>user\n{SYSTEM_PROMPT}\n\nQ<end_of_turn>\n"
                    "<start_of_turn>model\n<reasoning>\n")
    with pytest.raises(Exception, match="System role not supported"):
        render(gemma, Q)


def test_install_prefill_on_a_processor_wrapping_a_tokenizer(tok, bundled):
    proc = Processor(tok)
    assert install_prefill(proc, PREFILL) is proc
    assert installed_prefill(proc) == installed_prefill(proc.tokenizer) == PREFILL
    assert render(proc, Q).endswith("assistant\n<reasoning>\n")
    assert encode(proc, [Q]) == encode(proc.tokenizer, [Q])
    install_prefill(proc, "")
    assert proc.chat_template == proc.tokenizer.chat_template == bundled.chat_template
    # a text tokenizer without a template of its own is left alone
    proc.tokenizer.chat_template = None
    install_prefill(proc, PREFILL)
    assert installed_prefill(proc) == PREFILL and proc.tokenizer.chat_template is None


def test_install_prefill_needs_a_chat_template(tok):
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        install_prefill(tok, PREFILL)


# --------------------------------------------------------------------------- rendering and encoding as TRL does


def test_render_is_apply_chat_template_with_a_generation_prompt(tok):
    install_prefill(tok, PREFILL)
    assert render(tok, Q) == tok.apply_chat_template(Q, tokenize=False, add_generation_prompt=True)
    assert render(tok, "a plain text prompt") == "a plain text prompt"
    assert render(tok, tuple(Q)) == render(tok, Q)


def test_render_and_encode_pass_chat_template_kwargs(tok):
    thinking = install_prefill(with_template(tok, THINKING), PREFILL)
    assert render(thinking, Q).endswith("<|assistant|><reasoning>\n")
    assert render(thinking, Q, enable_thinking=False).endswith("<|assistant|><think></think><reasoning>\n")
    assert len(encode(thinking, [Q], enable_thinking=False)[0]) > len(encode(thinking, [Q])[0])


def test_encode_is_trls_tokenization(tok):
    install_prefill(tok, PREFILL)
    prompts = [Q, build_prompt("What is 123 + 456? " * 5, SYSTEM_PROMPT), build_prompt("Q", SYSTEM_PROMPT, system_role=False),
               build_prompt("Q")]
    want = tok.apply_chat_template(prompts, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    got = encode(tok, prompts)
    assert got == [list(x) for x in want]
    assert all(isinstance(i, int) for i in got[0])
    assert got[0] == tok(render(tok, Q), add_special_tokens=False)["input_ids"]  # the prefill's tokens included
    assert tok.decode(got[0]).endswith("<|im_start|>assistant\n<reasoning>\n")
    assert encode(tok, []) == []


def test_encode_plain_text_prompts_with_text_keyword(tok):
    texts = ["What is 2 + 3?\nAnswer:", "x"]
    assert encode(tok, texts) == tok(text=texts)["input_ids"]
    proc = Processor(tok)
    assert encode(proc, texts) == encode(tok, texts)  # never passes texts as a processor's images


# --------------------------------------------------------------------------- system role


def test_supports_system_role(tok, bundled):
    assert supports_system_role(bundled) is True
    assert supports_system_role(with_template(copy.deepcopy(bundled), GEMMA_LIKE)) is False
    assert supports_system_role(with_template(tok, DROPS_SYSTEM)) is False  # renders, but drops it

    class Raises:
        def apply_chat_template(self, *args, **kwargs):
            raise ValueError("System role not supported")

    assert supports_system_role(Raises()) is False
    assert supports_system_role(install_prefill(copy.deepcopy(bundled), PREFILL)) is True

"""helpers.warmup: format-only SFT pairs, the chat end-of-turn, and the EOS fix."""

import pytest

from helpers.data import reference_completion
from helpers.models import align_eos_with_chat_template, end_of_turn
from helpers.warmup import warmup_pairs

PROMPT = [{"role": "user", "content": "What is 2 + 3?"}]
PREFILLED = PROMPT + [{"role": "assistant", "content": "<reasoning>\n"}]


def test_pairs_continue_the_prefill_and_end_the_turn():
    rows = [{"prompt": PREFILLED, "solution": "2 + 3 = 5", "answer": "5"}]
    pair = warmup_pairs(rows, render=lambda p: "P", end="<|im_end|>")[0]
    assert pair == {"prompt": "P", "completion": "2 + 3 = 5\n</reasoning>\n<answer>\n5\n</answer><|im_end|>"}
    # without a prefill the completion carries the whole response
    full = warmup_pairs([dict(rows[0], prompt=PROMPT)], render=lambda p: "P", end="")[0]["completion"]
    assert full == reference_completion("2 + 3 = 5", "5")
    assert "<reasoning>\n" + pair["completion"][: -len("<|im_end|>")] == full


def test_pairs_reject_rows_without_a_solution_or_a_foreign_prefill():
    with pytest.raises(ValueError, match="row 0 lacks \\['solution'\\]"):
        warmup_pairs([{"prompt": PROMPT, "answer": "5"}], render=str, end="")
    bad = PROMPT + [{"role": "assistant", "content": "<think>"}]
    with pytest.raises(ValueError, match="not the start of the response format"):
        warmup_pairs([{"prompt": bad, "solution": "x", "answer": "5"}], render=str, end="")


def test_bundled_tokenizer_end_of_turn_and_eos_fix():
    from helpers.models import load_tokenizer

    tok = load_tokenizer()
    assert end_of_turn(tok) == "<|im_end|>"
    class Cfg:  # stands in for model.config / generation_config
        eos_token_id = None
    model = type("M", (), {"config": Cfg(), "generation_config": Cfg()})()
    changed = align_eos_with_chat_template(tok, model)
    assert tok.eos_token == "<|im_end|>"
    assert changed in (None, "<|im_end|>")
    if changed:  # the GGUF-built tokenizer named <|im_start|> as EOS
        assert model.config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert align_eos_with_chat_template(tok, model) is None  # idempotent


@pytest.mark.slow
def test_format_warmup_teaches_the_layout(tmp_path):
    from helpers.config import get_profile
    from helpers.generation import SamplingSettings, generate
    from helpers.models import load_model
    from helpers.training import warmup_rows
    from helpers.warmup import format_warmup

    profile = get_profile("cpu-smoke")
    model, tok = load_model(profile)
    rows = warmup_rows(profile.with_overrides(warmup_examples=16), "<reasoning>\n")
    stats = format_warmup(model, tok, rows, tmp_path, epochs=1)
    assert stats["examples"] == 16 and stats["steps"] == 2 and stats["final_loss"] is not None
    from helpers.data import build_prompt

    out = generate(model, tok, [build_prompt("What is 4 + 4?", prefill=True)],
                   SamplingSettings(max_new_tokens=24))[0][0]
    assert "</reasoning>" in out and "<answer>" in out

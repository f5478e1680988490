"""Prompts exactly as the trainer renders them: the token ids TRL's GRPOTrainer feeds the model
equal what the notebooks display (helpers.prompts.render / encode), what SFTTrainer trains the
warm-up on, and what the evaluation and the chat sample from. For both tasks (the arithmetic prefill
``<reasoning>\n`` and the JSON prefill ``{"``), without a prefill, and on a Qwen3-style template with
thinking turned off through chat_template_kwargs.

The ids are read where they reach the model: a spy on ``model.generate`` (TRL's generation path
and helpers.generation call it) and SFTTrainer's tokenized dataset.
"""

from __future__ import annotations

import copy

import pytest

from helpers.data import ensure_prepared
from helpers.generation import SamplingSettings, generate
from helpers.models import load_model
from helpers.profiles import get_profile
from helpers.prompts import encode, install_prefill, render
from helpers.tasks import get_task
from helpers.tasks.orders import JSON_PREFILL
from helpers.tasks.reasoning import PREFILL
from helpers.training import grpo_config, warmup_dataset

pytestmark = pytest.mark.slow

#: A template shaped like Qwen3's: the generation prompt opens an empty <think> block when thinking
#: is off, and the last assistant turn is rendered with the same empty block before its content.
QWEN3_STYLE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}{%- if loop.last %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{{- message.content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


class Recorded(Exception):
    """Raised by the spy once it holds the prompts of one generation batch: nothing after generation is needed."""


def spy_on_generate(model, stop_after: int | None = None):
    """Record the unpadded prompt ids of every ``model.generate`` call; with ``stop_after``, raise :class:`Recorded`
    (before sampling) once that many prompt rows are recorded. A call is always recorded whole."""
    seen: list[list[int]] = []
    original = model.generate

    def spy(*args, **kwargs):
        for row, mask in zip(kwargs["input_ids"], kwargs["attention_mask"]):
            seen.append(row[mask.bool()].tolist())
        if stop_after is not None and len(seen) >= stop_after:
            raise Recorded
        return original(*args, **kwargs)

    model.generate = spy
    return seen


def trl_prompt_ids(model, tok, profile, run, dataset, **overrides):
    """The prompt ids TRL's GRPOTrainer generates from in its first generation batch (dataset order kept).

    The spy stops the step once the batch's prompts reach ``model.generate`` (TRL may split a batch over several
    calls): no completion is sampled and there is no loss, backward or optimizer step, which these tests do not read."""
    from trl import GRPOTrainer

    rewards = get_task(profile.task).rewards_for(profile.task_level)
    config = grpo_config(profile, run, shuffle_dataset=False, max_steps=1, log_completions=False,
                         save_strategy="no", **overrides)
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=[f for f, _ in rewards], args=config,
                          train_dataset=dataset)
    seen = spy_on_generate(model, stop_after=config.generation_batch_size)
    try:
        trainer.train()
    except Recorded:
        pass
    finally:
        del model.generate  # the spy is an instance attribute: the class's generate again
    assert len(seen) == config.generation_batch_size, (
        f"TRL sent {len(seen)} prompt rows to model.generate, not one generation batch of "
        f"{config.generation_batch_size}: the spy did not see the trainer's inputs")
    return seen


@pytest.fixture(scope="module")
def bundled():
    profile = get_profile("cpu-smoke", max_steps=1)
    model, tok = load_model(profile)
    return profile, model, tok


@pytest.mark.parametrize("task, prefill", [("arithmetic", PREFILL), ("arithmetic", ""), ("json", JSON_PREFILL)],
                         ids=["arithmetic", "no-prefill", "json"])
def test_trainer_notebooks_warmup_and_evaluation_see_the_same_ids(bundled, tmp_path, task, prefill):
    profile, model, tok = bundled
    profile = get_profile(profile.name, task=task, max_steps=1)
    tok = install_prefill(copy.deepcopy(tok), prefill)
    data = ensure_prepared(profile, tmp_path, tokenizer=tok, verbose=False)
    train = data["train"].select(range(profile.per_device_train_batch_size // profile.num_generations))

    expected = encode(tok, train["prompt"])
    # what the notebooks display is the same sequence, as text
    for prompt, ids in zip(train["prompt"], expected):
        assert tok(render(tok, prompt), add_special_tokens=False)["input_ids"] == ids
        assert render(tok, prompt).endswith("<|im_start|>assistant\n" + prefill)

    # TRL's GRPOTrainer: each prompt is generated from num_generations times
    seen = trl_prompt_ids(model, tok, profile, tmp_path / "grpo", train)
    assert seen == [ids for ids in expected for _ in range(profile.num_generations)]

    # the evaluation and the chat (helpers.generation.generate)
    seen = spy_on_generate(model)
    generate(model, tok, train["prompt"], SamplingSettings(max_new_tokens=2))
    assert seen == expected

    # the SFT warm-up: the prompt part of every tokenized row, and the completion continues the prefill (the JSON
    # prefill is '{"', one token, so the rendered prompt is a token prefix of prompt + answer)
    from trl import SFTConfig, SFTTrainer

    rows = warmup_dataset(profile, tok).select(range(3))
    sft = SFTTrainer(model=model, processing_class=tok, train_dataset=rows,
                     args=SFTConfig(output_dir=str(tmp_path / "sft"), use_cpu=True, report_to="none",
                                    completion_only_loss=True, bf16=False, max_steps=0))
    for row, tokenized in zip(rows, sft.train_dataset):
        start = next(i for i, label in enumerate(tokenized["labels"]) if label != -100)  # the loss starts here
        assert tokenized["input_ids"][:start] == encode(tok, [row["prompt"]])[0]
        learned = tok.decode(tokenized["input_ids"][start:])
        assert learned == row["completion"][0]["content"][len(prefill):] + "<|im_end|>\n"


def test_trl_closes_a_final_assistant_message(bundled, tmp_path):
    """The fact notebook 01 teaches: TRL 1.13 renders with add_generation_prompt=True, so a prefill given
    as a final assistant message is closed and a new assistant turn opens after it."""
    from datasets import Dataset

    profile, model, tok = bundled
    tok = install_prefill(copy.deepcopy(tok), "")
    turn = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": PREFILL}]
    seen = trl_prompt_ids(model, tok, profile, tmp_path, Dataset.from_list([{"prompt": turn, "answer": "5"}]))
    text = tok.decode(seen[0])
    assert text.endswith("<reasoning>\n<|im_end|>\n<|im_start|>assistant\n")
    assert seen[0] == encode(tok, [turn])[0]


def test_qwen3_style_thinking_off_is_rendered_everywhere(bundled, tmp_path):
    profile, model, tok = bundled
    tok = copy.deepcopy(tok)
    tok.chat_template = QWEN3_STYLE
    install_prefill(tok, PREFILL)
    kwargs = {"enable_thinking": False}
    data = ensure_prepared(profile, tmp_path, tokenizer=tok, verbose=False)
    train = data["train"].select(range(1))

    expected = encode(tok, train["prompt"], **kwargs)
    assert render(tok, train["prompt"][0], **kwargs).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n<reasoning>\n")
    assert expected != encode(tok, train["prompt"]), "without the kwarg the think block is not opened"

    seen = trl_prompt_ids(model, tok, profile, tmp_path / "grpo", train, chat_template_kwargs=kwargs)
    assert seen == [expected[0]] * profile.num_generations

    seen = spy_on_generate(model)
    generate(model, tok, train["prompt"], SamplingSettings(max_new_tokens=2), chat_template_kwargs=kwargs)
    assert seen == expected

    rows = warmup_dataset(profile, tok).select(range(1)).map(lambda r: {"chat_template_kwargs": kwargs})
    from trl import SFTConfig, SFTTrainer

    sft = SFTTrainer(model=model, processing_class=tok, train_dataset=rows,
                     args=SFTConfig(output_dir=str(tmp_path / "sft"), use_cpu=True, report_to="none",
                                    completion_only_loss=True, bf16=False, max_steps=0))
    tokenized = sft.train_dataset[0]
    start = next(i for i, label in enumerate(tokenized["labels"]) if label != -100)
    assert tokenized["input_ids"][:start] == encode(tok, [rows[0]["prompt"]], **kwargs)[0]

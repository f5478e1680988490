"""A short supervised warm-up that teaches the response FORMAT, nothing more.

A 135M model never finds ``<reasoning>...</reasoning><answer>...</answer>`` by
sampling, so GRPO's format reward stays at 0 and nothing is learned. A few
dozen worked examples of an EASIER level than the one GRPO trains on (e.g.
single-digit sums) teach the tags in well under a minute on a CPU, while
leaving the harder task for GRPO to learn. The loss is on the completion only
(TRL's prompt-completion format), and the prompt carries the same prefilled
``<reasoning>`` opening that GRPO will use.

Example:
    >>> from helpers.warmup import warmup_pairs
    >>> rows = [{"prompt": [{"role": "user", "content": "What is 2 + 3?"},
    ...                     {"role": "assistant", "content": "<reasoning>\\n"}],
    ...          "solution": "2 + 3 = 5", "answer": "5"}]
    >>> warmup_pairs(rows, render=lambda p: "[" + p[0]["content"] + "]", end="<|im_end|>")[0]["completion"]
    '2 + 3 = 5\\n</reasoning>\\n<answer>\\n5\\n</answer><|im_end|>'
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .data import reference_completion
from .models import align_eos_with_chat_template, end_of_turn


def _prefill(prompt: Any) -> str:
    if isinstance(prompt, list) and prompt and prompt[-1].get("role") == "assistant":
        return str(prompt[-1].get("content") or "")
    return ""


def warmup_pairs(rows: Sequence[dict[str, Any]], render: Callable[[Any], str], end: str) -> list[dict[str, str]]:
    """Prompt/completion text pairs for SFT: the completion continues the prompt's prefill.

    Each row needs ``prompt`` (conversational, optionally ending with a
    prefilled assistant message), ``solution`` (worked steps) and ``answer``.
    """
    pairs = []
    for i, row in enumerate(rows):
        missing = [k for k in ("prompt", "solution", "answer") if row.get(k) in (None, "")]
        if missing:
            raise ValueError(
                f"Warm-up row {i} lacks {missing}; warm-up rows come from "
                "helpers.tasks.generate_arithmetic (they carry 'solution')."
            )
        target = reference_completion(str(row["solution"]).strip(), str(row["answer"]).strip())
        prefill = _prefill(row["prompt"])
        if prefill and not target.startswith(prefill.rstrip("\n")):
            raise ValueError(f"Warm-up row {i}: the prefill {prefill!r} is not the start of the response format.")
        completion = target[len(prefill):] if target.startswith(prefill) else target[len(prefill.rstrip("\n")):]
        pairs.append({"prompt": render(row["prompt"]), "completion": completion + end})
    return pairs


def format_warmup(
    model: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    output_dir: str | Path,
    epochs: int = 3,
    learning_rate: float = 1e-3,
    batch_size: int = 8,
    seed: int = 0,
    use_cpu: bool | None = None,
    precision: dict[str, bool] | None = None,
) -> dict[str, Any]:
    """Supervised fine-tuning of the LoRA on a few formatted examples (completion-only loss).

    Trains ``model`` in place and returns ``{"examples", "steps", "seconds",
    "final_loss"}``. Keep ``rows`` to an easier level than the GRPO task, so
    the warm-up teaches the format and GRPO does the rest.

    ``precision`` (``{"bf16", "fp16"}``) must match the GRPO config that
    follows in the same process (``helpers.training.choose_precision``): TRL
    defaults to bf16, and accelerate refuses a second, different precision.
    ``None``: float32 on a CPU, bf16 on compute capability >= 8.0, else fp16.

    Example:
        >>> stats = format_warmup(model, tok, rows, RUN / "warmup")   # doctest: +SKIP
        >>> stats["examples"]                                          # doctest: +SKIP
        32
    """
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from .generation import render_prompt

    if not rows:
        raise ValueError("format_warmup needs at least one example; set warmup_examples > 0 in the profile.")
    align_eos_with_chat_template(tokenizer, model)
    pairs = warmup_pairs(rows, render=lambda p: render_prompt(tokenizer, p), end=end_of_turn(tokenizer))
    import torch

    if use_cpu is None:
        use_cpu = not torch.cuda.is_available()
    if precision is None:
        if use_cpu:
            precision = {"bf16": False, "fp16": False}
        else:
            major = torch.cuda.get_device_capability(0)[0]
            precision = {"bf16": major >= 8, "fp16": major < 8}
    config = SFTConfig(
        output_dir=str(output_dir),
        num_train_epochs=epochs,
        learning_rate=learning_rate,
        lr_scheduler_type="constant",
        per_device_train_batch_size=batch_size,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=seed,
        use_cpu=use_cpu,
        completion_only_loss=True,
        disable_tqdm=True,
        **precision,
    )
    start = time.time()
    trainer = SFTTrainer(model=model, processing_class=tokenizer, train_dataset=Dataset.from_list(pairs),
                         args=config)
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # no raw log dicts in the notebook
    out = trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    # SFTTrainer may have aligned the model's EOS to the tokenizer's; keep the chat one.
    align_eos_with_chat_template(tokenizer, model)
    return {"examples": len(pairs), "epochs": epochs, "learning_rate": learning_rate,
            "steps": int(out.global_step), "seconds": round(time.time() - start, 1),
            "final_loss": losses[-1] if losses else None}

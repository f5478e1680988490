"""One function to sample completions, with one set of sampling settings.

Prompts are conversations (lists of ``{"role", "content"}``) or plain strings.
A conversation whose last message is from the assistant is *continued* (the
model writes after a prefilled opening such as ``<reasoning>``), exactly as
TRL's GRPOTrainer does; the returned completions hold only the new text.

Example:
    >>> from helpers.generation import SamplingSettings, generate
    >>> outs = generate(model, tok, [[{"role": "user", "content": "2+2?"}]],
    ...                 SamplingSettings(max_new_tokens=8))          # doctest: +SKIP
    >>> len(outs), len(outs[0])                                      # doctest: +SKIP
    (1, 1)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

Prompt = "str | list[dict[str, str]]"


@dataclass(frozen=True)
class SamplingSettings:
    """Sampling settings shared by every backend. ``temperature=0`` means greedy."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    num_return_sequences: int = 1
    seed: int = 0


def render_prompt(tokenizer: Any, prompt: Any) -> str:
    """The exact text the model sees for a prompt (chat template applied).

    Example:
        >>> render_prompt(tok, [{"role": "user", "content": "hi"}])   # doctest: +SKIP
        '<|im_start|>system\\n...<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n'
    """
    if isinstance(prompt, str):
        return prompt
    messages = list(prompt)
    continue_final = bool(messages) and messages[-1].get("role") == "assistant"
    return tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=not continue_final,
        continue_final_message=continue_final,
    )


def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Any],
    settings: SamplingSettings = SamplingSettings(),
    batch_size: int = 16,
    adapter: str | Path | None = None,
) -> list[list[str]]:
    """Sample ``settings.num_return_sequences`` completions for each prompt.

    Returns one list of completion strings per prompt (special tokens removed).

    Backends, chosen from ``model``:

    * an Unsloth model loaded with ``fast_inference=True`` (it has a
      ``vllm_engine``): vLLM through ``model.fast_generate``; ``adapter`` is the
      saved LoRA folder to apply (``model.load_lora(adapter)``), ``None`` samples
      the base weights;
    * a ``vllm.LLM``: ``llm.generate`` with a ``LoRARequest`` for ``adapter``;
    * anything else: transformers ``model.generate`` in batches of ``batch_size``
      (a PEFT model already carries its adapter; ``adapter`` is ignored).
    """
    texts = [render_prompt(tokenizer, p) for p in prompts]
    if _is_vllm(model):
        return _generate_vllm(model, texts, settings, adapter)
    import torch

    n = settings.num_return_sequences
    do_sample = settings.temperature > 0
    gen_kwargs: dict[str, Any] = dict(
        max_new_tokens=settings.max_new_tokens,
        do_sample=do_sample,
        num_return_sequences=n,
        pad_token_id=tokenizer.pad_token_id,
    )
    if do_sample:
        gen_kwargs.update(temperature=settings.temperature, top_p=settings.top_p, top_k=0)
    else:
        gen_kwargs.update(temperature=None, top_p=None, top_k=None)
    tokenizer.padding_side = "left"
    was_training = model.training
    model.eval()
    results: list[list[str]] = []
    try:
        for start in range(0, len(texts), batch_size):
            batch = texts[start : start + batch_size]
            torch.manual_seed(settings.seed + start)
            enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False)
            enc = {k: v.to(model.device) for k, v in enc.items()}
            with torch.no_grad():
                out = model.generate(**enc, **gen_kwargs)
            new = out[:, enc["input_ids"].shape[1] :]
            decoded = tokenizer.batch_decode(new, skip_special_tokens=True)
            results.extend(decoded[i * n : (i + 1) * n] for i in range(len(batch)))
    finally:
        if was_training:
            model.train()
    return results


def _is_vllm(model: Any) -> bool:
    """True for an Unsloth model with a vLLM engine, or a ``vllm.LLM``."""
    if getattr(model, "vllm_engine", None) is not None:
        return True
    return type(model).__name__ == "LLM" and type(model).__module__.startswith("vllm")


def vllm_sampling_kwargs(settings: SamplingSettings) -> dict[str, Any]:
    """Keywords for ``vllm.SamplingParams`` equal to ``settings`` (checked by contract tests).

    Example:
        >>> vllm_sampling_kwargs(SamplingSettings(max_new_tokens=8))["max_tokens"]
        8
    """
    return dict(
        n=settings.num_return_sequences,
        temperature=float(settings.temperature),
        top_p=float(settings.top_p) if settings.temperature > 0 else 1.0,
        max_tokens=settings.max_new_tokens,
        seed=settings.seed,
    )


def _generate_vllm(model: Any, texts: list[str], settings: SamplingSettings,
                   adapter: str | Path | None) -> list[list[str]]:
    from vllm import SamplingParams

    params = SamplingParams(**vllm_sampling_kwargs(settings))
    lora_request = None
    if getattr(model, "vllm_engine", None) is not None:  # Unsloth fast_inference=True
        if adapter is not None:
            lora_request = model.load_lora(str(adapter))
        outputs = model.fast_generate(texts, sampling_params=params,
                                      lora_request=lora_request, use_tqdm=False)
    else:  # a plain vllm.LLM built with enable_lora=True
        if adapter is not None:
            from vllm.lora.request import LoRARequest

            lora_request = LoRARequest(lora_name="adapter", lora_int_id=1,
                                       lora_path=str(adapter))
        outputs = model.generate(texts, sampling_params=params, lora_request=lora_request,
                                 use_tqdm=False)
    return [[o.text for o in out.outputs] for out in outputs]

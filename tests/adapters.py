"""Test helper: 'trained' adapters made at test time (no weights live in git).

A fresh LoRA has B = 0, so it changes nothing; perturbing B with a fixed seed
gives an adapter whose greedy outputs differ from the base model's, which is
what merge and before/after tests need.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers.prompts import build_prompt
from helpers.tasks.reasoning import SYSTEM_PROMPT

#: Held-out style prompts (system + user, as the arithmetic task's dataset holds them) and their gold answers.
QUESTIONS = ["What is 23 + 19?", "What is 7 + 5?", "What is 40 + 15?", "What is 3 + 4?"]
ANSWERS = ["42", "12", "55", "7"]
PROMPTS = [build_prompt(q, SYSTEM_PROMPT) for q in QUESTIONS]
#: The same as dataset rows, the shape helpers.evaluation reads.
ROWS = [{"question": q, "answer": a, "prompt": p} for q, a, p in zip(QUESTIONS, ANSWERS, PROMPTS)]


def perturb(model: Any, adapter: str = "default", seed: int = 0, std: float = 0.02) -> Any:
    """Give the LoRA B matrices of ``adapter`` random (seeded) values; return the model."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if f"lora_B.{adapter}." in name:
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    return model


def perturbed_lora_model(profile: Any, seed: int = 0, std: float = 0.02) -> tuple[Any, Any]:
    """The bundled model with a LoRA ("default") whose B matrices are random (seeded)."""
    from helpers.models import load_model

    model, tok = load_model(profile)
    perturb(model, "default", seed, std)
    model.eval()
    return model, tok


def add_perturbed_adapter(model: Any, name: str, seed: int, std: float = 0.02) -> Any:
    """A second named LoRA beside "default", with the same config and its own random B."""
    import copy

    model.add_adapter(name, copy.deepcopy(model.peft_config["default"]))
    perturb(model, name, seed, std)
    model.eval()
    return model


def save_adapter(model: Any, tok: Any, folder: Path) -> Path:
    """Save the adapter and tokenizer the way helpers.training does (RUN/adapter)."""
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder

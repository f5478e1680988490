"""Test helper: a 'trained' adapter made at test time (no weights live in git).

A fresh LoRA has B = 0, so it changes nothing; perturbing B with a fixed seed
gives an adapter whose greedy outputs differ from the base model's, which is
what merge and before/after tests need.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PROMPTS = [
    [{"role": "user", "content": "What is 23 + 19?"}],
    [{"role": "user", "content": "What is 7 + 5?"}],
    [{"role": "user", "content": "Name a colour."}],
    [{"role": "user", "content": "What is 40 + 15?"},
     {"role": "assistant", "content": "<reasoning>\n"}],
]


def perturbed_lora_model(profile: Any, seed: int = 0, std: float = 0.02) -> tuple[Any, Any]:
    """The bundled model with a LoRA whose B matrices are random (seeded)."""
    import torch

    from helpers.models import load_model

    model, tok = load_model(profile)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    model.eval()
    return model, tok


def save_adapter(model: Any, tok: Any, folder: Path) -> Path:
    """Save the adapter and tokenizer the way helpers.training does (RUN/adapter)."""
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder

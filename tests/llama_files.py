"""Test helper: one 'trained' adapter, its merge and the merge's 16-bit GGUF, made once per test session.

tests/test_export.py and tests/test_serve.py read the same files (``once``: whichever pytest-xdist worker asks
first makes them). The adapter is the bundled model's LoRA with seeded random B matrices (tests/adapters.py),
merged with PEFT's ``merge_and_unload`` as notebook 04 merges, saved with the course's tokenizer (the prefill
in its chat template), then converted with llama.cpp's own converter.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.shared import once


def make_files(folder: Path) -> dict[str, str]:
    import torch

    from helpers.export import convert_merged
    from helpers.profiles import get_profile
    from tests.adapters import perturbed_lora_model, save_adapter

    model, tok = perturbed_lora_model(get_profile("cpu-smoke"), seed=3, std=0.02)
    adapter = save_adapter(model, tok, folder / "adapter")
    merged = model.merge_and_unload()
    merged.to(torch.float32).save_pretrained(str(folder / "merged"))
    tok.save_pretrained(str(folder / "merged"))
    gguf = convert_merged(folder / "merged", folder / "gguf" / "model-f16.gguf", "f16")
    return {"adapter": str(adapter), "merged": str(folder / "merged"), "f16": str(gguf)}


def llama_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``{"adapter", "merged", "f16"}``: the session's folders and GGUF file."""
    return {k: Path(v) for k, v in once("llama-files", tmp_path_factory, make_files).items()}

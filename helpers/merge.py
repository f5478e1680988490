"""The checks around notebook 04's merge: the disk it needs, the dtype it wrote, whether it gives the same outputs."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .generation import SamplingSettings, generate
from .profiles import get_model_spec
from .rewards import clip
from .runs import atomic_folder


def merged_size_bytes(profile: Any, dtype: str) -> int:
    """Bytes a merged copy of the profile's model takes on disk (weights + 5%)."""
    per_weight = {"float32": 4, "float16": 2, "bfloat16": 2}  # bytes of each dtype a merge can write
    if dtype not in per_weight:
        raise ValueError(f"dtype={dtype!r}: choose one of {sorted(per_weight)}.")
    return int(get_model_spec(profile.model).params_b * 1e9 * per_weight[dtype] * 1.05)


def saved_dtype(model_dir: str | Path) -> str | None:
    """The dtype a saved model folder declares in its ``config.json`` (what was really written)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("dtype") or config.get("torch_dtype") or config.get("text_config", {}).get("dtype")
    return str(value) if value else None


def collect_gguf(save_directory: str | Path, out_dir: str | Path, overwrite: bool = False) -> list[Path]:
    """Move the ``.gguf`` files of Unsloth's ``save_pretrained_gguf(save_directory)`` into ``out_dir``."""
    # Unsloth writes into save_directory + "_gguf" (_gguf_output_directory in unsloth/save.py; a contract test)
    work = Path(save_directory)
    sibling = Path(f"{work}_gguf")
    files = sorted(sibling.glob("*.gguf")) or sorted(work.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"No .gguf file in {sibling} or {work}: did save_pretrained_gguf finish? "
                                "Its log says where it wrote.")
    with atomic_folder(out_dir, overwrite=overwrite) as tmp:
        for f in files:
            shutil.move(str(f), tmp / f.name)
    for folder in (sibling, work):
        shutil.rmtree(folder, ignore_errors=True)
    return sorted(Path(out_dir).glob("*.gguf"))


@dataclass
class VerifyReport:
    """Greedy outputs of the adapter model and of the reloaded merged model, prompt by prompt."""

    adapter_outputs: list[str]
    merged_outputs: list[str]

    @property
    def matches(self) -> list[bool]:
        return [a == m for a, m in zip(self.adapter_outputs, self.merged_outputs)]

    def table(self, max_chars: int = 80) -> Any:
        """The comparison as a DataFrame, for the notebook."""
        import pandas as pd
        return pd.DataFrame({"adapter model": [clip(t, max_chars) for t in self.adapter_outputs],
                             "merged model": [clip(t, max_chars) for t in self.merged_outputs], "same": self.matches})

    def __str__(self) -> str:
        return (f"{sum(self.matches)}/{len(self.matches)} prompts give the same greedy output from the adapter "
                "model and the merged model")


def verify_merged(adapter_model: Any, merged_model: Any, tokenizer: Any, prompts: Sequence[Any],
                  max_new_tokens: int = 32, adapter: str | Path | None = None) -> VerifyReport:
    """Greedy outputs of the adapter model and the merged model on the same prompts (``adapter``: a vLLM LoRA
    request). Run the adapter on the same full-precision base the merge used: a 4-bit base diverges."""
    settings = SamplingSettings(max_new_tokens=max_new_tokens, temperature=0.0)
    return VerifyReport([o[0] for o in generate(adapter_model, tokenizer, prompts, settings, adapter=adapter)],
                        [o[0] for o in generate(merged_model, tokenizer, prompts, settings)])

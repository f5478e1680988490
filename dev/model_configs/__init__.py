"""The real ``config.json`` of each model ``colab-t4`` can train (``<registry key>.json``; where each came from in
``sources.json``): the GPU check and ``bench/t4_memory.py`` build these architectures with random weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIGS = Path(__file__).resolve().parent
#: colab-t4's default first, then the models a T4 learner may pick (helpers/profiles.py MODELS).
MODELS = ("qwen2.5-1.5b", "gemma3-1b", "qwen2.5-3b", "qwen3-1.7b")


def config_values(key: str) -> dict[str, Any]:
    """The published ``config.json`` of registry model ``key``, as a dict."""
    path = CONFIGS / f"{key}.json"
    if not path.is_file():
        raise FileNotFoundError(f"No config for {key!r} in {CONFIGS}: carry the model's config.json there as "
                                f"{key}.json and record where it came from in {CONFIGS / 'sources.json'}.")
    return json.loads(path.read_text())


def load_config(key: str, **overrides: Any) -> Any:
    """The transformers config of registry model ``key`` (``overrides``: values to change, e.g. token ids)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(**{**config_values(key), **overrides})

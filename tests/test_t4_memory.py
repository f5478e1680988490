"""bench/t4_memory.py: colab-t4's models from their real configs on the meta device, and the memory estimate per stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import t4_memory as tm

ROOT = Path(__file__).resolve().parents[1]
#: Parameters as each model's card states them (tied embeddings counted once).
KNOWN_BILLIONS = {"qwen2.5-1.5b": 1.54, "qwen2.5-3b": 3.09, "gemma3-1b": 1.0, "qwen3-1.7b": 1.7}
CLASSES = {"qwen2.5-1.5b": "Qwen2Config", "qwen2.5-3b": "Qwen2Config", "gemma3-1b": "Gemma3TextConfig",
           "qwen3-1.7b": "Qwen3Config"}
SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "vocab_size", "tie_word_embeddings", "head_dim", "query_pre_attn_scalar", "hidden_act",
              "hidden_activation", "rms_norm_eps")


def test_every_colab_t4_model_has_a_real_config_with_its_source():
    from helpers.profiles import MODELS

    sources = json.loads((tm.CONFIGS / "sources.json").read_text())["models"]
    assert set(tm.MODELS) == set(sources) == {p.stem for p in tm.CONFIGS.glob("*.json")} - {"sources"}
    for key, source in sources.items():
        assert source["hf_id"] == MODELS[key].hf_id and len(source["commit"]) == 40
        assert source["repo"] and source["path"].endswith((".json", ".py"))


@pytest.mark.parametrize("key", tm.MODELS)
def test_the_configs_load_into_transformers_config_classes_with_their_shapes_kept(key):
    values = json.loads((tm.CONFIGS / f"{key}.json").read_text())
    config = tm.load_config(key)
    assert type(config).__name__ == CLASSES[key]
    for name in SHAPE_KEYS:
        if name in values:
            assert getattr(config, name) == values[name], name   # nothing the architecture reads was dropped
    theta = values.get("rope_theta") or values["rope_parameters"]["rope_theta"]
    rope = config.rope_parameters
    assert theta in {rope.get("rope_theta"), *(v.get("rope_theta") for v in rope.values() if isinstance(v, dict))}


@pytest.mark.parametrize("key", tm.MODELS)
def test_the_meta_models_have_the_published_sizes_and_lora_counts(key):
    import torch

    model = tm.meta_model(key)
    assert next(model.parameters()).device == torch.device("meta")
    shapes = tm.shapes(model)
    assert shapes["parameters"] / 1e9 == pytest.approx(KNOWN_BILLIONS[key], rel=0.03)
    assert shapes["tied_head"]                   # all four tie the head to the embedding
    cfg = model.config
    h, i, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    q = cfg.num_attention_heads * shapes["head_dim"]
    kv = cfg.num_key_value_heads * shapes["head_dim"]
    per_layer = (h + q) + 2 * (h + kv) + (q + h) + 3 * (h + i)          # q, k, v, o, gate, up, down
    assert tm.lora_parameters(model, 16, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                          "down_proj"]) == 16 * layers * per_layer
    assert shapes["quantized_linear"] == layers * (h * q + 2 * h * kv + q * h + 3 * h * i)
    assert shapes["quantized_linear"] + shapes["kept_16bit"] == shapes["parameters"]


def test_the_nf4_bytes_are_what_bitsandbytes_stores():
    import torch
    from bitsandbytes.functional import quantize_4bit

    weight = torch.randn(256, 1536)
    codes, state = quantize_4bit(weight, blocksize=64, compress_statistics=True, quant_type="nf4")
    stored = sum(t.numel() * t.element_size() for t in (codes, state.absmax, state.state2.absmax))
    assert stored == pytest.approx(tm.NF4_BYTES_PER_WEIGHT * weight.numel(), rel=1e-6)


def test_the_estimate_grows_with_the_completion_and_orders_its_stages():
    short, default, long = (tm.estimate("qwen2.5-1.5b", completion_length=c) for c in (64, None, 512))
    for stage in ("generate", "train", "heldout", "evaluate_04"):
        assert short["stages_gib"][stage] < default["stages_gib"][stage] < long["stages_gib"][stage], stage
    assert short["stages_gib"]["load"] == long["stages_gib"]["load"]      # the weights do not depend on it
    s = default["stages_gib"]
    assert s["load"] < s["generate"] < s["train"] < s["train_plain_checkpointing"]
    assert default["sizes"]["completion_tokens"] == 256 and default["sizes"]["sequences"] == 6
    gemma = tm.estimate("gemma3-1b")
    assert gemma["dtype_on_t4"] == "float32"      # Unsloth's float32 on a T4: 4 bytes where Qwen keeps 2
    assert gemma["parts_gib"]["full_precision_copy"] == pytest.approx(gemma["parameters"] * 4 / tm.GIB, abs=0.01)


def test_the_stored_estimate_is_what_the_script_computes():
    stored = json.loads((ROOT / "bench" / "measured" / "gpu" / "t4_memory.json").read_text())
    assert stored["estimate"] is True and "estimated, not measured" in stored["what"]
    assert stored["command"].startswith("python bench/t4_memory.py") and stored["commit"] and stored["date"]
    assert stored["machine"]["cpu_capability"] and stored["counted"] and stored["not_counted"]
    assert set(stored["models"]) == set(tm.MODELS)
    fresh = tm.estimate("qwen2.5-1.5b")
    assert stored["models"]["qwen2.5-1.5b"]["stages_gib"] == fresh["stages_gib"]

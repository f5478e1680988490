"""Estimated GPU memory of `colab-t4`'s models at each stage of notebooks 03 and 04, from their real configs (issue 52).

    python bench/t4_memory.py [--out bench/measured/gpu/t4_memory.json]

No GPU and no weights: each model of the ``colab-t4`` registry is built from its real ``config.json``
(``dev/model_configs/``, where each came from in ``sources.json``) on PyTorch's meta device
(``accelerate.init_empty_weights``), so its parameters are counted exactly, layer by layer. The memory of each stage
is then *computed*, not measured, from what the course's GPU path holds at that point (``colab-t4``'s recipe: 4-bit
base, LoRA at the profile's rank, 8-bit AdamW, gradient checkpointing, the profile's batch and lengths). What is
counted, and how, is written into the JSON beside the figures (``counted``, ``not_counted``). The GPU check
(``dev/gpu_check.py --real``, docs/gpu-check.md) measures the same stages when a GPU is lent.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench.record import commit, machine, stamp  # noqa: E402 - after ROOT is on the path
from dev.model_configs import CONFIGS, MODELS, load_config  # noqa: E402

GIB = 1024**3
T4_GIB = 15.0                     # a T4's 15,360 MiB, as Colab shows it (the GPU check's cap)
#: bitsandbytes NF4 with double quantization, as Unsloth loads a 4-bit base (unsloth/models/llama.py:3109,
#: bnb_4bit_use_double_quant=True): 4-bit codes, one 8-bit absmax per block of 64 weights (bitsandbytes/nn/modules.py
#: Params4bit: blocksize 64), and one float32 absmax per 256 of those (bitsandbytes/functional.py quantize_4bit:
#: compress_statistics quantizes the absmax with blocksize=256).
NF4_BYTES_PER_WEIGHT = 0.5 + 1 / 64 + 4 / (64 * 256)
LORA_BYTES = 4                    # PEFT keeps adapter weights in float32 (peft/tuners/tuners_utils.py _cast_adapter_dtype)
ADAMW_8BIT_STATE_BYTES = 2        # two 8-bit moments per trainable weight (adamw_8bit); adamw_torch: 8
EVAL_BATCH = 64                   # sequences per model.generate call (helpers/generation.py generate's batch_size)


def meta_model(key: str) -> Any:
    """Registry model ``key`` built from its real config on the meta device (no memory, exact shapes), weights tied
    where the config ties them."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(load_config(key))
    model.tie_weights()   # init_empty_weights leaves a tied head as its own tensor until asked
    return model


def shapes(model: Any) -> dict[str, Any]:
    """What the estimate reads of a model: parameters by kind, and the attention and MLP sizes."""
    import torch

    cfg = model.config
    layers = model.model.layers
    quantized = other = 0
    for name, module in model.model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if isinstance(module, torch.nn.Linear) and pname == "weight" and ".layers." in f".{name}":
                quantized += p.numel()   # every decoder projection goes to NF4; lm_head is skipped (tied here)
            else:
                other += p.numel()       # embeddings, norms, biases: kept in the compute dtype
    head = model.get_output_embeddings().weight
    tied = head.data_ptr() == model.get_input_embeddings().weight.data_ptr() or head is model.get_input_embeddings().weight
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    windows = [getattr(cfg, "sliding_window", None) if t == "sliding_attention" else None
               for t in (getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers)]
    return {"parameters": sum(p.numel() for p in model.parameters()), "quantized_linear": quantized,
            "kept_16bit": other + (0 if tied else head.numel()), "tied_head": bool(tied),
            "layers": len(layers), "hidden": cfg.hidden_size, "intermediate": cfg.intermediate_size,
            "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads, "head_dim": head_dim,
            "vocab": cfg.vocab_size, "windows": windows}


def lora_parameters(model: Any, rank: int, targets: list[str]) -> int:
    """Trainable LoRA weights: ``rank x (in + out)`` for every targeted projection."""
    import torch

    return sum(rank * (m.in_features + m.out_features) for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets)


def estimate(key: str, completion_length: int | None = None, profile: Any = None) -> dict[str, Any]:
    """GiB per stage for registry model ``key`` on ``colab-t4`` (``completion_length`` overrides the profile's)."""
    from helpers.models import LORA_TARGETS
    from helpers.profiles import PROFILES, get_model_spec

    profile = profile or PROFILES["colab-t4"].with_overrides(model=key)
    spec = get_model_spec(key)
    model = meta_model(key)
    s = shapes(model)
    c = completion_length or profile.max_completion_length
    p = profile.max_prompt_tokens                      # the prompt's cap: an upper bound on a GSM8K prompt
    fp32 = spec.fp32_on_t4                             # Gemma 3: Unsloth runs it in float32 on a T4
    act = 4 if fp32 else 2                             # bytes of an activation, a kept weight, a KV entry
    b = profile.per_device_train_batch_size            # sequences per loss micro-batch and per generation call
    lora = lora_parameters(model, profile.lora_rank, LORA_TARGETS)
    state = ADAMW_8BIT_STATE_BYTES if profile.optim == "adamw_8bit" else 8
    q_dim, kv_dim = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]

    def kv_cache(sequences: int, tokens: int) -> int:
        cached = sum(min(tokens, w) if w else tokens for w in s["windows"])   # a sliding layer keeps its window
        return sequences * cached * 2 * kv_dim * act

    per_token_layer = 6 * s["hidden"] + 2 * q_dim + 2 * kv_dim + 4 * s["intermediate"]
    parts = {
        "base_weights": s["quantized_linear"] * NF4_BYTES_PER_WEIGHT + s["kept_16bit"] * act,
        "lora_weights": lora * LORA_BYTES,
        "lora_gradients": lora * LORA_BYTES,
        "optimizer_state": lora * state,
        "checkpointed_layer_inputs": s["layers"] * b * (p + c) * s["hidden"] * act,
        "one_layer_recomputed": 2 * b * (p + c) * per_token_layer * act,
        "logits_train": b * c * s["vocab"] * 4,
        "kv_cache_group": kv_cache(b, p + c),
        "logits_generate": b * s["vocab"] * 4,
        "kv_cache_heldout": kv_cache(min(profile.watch_prompts, EVAL_BATCH), p + c),
        "kv_cache_eval": kv_cache(EVAL_BATCH, p + c),
        "full_precision_copy": s["parameters"] * act,
    }
    held = parts["base_weights"] + parts["lora_weights"] + parts["optimizer_state"]
    stages = {
        "load": parts["base_weights"] + parts["lora_weights"],
        "generate": held + parts["kv_cache_group"] + parts["logits_generate"],
        "train": held + parts["lora_gradients"] + parts["one_layer_recomputed"] + parts["logits_train"],
        "train_plain_checkpointing": held + parts["lora_gradients"] + parts["one_layer_recomputed"]
        + parts["logits_train"] + parts["checkpointed_layer_inputs"],
        "heldout": held + parts["kv_cache_heldout"] + parts["logits_generate"],
        "evaluate_04": parts["base_weights"] + 2 * parts["lora_weights"] + parts["kv_cache_eval"],
        "verify_04": parts["base_weights"] + 2 * parts["lora_weights"] + 2 * parts["full_precision_copy"],
    }
    gib = lambda v: round(v / GIB, 2)  # noqa: E731
    return {"hf_id": spec.hf_id, "config": f"dev/model_configs/{key}.json", "dtype_on_t4": "float32" if fp32
            else "float16", "parameters": s["parameters"], "quantized_linear_parameters": s["quantized_linear"],
            "kept_parameters": s["kept_16bit"], "tied_head": s["tied_head"], "lora_parameters": lora,
            "shapes": {k: s[k] for k in ("layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab")},
            "sizes": {"prompt_tokens_cap": p, "completion_tokens": c, "sequences": b, "lora_rank": profile.lora_rank,
                      "optim": profile.optim, "heldout_sequences": min(profile.watch_prompts, EVAL_BATCH),
                      "eval_sequences": EVAL_BATCH},
            "parts_gib": {k: gib(v) for k, v in parts.items()}, "stages_gib": {k: gib(v) for k, v in stages.items()},
            "peak_gib": gib(max(v for k, v in stages.items() if k != "train_plain_checkpointing")),
            "peak_stage": max((k for k in stages if k != "train_plain_checkpointing"), key=stages.get),
            "fits_t4": max(v for k, v in stages.items() if k != "train_plain_checkpointing") / GIB <= T4_GIB}


COUNTED = [
    "base_weights: every decoder projection in NF4 with double quantization (0.5 byte a weight + an 8-bit absmax per "
    "64 + a float32 absmax per 256 blocks), the rest (embeddings, norms, biases) in the compute dtype: float16 on a "
    "T4, float32 for Gemma 3, which Unsloth runs in float32 there; a tied head is the embedding (no extra)",
    "lora_weights, lora_gradients: rank x (in + out) for each targeted projection, float32; optimizer_state: two "
    "8-bit moments a weight (adamw_8bit)",
    "one_layer_recomputed: gradient checkpointing keeps one decoder layer's activations at a time: per token "
    "6 x hidden + 2 x (query + key-value width) + 4 x intermediate values, twice (forward and its gradients), for "
    "the loss micro-batch (per_device_train_batch_size sequences of prompt cap + completion tokens)",
    "checkpointed_layer_inputs: each layer's input kept for the recompute; Unsloth's 'unsloth' checkpointing moves "
    "them to CPU memory (unsloth_zoo/gradient_checkpointing.py, Unsloth_Offloaded_Gradient_Checkpointer), so only "
    "train_plain_checkpointing counts them",
    "logits_train: the completion tokens' logits of one loss micro-batch in float32 (an upper bound: Unsloth's GRPO "
    "loss computes them in chunks)",
    "kv_cache_*: keys and values of every layer for the sequences of one generate call at prompt cap + completion "
    "length (a sliding-window layer keeps its window): the group while training, the held-out slice, 64 sequences "
    "in notebook 04's evaluation",
    "verify_04: notebook 04's reload holds the merged model and the adapter on the full-precision base at once, "
    "beside the 4-bit model (two full-precision copies)",
]
NOT_COUNTED = [
    "the CUDA context and kernels (outside PyTorch's allocator, so outside the GPU check's 15 GiB cap too)",
    "the allocator's fragmentation and cache, temporary buffers inside kernels, Unsloth's compiled-kernel workspaces",
    "a reference model (colab-t4 has beta = 0, so TRL builds none) and vLLM (colab-t4 runs without it)",
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="write the JSON here too (bench/measured/gpu/t4_memory.json)")
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args(argv)
    import torch

    start = time.time()
    models = {key: estimate(key) for key in args.models.split(",")}
    result = {"what": "estimated, not measured: GPU memory per stage of notebooks 03 and 04 on colab-t4, computed "
                      "from each model's real config built on the meta device",
              "estimate": True, "profile": "colab-t4", "t4_gib": T4_GIB, "models": models, "counted": COUNTED,
              "not_counted": NOT_COUNTED, "command": "python bench/t4_memory.py " + " ".join(argv or sys.argv[1:]),
              "commit": commit(short=False) or None, "date": stamp("%Y-%m-%dT%H:%M:%S%z"),
              "machine": machine(cpu_capability=torch.backends.cpu.get_cpu_capability(),
                                 platform=platform.platform(), python=platform.python_version()),
              "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
              "seconds": round(time.time() - start, 1)}
    text = json.dumps(result, indent=1) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

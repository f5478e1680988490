"""The course's GPU path on a real GPU, in one call (issue 36): notebooks 03 and 04, T4-like, on tiny models.

On the lent GPU machine, from the repository root, with ``.cache/gpu-carry`` carried (docs/gpu-check.md):

    python3 dev/gpu_check.py --install --out "$OUT"

Elsewhere (a GPU workstation with the GPU stack installed, or a CPU, where it stops at the first CUDA call):

    python dev/gpu_check.py [--out DIR] [--models qwen2,gemma3] [--minutes 7.5] [--native]
    python dev/gpu_check.py store FILE     # keep a result as bench/measured/gpu/gpu_check.json

What one run does, each step recorded (an error is recorded with its step, and the run goes on where it can):

1. ``--install``: installs the carried wheels (``dev/wheelhouse.py build``) with ``pip install --no-index
   --no-deps --target`` beside the image's packages, and checks what they require of the image (versions read
   there, not assumed);
2. per architecture (a child process each, side by side unless ``--serial``, so one crash cannot take the
   other): builds a tiny random-weight causal
   LM from a config (Qwen2 or Gemma 3, 2 layers, the bundled SmolLM2 tokenizer), registers it as the course's
   model and shrinks the ``colab-t4`` profile's sizes (its recipe kept: 4-bit, LoRA r16, 8-bit AdamW, DAPO, groups
   of 6); makes the GPU T4-like: compute capability 7.5 as Unsloth and the course see it (so fp16, no bf16; Gemma 3
   in float32, as Unsloth does on a T4) and PyTorch's memory capped at 15 GiB
   (``torch.cuda.set_per_process_memory_fraction``); ``--native`` keeps the GPU as it is;
3. runs notebook 03's code cells as the learner runs them (the notebook's own source, executed in order in one
   namespace): ``FastLanguageModel.from_pretrained(load_in_4bit=True)``, ``get_peft_model``, the data, the rewards,
   ``GRPOConfig`` as Unsloth rewrites it, Unsloth's patched ``GRPOTrainer`` for 2 steps with a checkpoint a step;
   then its path cells again with 3 steps, which resumes from the checkpoint (a learner's disconnect);
4. runs notebook 04's cells: the adapter reloaded through Unsloth, the held-out evaluation, the 16-bit merge
   (``save_pretrained_merged(..., "merged_16bit")``), the merged model reloaded through Unsloth and generating,
   the chat; not the GGUF export (Unsloth builds llama.cpp from the network);
5. writes one JSON (``OUT/gpu_check.json``): the date, the machine, versions, what ran, what failed with its
   error, seconds per training step, peak GPU memory and the config as Unsloth rewrote it. It ends inside
   ``--minutes`` (7.5 by default): a child still running then is stopped and what it recorded is kept.

``--real`` runs the same notebooks at ``colab-t4``'s real sizes on random-weight models built from the real configs of
the T4's models (``dev/model_configs/``: Qwen2.5-1.5B, Gemma 3 1B, Qwen2.5-3B, Qwen3-1.7B; a stand-in tokenizer
grown to each model's vocabulary): notebook 03 on a short time budget, then notebook 04, one model after the other,
with the peak GPU memory of each stage, the step time labelled with the lent GPU's name and the pre-flight's figures
(``bench/t4_memory.py`` estimates the same stages without a GPU).

Exit status: 0 when everything ran, 1 when something failed, 2 when there is no CUDA GPU (the run stops at the
first CUDA call; ``tests/test_gpu_check.py`` runs it so on a CPU to catch a broken check before a GPU is lent, and
once more as a rehearsal past that call, ``--native --rehearse tests/gpu_check_cpu.py``, where CPU stand-ins take
the place of what needs a GPU: that checks the check, not the GPU path).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import io
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
CARRY = ROOT / ".cache" / "gpu-carry"           # dev/wheelhouse.py build: wheels/, tokenizer/, manifest.json
STORED = ROOT / "bench" / "measured" / "gpu" / "gpu_check.json"
STORED_REAL = ROOT / "bench" / "measured" / "gpu" / "gpu_check_t4_real.json"   # --real: the T4's models at their real size
NOTEBOOKS = {"03": ROOT / "notebooks" / "03_grpo_training.ipynb", "04": ROOT / "notebooks" / "04_merge_and_inference.ipynb"}
ARCHITECTURES = ("qwen2", "gemma3")
T4_CAPABILITY = (7, 5)
T4_MEMORY_BYTES = 15 * 1024**3                  # a T4's 15,360 MiB, as Colab shows it
DEFAULT_MINUTES = 7.5                           # the whole run, install included: inside 8 minutes
EOS_PROBABILITY = 0.08                          # a sampled completion ends after ~12 tokens on average
STEADY_H0 = 8.0                                 # the constant feature after the final norm (of ~16 in all)
LOGIT_SPREAD = 5.5                              # std of the other logits: peaked, so greedy decoding writes tokens
LAYER_SCALE = 60.0                              # a tied model's layer outputs, scaled over its token embeddings
STEPS, RESUME_STEPS = 2, 3
ADAPTER_SIGNAL_STD = 0.05                       # noise on LoRA B before notebook 04, so the merge has work to do
#: colab-t4's sizes cut for a tiny model and a few steps; its recipe (model loading, LoRA, optimizer, loss) kept.
SIZES = dict(max_steps=STEPS, save_steps=1, train_rows=24, eval_rows=8, eval_prompts=8, max_completion_length=64,
             time_budget_minutes=None)

#: Cells that must run for the ones after them (a failure stops that notebook); every marker must match one cell.
PATH_MARKERS = {
    "03": ("PROFILE = get_profile()", "FastLanguageModel.from_pretrained(", "data = ensure_prepared(",
           "REWARDS = TASK.rewards_for(", "SFTTrainer(", "config = GRPOConfig(**ASKED)", "trainer = GRPOTrainer(",
           "trainer.train(resume_from_checkpoint="),
    "04": ("PROFILE = get_profile()", "ADAPTER = ensure_adapter(",
           "model, tokenizer = FastLanguageModel.from_pretrained(", "SETTINGS = eval_settings(",
           "results = evaluate_adapters(", "save_pretrained_merged(", "verify_merged("),
}
#: Cells the check does not run, with the reason.
SKIP_MARKERS = {
    "03": {"trackio.show(": "starts trackio's dashboard web server, which never returns in a script (the notebook's "
                            "NBVAL_SKIP cell; dev/browser_check.py checks the dashboard)"},
    "04": {"save_pretrained_gguf(": "the GGUF export: Unsloth clones and builds llama.cpp from GitHub, which the "
                                    "lent machine cannot reach"},
}
FIRST_CUDA_CELL = ("03", "FastLanguageModel.from_pretrained(")   # the GPU memory cap goes right before it
#: --real: the T4's models (dev/model_configs/) and colab-t4's own sizes (completion length, group, batch, LoRA
#: rank, sequence length), cut only where time needs it: a short budget stops training (max_steps stays 250).
REAL_MODELS = ("qwen2.5-1.5b", "gemma3-1b", "qwen2.5-3b", "qwen3-1.7b")
REAL_SIZES = dict(time_budget_minutes=1.5, fallback_minutes=1.0, train_rows=24, eval_rows=8, eval_prompts=8,
                  watch_prompts=8, save_steps=25)   # GSM8K's sample in data/ holds 30 + 10 problems
REAL_MINUTES = 9.0                              # one call's limit is 10 minutes: a model a call
#: Cells whose GPU memory peak is a stage of the run (a marker may match several cells: the stage is their maximum).
STAGES = {("03", "FastLanguageModel.from_pretrained("): "load", ("03", "readiness"): "preflight",
          ("03", "trainer.train(resume_from_checkpoint="): "train (held-out evaluations inside)",
          ("04", "model, tokenizer = FastLanguageModel.from_pretrained("): "reload_04",
          ("04", "results = evaluate_adapters("): "evaluate_04", ("04", "pass_at_k_curve("): "pass_at_k_04",
          ("04", "save_pretrained_merged("): "merge_04", ("04", "verify_merged("): "verify_04"}


class NoGPU(RuntimeError):
    """No CUDA GPU: the check stops here (on a CPU this is where a test expects it to stop)."""


# ------------------------------------------------------------------------------------------- notebook cells
@dataclasses.dataclass
class Cell:
    """One code cell of a notebook, as the check runs it."""

    notebook: str
    index: int
    source: str
    role: str                    # "path" (later cells need it), "aside", or "skip"
    marker: str = ""             # the path or skip marker it matched
    why: str = ""                # why it is skipped

    @property
    def name(self) -> str:
        return f"{self.notebook}[{self.index}]"


def read_cells(notebook: str, path: Path | None = None) -> list[Cell]:
    """The code cells of notebook ``03``/``04`` in order, classified; IPython magics become ``pass`` (as
    ``tests/notebook_code.py`` reads them). Raises when a marker matches no cell or several."""
    data = json.loads((path or NOTEBOOKS[notebook]).read_text())
    cells = []
    for index, cell in enumerate(data["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        source = re.sub(r"^(\s*)%(.*)$", r"\1pass  # %\2", source, flags=re.M)
        cells.append(Cell(notebook, index, source, "aside"))
    for marker in PATH_MARKERS.get(notebook, ()):
        cell = _one(cells, marker, notebook)
        cell.role, cell.marker = "path", marker
    for marker, why in SKIP_MARKERS.get(notebook, {}).items():
        cell = _one(cells, marker, notebook)
        cell.role, cell.marker, cell.why = "skip", marker, why
    return cells


def _one(cells: list[Cell], marker: str, notebook: str) -> Cell:
    found = [c for c in cells if marker in c.source]
    if len(found) != 1:
        raise ValueError(f"notebook {notebook}: {len(found)} code cells contain {marker!r}, the check expects one. "
                         "The notebook changed: update PATH_MARKERS / SKIP_MARKERS in dev/gpu_check.py.")
    return found[0]


def substitutions(trackio: bool) -> list[tuple[str, str, str]]:
    """``(old, new, why)`` edits the check makes to the cells' source on the machine (each one recorded)."""
    subs = []
    if not trackio:
        subs.append(('report_to="trackio"', 'report_to="none"',
                     "trackio is not installed on the lent machine: the check's GRPOConfig logs nowhere"))
    return subs


def apply_substitutions(cells: list[Cell], subs: list[tuple[str, str, str]]) -> list[dict[str, str]]:
    applied = []
    for cell in cells:
        for old, new, why in subs:
            if old in cell.source:
                cell.source = cell.source.replace(old, new)
                applied.append({"cell": cell.name, "old": old, "new": new, "why": why})
    return applied


# ------------------------------------------------------------------------------------------------ tiny models
def tiny_config(arch: str, tok: Any, eos: int) -> Any:
    """A 2-layer config of ``arch`` (``qwen2``: untied head like Qwen2.5; ``gemma3``: tied, like Gemma 3 1B)."""
    common = dict(vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=2048, bos_token_id=tok.bos_token_id,
                  eos_token_id=eos, pad_token_id=tok.pad_token_id)
    if arch == "qwen2":
        from transformers import Qwen2Config
        return Qwen2Config(**common, num_key_value_heads=2, tie_word_embeddings=False)
    if arch == "gemma3":
        from transformers import Gemma3TextConfig
        return Gemma3TextConfig(**common, num_key_value_heads=1, head_dim=64, query_pre_attn_scalar=64,
                                sliding_window=512, layer_types=["sliding_attention", "full_attention"],
                                tie_word_embeddings=True)
    raise ValueError(f"Unknown architecture {arch!r}: use one of {', '.join(ARCHITECTURES)}.")


def tiny_model(arch: str, tokenizer_dir: str | Path, out: str | Path,
               eos_probability: float = EOS_PROBABILITY) -> dict[str, Any]:
    """Build a random-weight ``arch`` model with ``tokenizer_dir``'s tokenizer, save it (bfloat16) in ``out``.

    Random weights are shaped so the course's code has something to do: ``<|im_end|>`` is sampled with probability
    ~``eos_probability`` a token (some completions end, some are cut off; a plain random model never ends one), and
    the other logits are peaked (:data:`LOGIT_SPREAD`), so greedy decoding writes tokens instead of ending at once. How:
    every token embedding carries one constant feature that no layer writes to, so the final norm's output has a
    steady ``h[0]``; only ``<|im_end|>``'s head row reads it. A tied head (Gemma 3) reads it in every row alike (a
    shift softmax ignores), and its layers' outputs are scaled up so the last hidden state is not the input token's
    own embedding (a tied random model otherwise repeats its input). Returns what was built and measured."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tok.eos_token, tok.pad_token = "<|im_end|>", "<|endoftext|>"
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    config = tiny_config(arch, tok, eos)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    head, embed = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    tied = head.data_ptr() == embed.data_ptr()
    chats = [[{"role": "user", "content": q}] for q in ("What is 12 + 30? Think step by step.",
                                                         "A shelf holds 14 books and 6 more arrive. How many now?",
                                                         "How many legs do 3 cats have?")]
    side, tok.padding_side = tok.padding_side, "left"
    batch = tok.apply_chat_template(chats, add_generation_prompt=True, return_tensors="pt", return_dict=True,
                                    padding=True)
    ids, mask = batch["input_ids"], batch["attention_mask"].bool()
    log_odds = torch.log(torch.tensor(eos_probability / (1 - eos_probability)))
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.endswith(("o_proj", "down_proj")):
                module.weight[0] = 0.0          # no layer writes feature 0
            if tied and name.endswith(("post_attention_layernorm", "post_feedforward_layernorm")):
                module.weight.fill_(LAYER_SCALE - 1.0)   # Gemma's norms scale by (1 + weight): layers outweigh embeddings
        if not tied:
            head[:, 0] = 0.0
        head[eos] = 0.0
        embed[:, 0] = float(embed[:, 1:].std())
        others = torch.ones(len(tok), dtype=torch.bool)
        others[eos] = False
        for _ in range(8):  # settle the constant, the head's spread and <|im_end|>'s row together
            hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state[mask]
            rest = model.get_output_embeddings()(hidden).float()[:, others]
            embed[:, 0] *= STEADY_H0 / float(hidden[:, 0].mean())                  # h[0] about STEADY_H0
            head[others, 1:] *= LOGIT_SPREAD / float(rest.std(-1).mean())          # peaked: greedy writes tokens
            target = torch.logsumexp(rest, -1) + log_odds       # <|im_end|>'s logit wanted, per position
            head[eos, 0] = float((target * hidden[:, 0]).sum() / (hidden[:, 0] ** 2).sum())   # least squares
        logits = model(input_ids=ids, attention_mask=mask).logits.float()[mask]
        probs = torch.softmax(logits, -1)
        p_eos, p_top = probs[:, eos], probs[:, others].max(-1).values
        copies = float((logits.argmax(-1) == ids[mask]).float().mean())
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = eos, tok.pad_token_id
    model = model.to(torch.bfloat16)
    model.save_pretrained(str(out))
    tok.padding_side = side
    tok.save_pretrained(str(out))
    return {"arch": arch, "model_type": config.model_type, "class": type(model).__name__, "path": str(out),
            "config": {k: getattr(config, k) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                       "num_hidden_layers", "num_attention_heads",
                                                       "num_key_value_heads", "tie_word_embeddings")},
            "parameters": sum(p.numel() for p in model.parameters()), "saved_dtype": "bfloat16",
            "eos_token": tok.eos_token, "pad_token": tok.pad_token,
            "p_eos_per_token": [round(float(p_eos.min()), 4), round(float(p_eos.mean()), 4), round(float(p_eos.max()), 4)],
            "p_top_other_token_mean": round(float(p_top.mean()), 4), "predicts_its_input": round(copies, 3)}


# ------------------------------------------------------------------------------------------- real-size models
def standin_tokenizer(tokenizer_dir: str | Path, vocab_size: int, out: str | Path) -> dict[str, Any]:
    """The bundled tokenizer grown to ``vocab_size`` tokens, saved in ``out``: its own BPE vocabulary and chat
    template, then filler tokens (``<f123>``, in the vocabulary, never produced by encoding) up to the real model's
    size, so the logits, the embedding and every sampled id have the real model's width (no model hub here)."""
    from transformers import AutoTokenizer

    src, out = Path(tokenizer_dir), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = json.loads((src / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    used = set(vocab.values()) | {t["id"] for t in data.get("added_tokens", [])}
    if vocab_size < len(used):
        raise ValueError(f"vocab_size={vocab_size} is smaller than the bundled tokenizer's {len(used)} tokens.")
    for i in range(max(used) + 1, vocab_size):
        vocab[f"<f{i}>"] = i
    for name in os.listdir(src):
        if name != "tokenizer.json" and (src / name).is_file() and name.startswith(("tokenizer", "special", "chat")):
            shutil.copy(src / name, out / name)
    (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    tok = AutoTokenizer.from_pretrained(str(out))
    if len(tok) != vocab_size:
        raise RuntimeError(f"the stand-in tokenizer has {len(tok)} tokens, not {vocab_size}")
    return {"tokenizer": str(out), "vocab_size": len(tok), "from": str(src), "fillers": vocab_size - len(used)}


def meta_shapes(key: str) -> dict[str, Any]:
    """Registry model ``key`` from its real config on the meta device (``bench/t4_memory.py``): its parameters and
    shapes, before anything is built for real."""
    sys.path.insert(0, str(ROOT))
    from bench.t4_memory import meta_model, shapes

    return {k: v for k, v in shapes(meta_model(key)).items() if k != "windows"}


def real_config(key: str, tok: Any, overrides: dict[str, Any] | None = None) -> Any:
    """Registry model ``key``'s real config (``dev/model_configs``) with the stand-in tokenizer's special ids
    (``overrides``: other values to change; fewer layers cut ``layer_types`` to match)."""
    from dev.model_configs import config_values, load_config

    overrides = dict(overrides or {})
    layers, types = overrides.get("num_hidden_layers"), config_values(key).get("layer_types")
    if layers and types and "layer_types" not in overrides:
        overrides["layer_types"] = types[:layers]
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    config = load_config(key, bos_token_id=tok.bos_token_id, eos_token_id=eos,
                         pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"), **overrides)
    if config.vocab_size != len(tok):
        raise ValueError(f"{key}: the config's vocab_size {config.vocab_size} is not the tokenizer's {len(tok)}: build "
                         "the tokenizer with standin_tokenizer(..., config.vocab_size, ...).")
    return config


def real_model(key: str, tokenizer_dir: str | Path, out: str | Path, device: str = "cuda",
               overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """A random-weight ``key`` at its real size (``overrides``: config values to change, a test's smaller copy),
    built on ``device`` in bfloat16 and saved in ``out`` with the stand-in tokenizer, for Unsloth to load as notebook
    03 does (4-bit). Its weights are transformers' random initialisation: it rarely samples ``<|im_end|>``, so its
    completions run to ``max_completion_length``, the longest a T4 has to hold."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.time()
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tok.eos_token, tok.pad_token = "<|im_end|>", "<|endoftext|>"
    config = real_config(key, tok, overrides)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = tok.eos_token_id, tok.pad_token_id
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    head, embed = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    info = {"key": key, "model_type": config.model_type, "class": type(model).__name__, "path": str(out),
            "config": {k: getattr(config, k, None) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                             "num_hidden_layers", "num_attention_heads",
                                                             "num_key_value_heads", "head_dim", "tie_word_embeddings")},
            "parameters": sum(p.numel() for p in model.parameters()), "tied": head.data_ptr() == embed.data_ptr(),
            "saved_dtype": "bfloat16", "device": str(device), "overrides": overrides or {},
            "bytes": sum(p.stat().st_size for p in Path(out).rglob("*") if p.is_file()),
            "seconds": round(time.time() - start, 1)}
    del model, head, embed
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()   # the 15 GiB cap is for notebook 03's model, not this copy
    return info


# ------------------------------------------------------------------------------------------------ recording
class Tee(io.TextIOBase):
    """Write to the real stream and keep the text, so each step's output can be recorded (its tail)."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.parts = stream, []

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.parts.append(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def text(self) -> str:
        return "".join(self.parts)


class Recorder:
    """One child's record: each step timed, its error (with the traceback's tail) kept; written after each step."""

    def __init__(self, path: Path, deadline: float, **fields: Any) -> None:
        self.path, self.deadline = path, deadline
        self.data: dict[str, Any] = {**fields, "steps": [], "stopped_at": None}
        self.window: dict[str, float] | None = None   # the largest step peak since take_window()
        self.write()

    def take_window(self) -> dict[str, float] | None:
        """The largest GPU memory peak of the steps since the last call (None: no GPU in use), and start anew."""
        window, self.window = self.window, None
        return window

    def write(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=1, default=str))

    def run(self, name: str, func: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[bool, Any]:
        """Run one step; ``(ok, value)``. ``NoGPU`` is recorded as where the check stopped, not as a failure."""
        print(f"=== {self.data.get('model', '')} {name}", flush=True)
        step: dict[str, Any] = {"name": name}
        self.data["running"] = name  # what a run stopped at the deadline was doing
        self.write()
        start, tee = time.time(), Tee(sys.stdout)
        ok, value = False, None
        gpu_peak(reset=True)
        try:
            with contextlib.redirect_stdout(tee):
                value = func(*args, **kwargs)
            ok = True
        except NoGPU as exc:
            step["stopped"] = str(exc)
            self.data["stopped_at"] = f"{name}: {exc}"
        except BaseException as exc:  # noqa: BLE001 - recorded; the run goes on where it can
            step["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            step["traceback"] = traceback.format_exc()[-3000:]
            traceback.print_exc()
            if isinstance(exc, KeyboardInterrupt):
                raise
        step.update(ok=ok, seconds=round(time.time() - start, 2), output_tail=tee.text()[-(600 if ok else 2000):])
        if (peak := gpu_peak(reset=False)) is not None:   # this step's own peak (reset before it ran)
            step["peak_gpu"] = peak
            self.window = {k: max(v, (self.window or {}).get(k, 0.0)) for k, v in peak.items()}
        self.data["steps"].append(step)
        self.data["running"] = None
        self.write()
        return ok, value

    def time_left(self) -> float:
        return self.deadline - time.time()


def jsonable(value: Any) -> Any:
    """A JSON-friendly copy of a config value (enums by value, unknown objects by repr)."""
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if hasattr(value, "value") and isinstance(getattr(value, "value"), (str, int)):
        return value.value
    return repr(value)


# ----------------------------------------------------------------------------------------- the GPU, T4-like
def emulate_t4() -> dict[str, Any]:
    """Make Unsloth and the course see a T4: compute capability 7.5, no bf16 (no CUDA call; before ``import
    unsloth``, which reads the capability at import). Triton and torch's own compilers still see the real GPU."""
    import torch

    real = torch.cuda.get_device_capability

    def capability(device: Any = None) -> tuple[int, int]:
        # Triton and torch's compilers build kernels for the capability they read: told 7.5 on an H100 they build
        # sm_75 code the GPU cannot load ("no kernel image is available", the check's first run on 2026-11-27).
        # They see the real GPU; Unsloth, bitsandbytes, TRL and the course see a T4.
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.split(".")[0] == "triton" or caller.startswith("torch."):
            return real(device)
        return T4_CAPABILITY

    torch.cuda.get_device_capability = capability
    torch.cuda.is_bf16_supported = lambda *args, **kwargs: False
    torch.cuda._course_real_capability = real
    return {"capability": list(T4_CAPABILITY), "bf16_supported": False}


def gpu_memory_cap(native: bool, rehearsal: bool = False) -> dict[str, Any]:
    """The first CUDA call: cap PyTorch's memory at a T4's 15 GiB (``NoGPU`` without CUDA, unless rehearsing)."""
    import torch

    if not torch.cuda.is_available():
        if rehearsal:
            return {"gpu": None, "rehearsal": "no GPU: the cells run on the CPU with the rehearsal's stand-ins"}
        raise NoGPU("no CUDA GPU is visible; everything up to here ran, the rest needs a GPU")
    props = torch.cuda.get_device_properties(0)
    real = getattr(torch.cuda, "_course_real_capability", torch.cuda.get_device_capability)(0)
    out = {"gpu": props.name, "capability": list(real), "memory_gib": round(props.total_memory / 1024**3, 1),
           "cuda": torch.version.cuda, "torch": torch.__version__}
    if not native:
        fraction = min(1.0, T4_MEMORY_BYTES / props.total_memory)
        torch.cuda.set_per_process_memory_fraction(fraction, 0)
        out["memory_fraction"] = round(fraction, 4)
        out["memory_cap_gib"] = round(fraction * props.total_memory / 1024**3, 2)
    torch.cuda.reset_peak_memory_stats()
    return out


def gpu_peak(reset: bool) -> dict[str, float] | None:
    """PyTorch's GPU memory peak since the last reset, in GiB (None where CUDA is not in use yet: the check never
    initialises CUDA to ask); ``reset``: start a new peak instead."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    if reset:
        torch.cuda.reset_peak_memory_stats()
        return None
    return {"allocated_gib": round(torch.cuda.max_memory_allocated() / 1024**3, 3),
            "reserved_gib": round(torch.cuda.max_memory_reserved() / 1024**3, 3)}


def peak_memory(reset: bool = True) -> dict[str, float] | None:
    import torch

    if not torch.cuda.is_available():
        return None
    out = {"allocated_gib": round(torch.cuda.max_memory_allocated() / 1024**3, 3),
           "reserved_gib": round(torch.cuda.max_memory_reserved() / 1024**3, 3)}
    if reset:
        torch.cuda.reset_peak_memory_stats()
    return out


def free_gpu(namespace: dict[str, Any]) -> None:
    namespace.clear()
    gc.collect()
    with contextlib.suppress(Exception):
        import torch
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------- the course
def course_setup(arch: str, model_dir: Path, run: Path, steps: int | None, sizes: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    """Register the built model as the course's model and the shrunk ``colab-t4`` profile, as the notebooks read
    them (``COURSE_PROFILE``, ``COURSE_MODEL``, ``COURSE_RUN_DIR``); the data is GSM8K's sample in ``data/``.
    ``arch``: a tiny architecture (``qwen2``, ``gemma3``; the check's sizes) or a registry key of ``REAL_MODELS``
    (``colab-t4``'s sizes with ``REAL_SIZES``; ``steps`` None keeps its 250, which the time budget cuts)."""
    import helpers.profiles as hp

    if arch in REAL_MODELS:
        key, real = f"random-{arch}", hp.MODELS[arch]
        hp.MODELS[key] = dataclasses.replace(real, key=key, hf_id=str(model_dir), unsloth_id=str(model_dir),
                                             notes=f"{arch} at its real size, random weights, for the GPU check")
        base = REAL_SIZES
    else:
        key = f"tiny-{arch}"
        real = hp.MODELS["gemma3-1b" if arch == "gemma3" else "qwen2.5-1.5b"]
        hp.MODELS[key] = dataclasses.replace(real, key=key, hf_id=str(model_dir), unsloth_id=str(model_dir),
                                             params_b=0.03, notes=f"a tiny random-weight {arch} for the GPU check")
        base = SIZES
    sizes = dict(base, **(sizes or {}), **({} if steps is None else {"max_steps": steps}))
    hp.PROFILES["colab-t4"] = dataclasses.replace(hp.COLAB_T4, **sizes)
    os.environ.update(COURSE_PROFILE="colab-t4", COURSE_MODEL=key, COURSE_RUN_DIR=str(run),
                      COURSE_GSM8K_DIR=str(ROOT / "data" / "gsm8k_sample"))
    os.environ.pop("COURSE_TIME_BUDGET", None)
    profile = hp.get_profile()
    return {"model_key": key, "like": real.key, "profile": {k: v for k, v in profile.to_dict().items()
                                                            if k != "minutes"}, "sizes_changed": sizes}


class StepTimer:
    """A trainer callback recording each optimizer step's wall time (added after the notebook builds the trainer)."""

    def __new__(cls) -> Any:
        from transformers import TrainerCallback

        class _Timer(TrainerCallback):
            def __init__(self) -> None:
                self.seconds: list[float] = []
                self._start = 0.0

            def on_step_begin(self, args, state, control, **kwargs):  # noqa: D102
                self._start = time.time()

            def on_step_end(self, args, state, control, **kwargs):  # noqa: D102
                self.seconds.append(round(time.time() - self._start, 3))

        return _Timer()


def config_record(ns: dict[str, Any]) -> dict[str, Any]:
    """What the config cell asked and what Unsloth's ``GRPOConfig`` built (notebook 03's own comparison)."""
    asked, config = ns["ASKED"], ns["config"]

    def differs(a: Any, got: Any) -> bool:
        return not (got == a or (a == "none" and got == []))

    changed = {k: [jsonable(v), jsonable(getattr(config, k, None))] for k, v in asked.items()
               if differs(v, getattr(config, k, None))}
    watch = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "steps_per_generation",
             "generation_batch_size", "learning_rate", "optim", "weight_decay", "bf16", "fp16", "loss_type", "beta",
             "epsilon", "epsilon_high", "mask_truncated_completions", "scale_rewards", "max_completion_length",
             "temperature", "vllm_importance_sampling_correction", "report_to", "gradient_checkpointing", "use_vllm")
    return {"class": f"{type(config).__module__}.{type(config).__qualname__}",
            "unsloth_config": hasattr(config, "unsloth_num_chunks"), "changed_from_asked": changed,
            "built": {k: jsonable(getattr(config, k, None)) for k in watch},
            "unsloth_only": {k: jsonable(getattr(config, k)) for k in ("unsloth_num_chunks", "unsloth_logit_chunk_multiplier",
                                                                        "unsloth_grpo_mini_batch", "vllm_sampling_params")
                             if hasattr(config, k)}}


READ_AFTER = ("config = GRPOConfig(**ASKED)", "trainer = GRPOTrainer(", "trainer.train(resume_from_checkpoint=",
              "save_pretrained_merged(", "verify_merged(")


def after_cell(cell: Cell, ns: dict[str, Any], record: dict[str, Any], timer: list[Any]) -> None:
    """Read what a path cell made into the record (the notebook's own variables)."""
    if cell.marker == "config = GRPOConfig(**ASKED)":
        record["config"] = config_record(ns)
    elif cell.marker == "trainer = GRPOTrainer(":
        trainer = ns["trainer"]
        timer[:] = [StepTimer()]
        trainer.add_callback(timer[0])
        model = ns["model"]
        record["trainer"] = {"class": type(trainer).__name__, "args_fp16": trainer.args.fp16,
                             "args_bf16": trainer.args.bf16, "model_class": type(model).__name__,
                             "model_dtype": str(getattr(model, "dtype", None)),
                             "linear4bit_modules": sum(type(m).__name__ == "Linear4bit" for m in model.modules()),
                             "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
                             "padding_side": getattr(ns["tokenizer"], "padding_side", None)}
    elif cell.marker == "trainer.train(resume_from_checkpoint=":
        trainer = ns["trainer"]
        logs = [{k: jsonable(v) for k, v in h.items() if k in (
            "step", "loss", "reward", "reward_std", "kl", "entropy", "completions/mean_length",
            "completions/clipped_ratio", "frac_reward_zero_std", "grad_norm", "learning_rate", "train_runtime")}
            for h in trainer.state.log_history]
        steps = timer[0].seconds if timer else []
        record["train"] = {"resumed_from": ns.get("checkpoint"), "global_step": trainer.state.global_step,
                           "step_seconds": steps, "log_history": logs,
                           "seconds_per_step": round(sum(steps[1:]) / len(steps[1:]), 3) if len(steps) > 1 else
                           (steps[0] if steps else None)}
    elif cell.marker == "save_pretrained_merged(":
        merged = Path(ns["MERGED"])
        record["merge"] = {"files": sorted(p.name for p in merged.iterdir()), "saved_dtype": ns["saved_dtype"](merged),
                           "bytes": sum(p.stat().st_size for p in merged.rglob("*") if p.is_file())}
    elif cell.marker == "verify_merged(":
        import torch

        from helpers.prompts import encode

        report, reference, reloaded = ns["report"], ns["reference"], ns["reloaded"]
        ids = torch.tensor(encode(ns["tokenizer"], [ns["held_out"]["prompt"][0]]))
        with torch.no_grad():
            a = reference(input_ids=ids.to(reference.device)).logits.float().cpu()
            b = reloaded(input_ids=ids.to(reloaded.device)).logits.float().cpu()
        record["reload_and_generate"] = {
            "summary": str(report), "matches": list(report.matches),
            "dtype": str(next(reloaded.parameters()).dtype),
            "merged_outputs": [o[:120] for o in report.merged_outputs],
            "logits_merged_vs_adapter": {"max_abs_diff": round(float((a - b).abs().max()), 4),
                                         "scale": round(float(a.abs().max()), 2),
                                         "argmax_agreement": round(float((a.argmax(-1) == b.argmax(-1)).float().mean()), 4)}}


def preflight_record(ns: dict[str, Any]) -> dict[str, Any] | None:
    """The pre-flight's report a notebook cell left in ``ns`` (a ``helpers.readiness`` object with ``to_dict``):
    its figures, verdict and plan, and the text the learner read."""
    for value in list(ns.values()):
        if type(value).__module__ == "helpers.readiness" and callable(getattr(value, "to_dict", None)):
            return {**jsonable(value.to_dict()), "printed": str(value)}
    return None


def stage_cells(cells: dict[str, list[Cell]]) -> dict[str, str]:
    """``{cell name: stage}`` for the cells whose GPU memory peak is a stage of the run (:data:`STAGES`)."""
    out = {}
    for (notebook, marker), stage in STAGES.items():
        for cell in cells.get(notebook, []):
            if marker in cell.source and cell.role != "skip":
                out.setdefault(cell.name, stage)
    return out


def untrained_adapter(ns: dict[str, Any], run: Path) -> dict[str, Any]:
    """Training failed: save the LoRA model notebook 03 loaded as ``RUN/adapter``, so notebook 04's loading, merge
    and reload still run on the GPU (its own fallback would train again, and fail the same way)."""
    ns["model"].save_pretrained(str(run / "adapter"))
    ns["tokenizer"].save_pretrained(str(run / "adapter"))
    return {"why": "notebook 03's training failed (see its step): 04 runs on the untrained adapter"}


def adapter_signal(run: Path, std: float = ADAPTER_SIGNAL_STD) -> dict[str, Any]:
    """Add seeded noise to the saved adapter's LoRA B matrices (``RUN/adapter``), so notebook 04 evaluates and merges
    an adapter that changes the model: a few steps of a random model's GRPO leave B at zero (every group's rewards
    are equal, so no gradient), and merging a zero update would check nothing."""
    import torch
    from safetensors.torch import load_file, save_file

    path = run / "adapter" / "adapter_model.safetensors"
    tensors = load_file(str(path))
    generator = torch.Generator().manual_seed(0)
    changed = 0
    for name, tensor in tensors.items():
        if "lora_B" in name:
            noise = torch.randn(tensor.shape, generator=generator) * std
            tensors[name] = (tensor.float() + noise).to(tensor.dtype)
            changed += 1
    save_file(tensors, str(path), metadata={"format": "pt"})
    return {"lora_B_tensors": changed, "noise_std": std,
            "why": "a random model's few GRPO steps leave LoRA B at zero; merging a zero update checks nothing"}


def run_cells(rec: Recorder, label: str, cells: list[Cell], ns: dict[str, Any], record: dict[str, Any],
              before: dict[tuple[str, str], Any] | None = None, reserve: float = 20.0) -> bool:
    """Execute cells in order in ``ns``; a failed path cell stops the notebook. True when every cell ran.

    ``before``: a function (or a list of them) to run before the cell with that path marker; a failed one stops."""
    timer: list[Any] = []
    ran_all = True
    for cell in cells:
        if cell.role == "skip":
            record.setdefault("skipped", {})[cell.name] = cell.why
            continue
        hooks = (before or {}).get((cell.notebook, cell.marker))
        for hook in hooks if isinstance(hooks, (list, tuple)) else [hooks] if hooks else []:
            ok, _ = rec.run(hook.__name__, hook)
            if not ok:
                return False
        if rec.time_left() < reserve:
            rec.data["stopped_at"] = rec.data["stopped_at"] or f"{label} {cell.name}: out of time"
            return False
        code = compile(cell.source, f"<notebook {cell.name}>", "exec")
        ok, _ = rec.run(f"{label} {cell.name}", exec, code, ns)
        if ok and cell.marker in READ_AFTER:
            rec.run(f"{label} {cell.name} (read)", after_cell, cell, ns, record, timer)
        if ok and (found := preflight_record(ns)) and found != record.get("preflight"):
            record["preflight"] = found
        if not ok:
            ran_all = False
            if cell.role == "path":
                record["stopped_after"] = cell.name
                return False
    return ran_all


def child(arch: str, work: Path, out_json: Path, deadline: float, native: bool, tokenizer: Path,
          rehearse: Path | None = None, sizes: dict[str, Any] | None = None, layers: int | None = None) -> int:
    """One architecture, start to end, in this process (``--child``)."""
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent asks for the stacks before a kill
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)  # Unsloth writes unsloth_compiled_cache/ into the working folder
    rec = Recorder(out_json, deadline, model=arch, t4_like=not native)
    data = rec.data
    real = arch in REAL_MODELS
    model_dir = work / (f"random-{arch}" if real else f"tiny-{arch}")
    if real:  # the real size: a tokenizer of the model's vocabulary now, the weights on the GPU after its cap
        data["real_size"] = True
        ok, meta = rec.run("model_config", meta_shapes, arch)
        data["model_config"] = meta
        if not ok:
            return 1
        ok, info = rec.run("standin_tokenizer", standin_tokenizer, tokenizer, meta["vocab"], work / "tokenizer")
        data["standin_tokenizer"] = info
        if not ok:
            return 1
    else:
        ok, info = rec.run("tiny_model", tiny_model, arch, tokenizer, model_dir)
        data["tiny_model"] = info
        if not ok:
            return 1

    def load_cells() -> dict[str, Any]:
        import importlib.util
        cells = {nb: read_cells(nb) for nb in NOTEBOOKS}
        applied = apply_substitutions([c for nb in cells.values() for c in nb],
                                      substitutions(importlib.util.find_spec("trackio") is not None))
        for cell in (c for nb in cells.values() for c in nb):
            compile(cell.source, f"<notebook {cell.name}>", "exec")
        data["substitutions"] = applied
        data["cells"] = {nb: {"run": [c.name for c in cs if c.role != "skip"],
                              "path": [c.name for c in cs if c.role == "path"],
                              "skipped": {c.name: c.why for c in cs if c.role == "skip"}} for nb, cs in cells.items()}
        data["stage_cells"] = stage_cells(cells)
        return cells

    ok, cells = rec.run("notebook_cells", load_cells)
    if not ok:
        return 1
    if not native:
        data["t4_emulation"] = rec.run("t4_like", emulate_t4)[1]

    def import_unsloth() -> dict[str, Any]:
        start = time.time()
        import unsloth  # noqa: F401  (before TRL, as the notebooks do)
        return {"seconds": round(time.time() - start, 1), "versions": versions()}

    ok, imported = rec.run("import_unsloth", import_unsloth)
    data["import_unsloth"] = imported
    if not ok:
        return 1
    if rehearse is not None:  # a CPU rehearsal of the check itself: stand-ins for what needs a GPU
        import runpy
        data["rehearsal"] = str(rehearse)
        if not rec.run("rehearsal_prelude", runpy.run_path, str(rehearse), run_name="__gpu_check_rehearsal__")[0]:
            return 1
    run = work / f"run-{arch}"
    ok, setup = rec.run("course_setup", course_setup, arch, model_dir, run, None if real else STEPS, sizes)
    data["course"] = setup
    if not ok:
        return 1

    def gpu_memory_cap_step() -> Any:
        data["gpu"] = gpu_memory_cap(native, rehearsal=rehearse is not None)
        return data["gpu"]

    def random_model() -> Any:  # real size: built on the GPU under its cap, saved for notebook 03 to load
        data["real_model"] = real_model(arch, work / "tokenizer", model_dir, device="cuda" if data["gpu"]["gpu"]
                                        else "cpu", overrides={"num_hidden_layers": layers} if layers else None)
        return data["real_model"]

    gpu_memory_cap_step.__name__ = "gpu_memory_cap"
    hooks = [gpu_memory_cap_step, random_model] if real else [gpu_memory_cap_step]
    # notebook 03: tiny: 2 steps, a checkpoint a step; real: colab-t4's steps, stopped by a short time budget
    ns: dict[str, Any] = {"__name__": "__main__"}
    nb03: dict[str, Any] = {}
    data["notebook_03"] = nb03
    rec.take_window()
    run_cells(rec, "03", cells["03"], ns, nb03, before={FIRST_CUDA_CELL: hooks})
    if data["stopped_at"] and data["stopped_at"].startswith("gpu_memory_cap"):
        return 2
    nb03["peak_gpu_memory"] = rec.take_window()
    adapter = run / "adapter" / "adapter_config.json"
    if "train" not in nb03 and "model" in ns and "tokenizer" in ns and not adapter.is_file():
        data["untrained_adapter"] = rec.run("untrained_adapter", untrained_adapter, ns, run)[1]
    free_gpu(ns)
    if "train" in nb03 and not real:
        # the learner comes back: the notebook's path again, one step more, resumes from the last checkpoint
        resume: dict[str, Any] = {}
        data["notebook_03_resume"] = resume
        rec.run("course_setup (3 steps)", course_setup, arch, model_dir, run, RESUME_STEPS, sizes)
        rec.take_window()
        run_cells(rec, "03 again", [c for c in cells["03"] if c.role == "path"], ns, resume)
        resume["peak_gpu_memory"] = rec.take_window()
        free_gpu(ns)
    if adapter.is_file():
        data["adapter_signal"] = rec.run("adapter_signal", adapter_signal, run)[1]
        nb04: dict[str, Any] = {}
        data["notebook_04"] = nb04
        rec.take_window()
        run_cells(rec, "04", cells["04"], ns, nb04)
        nb04["peak_gpu_memory"] = rec.take_window()
        free_gpu(ns)
    rec.write()
    failed = [s for s in data["steps"] if not s["ok"] and "stopped" not in s]
    return 1 if failed or data["stopped_at"] else 0


# ------------------------------------------------------------------------------------------ the parent run
VERSIONED = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "bitsandbytes", "unsloth",
             "unsloth_zoo", "triton", "torchao", "xformers", "tokenizers", "numpy", "huggingface_hub", "trackio")


def versions() -> dict[str, str | None]:
    import importlib.metadata as md

    out: dict[str, str | None] = {}
    for name in VERSIONED:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def machine() -> dict[str, Any]:
    """The machine, read without initialising CUDA in this process (nvidia-smi)."""
    info: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                            "cpus": os.cpu_count(), "gpu": None}
    smi = shutil.which("nvidia-smi")
    if smi:
        proc = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True)
        if proc.returncode == 0 and proc.stdout.strip():
            name, memory, driver = [x.strip() for x in proc.stdout.splitlines()[0].split(",")]
            info.update(gpu=name, gpu_memory=memory, driver=driver)
    return info


def install(carry: Path, site: Path) -> dict[str, Any]:
    """The carried wheels into ``site`` (``pip install --no-index --no-deps --target``), ahead of the image's."""
    wheels = sorted((carry / "wheels").glob("*.whl"))
    if not wheels:
        raise FileNotFoundError(f"No wheels in {carry / 'wheels'}: build them here with `python dev/wheelhouse.py "
                                "build` and carry .cache/gpu-carry to the machine.")
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile",
                           "--no-cache-dir", "--quiet", "--disable-pip-version-check", "--upgrade", "--target",
                           str(site), *map(str, wheels)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip install of the carried wheels failed:\n{proc.stderr[-3000:]}")
    return {"wheels": len(wheels), "seconds": round(time.time() - start, 1), "site": str(site)}


def image_requirements(carry: Path) -> dict[str, Any]:
    """What the carried packages require of the image, against the versions installed here."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    manifest = json.loads((carry / "manifest.json").read_text())
    met, unmet = [], []
    for name, reqs in manifest.get("image_requirements", {}).items():
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            have = None
        for text in reqs:
            req = Requirement(text.split(" (", 1)[0])
            line = f"{text}: {name} {have or 'missing'}"
            (met if have is not None and req.specifier.contains(have, prereleases=True) else unmet).append(line)
    return {"checked": len(met) + len(unmet), "unmet": unmet}


def summarize(result: dict[str, Any]) -> None:
    """What ran, what failed, seconds per step, peak memory and the rewritten config, over every architecture."""
    ran, failed, stopped = [], {}, {}
    for arch, data in result["models"].items():
        for step in data.get("steps", []):
            if step["ok"]:
                ran.append(f"{arch}: {step['name']}")
            elif "stopped" not in step:
                failed[f"{arch}: {step['name']}"] = step.get("error")
        if data.get("stopped_at"):
            stopped[arch] = data["stopped_at"]
        if data.get("child_error"):
            failed[f"{arch}: process"] = data["child_error"]
    result.update(ran=ran, failed=failed, stopped=stopped)
    result["substitutions"] = sorted({f"{s['cell']}: {s['old']} -> {s['new']} ({s['why']})"
                                      for d in result["models"].values() for s in d.get("substitutions", [])})
    result["seconds_per_step"] = {a: d.get("notebook_03", {}).get("train", {}).get("seconds_per_step")
                                  for a, d in result["models"].items()}
    result["peak_gpu_memory_gib"] = {a: max([p["allocated_gib"] for k in ("notebook_03", "notebook_03_resume",
                                                                          "notebook_04")
                                             if (p := d.get(k, {}).get("peak_gpu_memory"))] or [None],
                                            key=lambda v: -1 if v is None else v)
                                     for a, d in result["models"].items()}
    result["rewritten_config"] = {a: d.get("notebook_03", {}).get("config") for a, d in result["models"].items()}
    gpu = (result.get("machine") or {}).get("gpu")
    like = " told it is a T4 (capability 7.5, 15 GiB cap): not a T4's speed" if result.get("t4_like") else ""
    result["step_time"] = {a: {"seconds_per_step": secs, "gpu": gpu, "label": f"{secs} s a step on {gpu}{like}"}
                           for a, secs in result["seconds_per_step"].items() if secs is not None and gpu}
    result["peak_gpu_gib_by_stage"] = {a: stage_peaks(d) for a, d in result["models"].items()}
    result["preflight"] = {a: d.get("notebook_03", {}).get("preflight") for a, d in result["models"].items()}


def stage_peaks(model: dict[str, Any]) -> dict[str, float]:
    """The largest allocated GPU memory (GiB) of each stage's cells (``stage_cells``), from each step's own peak."""
    names = model.get("stage_cells") or {}
    out: dict[str, float] = {}
    for step in model.get("steps", []):
        label, _, cell = step["name"].rpartition(" ")
        stage = names.get(cell) if label in ("03", "04") else None
        if stage is None and step["name"] == "random_model":
            stage = "build (the random model, bfloat16)"
        if stage and (peak := step.get("peak_gpu")):
            out[stage] = max(out.get(stage, 0.0), peak["allocated_gib"])
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["store"]:
        return store(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "runs" / "gpu-check"),
                        help="folder for gpu_check.json (default $OUT, else runs/gpu-check)")
    parser.add_argument("--work", type=Path, default=None,
                        help="scratch folder for models and runs (default: a temporary folder)")
    parser.add_argument("--models", default=None,
                        help="in order: tiny architectures (qwen2,gemma3; the default) or, with --real, registry keys "
                             f"({','.join(REAL_MODELS)}; the default)")
    parser.add_argument("--minutes", type=float, default=None,
                        help=f"the whole run ends inside this ({DEFAULT_MINUTES}; --real: {REAL_MINUTES})")
    parser.add_argument("--real", action="store_true",
                        help="the T4's models at their real size (random weights from dev/model_configs), "
                             "colab-t4's sizes, notebook 03 on a short budget: one model after the other")
    parser.add_argument("--native", action="store_true", help="the GPU as it is (no T4 capability, no memory cap)")
    parser.add_argument("--install", action="store_true", help="install the carried wheels first (the lent machine)")
    parser.add_argument("--serial", action="store_true",
                        help="one architecture after the other (default: side by side, each with its own memory cap)")
    parser.add_argument("--carry", type=Path, default=CARRY, help=f"the carried folder (default {CARRY})")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="tokenizer folder (default: CARRY/tokenizer, else the bundled model's)")
    parser.add_argument("--rehearse", type=Path, default=None,
                        help="a Python file of CPU stand-ins (tests/gpu_check_cpu.py): run every cell on a CPU, to "
                             "check the check itself, not the GPU path (use with --native)")
    parser.add_argument("--sizes", default=None,
                        help="profile sizes over the check's own, as JSON (a rehearsal's: '{\"num_generations\": 2}')")
    parser.add_argument("--layers", type=int, default=None,
                        help="--real with fewer decoder layers (the real widths and vocabulary): a CPU rehearsal's copy")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-json", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for key, value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                       "UNSLOTH_DISABLE_STATISTICS": "1", "TOKENIZERS_PARALLELISM": "false",
                       "PYTHONWARNINGS": "ignore"}.items():
        os.environ.setdefault(key, value)
    if args.tokenizer is None:
        args.tokenizer = args.carry / "tokenizer"
        if not (args.tokenizer / "tokenizer.json").is_file():
            sys.path.insert(0, str(ROOT))
            from helpers.models import bundled_model_path
            args.tokenizer = bundled_model_path(build=False)
    if args.child:
        sys.path.insert(0, str(ROOT))
        return child(args.child, args.work, args.child_json, args.deadline, args.native, args.tokenizer,
                     args.rehearse, json.loads(args.sizes) if args.sizes else None, args.layers)

    args.models = args.models or ",".join(REAL_MODELS if args.real else ARCHITECTURES)
    args.minutes = args.minutes or (REAL_MINUTES if args.real else DEFAULT_MINUTES)
    args.serial = args.serial or args.real   # real sizes: the step times and memory peaks of one model at a time
    unknown = [a for a in args.models.split(",") if a.strip() and a.strip() not in (
        REAL_MODELS if args.real else ARCHITECTURES)]
    if unknown:
        parser.error(f"unknown model(s) {unknown}: use {', '.join(REAL_MODELS if args.real else ARCHITECTURES)}"
                     + ("" if args.real else " (or --real for the T4's models at their real size)"))
    start = time.time()
    deadline = start + args.minutes * 60
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = (args.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))).resolve()
    result: dict[str, Any] = {"check": "dev/gpu_check.py", "issue": 36,
                              "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(),
                              "command": "python3 dev/gpu_check.py " + " ".join(argv),
                              "t4_like": None if args.native else {"capability": list(T4_CAPABILITY),
                                                                   "memory_cap_gib": T4_MEMORY_BYTES / 1024**3},
                              "real_size": args.real,
                              "rehearsal": str(args.rehearse) if args.rehearse else None, "models": {}}
    env = dict(os.environ)
    paths = [str(ROOT)]
    if args.install:
        site = work / "site"
        try:
            result["install"] = install(args.carry, site)
        except Exception as exc:  # noqa: BLE001 - recorded; the check still says what it can
            result["install"] = {"error": f"{type(exc).__name__}: {exc}"[:3000]}
        paths.insert(0, str(site))
        sys.path[:0] = [str(site)]
        import importlib
        importlib.invalidate_caches()
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    result["versions"] = versions()
    if (args.carry / "manifest.json").is_file():
        try:
            result["image_requirements"] = image_requirements(args.carry)
        except Exception as exc:  # noqa: BLE001
            result["image_requirements"] = {"error": f"{type(exc).__name__}: {exc}"}
    path = out / "gpu_check.json"
    archs = [a.strip() for a in args.models.split(",") if a.strip()]
    result["children"] = "one after the other" if args.serial else "side by side (timings overlap)"
    running: dict[str, tuple[subprocess.Popen, Path, float]] = {}

    def launch(arch: str) -> None:
        child_json = work / f"{arch}.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", arch, "--work", str(work / arch),
               "--child-json", str(child_json), "--deadline", str(deadline - 5), "--tokenizer", str(args.tokenizer),
               "--carry", str(args.carry)] + (["--native"] if args.native else []) + (
            ["--rehearse", str(args.rehearse.resolve())] if args.rehearse else []) + (
            ["--sizes", args.sizes] if args.sizes else []) + (["--layers", str(args.layers)] if args.layers else [])
        running[arch] = (subprocess.Popen(cmd, env=env, start_new_session=True), child_json, time.time())

    def collect(arch: str) -> None:
        proc, child_json, started = running.pop(arch)
        try:
            code = proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGUSR1)  # its threads' stacks to stderr: where it hung
            time.sleep(2)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
        data = json.loads(child_json.read_text()) if child_json.is_file() else {}
        data.update(exit_code=code, seconds=round(time.time() - started, 1))
        if code is None:
            data["stopped_at"] = data.get("stopped_at") or (
                f"killed at the deadline, in {data.get('running')} (its stacks are in the output)")
        elif code not in (0, 1, 2):
            data["child_error"] = f"exit status {code} (a crash: see the output above)"
        result["models"][arch] = data
        summarize(result)
        result["seconds"] = round(time.time() - start, 1)
        path.write_text(json.dumps(result, indent=1, default=str) + "\n")

    for arch in archs:
        if deadline - time.time() < 60:
            result["models"][arch] = {"stopped_at": "not started: out of time"}
            continue
        launch(arch)
        if args.serial:
            collect(arch)
    for arch in list(running):
        collect(arch)
    summarize(result)
    result["seconds"] = round(time.time() - start, 1)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"\nwrote {path} ({result['seconds']} s)")
    print(f"ran {len(result['ran'])} steps; failed: {json.dumps(result['failed'], indent=1) if result['failed'] else 'none'}")
    for arch, where in result["stopped"].items():
        print(f"{arch} stopped at {where}")
    print("seconds per step:", result["seconds_per_step"], "peak GPU GiB:", result["peak_gpu_memory_gib"])
    for arch, stages in result["peak_gpu_gib_by_stage"].items():
        if stages:
            print(f"{arch} peak GPU GiB by stage: {stages}")
    if result["machine"]["gpu"] is None and all("gpu_memory_cap" in (d.get("stopped_at") or "")
                                                 for d in result["models"].values()):
        return 2
    return 1 if result["failed"] or result["stopped"] else 0


REQUIRED = ("date", "machine", "versions", "models", "ran", "failed", "seconds_per_step", "peak_gpu_memory_gib",
            "rewritten_config")


def store(argv: list[str]) -> int:
    """``store FILE [--dest PATH]``: check a result from the lent machine and keep it as bench/measured/gpu/gpu_check.json
    (a ``--real`` result as bench/measured/gpu/gpu_check_t4_real.json), with the commit it is stored at."""
    parser = argparse.ArgumentParser(prog="gpu_check.py store", description=store.__doc__)
    parser.add_argument("file", type=Path)
    parser.add_argument("--dest", type=Path, default=None)
    args = parser.parse_args(argv)
    data = json.loads(args.file.read_text())
    args.dest = args.dest or (STORED_REAL if data.get("real_size") else STORED)
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        print(f"error: {args.file} lacks {missing}: it is not a dev/gpu_check.py result", file=sys.stderr)
        return 1
    if not data["machine"].get("gpu"):
        print(f"error: {args.file} ran on no GPU ({data['machine']}): only a GPU run is stored", file=sys.stderr)
        return 1
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    data.setdefault("stored_at_commit", git.stdout.strip() or None)
    args.dest.parent.mkdir(parents=True, exist_ok=True)
    args.dest.write_text(json.dumps(data, indent=1, default=str) + "\n")
    print(f"stored {args.dest}: {data['machine']['gpu']}, {data['date']}, {len(data['ran'])} steps ran, "
          f"{len(data['failed'])} failed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

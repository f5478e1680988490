"""Merge the trained adapter into the base model, verify it, export it.

* :func:`merge_adapter` writes ``RUN/merged``: the adapter folded into the
  full-precision base weights. On CPU: transformers + PEFT
  (``merge_and_unload``) in float32 by default. On a GPU profile: Unsloth's
  ``save_pretrained_merged(save_method="merged_16bit")``. Never ``merged_4bit``:
  rounding the merged weights back to 4 bits wipes out most of the small LoRA
  update, which is why Unsloth refuses it unless forced.
* When training used a 4-bit base, the merge still uses the full-precision
  base: LoRA learned a small correction ``B @ A``; adding it to 16-bit weights
  keeps it, and the merged model can be quantised afterwards (GGUF) if wanted.
* The output folder is never overwritten unless ``overwrite=True``; the
  model is written to a temporary folder next to it and renamed into place,
  after checking that the disk has room (the message says how much).
* :func:`verify_merged` reloads the merged folder with plain transformers and
  checks that greedy outputs match the adapter model's.
* :func:`export_gguf` and :func:`push_to_hub` (GPU / token needed) go through
  Unsloth; the token comes from ``HF_TOKEN`` or Colab secrets and is never
  printed.

Example:
    >>> from helpers.export import merge_adapter
    >>> merged = merge_adapter(PROFILE, RUN / "adapter", RUN / "merged")   # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

#: Bytes per weight for each dtype a merge can write.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
#: Written into every merged folder: how it was made.
MERGE_INFO = "merge_info.json"


class DiskSpaceError(OSError):
    """Not enough free disk for a save; the message says how much is needed."""


def estimate_merged_bytes(profile: Any, dtype: str | None = None) -> int:
    """Bytes a merged model of ``profile``'s model takes on disk (weights + 5% margin).

    Example:
        >>> from helpers.config import get_profile
        >>> round(estimate_merged_bytes(get_profile("cpu-smoke"), "float32") / 1e6)
        567
    """
    from .config import get_model_spec

    spec = get_model_spec(profile.model)
    dtype = dtype or default_merge_dtype(profile)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r}: choose one of {sorted(DTYPE_BYTES)}.")
    return int(spec.params_b * 1e9 * DTYPE_BYTES[dtype] * 1.05)


def default_merge_dtype(profile: Any) -> str:
    """float32 on CPU (exactly what the adapter model computes), float16 on a GPU profile."""
    return "float32" if profile.backend == "transformers" else "float16"


def check_free_disk(folder: str | Path, needed_bytes: int, what: str = "the merged model") -> int:
    """Raise :class:`DiskSpaceError` unless ``folder``'s disk has ``needed_bytes`` free.

    Returns the free bytes.

    Example:
        >>> check_free_disk(".", 1) > 0
        True
    """
    folder = Path(folder)
    probe = folder
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < needed_bytes:
        raise DiskSpaceError(
            f"Not enough disk for {what}: it needs about {needed_bytes / 1e9:.2f} GB in "
            f"{probe}, and {free / 1e9:.2f} GB are free. Free some space (delete old runs/ "
            "folders or checkpoints), or save only the adapter (it is small) and merge "
            "on a machine with more disk."
        )
    return free


def _refuse_existing(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(
            f"{out_dir} already exists and is not empty, so nothing was written. "
            "Pass overwrite=True to replace it, or choose another folder."
        )


@contextmanager
def atomic_folder(out_dir: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder next to ``out_dir``; rename it into place on success.

    An existing non-empty ``out_dir`` is refused unless ``overwrite=True``; on
    any error the temporary folder is removed and ``out_dir`` is untouched.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()) / "out"
        >>> with atomic_folder(d) as tmp:
        ...     _ = (tmp / "x.txt").write_text("hi")
        >>> (d / "x.txt").read_text()
        'hi'
    """
    out_dir = Path(out_dir)
    _refuse_existing(out_dir, overwrite)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-writing-", dir=out_dir.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}-old-{int(time.time())}")
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def unsloth_merge_kwargs(tokenizer: Any) -> dict[str, Any]:
    """Keywords for Unsloth's ``model.save_pretrained_merged`` (checked by contract tests)."""
    return dict(tokenizer=tokenizer, save_method="merged_16bit", safe_serialization=True)


def unsloth_gguf_kwargs(tokenizer: Any, quantization_method: str = "q4_k_m") -> dict[str, Any]:
    """Keywords for Unsloth's ``model.save_pretrained_gguf`` (checked by contract tests)."""
    return dict(tokenizer=tokenizer, quantization_method=quantization_method)


def unsloth_push_kwargs(tokenizer: Any, token: str, private: bool = True) -> dict[str, Any]:
    """Keywords for Unsloth's ``model.push_to_hub_merged`` (checked by contract tests)."""
    return dict(tokenizer=tokenizer, save_method="merged_16bit", token=token, private=private)


def vllm_llm_kwargs(profile: Any, model_dir: str | Path, enable_lora: bool = False) -> dict[str, Any]:
    """Keywords for ``vllm.LLM(...)`` serving a merged folder (checked by contract tests).

    ``dtype="half"`` because a T4 has no bf16; the memory share and context come
    from the profile.

    Example:
        >>> from helpers.config import get_profile
        >>> vllm_llm_kwargs(get_profile("colab-t4"), "runs/x/merged")["max_model_len"]
        1024
    """
    kwargs: dict[str, Any] = dict(
        model=str(model_dir),
        dtype="half",
        max_model_len=profile.max_seq_length,
        gpu_memory_utilization=profile.gpu_memory_utilization,
        seed=profile.seed,
    )
    if enable_lora:
        kwargs.update(enable_lora=True, max_lora_rank=profile.lora_rank)
    return kwargs


def merge_adapter(
    profile: Any,
    adapter_dir: str | Path,
    out_dir: str | Path,
    overwrite: bool = False,
    dtype: str | None = None,
    model: Any = None,
    tokenizer: Any = None,
) -> Path:
    """Merge a saved adapter into the full-precision base and save it to ``out_dir``.

    * CPU profiles: load the base in full precision (even when the profile
      trains in 4-bit), attach ``adapter_dir``, ``merge_and_unload()``, save in
      ``dtype`` (default float32) with the tokenizer.
    * GPU profiles: Unsloth ``save_pretrained_merged(..., save_method="merged_16bit")``
      on ``model`` (the Unsloth model with the trained LoRA; loaded from
      ``adapter_dir`` when not given).

    Writes ``merge_info.json`` alongside. Refuses an existing folder unless
    ``overwrite=True``; checks free disk first.

    Example:
        >>> merge_adapter(PROFILE, RUN / "adapter", RUN / "merged")     # doctest: +SKIP
        PosixPath('.../merged')
    """
    from .runs import write_json

    adapter_dir, out_dir = Path(adapter_dir), Path(out_dir)
    if not (adapter_dir / "adapter_config.json").is_file():
        raise FileNotFoundError(
            f"No adapter in {adapter_dir} (adapter_config.json missing). Train one first "
            "(notebook 03, or helpers.training.ensure_adapter(PROFILE, RUN))."
        )
    _refuse_existing(out_dir, overwrite)
    dtype = dtype or default_merge_dtype(profile)
    needed = estimate_merged_bytes(profile, dtype)
    if profile.backend == "unsloth":
        # Unsloth downloads the 16-bit base into the Hugging Face cache (usually the same disk).
        needed *= 2
    check_free_disk(out_dir.parent, needed)
    t0 = time.perf_counter()
    with atomic_folder(out_dir, overwrite=overwrite) as tmp:
        if profile.backend == "unsloth":
            if model is None:
                from .models import load_model

                model, tokenizer = load_model(profile, adapter=adapter_dir)
            model.save_pretrained_merged(str(tmp), **unsloth_merge_kwargs(tokenizer))
            how = "unsloth save_pretrained_merged(save_method='merged_16bit')"
        else:
            _merge_transformers(profile, adapter_dir, tmp, dtype)
            how = "peft merge_and_unload on the full-precision base"
        write_json(tmp / MERGE_INFO, {
            "adapter": str(adapter_dir), "base_model": profile.model, "dtype": dtype,
            "method": how, "trained_in_4bit": bool(profile.load_in_4bit),
            "seconds": round(time.perf_counter() - t0, 1),
        })
    return out_dir


def _merge_transformers(profile: Any, adapter_dir: Path, tmp: Path, dtype: str) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .config import get_model_spec
    from .models import model_source

    source = model_source(get_model_spec(profile.model))
    # Full precision on purpose, even when training used a 4-bit base (see module doc).
    base = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged = merged.to(getattr(torch, dtype))
    merged.save_pretrained(str(tmp), safe_serialization=True)
    tok_source = adapter_dir if (adapter_dir / "tokenizer_config.json").is_file() else source
    AutoTokenizer.from_pretrained(str(tok_source)).save_pretrained(str(tmp))


def load_merged(merged_dir: str | Path, dtype: str | None = None) -> tuple[Any, Any]:
    """Load a merged folder with plain transformers (no PEFT, no Unsloth).

    ``dtype`` defaults to float32 on CPU and float16 on a CUDA GPU (where the
    model is placed).

    Example:
        >>> model, tok = load_merged(RUN / "merged")     # doctest: +SKIP
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .models import _prepare_tokenizer

    merged_dir = Path(merged_dir)
    if not (merged_dir / "config.json").is_file():
        raise FileNotFoundError(f"No merged model in {merged_dir}; run merge_adapter first.")
    cuda = torch.cuda.is_available()
    dtype = dtype or ("float16" if cuda else "float32")
    model = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype=getattr(torch, dtype))
    if cuda:
        model = model.to("cuda")
    tok = _prepare_tokenizer(AutoTokenizer.from_pretrained(str(merged_dir)))
    return model, tok


@dataclass
class VerifyReport:
    """Greedy outputs of the adapter model and the merged model, prompt by prompt."""

    prompts: list[Any]
    adapter_outputs: list[str]
    merged_outputs: list[str]
    matches: list[bool] = field(default_factory=list)

    @property
    def all_match(self) -> bool:
        return bool(self.matches) and all(self.matches)

    @property
    def n_match(self) -> int:
        return sum(self.matches)

    def table(self, max_chars: int = 80) -> Any:
        """A pandas DataFrame of the comparison, for the notebook."""
        import pandas as pd

        def clip(t: str) -> str:
            t = t.replace("\n", " \u21b5 ")
            return t if len(t) <= max_chars else t[: max_chars - 1] + "\u2026"

        return pd.DataFrame({
            "adapter model": [clip(t) for t in self.adapter_outputs],
            "merged model": [clip(t) for t in self.merged_outputs],
            "same": self.matches,
        })

    def __str__(self) -> str:
        return (f"{self.n_match}/{len(self.matches)} prompts give the same greedy output "
                "from the adapter model and the merged model")


def verify_merged(
    adapter_model: Any,
    tokenizer: Any,
    merged_dir: str | Path,
    prompts: Sequence[Any],
    max_new_tokens: int = 32,
    merged_model: Any = None,
    adapter: str | Path | None = None,
) -> VerifyReport:
    """Reload ``merged_dir`` with plain transformers and compare greedy outputs.

    ``adapter_model`` is the PEFT model with the trained adapter (same one the
    evaluation used; on a vLLM GPU model pass ``adapter`` so its side gets the
    LoRA request). Greedy decoding is deterministic, so a correct merge gives
    the same text; tiny float differences can flip a near-tie late in a long
    output, which is why the check uses a short ``max_new_tokens``.

    Example:
        >>> report = verify_merged(model, tok, RUN / "merged", prompts[:4])   # doctest: +SKIP
        >>> report.all_match                                                  # doctest: +SKIP
        True
    """
    from .generation import SamplingSettings, generate

    settings = SamplingSettings(max_new_tokens=max_new_tokens, temperature=0.0)
    prompts = list(prompts)
    adapter_out = [o[0] for o in generate(adapter_model, tokenizer, prompts, settings,
                                          adapter=adapter)]
    if merged_model is None:
        merged_model, merged_tok = load_merged(merged_dir)
    else:
        merged_tok = tokenizer
    merged_out = [o[0] for o in generate(merged_model, merged_tok, prompts, settings)]
    return VerifyReport(prompts, adapter_out, merged_out,
                        [a == m for a, m in zip(adapter_out, merged_out)])


def hf_token() -> str | None:
    """A Hugging Face token from ``HF_TOKEN`` or Colab secrets, else None. Never printed.

    Example:
        >>> token = hf_token()              # doctest: +SKIP
        >>> push_to_hub("me/model", merged_dir=RUN / "merged")   # doctest: +SKIP
    """
    token = os.environ.get("HF_TOKEN", "").strip()
    if token:
        return token
    try:
        from google.colab import userdata  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        return (userdata.get("HF_TOKEN") or "").strip() or None
    except Exception:  # secret missing or notebook access not granted
        return None


def export_gguf(model: Any, tokenizer: Any, out_dir: str | Path,
                quantization_method: str = "q4_k_m", overwrite: bool = False,
                needed_bytes: int | None = None) -> Path:
    """GGUF export through Unsloth (GPU profiles): ``model.save_pretrained_gguf``.

    Unsloth writes a 16-bit merge first and converts it with llama.cpp, so it
    needs room for both. Refuses an existing folder unless ``overwrite=True``.

    Example:
        >>> export_gguf(model, tok, RUN / "gguf")     # doctest: +SKIP
    """
    if not hasattr(model, "save_pretrained_gguf"):
        raise RuntimeError(
            "GGUF export needs a model loaded through Unsloth (a GPU profile). On CPU, "
            "llama.cpp's convert_hf_to_gguf.py can convert the merged folder instead."
        )
    out_dir = Path(out_dir)
    if needed_bytes:
        check_free_disk(out_dir.parent, needed_bytes, what="the GGUF export")
    with atomic_folder(out_dir, overwrite=overwrite) as tmp:
        model.save_pretrained_gguf(str(tmp), **unsloth_gguf_kwargs(tokenizer, quantization_method))
    return out_dir


def push_to_hub(repo_id: str, model: Any = None, tokenizer: Any = None,
                merged_dir: str | Path | None = None, private: bool = True) -> str:
    """Push the merged model to the Hugging Face Hub with the token from :func:`hf_token`.

    With an Unsloth ``model``: ``model.push_to_hub_merged(repo_id, ...)`` (16-bit).
    Otherwise uploads ``merged_dir``. Raises with instructions when no token is set;
    the token is passed to the library and never printed or returned.

    Example:
        >>> push_to_hub("me/my-grpo-model", merged_dir=RUN / "merged")   # doctest: +SKIP
        'https://huggingface.co/me/my-grpo-model'
    """
    token = hf_token()
    if token is None:
        raise PermissionError(
            "No Hugging Face token: set the HF_TOKEN environment variable, or on Colab add "
            "a secret named HF_TOKEN (key icon on the left) and allow this notebook to read "
            "it. Never paste a token into a notebook cell."
        )
    if model is not None and hasattr(model, "push_to_hub_merged"):
        model.push_to_hub_merged(repo_id, **unsloth_push_kwargs(tokenizer, token, private))
    else:
        if merged_dir is None:
            raise ValueError("Pass merged_dir=<merged folder> (or an Unsloth model).")
        from huggingface_hub import HfApi

        api = HfApi(token=token)
        api.create_repo(repo_id, private=private, exist_ok=True)
        api.upload_folder(folder_path=str(merged_dir), repo_id=repo_id)
    return f"https://huggingface.co/{repo_id}"

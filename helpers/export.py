"""GGUF files llama.cpp loads, written by llama.cpp's own converters (notebook 04, section 7): model and adapter.

llama.cpp (the runtime under Ollama and LM Studio) reads one file, a GGUF: the weights, the vocabulary and the chat
template. Its converters ship in ``llama-cpp-python``'s source distribution on PyPI; :func:`converters` unpacks them
once into the course's cache (``make llama`` does it) and the functions here run them as subprocesses:

- :func:`convert_merged`: ``RUN/merged`` to one 16-bit file (``f16``);
- :func:`quantize`: that file at fewer bits (``q8_0``, ``q4_k_m``, ...), by llama.cpp's own quantizer, in-process;
- :func:`convert_adapter`: ``RUN/adapter`` to a LoRA GGUF, applied by llama.cpp on a base GGUF (the bundled Q4_1);
- :func:`check_prefill`: the chat template in a GGUF ends its generation prompt with the task's prefill.

Example:
    >>> byte_level_tokenizer({"model": {"type": "BPE", "byte_fallback": True}, "pre_tokenizer": {"type": "Split"}})
    >>> fixed = byte_level_tokenizer({"model": {"type": "BPE", "byte_fallback": True},
    ...                               "pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "Sequence"}})
    >>> fixed["model"]["byte_fallback"], fixed["decoder"]["type"]
    (False, 'ByteLevel')
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from .runs import cache_dir

#: The files of a merged folder the converter reads (the weights are checked apart: one file or shards).
MERGED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")
#: What :func:`converters` unpacks from the source distribution's ``vendor/llama.cpp/``.
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py", "conversion", "gguf-py")
OUTTYPES = ("f16", "bf16", "f32")


class GGUFError(RuntimeError):
    """A GGUF could not be written or is not usable as it is; the message names the file and what to do."""


def llama_cpp_version() -> str:
    """The installed ``llama-cpp-python`` (the converters must come from the same release as the runtime)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        raise GGUFError("llama.cpp is not installed here (the package llama-cpp-python). Run `make llama` in the "
                        "course folder (it builds llama.cpp from PyPI's source, a few minutes), or "
                        "`pip install \"grpo-course[llama]\"` elsewhere; then run this again.") from None


def converters(fetch: bool = True) -> Path:
    """The folder holding llama.cpp's ``convert_hf_to_gguf.py`` and ``convert_lora_to_gguf.py``, unpacked once
    from the installed release's source distribution (``pip download``, 76 MB) into the course's cache."""
    release = llama_cpp_version()
    target = cache_dir() / f"llama.cpp-converters-{release}"
    if all((target / part).exists() for part in CONVERTER_PARTS):
        return target
    if not fetch:
        raise GGUFError(f"llama.cpp's converters are not unpacked yet (looked in {target}): run `make llama`.")
    with tempfile.TemporaryDirectory() as tmp:
        got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                              "--disable-pip-version-check", "--quiet", "-d", tmp, f"llama-cpp-python=={release}"],
                             capture_output=True, text=True)
        sdists = sorted(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if got.returncode != 0 or not sdists:
            raise GGUFError(f"Could not download llama-cpp-python=={release}'s source from PyPI "
                            f"({got.stderr.strip()[-300:] or 'no message'}); connect and run `make llama` again.")
        prefix = f"{sdists[0].name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
        partial = target.with_name(f".{target.name}-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        with tarfile.open(sdists[0]) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)
                       and m.name[len(prefix):].split("/", 1)[0] in CONVERTER_PARTS]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(partial, members=members, filter="data")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(partial, target)
    return target


def bundled_gguf() -> Path:
    """The bundled model's own GGUF (SmolLM2-135M-Instruct, Q4_1), the base a LoRA GGUF of the course applies to."""
    from .models import _find_gguf
    return _find_gguf(cache_dir())


def check_merged(folder: str | Path) -> Path:
    """``folder`` if it is a complete merged model, else a :class:`GGUFError` naming the missing or cut file."""
    folder = Path(folder)
    redo = "Run notebook 04's merge cell (section 5) again with OVERWRITE = True."
    if not folder.is_dir():
        leftovers = sorted(folder.parent.glob(f".{folder.name}-writing-*")) if folder.parent.is_dir() else []
        why = f" ({leftovers[0].name} is a merge that was interrupted: delete it)" if leftovers else ""
        raise GGUFError(f"No merged model in {folder}{why}. {redo}")
    for name in MERGED_FILES:
        if not (folder / name).is_file():
            raise GGUFError(f"{folder / name} is missing: the merged folder is incomplete. {redo}")
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        raise GGUFError(f"No weights (*.safetensors) in {folder}: the merge did not finish. {redo}")
    for path in weights:
        if not _safetensors_complete(path):
            raise GGUFError(f"{path} is cut short (a merge or copy stopped half-way). {redo}")
    return folder


def _safetensors_complete(path: Path) -> bool:
    """Whether the file is as long as its own header says (8-byte length, JSON header, then the tensors)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8 or 8 + int.from_bytes(head, "little") > size:
            return False
        try:
            header = json.loads(f.read(int.from_bytes(head, "little")))
        except ValueError:
            return False
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    return 8 + int.from_bytes(head, "little") + max(ends, default=0) <= size


def byte_level_tokenizer(data: dict[str, Any]) -> dict[str, Any] | None:
    """``tokenizer.json`` declared as the byte-level BPE it is, or None when it needs no change.

    transformers rebuilds the bundled model's tokenizer from its GGUF with the converter of the *architecture*
    (``GGUF_TO_FAST_CONVERTERS["llama"]``, transformers/integrations/ggml.py), which marks the BPE model
    ``byte_fallback`` and gives it a SentencePiece-style decoder, although its vocabulary is byte-level (GPT-2 style,
    ``tokenizer.ggml.model = gpt2`` in the GGUF). llama.cpp's converter takes exactly that mark for a Llama-2
    tokenizer (``LlamaHfVocab`` in gguf-py/gguf/vocab.py) and writes a SentencePiece vocabulary that llama.cpp
    cannot run. Byte fallback never fires on a byte-level vocabulary (every byte is a token), so clearing it and
    decoding byte-level changes no token id and no text (tests/test_export.py checks both)."""
    model, pre = data.get("model") or {}, data.get("pre_tokenizer") or {}
    pres = [pre, *pre.get("pretokenizers", [])]
    if model.get("type") != "BPE" or not model.get("byte_fallback") or not any(p.get("type") == "ByteLevel"
                                                                               for p in pres):
        return None
    fixed = json.loads(json.dumps(data))
    fixed["model"]["byte_fallback"] = False
    fixed["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    return fixed


def _source_folder(merged: Path, work: Path) -> Path:
    """What the converter reads: links to the merged files, the tokenizer declared byte-level where it must be."""
    work.mkdir(parents=True, exist_ok=True)
    for path in merged.iterdir():
        if path.is_file():
            os.symlink(path.resolve(), work / path.name)
    fixed = byte_level_tokenizer(json.loads((merged / "tokenizer.json").read_text(encoding="utf-8")))
    if fixed is not None:
        (work / "tokenizer.json").unlink()
        (work / "tokenizer.json").write_text(json.dumps(fixed, ensure_ascii=False), encoding="utf-8")
    return work


def _run(args: list[str], step: str, out: Path) -> None:
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise GGUFError(f"{step} failed writing {out} (exit {result.returncode}). The converter's last words:\n"
                        f"{result.stderr.strip()[-1500:]}")


def convert_merged(merged: str | Path, out: str | Path, outtype: str = "f16") -> Path:
    """``RUN/merged`` as one GGUF file ``out`` (``f16``, ``bf16`` or ``f32``), written whole or not at all, with the
    merged tokenizer's chat template (the prefill) inside. Fewer bits: :func:`quantize` this file."""
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype={outtype!r}: choose one of {OUTTYPES}; for 8 bits or fewer quantize() the f16 file.")
    merged, out = check_merged(merged), Path(out)
    script = converters() / "convert_hf_to_gguf.py"
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-") as tmp:
        source = _source_folder(merged, Path(tmp) / "source")
        part = Path(tmp) / out.name
        name = f"{merged.resolve().parent.name}-{merged.name}"  # general.name: the run's, not the work folder's
        _run([str(script), str(source), "--outfile", str(part), "--outtype", outtype, "--model-name", name],
             "convert_hf_to_gguf.py", out)
        os.replace(part, out)
    return out


def quantize(gguf: str | Path, out: str | Path, qtype: str = "q8_0", threads: int = 0) -> Path:
    """``gguf`` (16-bit) quantised to ``qtype`` by llama.cpp itself (``llama_model_quantize``, what its
    ``llama-quantize`` runs), written whole to ``out`` or not at all; vocabulary and chat template are copied."""
    import ctypes
    import logging

    import llama_cpp.llama_cpp as lib
    gguf, out = Path(gguf), Path(out)
    ftype = getattr(lib, f"LLAMA_FTYPE_MOSTLY_{qtype.upper()}", None)
    if ftype is None:
        raise ValueError(f"qtype={qtype!r}: llama.cpp {llama_cpp_version()} has no such type (q8_0, q4_k_m, q5_k_m).")
    if not gguf.is_file():
        raise GGUFError(f"{gguf}: no such GGUF file. Write the 16-bit file first: convert_merged(RUN/merged, ...).")
    params = lib.llama_model_quantize_default_params()
    params.ftype, params.nthread = ftype, threads   # 0: llama.cpp picks the threads
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)   # llama.cpp's per-tensor lines, as verbose=False
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-") as tmp:
        part = Path(tmp) / out.name
        if lib.llama_model_quantize(str(gguf).encode(), str(part).encode(), ctypes.byref(params)) != 0:
            raise GGUFError(f"llama.cpp could not quantise {gguf} to {qtype} (see its log above): is it a GGUF "
                            "llama.cpp loads (16 or 32 bits)?")
        os.replace(part, out)
    return out


def convert_adapter(adapter: str | Path, base: str | Path, out: str | Path) -> Path:
    """``RUN/adapter`` as a LoRA GGUF ``out`` (16-bit), for llama.cpp to apply on a GGUF of ``base`` (a model folder:
    only its config is read)."""
    adapter, out = Path(adapter), Path(out)
    if not (adapter / "adapter_config.json").is_file():
        raise GGUFError(f"{adapter / 'adapter_config.json'} is missing: no trained adapter there. Run notebook 03 "
                        "(or notebook 04's first cell, which trains a short one).")
    script = converters() / "convert_lora_to_gguf.py"
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-") as tmp:
        part = Path(tmp) / out.name
        _run([str(script), str(adapter), "--base", str(base), "--outfile", str(part), "--outtype", "f16"],
             "convert_lora_to_gguf.py", out)
        os.replace(part, out)
    return out


def metadata(gguf: str | Path, *keys: str) -> dict[str, Any]:
    """String and number fields of a GGUF's header (``gguf`` package; no tensor is read)."""
    from gguf import GGUFReader
    from gguf.constants import GGUFValueType
    fields = GGUFReader(str(gguf)).fields
    out: dict[str, Any] = {}
    for key in keys:
        field = fields.get(key)
        if field is None:
            out[key] = None
        elif field.types and field.types[0] == GGUFValueType.STRING:
            out[key] = bytes(field.parts[field.data[0]]).decode("utf-8")
        else:
            out[key] = field.parts[field.data[0]].tolist()[0] if field.data else None
    return out


def check_prefill(gguf: str | Path, prefill: str) -> str:
    """The GGUF's chat template, when its generation prompt ends with ``prefill``; else a :class:`GGUFError`."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    template = metadata(gguf, "tokenizer.chat_template")["tokenizer.chat_template"]
    if not template:
        raise GGUFError(f"{gguf} has no chat template: a chat request would not carry the prefill {prefill!r}. "
                        "Convert RUN/merged again (its tokenizer carries notebook 01's template).")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    shown = env.from_string(template).render(messages=[{"role": "user", "content": "1 + 1?"}],
                                             add_generation_prompt=True, bos_token="", eos_token="")
    if prefill and not shown.endswith(prefill):
        raise GGUFError(f"{gguf}'s chat template does not end the generation prompt with the prefill {prefill!r} "
                        f"(it ends {shown[-40:]!r}): served as it is, the model answers as if untrained. Convert "
                        "from a merged folder saved with the course's tokenizer (notebook 04 section 5), or send "
                        "prompts rendered by that tokenizer as plain completions.")
    return template


if __name__ == "__main__":  # `make llama`: python -m helpers.export --fetch
    if sys.argv[1:] != ["--fetch"]:
        sys.exit("usage: python -m helpers.export --fetch   (unpacks llama.cpp's converters into the cache)")
    print(converters())

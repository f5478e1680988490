"""helpers.export: llama.cpp's converters on the course's merged model and adapter, and llama.cpp loading them.

Real converters (unpacked from llama-cpp-python's source distribution by `make llama`), the real runtime, the
bundled model with a seeded 'trained' adapter (tests/llama_files.py, made once per session)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.export import (GGUFError, bundled_gguf, byte_level_tokenizer, check_merged, check_prefill,
                            convert_adapter, convert_merged, converters, metadata, quantize)
from helpers.models import bundled_model_path, prepare_tokenizer
from helpers.prompts import render
from helpers.tasks import get_task
from tests.adapters import PROMPTS
from tests.llama_files import llama_files

pytestmark = pytest.mark.slow
PREFILL = get_task("arithmetic").prefill
TEXTS = ["What is 23 + 19?", "  two  spaces\tand a tab\n", "12345678 + 0.5 = ?", "naïve café 東京 🙂",
         "<|im_start|>user\nhi<|im_end|>", "<reasoning>\n7 + 5 = 12\n</reasoning>\n<answer>\n12\n</answer>"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return llama_files(tmp_path_factory)


def test_the_byte_level_declaration_changes_no_token_id_and_no_text():
    """The fix only re-declares the tokenizer: the same ids for every text, the same text back."""
    from tokenizers import Tokenizer

    raw = json.loads((bundled_model_path() / "tokenizer.json").read_text(encoding="utf-8"))
    fixed = byte_level_tokenizer(raw)
    assert fixed is not None and raw["model"]["byte_fallback"] and not fixed["model"]["byte_fallback"]
    before, after = Tokenizer.from_str(json.dumps(raw)), Tokenizer.from_str(json.dumps(fixed))
    for text in TEXTS:
        ids = before.encode(text).ids
        assert after.encode(text).ids == ids
        assert after.decode(ids, skip_special_tokens=False) == before.decode(ids, skip_special_tokens=False) == text
    assert byte_level_tokenizer(fixed) is None  # already byte-level: nothing to change


def _vocab_model(folder: Path, out: Path) -> str:
    subprocess.run([sys.executable, str(converters() / "convert_hf_to_gguf.py"), str(folder), "--vocab-only",
                    "--outfile", str(out)], check=True, capture_output=True)
    return metadata(out, "tokenizer.ggml.model")["tokenizer.ggml.model"]


def test_the_converter_alone_writes_a_vocabulary_llama_cpp_cannot_run(files, tmp_path):
    """The known failure, reproduced: on the merged folder as saved, convert_hf_to_gguf.py picks SentencePiece's
    'llama' vocabulary (llama.cpp then aborts on the first chat); convert_merged's file says 'gpt2'/'smollm'."""
    assert _vocab_model(files["merged"], tmp_path / "as-saved.gguf") == "llama"
    got = metadata(files["f16"], "tokenizer.ggml.model", "tokenizer.ggml.pre", "general.file_type")
    assert got["tokenizer.ggml.model"] == "gpt2" and got["tokenizer.ggml.pre"] == "smollm"
    assert got["general.file_type"] == 1  # LlamaFileType.MOSTLY_F16


def test_the_merged_gguf_carries_the_prefill_and_answers_as_transformers(files):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from helpers.generation import SamplingSettings, generate
    from helpers.serve import llama_complete, load_llama

    assert PREFILL and check_prefill(files["f16"], PREFILL).endswith("{% endif %}")
    tok = AutoTokenizer.from_pretrained(str(files["merged"]))
    model = AutoModelForCausalLM.from_pretrained(str(files["merged"]))
    prepare_tokenizer(tok, model)
    reference = [o[0] for o in generate(model, tok, PROMPTS, SamplingSettings(max_new_tokens=24, temperature=0.0))]
    texts, tokens = llama_complete(load_llama(files["f16"], threads=1), [render(tok, p) for p in PROMPTS], 24)
    assert 0 < tokens <= 24 * len(PROMPTS)
    same = [a.strip() == b.strip() for a, b in zip(texts, reference)]
    assert sum(same) >= 3, list(zip(texts, reference))  # float32 against 16-bit: a near tie may part, not more


def test_q8_0_is_smaller_and_still_answers(files, tmp_path):
    """The 16-bit file quantised by llama.cpp's own quantizer: 8 bits, the vocabulary and the template kept."""
    from helpers.serve import llama_complete, load_llama

    q8 = quantize(files["f16"], tmp_path / "model-q8_0.gguf", "q8_0", threads=1)
    assert metadata(q8, "general.file_type")["general.file_type"] == 7  # LlamaFileType.MOSTLY_Q8_0
    assert q8.stat().st_size < 0.6 * files["f16"].stat().st_size
    assert metadata(q8, "tokenizer.ggml.model", "tokenizer.chat_template") == metadata(
        files["f16"], "tokenizer.ggml.model", "tokenizer.chat_template")
    assert [p.name for p in tmp_path.iterdir()] == ["model-q8_0.gguf"]  # no work file left beside it
    texts, tokens = llama_complete(load_llama(q8, threads=1), ["<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n"
                                                                "<|im_start|>assistant\n" + PREFILL], 16)
    assert tokens > 0 and texts[0].strip()


def test_the_adapter_as_a_lora_gguf_on_the_bundled_gguf(files, tmp_path):
    """The llama.cpp users' route: the base GGUF (the bundled Q4_1) plus the adapter converted alone."""
    import llama_cpp
    import numpy as np

    from helpers.serve import llama_complete, load_llama

    lora = convert_adapter(files["adapter"], bundled_model_path(), tmp_path / "adapter.gguf")
    assert metadata(lora, "general.type", "adapter.type") == {"general.type": "adapter", "adapter.type": "lora"}
    base = bundled_gguf()
    prompt = "<|im_start|>user\nWhat is 23 + 19?<|im_end|>\n<|im_start|>assistant\n" + PREFILL
    last = {}
    for name, llm in [("with", load_llama(base, lora=lora, threads=1)), ("alone", load_llama(base, threads=1))]:
        llm.eval(llm.tokenize(prompt.encode(), add_bos=False, special=True))
        logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)  # the next token's, from llama.cpp's C API
        last[name] = np.ctypeslib.as_array(logits, shape=(llm.n_vocab(),)).copy()
        assert llama_complete(llm, [prompt], 8)[1] > 0
    assert abs(last["with"] - last["alone"]).max() > 0.05  # the adapter is applied (its B matrices are random)


def test_a_gguf_without_the_prefill_is_refused_by_name():
    base = bundled_gguf()  # the bundled GGUF: SmolLM2's own template, no prefill
    with pytest.raises(GGUFError, match=rf"{base.name}.*does not end the generation prompt with the prefill"):
        check_prefill(base, PREFILL)


def test_quantize_names_a_missing_file_an_unknown_type_and_a_file_it_cannot_read(tmp_path):
    with pytest.raises(GGUFError, match=r"missing\.gguf: no such GGUF file.*convert_merged"):
        quantize(tmp_path / "missing.gguf", tmp_path / "out.gguf")
    with pytest.raises(ValueError, match=r"qtype='q9_9'.*q4_k_m"):
        quantize(bundled_gguf(), tmp_path / "out.gguf", "q9_9")
    (tmp_path / "broken.gguf").write_bytes(b"GGUF" + bytes(60))   # a header and nothing else
    with pytest.raises(GGUFError, match=r"could not quantise .*broken\.gguf to q8_0"):
        quantize(tmp_path / "broken.gguf", tmp_path / "out.gguf", threads=1)
    with pytest.raises(ValueError, match="quantize"):
        convert_merged(tmp_path, tmp_path / "out.gguf", "q8_0")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.gguf"]   # nothing half-written left


def test_missing_or_half_written_merged_folders_are_named(files, tmp_path):
    import shutil

    with pytest.raises(GGUFError, match="No merged model in .*OVERWRITE = True"):
        check_merged(tmp_path / "merged")
    (tmp_path / ".merged-writing-1-2").mkdir()
    with pytest.raises(GGUFError, match=r"\.merged-writing-1-2 is a merge that was interrupted"):
        check_merged(tmp_path / "merged")
    shutil.copytree(files["merged"], tmp_path / "merged")
    assert check_merged(tmp_path / "merged") == tmp_path / "merged"
    weights = tmp_path / "merged" / "model.safetensors"
    with open(weights, "r+b") as f:  # a copy stopped half-way
        f.truncate(weights.stat().st_size // 2)
    with pytest.raises(GGUFError, match="model.safetensors is cut short"):
        convert_merged(tmp_path / "merged", tmp_path / "out.gguf")
    (tmp_path / "merged" / "tokenizer.json").unlink()
    with pytest.raises(GGUFError, match="tokenizer.json is missing"):
        check_merged(tmp_path / "merged")
    assert not (tmp_path / "out.gguf").exists() and not list(tmp_path.glob(".out.gguf-*"))

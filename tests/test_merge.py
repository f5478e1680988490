"""helpers.merge: disk needed, the dtype a merge wrote, and the greedy check of a merged model."""

import json

import pytest

from helpers.profiles import get_profile
from helpers.merge import VerifyReport, merged_size_bytes, saved_dtype, verify_merged

from .adapters import PROMPTS, perturbed_lora_model, save_adapter


def test_merged_size_follows_parameters_and_dtype():
    smoke = get_profile("cpu-smoke")
    assert merged_size_bytes(smoke, "float32") == int(0.135e9 * 4 * 1.05)
    assert merged_size_bytes(smoke, "bfloat16") == merged_size_bytes(smoke, "float16")
    assert merged_size_bytes(smoke, "float32") == pytest.approx(2 * merged_size_bytes(smoke, "bfloat16"), abs=1)
    assert merged_size_bytes(get_profile("colab-t4"), "bfloat16") == int(1.5e9 * 2 * 1.05)
    with pytest.raises(ValueError, match="choose one of"):
        merged_size_bytes(smoke, "int4")


@pytest.mark.parametrize("config, expected", [
    ({"dtype": "float32"}, "float32"),
    ({"torch_dtype": "bfloat16"}, "bfloat16"),  # transformers 4 wrote this key
    ({"text_config": {"dtype": "float16"}}, "float16"),  # Gemma 3 style: the text model's dtype
    ({"model_type": "llama"}, None),
])
def test_saved_dtype_reads_config_json(tmp_path, config, expected):
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert saved_dtype(tmp_path) == expected


def test_saved_dtype_of_a_missing_or_broken_folder_is_none(tmp_path):
    assert saved_dtype(tmp_path / "missing") is None
    (tmp_path / "config.json").write_text("{not json")
    assert saved_dtype(tmp_path) is None


def test_report_counts_matching_prompts():
    report = VerifyReport(["a", "b\nc", "d"], ["a", "b\nc", "x"])
    assert report.matches == [True, True, False]
    assert str(report).startswith("2/3 prompts give the same greedy output")
    table = report.table()
    assert list(table.columns) == ["adapter model", "merged model", "same"]
    assert table.loc[1, "adapter model"] == "b \u21b5 c"


@pytest.mark.slow
def test_a_float32_merge_matches_and_a_wrong_merge_or_a_bf16_copy_does_not(tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from helpers.models import load_model

    profile = get_profile("cpu-smoke")
    model, tok = perturbed_lora_model(profile, seed=0)
    adapter = save_adapter(model, tok, tmp_path / "adapter")

    full_base, _ = load_model(profile, lora=False)  # notebook 04's merge: float32 base + adapter
    merged = PeftModel.from_pretrained(full_base, str(adapter)).merge_and_unload()
    merged.save_pretrained(str(tmp_path / "merged"))
    assert saved_dtype(tmp_path / "merged") == "float32"
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), dtype=torch.float32)
    report = verify_merged(model, reloaded, tok, PROMPTS, max_new_tokens=24)
    assert report.matches == [True] * 4, report.table()

    merged.to(torch.bfloat16).save_pretrained(str(tmp_path / "bf16"))
    assert saved_dtype(tmp_path / "bf16") == "bfloat16"
    bf16 = AutoModelForCausalLM.from_pretrained(str(tmp_path / "bf16"), dtype=torch.bfloat16)
    assert not all(verify_merged(model, bf16, tok, PROMPTS, max_new_tokens=24).matches)

    wrong, _ = perturbed_lora_model(profile, seed=1)  # another adapter's update merged in
    assert not all(verify_merged(model, wrong.merge_and_unload(), tok, PROMPTS, max_new_tokens=24).matches)


# --------------------------------------------------------------------------- GGUF files, where Unsloth writes them


def test_collect_gguf_moves_the_files_out_of_unsloths_sibling_folder(tmp_path):
    from helpers.merge import collect_gguf

    work, sibling = tmp_path / "gguf-export", tmp_path / "gguf-export_gguf"
    work.mkdir()
    (work / "model.safetensors").write_bytes(b"16-bit merge")
    sibling.mkdir()
    (sibling / "m-Q4_K_M.gguf").write_bytes(b"GGUF")
    out = collect_gguf(work, tmp_path / "gguf")
    assert [p.name for p in out] == ["m-Q4_K_M.gguf"] and out[0].parent == tmp_path / "gguf"
    assert not work.exists() and not sibling.exists()  # the 16-bit work copy no longer fills the disk
    sibling.mkdir()
    (sibling / "again.gguf").write_bytes(b"GGUF")
    with pytest.raises(FileExistsError):  # a rerun does not silently replace the first export
        collect_gguf(work, tmp_path / "gguf")
    assert [p.name for p in collect_gguf(work, tmp_path / "gguf", overwrite=True)] == ["again.gguf"]


def test_collect_gguf_says_where_it_looked(tmp_path):
    from helpers.merge import collect_gguf

    with pytest.raises(FileNotFoundError, match="gguf-export_gguf"):
        collect_gguf(tmp_path / "gguf-export", tmp_path / "gguf")


@pytest.mark.slow
def test_after_4bit_training_the_merge_is_checked_against_the_full_precision_base(tmp_path):
    """A merge is the full-precision base + LoRA: a 4-bit adapter model rounds differently and drifts from it
    even when the merge is right, so notebook 04 compares the merged model with the same full-precision base
    with the adapter loaded on it (like with like)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from helpers.models import load_model

    four_bit = get_profile("cpu-smoke", load_in_4bit=True)  # NF4 through bitsandbytes, on the CPU
    model, tok = perturbed_lora_model(four_bit, seed=0, std=0.05)
    adapter = save_adapter(model, tok, tmp_path / "adapter")
    full, _ = load_model(four_bit.with_overrides(load_in_4bit=False), lora=False)
    PeftModel.from_pretrained(full, str(adapter)).merge_and_unload().save_pretrained(str(tmp_path / "merged"))
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), dtype=torch.float32)

    assert not all(verify_merged(model, merged, tok, PROMPTS, max_new_tokens=24).matches)  # unlike with like
    full_again, _ = load_model(four_bit.with_overrides(load_in_4bit=False), lora=False)
    reference = PeftModel.from_pretrained(full_again, str(adapter))
    assert all(verify_merged(reference, merged, tok, PROMPTS, max_new_tokens=24).matches)

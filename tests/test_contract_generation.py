"""Contract: the GPU paths of helpers.generation call Unsloth and vLLM as they really are.

* Unsloth: ``model.load_lora`` is ``unsloth_zoo.vllm_utils.load_lora`` and
  ``model.fast_generate`` is the vLLM engine's ``generate`` (read from the
  installed source).
* vLLM (no GPU here, so not installed): signatures recorded from the pinned wheel
  in ``tests/fixtures/vllm_0.19.1_signatures.json``; a fake ``vllm`` module built
  from that record rejects any keyword the real one would, and the generation
  code is run against it.
"""

import functools
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest

from helpers.generation import SamplingSettings, generate, vllm_sampling_kwargs

from .contract import assert_accepts, signatures

RECORD = Path(__file__).parent / "fixtures" / "vllm_0.19.1_signatures.json"
LOAD_LORA = "unsloth_zoo.vllm_utils:load_lora"


@functools.lru_cache(maxsize=None)
def recorded_vllm() -> dict:
    return json.loads(RECORD.read_text())


def vllm_accepts(target: str, kwargs: dict, rec: dict | None = None) -> None:
    rec = rec or recorded_vllm()
    params = set(rec["targets"][target]["params"])
    unknown = sorted(set(kwargs) - params)
    assert not unknown, f"{target} (vllm {rec['versions']['vllm']}) has no parameter(s) {unknown}"


def test_the_record_matches_the_pinned_vllm():
    from tests.test_versions import pinned

    assert recorded_vllm()["versions"]["vllm"] == pinned("vllm", extra="vllm"), (
        "vllm's pin changed: re-record tests/fixtures/vllm_*_signatures.json from the new wheel")


@pytest.mark.parametrize("settings", [SamplingSettings(), SamplingSettings(
    max_new_tokens=7, temperature=0.8, top_p=0.9, num_return_sequences=4, seed=3)])
def test_sampling_settings_map_to_sampling_params(settings):
    kwargs = vllm_sampling_kwargs(settings)
    vllm_accepts("vllm:SamplingParams", kwargs)
    assert kwargs["max_tokens"] == settings.max_new_tokens and kwargs["n"] == settings.num_return_sequences
    assert kwargs["temperature"] == settings.temperature and kwargs["seed"] == settings.seed


def _fake_vllm(monkeypatch):
    """A ``vllm`` module whose classes accept exactly the recorded keywords."""
    rec = recorded_vllm()

    def strict(target):
        class Strict:
            def __init__(self, **kwargs):
                vllm_accepts(target, kwargs, rec)
                self.__dict__.update(kwargs)
        Strict.__name__ = target.split(":")[1]
        return Strict

    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = strict("vllm:SamplingParams")
    lora_mod = types.ModuleType("vllm.lora.request")
    lora_mod.LoRARequest = strict("vllm.lora.request:LoRARequest")
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.lora", types.ModuleType("vllm.lora"))
    monkeypatch.setitem(sys.modules, "vllm.lora.request", lora_mod)
    return rec


class _Out:
    def __init__(self, texts):
        self.outputs = [types.SimpleNamespace(text=t) for t in texts]


def _engine_generate(rec, calls):
    def generate(prompts, sampling_params=None, **kwargs):
        vllm_accepts("vllm:LLM.generate", dict(kwargs, prompts=prompts, sampling_params=sampling_params), rec)
        calls.append(dict(kwargs, prompts=prompts, params=sampling_params))
        return [_Out([f"{p[-3:]}#{i}" for i in range(sampling_params.n)]) for p in prompts]
    return generate


class _Tok:
    def apply_chat_template(self, messages, tokenize, add_generation_prompt, continue_final_message):
        return "|".join(m["content"] for m in messages) + ("<gen>" if add_generation_prompt else "")


def test_unsloth_fast_generate_path_with_and_without_lora(monkeypatch):
    rec = _fake_vllm(monkeypatch)
    calls, loaded = [], []

    class UnslothModel:  # what FastLanguageModel gives with fast_inference=True
        vllm_engine = object()
        fast_generate = staticmethod(_engine_generate(rec, calls))

        def load_lora(self, path):
            loaded.append(path)
            return "lora-request"

    prompts = [[{"role": "user", "content": "2+2?"}]]
    settings = SamplingSettings(max_new_tokens=5, num_return_sequences=2)
    base = generate(UnslothModel(), _Tok(), prompts, settings)
    trained = generate(UnslothModel(), _Tok(), prompts, settings, adapter=Path("run/adapter"))
    assert base == [["en>#0", "en>#1"]] and trained == base
    assert calls[0]["lora_request"] is None and calls[1]["lora_request"] == "lora-request"
    assert loaded == ["run/adapter"]
    assert calls[0]["params"].max_tokens == 5 and calls[0]["prompts"] == ["2+2?<gen>"]


def test_plain_vllm_llm_path_builds_a_lora_request(monkeypatch):
    rec = _fake_vllm(monkeypatch)
    calls = []
    LLM = type("LLM", (), {"__module__": "vllm.entrypoints.llm",
                           "generate": staticmethod(_engine_generate(rec, calls))})
    out = generate(LLM(), _Tok(), ["plain prompt"], SamplingSettings(), adapter="a/b")
    assert out == [["mpt#0"]]
    req = calls[0]["lora_request"]
    assert (req.lora_name, req.lora_int_id, req.lora_path) == ("adapter", 1, "a/b")


@pytest.mark.contract
def test_unsloth_load_lora_takes_the_adapter_path():
    info = signatures(LOAD_LORA)
    params = info["targets"][LOAD_LORA]["params"]
    assert params[:2] == ["model", "save_directory"]  # called as model.load_lora(path)


@pytest.mark.contract
def test_unsloth_fast_generate_is_the_vllm_engine_generate():
    from .contract import contract_python
    import subprocess

    code = ("import importlib.util, pathlib; s = importlib.util.find_spec('unsloth'); "
            "print(pathlib.Path(s.origin).parent)")
    root = subprocess.run([contract_python(), "-c", code], capture_output=True, text=True,
                          timeout=120).stdout.strip()
    llama = (Path(root) / "models" / "llama.py").read_text()
    utils = (Path(root) / "models" / "_utils.py").read_text()
    assert "model.fast_generate = model.vllm_engine.generate" in llama
    assert "model.load_lora = functools.partial(load_lora, model)" in utils

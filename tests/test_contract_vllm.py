"""Contract: helpers.generation's vLLM paths, run against a strict stand-in for the pinned vLLM.

vLLM needs a GPU to install, so its signatures were recorded from the pinned wheel
(``tests/fixtures/vllm_*_signatures.json``). The stand-in ``vllm`` module built from that record
rejects any keyword the real one would; the course's generation code runs against it for both
GPU paths: Unsloth's ``fast_inference`` engine (whose vLLM engine holds the *base* weights, so the
trained side needs a LoRA request) and a plain ``vllm.LLM``.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from helpers.generation import SamplingSettings, generate

from .test_contract_calls import recorded_vllm

pytestmark = pytest.mark.contract


def accepts(target: str, kwargs: dict) -> None:
    params = set(recorded_vllm()["targets"][target]["params"])
    unknown = sorted(set(kwargs) - params)
    assert not unknown, f"{target} (vllm {recorded_vllm()['versions']['vllm']}) has no parameter(s) {unknown}"


@pytest.fixture
def fake_vllm(monkeypatch):
    """A ``vllm`` module whose classes accept exactly the recorded keywords."""
    def strict(target):
        class Strict:
            def __init__(self, **kwargs):
                accepts(target, kwargs)
                self.__dict__.update(kwargs)
        return Strict

    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = strict("vllm:SamplingParams")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = strict("vllm.lora.request:LoRARequest")
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.lora", types.ModuleType("vllm.lora"))
    monkeypatch.setitem(sys.modules, "vllm.lora.request", request)


def engine_generate(calls: list):
    def generate(prompts, sampling_params=None, **kwargs):
        accepts("vllm:LLM.generate", dict(kwargs, prompts=prompts, sampling_params=sampling_params))
        calls.append(dict(kwargs, prompts=prompts, params=sampling_params))
        return [types.SimpleNamespace(outputs=[types.SimpleNamespace(text=f"{p['prompt_token_ids'][-1]}#{i}")
                                               for i in range(sampling_params.n)]) for p in prompts]
    return generate


class Tok:
    """Encodes a conversation as the lengths of its messages (enough to follow the ids)."""

    def apply_chat_template(self, conversations, add_generation_prompt, tokenize, return_dict, **kwargs):
        return {"input_ids": [[len(m["content"]) for m in c] + [99] for c in conversations]}


def test_unsloth_engine_samples_the_base_without_a_lora_request_and_the_adapter_with_one(fake_vllm):
    calls, loaded = [], []

    class UnslothModel:  # what FastLanguageModel.from_pretrained(..., fast_inference=True) gives
        vllm_engine = object()
        fast_generate = staticmethod(engine_generate(calls))

        def load_lora(self, path):
            loaded.append(path)
            return "lora-request"

    prompts = [[{"role": "user", "content": "2+2?"}]]
    settings = SamplingSettings(max_new_tokens=5, num_return_sequences=2)
    assert generate(UnslothModel(), Tok(), prompts, settings) == [["99#0", "99#1"]]
    generate(UnslothModel(), Tok(), prompts, settings, adapter=Path("run/adapter"))
    assert calls[0]["lora_request"] is None and calls[1]["lora_request"] == "lora-request"
    assert loaded == ["run/adapter"]
    assert calls[0]["prompts"] == [{"prompt_token_ids": [4, 99]}]  # the ids TRL would feed, not re-rendered text
    assert calls[0]["params"].max_tokens == 5 and calls[0]["params"].n == 2


def test_a_plain_vllm_llm_gets_a_lora_request_for_the_adapter(fake_vllm):
    calls = []
    LLM = type("LLM", (), {"__module__": "vllm.entrypoints.llm", "generate": staticmethod(engine_generate(calls))})
    generate(LLM(), Tok(), [[{"role": "user", "content": "hi"}]], SamplingSettings(temperature=0.7, seed=3),
             adapter="runs/x/adapter")
    req, params = calls[0]["lora_request"], calls[0]["params"]
    assert (req.lora_name, req.lora_int_id, req.lora_path) == ("adapter", 1, "runs/x/adapter")
    assert params.temperature == 0.7 and params.seed == 3 and params.top_p == 1.0

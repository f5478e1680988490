"""Contract: what helpers.export passes to Unsloth and vLLM exists in the pinned versions.

Unsloth's signatures come from the real package (``tests/contract_probe.py`` in
the contract environment, imported with ``UNSLOTH_ALLOW_CPU=1``). vLLM cannot be
installed without a GPU, so its signatures were read from the pinned wheel
(``tests/fixtures/vllm_0.19.1_signatures.json``); the vLLM checks live in
``test_contract_generation.py``.
"""

import json
import os
import subprocess
import tempfile

import pytest

from helpers.config import PROFILES
from helpers.export import (
    unsloth_gguf_kwargs,
    unsloth_merge_kwargs,
    unsloth_push_kwargs,
    vllm_llm_kwargs,
)

from .contract import assert_accepts, contract_python, signatures
from .test_contract_generation import recorded_vllm, vllm_accepts

pytestmark = pytest.mark.contract

# patch_saving_functions binds these to model.save_pretrained_merged / push_to_hub_merged /
# save_pretrained_gguf on text models; the non-generic ones are the older names.
MERGED = ["unsloth.save:unsloth_generic_save_pretrained_merged",
          "unsloth.save:unsloth_save_pretrained_merged"]
PUSH = ["unsloth.save:unsloth_generic_push_to_hub_merged",
        "unsloth.save:unsloth_push_to_hub_merged"]
GGUF = ["unsloth.save:unsloth_save_pretrained_gguf"]
GPU_PROFILES = [p for p in PROFILES.values() if p.backend == "unsloth"]


@pytest.fixture(scope="module")
def info():
    return signatures(*MERGED, *PUSH, *GGUF)


@pytest.mark.parametrize("target", MERGED)
def test_save_pretrained_merged_keywords(info, target):
    assert_accepts(target, unsloth_merge_kwargs(tokenizer=None), info)


@pytest.mark.parametrize("target", PUSH)
def test_push_to_hub_merged_keywords(info, target):
    assert_accepts(target, unsloth_push_kwargs(tokenizer=None, token="x"), info)


def test_save_pretrained_gguf_keywords(info):
    assert_accepts(GGUF[0], unsloth_gguf_kwargs(tokenizer=None), info)


def test_the_gguf_quantization_and_save_method_are_known_to_unsloth():
    code = (
        "import json, os; os.environ['UNSLOTH_ALLOW_CPU'] = '1'; import unsloth; "
        "import unsloth.save as s; import inspect; "
        "print('CONTRACT-JSON ' + json.dumps({'quants': sorted(s.ALLOWED_QUANTS), "
        "'merged_src': inspect.getsource(s.unsloth_generic_save_pretrained_merged)}))"
    )
    env = dict(os.environ, UNSLOTH_ALLOW_CPU="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([contract_python(), "-c", code], capture_output=True, text=True,
                          env=env, timeout=600, cwd=tempfile.mkdtemp())
    line = next((l for l in proc.stdout.splitlines() if l.startswith("CONTRACT-JSON ")), None)
    assert line is not None, proc.stderr[-2000:]
    data = json.loads(line[len("CONTRACT-JSON "):])
    assert unsloth_gguf_kwargs(None)["quantization_method"] in data["quants"]
    assert "merged_16bit" in data["merged_src"]


@pytest.mark.parametrize("profile", GPU_PROFILES, ids=lambda p: p.name)
def test_vllm_llm_keywords(profile):
    rec = recorded_vllm()
    for enable_lora in (False, True):
        kwargs = vllm_llm_kwargs(profile, "merged", enable_lora=enable_lora)
        # LLM(**kwargs) takes its own parameters and hands the rest to EngineArgs
        own = set(rec["targets"]["vllm:LLM.__init__"]["params"])
        vllm_accepts("vllm.engine.arg_utils:EngineArgs",
                     {k: v for k, v in kwargs.items() if k not in own}, rec)

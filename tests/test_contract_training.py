"""Contract: every GRPOConfig keyword helpers.training passes exists in the installed TRL,
as Unsloth patches it on a GPU (checked in the contract environment)."""

import pytest

from helpers.config import MODELS, PROFILES
from helpers.training import grpo_settings

from .contract import assert_accepts, signatures

pytestmark = pytest.mark.contract

GRPO_CONFIG = "trl:GRPOConfig"
CAPABILITIES = {"t4": (7, 5), "a100": (8, 0)}


@pytest.fixture(scope="module")
def info():
    return signatures(GRPO_CONFIG)


@pytest.mark.parametrize("profile", list(PROFILES.values()), ids=lambda p: p.name)
@pytest.mark.parametrize("gpu", list(CAPABILITIES), ids=str)
@pytest.mark.parametrize("vllm", [False, True], ids=["hf-generate", "vllm"])
def test_grpo_config_keywords(info, tmp_path, profile, gpu, vllm):
    p = profile.with_overrides(use_vllm=vllm and profile.backend == "unsloth")
    settings = grpo_settings(p, tmp_path, capability=CAPABILITIES[gpu])
    assert_accepts(GRPO_CONFIG, settings, info)


@pytest.mark.parametrize("model", [m.key for m in MODELS.values() if m.unsloth_id])
def test_grpo_config_keywords_for_every_gpu_model(info, tmp_path, model):
    p = PROFILES["colab-t4"].with_overrides(model=model)
    assert_accepts(GRPO_CONFIG, grpo_settings(p, tmp_path, capability=(7, 5)), info)


def test_removed_max_prompt_length_is_caught(info):
    with pytest.raises(AssertionError, match="max_prompt_length"):
        assert_accepts(GRPO_CONFIG, {"max_prompt_length": 256}, info)

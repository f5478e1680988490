"""Contract: the keywords helpers.models passes to Unsloth exist in the installed Unsloth."""

import pytest

from helpers.config import MODELS, PROFILES
from helpers.models import unsloth_load_kwargs, unsloth_peft_kwargs

from .contract import assert_accepts, signatures

pytestmark = pytest.mark.contract

FROM_PRETRAINED = "unsloth:FastLanguageModel.from_pretrained"
GET_PEFT = "unsloth:FastLanguageModel.get_peft_model"
GPU_PROFILES = [p for p in PROFILES.values() if p.backend == "unsloth"]
GPU_MODELS = [m for m in MODELS.values() if m.unsloth_id]


@pytest.fixture(scope="module")
def info():
    return signatures(FROM_PRETRAINED, GET_PEFT)


def test_contract_env_has_the_pinned_unsloth(info):
    from tests.test_versions import pinned

    assert info["versions"]["unsloth"] == pinned("unsloth", extra="gpu")


@pytest.mark.parametrize("profile", GPU_PROFILES, ids=lambda p: p.name)
@pytest.mark.parametrize("spec", GPU_MODELS, ids=lambda m: m.key)
def test_from_pretrained_keywords(info, profile, spec):
    kwargs = unsloth_load_kwargs(profile.with_overrides(use_vllm=True), spec)
    assert_accepts(FROM_PRETRAINED, kwargs, info)
    assert_accepts(FROM_PRETRAINED, unsloth_load_kwargs(profile, spec), info)


@pytest.mark.parametrize("profile", GPU_PROFILES, ids=lambda p: p.name)
def test_get_peft_model_keywords(info, profile):
    assert_accepts(GET_PEFT, unsloth_peft_kwargs(profile), info)


def test_a_wrong_keyword_is_caught(info):
    with pytest.raises(AssertionError, match="max_prompt_length"):
        assert_accepts(FROM_PRETRAINED, {"max_prompt_length": 256}, info)

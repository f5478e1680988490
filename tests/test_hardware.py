"""Preflight: hardware facts and the warnings for known traps."""

from helpers.config import get_model_spec, get_profile
from helpers.hardware import Hardware, disk_needed, inspect_hardware, native_bf16, preflight_warnings


def machine(**kw):
    base = dict(cuda=True, gpu_name="Tesla T4", capability=(7, 5), vram_gb=14.7, cpus=2,
                ram_gb=12.7, free_disk_gb=60.0, on_colab=True, on_kaggle=False)
    base.update(kw)
    return Hardware(**base)


def topics(hw, profile="colab-t4", model="qwen2.5-1.5b", **over):
    return [w.topic for w in preflight_warnings(hw, get_profile(profile, **over), get_model_spec(model))]


def test_bf16_comes_from_the_compute_capability():
    assert not native_bf16((7, 5)) and native_bf16((8, 0)) and native_bf16((9, 0))
    assert not machine().bf16 and machine(capability=(8, 6)).bf16


def test_this_machine_is_inspected_without_error():
    hw = inspect_hardware()
    assert hw.cpus >= 1 and hw.free_disk_gb > 0 and hw.ram_gb > 0
    assert hw.cuda == (hw.capability is not None)


def test_t4_warns_about_bf16_only_for_qwen():
    assert topics(machine()) == ["bf16"]


def test_gemma_on_a_t4_warns_about_fp16_overflow():
    assert "gemma-fp16" in topics(machine(), model="gemma3-1b")
    assert "gemma-fp16" not in topics(machine(capability=(8, 0), vram_gb=40.0), model="gemma3-1b")


def test_vllm_on_a_t4_is_flagged():
    assert "vllm-t4" in topics(machine(), use_vllm=True)
    assert "vllm-t4" not in topics(machine(), use_vllm=False)


def test_colab_without_gpu_says_how_to_get_one():
    warnings = preflight_warnings(machine(cuda=False, gpu_name=None, capability=None, vram_gb=None),
                                  get_profile("cpu-demo"), get_model_spec("smollm2-135m"))
    assert [w.topic for w in warnings] == ["no-gpu"]
    assert "T4" in warnings[0].fix


def test_low_disk_names_the_need():
    hw = machine(free_disk_gb=2.0)
    warn = [w for w in preflight_warnings(hw, get_profile("colab-t4"), get_model_spec("qwen2.5-3b"))
            if w.topic == "disk"]
    assert warn and f"{disk_needed(get_model_spec('qwen2.5-3b')).gb}" in warn[0].message


def test_small_gpu_is_warned_about_a_big_model():
    assert "vram" in topics(machine(vram_gb=8.0), model="qwen3-4b")


def test_a_laptop_gets_no_warnings():
    hw = machine(cuda=False, gpu_name=None, capability=None, vram_gb=None, on_colab=False)
    assert topics(hw, profile="cpu-demo", model="smollm2-135m") == []

"""Profiles, detection, the model registry and paths."""

import pytest

from helpers import config
from helpers.config import MODELS, PROFILES, detect_profile, get_model_spec, get_profile


def test_the_four_profiles_exist():
    assert list(PROFILES) == ["cpu-smoke", "cpu-demo", "colab-t4", "gpu-large"]


def test_cpu_profiles_use_the_bundled_model_and_no_unsloth():
    for name in ("cpu-smoke", "cpu-demo"):
        p = PROFILES[name]
        assert p.backend == "transformers" and MODELS[p.model].bundled and not p.use_vllm


def test_gpu_profiles_use_unsloth_4bit_models_with_an_unsloth_id():
    for name in ("colab-t4", "gpu-large"):
        p = PROFILES[name]
        assert p.backend == "unsloth" and p.load_in_4bit and MODELS[p.model].unsloth_id


def test_colab_t4_keeps_vllm_off_and_fits_a_t4():
    p = PROFILES["colab-t4"]
    assert not p.use_vllm
    assert MODELS[p.model].t4_vram_gb < 15


def test_generations_divide_the_generation_batch_in_every_profile():
    for p in PROFILES.values():
        assert p.num_generations >= 2
        assert (p.per_device_train_batch_size * p.gradient_accumulation_steps) % p.num_generations == 0, p.name


def test_smoke_is_smaller_than_demo():
    s, d = PROFILES["cpu-smoke"], PROFILES["cpu-demo"]
    assert s.max_steps < d.max_steps and s.train_rows < d.train_rows


def test_registry_has_the_course_models():
    assert {"smollm2-135m", "gemma3-1b", "qwen2.5-1.5b", "qwen2.5-3b"} <= set(MODELS)
    assert get_model_spec("gemma3-1b").fp32_on_t4
    assert not get_model_spec("gemma3-1b").system_role


def test_unknown_model_lists_valid_ones():
    with pytest.raises(ValueError, match="qwen2.5-1.5b"):
        get_model_spec("llama-9000")


def test_course_profile_overrides_detection(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "cpu-smoke")
    name, reason = detect_profile()
    assert name == "cpu-smoke" and "COURSE_PROFILE" in reason
    assert get_profile().name == "cpu-smoke"


def test_unknown_profile_fails_fast_and_lists_the_valid_ones(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "nonsense")
    with pytest.raises(ValueError) as exc:
        get_profile()
    msg = str(exc.value)
    assert "nonsense" in msg and all(name in msg for name in PROFILES)


def test_detection_without_a_gpu_gives_cpu_demo(monkeypatch):
    monkeypatch.delenv("COURSE_PROFILE", raising=False)
    monkeypatch.setattr(config, "_cuda_available", lambda: False)
    assert detect_profile()[0] == "cpu-demo"


def test_detection_with_a_gpu_but_no_unsloth_stays_on_cpu(monkeypatch):
    monkeypatch.delenv("COURSE_PROFILE", raising=False)
    monkeypatch.setattr(config, "_cuda_available", lambda: True)
    monkeypatch.setattr(config.importlib.util, "find_spec", lambda name: None)
    name, reason = detect_profile()
    assert name == "cpu-demo" and "Unsloth" in reason


def test_overrides_copy_and_reject_unknown_fields():
    p = get_profile("cpu-demo", max_steps=3)
    assert p.max_steps == 3 and PROFILES["cpu-demo"].max_steps != 3
    with pytest.raises(ValueError, match="max_stepz"):
        get_profile("cpu-demo", max_stepz=3)


def test_course_model_env_selects_a_model(monkeypatch):
    monkeypatch.setenv("COURSE_MODEL", "gemma3-1b")
    assert get_profile("colab-t4").model == "gemma3-1b"
    monkeypatch.setenv("COURSE_MODEL", "nope")
    with pytest.raises(ValueError, match="Unknown model"):
        get_profile("colab-t4")


def test_paths_follow_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path / "c"))
    monkeypatch.setenv("COURSE_RUNS", str(tmp_path / "r"))
    assert config.cache_dir() == tmp_path / "c"
    assert config.runs_root() == tmp_path / "r"
    monkeypatch.delenv("COURSE_RUNS")
    assert config.runs_root() == config.project_root() / "runs"

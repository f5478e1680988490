"""helpers.config: profiles, detection, the model registry, the GRPO recipe fields and paths."""

import dataclasses
from pathlib import Path

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


def test_cache_dir_defaults_to_the_user_cache(monkeypatch):
    from platformdirs import user_cache_dir

    monkeypatch.delenv("COURSE_CACHE", raising=False)
    assert config.cache_dir() == Path(user_cache_dir("grpo-course"))


def test_every_profile_times_every_notebook():
    notebooks = sorted(p.stem for p in (config.project_root() / "notebooks").glob("*.ipynb"))
    assert len(notebooks) == 6
    for p in PROFILES.values():
        assert sorted(p.minutes) == notebooks and all(m > 0 for m in p.minutes.values()), p.name


def test_sizes_fit_together():
    for p in PROFILES.values():
        assert p.max_prompt_tokens + p.max_completion_length <= p.max_seq_length, p.name
        assert 0 < p.eval_prompts <= p.eval_rows, p.name
        assert p.scale_rewards in ("group", "batch", "none") and p.save_steps <= p.max_steps, p.name


def test_cpu_tasks_can_generate_every_row_they_ask_for():
    from helpers.tasks import LEVELS, generate_arithmetic

    for p in PROFILES.values():
        assert p.task in ("arithmetic", "gsm8k") and p.warmup_level in LEVELS, p.name
        if p.task == "arithmetic":
            rows = generate_arithmetic(p.train_rows + p.eval_rows, p.task_level, seed=p.seed)
            assert len(rows) == p.train_rows + p.eval_rows


def test_every_profile_names_a_reward_preset_and_the_course_prefill():
    from helpers.prompts import PREFILL
    from helpers.rewards import PRESETS, get_preset

    for p in PROFILES.values():
        assert p.reward_preset in PRESETS and p.prefill == PREFILL, p.name
        names = [f.__name__ for f, _ in get_preset(p.reward_preset, prefill=p.prefill)]
        assert "prefilled_strict_format_reward" in names, p.name
    assert {p.name: p.reward_preset for p in PROFILES.values()} == {
        "cpu-smoke": "arithmetic", "cpu-demo": "arithmetic", "colab-t4": "gsm8k", "gpu-large": "gsm8k"}


def test_gpu_profiles_share_the_gpu_recipe():
    for name in ("colab-t4", "gpu-large"):
        p = PROFILES[name]
        assert (p.optim, p.weight_decay, p.max_grad_norm, p.mask_truncated_completions) == (
            "adamw_8bit", 0.1, 0.1, True), name
    for name in ("cpu-smoke", "cpu-demo"):
        p = PROFILES[name]
        assert (p.optim, p.mask_truncated_completions) == ("adamw_torch", False), name  # bitsandbytes 8-bit Adam: GPU


def test_qwen3_models_turn_thinking_off():
    for key, spec in MODELS.items():
        want = {"enable_thinking": False} if key.startswith("qwen3") else {}
        assert spec.chat_template_kwargs == want, key
    assert MODELS["smollm2-135m"].chat_template_kwargs is not MODELS["qwen2.5-1.5b"].chat_template_kwargs


def test_profiles_are_frozen_and_round_trip_through_dicts():
    p = PROFILES["cpu-smoke"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.max_steps = 5
    assert config.Profile(**p.to_dict()) == p


def test_a_vllm_profile_without_vllm_installed_is_the_same_profile_without_vllm(monkeypatch):
    """Unsloth's fast_inference=True raises without vLLM: say so and generate with transformers instead."""
    import importlib.util
    import warnings

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = get_profile("gpu-large")
    assert p.use_vllm is False and p.max_steps == PROFILES["gpu-large"].max_steps
    assert any("vLLM is not installed" in str(w.message) and "grpo-course[vllm]" in str(w.message) for w in caught)
    assert get_profile("gpu-large", use_vllm=True).use_vllm is True  # an explicit choice is kept (and checked later)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    assert get_profile("gpu-large").use_vllm is True


def test_every_profile_has_a_time_budget_and_a_shorter_fallback():
    for p in PROFILES.values():
        assert p.time_budget_minutes and p.time_budget_minutes > 0, p.name
        assert 0 < p.fallback_minutes < p.time_budget_minutes, p.name
    # a workshop slot: no GPU profile trains for more than an hour unless told to
    assert all(p.time_budget_minutes <= 60 for p in PROFILES.values())


def test_course_time_budget_sets_the_budget_and_an_explicit_one_wins(monkeypatch):
    monkeypatch.setenv("COURSE_TIME_BUDGET", "20")
    assert get_profile("colab-t4", use_vllm=False).time_budget_minutes == 20.0
    assert get_profile("cpu-demo").time_budget_minutes == 20.0
    assert get_profile("colab-t4", use_vllm=False, time_budget_minutes=5).time_budget_minutes == 5
    monkeypatch.setenv("COURSE_TIME_BUDGET", " ")
    assert get_profile("colab-t4", use_vllm=False).time_budget_minutes == 45


def test_a_bad_course_time_budget_names_the_variable(monkeypatch):
    monkeypatch.setenv("COURSE_TIME_BUDGET", "45min")
    with pytest.raises(ValueError, match=r"COURSE_TIME_BUDGET='45min' is not a number of minutes"):
        get_profile("cpu-demo")

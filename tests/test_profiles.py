"""helpers.profiles: the four profiles as a base and deltas, their invariants, detection, overrides, the
task switch, the model registry."""

from __future__ import annotations

import dataclasses
import importlib.util
import warnings

import pytest

from helpers import machine
from helpers import profiles as P
from helpers.profiles import (
    CPU_DEMO,
    CPU_SMOKE,
    MODELS,
    PROFILES,
    Profile,
    ProfileError,
    detect_profile,
    get_model_spec,
    get_profile,
    profile_delta,
)
from helpers.runs import project_root
from helpers.tasks import get_task
from helpers.tasks.reasoning import PREFILL


def _hardware(**kw):
    base = dict(cuda=False, gpu_name=None, capability=None, vram_gb=None, cpus=2, ram_gb=12.0, free_disk_gb=50.0,
                on_colab=False, on_kaggle=False)
    return machine.Hardware(**(base | kw))


@pytest.fixture()
def fake_machine(monkeypatch):
    """Pretend to be a machine: ``fake_machine(hardware, unsloth=bool)``."""
    monkeypatch.delenv("COURSE_PROFILE", raising=False)

    def set_machine(hw, unsloth=False):
        monkeypatch.setattr(P, "inspect_hardware", lambda path=".": hw)
        monkeypatch.setattr(P, "installed", lambda name: unsloth if name == "unsloth" else importlib.util.find_spec(
            name) is not None)

    return set_machine


# --------------------------------------------------------------------------- the four profiles


def test_the_four_profiles_exist():
    assert list(PROFILES) == ["cpu-smoke", "cpu-demo", "colab-t4", "gpu-large"]
    assert PROFILES["cpu-smoke"] is CPU_SMOKE and PROFILES["cpu-demo"] is CPU_DEMO


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


def test_sizes_fit_together():
    for p in PROFILES.values():
        assert p.max_prompt_tokens + p.max_completion_length <= p.max_seq_length, p.name
        assert 0 < p.eval_prompts <= p.eval_rows, p.name
        assert p.scale_rewards in ("group", "batch", "none") and p.save_steps <= p.max_steps, p.name


def test_every_profile_times_every_notebook():
    notebooks = sorted(p.stem for p in (project_root() / "notebooks").glob("*.ipynb"))
    assert len(notebooks) >= 6
    for p in PROFILES.values():
        assert sorted(p.minutes) == notebooks and all(m > 0 for m in p.minutes.values()), p.name


def test_gpu_profiles_share_the_gpu_recipe():
    for name in ("colab-t4", "gpu-large"):
        p = PROFILES[name]
        assert (p.optim, p.weight_decay, p.max_grad_norm, p.mask_truncated_completions) == (
            "adamw_8bit", 0.1, 0.1, True), name
    for name in ("cpu-smoke", "cpu-demo"):
        p = PROFILES[name]
        assert (p.optim, p.mask_truncated_completions) == ("adamw_torch", False), name  # bitsandbytes 8-bit Adam: GPU


def test_every_profile_has_a_time_budget_and_a_shorter_fallback():
    for p in PROFILES.values():
        assert p.time_budget_minutes and p.time_budget_minutes > 0, p.name
        assert 0 < p.fallback_minutes < p.time_budget_minutes, p.name
    # a workshop slot: no GPU profile trains for more than an hour unless told to
    assert all(p.time_budget_minutes <= 60 for p in PROFILES.values())


def test_profiles_are_frozen_and_round_trip_through_dicts():
    p = PROFILES["cpu-smoke"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.max_steps = 5  # type: ignore[misc]
    assert Profile(**p.to_dict()) == p


def test_the_deleted_fields_are_gone():
    names = {f.name for f in dataclasses.fields(Profile)}
    assert not names & {"description", "logging_steps", "prefill", "reward_preset"}
    assert "system_role" not in {f.name for f in dataclasses.fields(P.ModelSpec)}


# --------------------------------------------------------------------------- a base and deltas


def test_each_profile_states_only_what_it_changes():
    t4 = profile_delta(PROFILES["cpu-demo"], PROFILES["colab-t4"])
    assert t4["model"] == ("smollm2-135m", "qwen2.5-1.5b") and t4["backend"] == ("transformers", "unsloth")
    assert t4["task_level"] == ("add2", "gsm8k") and "seed" not in t4 and "task" not in t4
    assert "name" not in t4 and "minutes" not in t4
    assert set(profile_delta(PROFILES["colab-t4"], PROFILES["gpu-large"])) == {
        "model", "use_vllm", "eval_rows", "max_completion_length", "num_generations", "per_device_train_batch_size",
        "max_steps", "lora_rank", "lora_alpha", "time_budget_minutes", "save_steps", "eval_prompts", "max_seq_length",
        "gpu_memory_utilization"}
    assert profile_delta(CPU_SMOKE, CPU_SMOKE) == {}
    assert profile_delta(CPU_SMOKE, get_profile("cpu-smoke", max_steps=9)) == {"max_steps": (2, 9)}


# --------------------------------------------------------------------------- invariants, checked when a profile is made


@pytest.mark.parametrize("overrides, message", [
    (dict(num_generations=3), r"num_generations=3 does not divide the generation batch .* = 2\)"),
    (dict(num_generations=1, per_device_train_batch_size=1), "a group needs at least 2 completions"),
    (dict(max_completion_length=400), r"max_prompt_tokens \+ max_completion_length = 656 exceeds max_seq_length=512"),
    (dict(eval_prompts=17), "eval_prompts=17 > eval_rows=16"),
    (dict(fallback_minutes=5), "fallback_minutes=5 exceeds time_budget_minutes=2"),
    (dict(time_budget_minutes=0), "time_budget_minutes=0: give a positive number"),
    (dict(backend="jax"), "backend='jax'"),
    (dict(model="llama-9000"), "model='llama-9000' is not in the registry"),
])
def test_a_bad_override_fails_at_once_with_the_fix(overrides, message):
    with pytest.raises(ProfileError, match=message) as err:
        get_profile("cpu-smoke", **overrides)
    assert str(err.value).startswith("Profile 'cpu-smoke': ")
    with pytest.raises(ProfileError, match=message):
        CPU_SMOKE.with_overrides(**overrides)  # the same check, however the profile is made
    assert isinstance(err.value, ValueError)


def test_every_problem_is_named_in_one_message():
    with pytest.raises(ProfileError) as err:
        get_profile("cpu-smoke", num_generations=3, eval_prompts=99)
    assert "num_generations=3" in str(err.value) and "eval_prompts=99" in str(err.value)


def test_no_time_budget_is_allowed():
    p = get_profile("cpu-smoke", time_budget_minutes=None)
    assert p.time_budget_minutes is None and p.fallback_minutes == CPU_SMOKE.fallback_minutes


def test_overrides_copy_and_reject_unknown_fields():
    p = get_profile("cpu-demo", max_steps=3)
    assert p.max_steps == 3 and PROFILES["cpu-demo"].max_steps != 3
    unknown = r"Unknown profile setting\(s\) \['max_stepz'\]. Valid settings: .*max_steps"
    with pytest.raises(ProfileError, match=unknown):
        get_profile("cpu-demo", max_stepz=3)


# --------------------------------------------------------------------------- detection and the environment


def test_course_profile_overrides_detection(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "cpu-smoke")
    name, reason = detect_profile()
    assert name == "cpu-smoke" and "COURSE_PROFILE" in reason
    assert get_profile().name == "cpu-smoke"


def test_unknown_profile_fails_fast_and_lists_the_valid_ones(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "nonsense")
    with pytest.raises(ProfileError) as exc:
        get_profile()
    msg = str(exc.value)
    assert "'nonsense' (from COURSE_PROFILE)" in msg and all(name in msg for name in PROFILES)
    assert "Unset COURSE_PROFILE" in msg
    with pytest.raises(ProfileError, match=r"'cpu-tiny' \(from get_profile\(\)\)"):
        get_profile("cpu-tiny")


def test_detection_without_a_gpu_gives_cpu_demo(fake_machine):
    fake_machine(_hardware(), unsloth=True)
    name, reason = detect_profile()
    assert name == "cpu-demo" and "no CUDA GPU" in reason


def test_detection_with_a_gpu_but_no_unsloth_stays_on_cpu(fake_machine):
    fake_machine(_hardware(cuda=True, gpu_name="Tesla T4", capability=(7, 5), vram_gb=14.7), unsloth=False)
    name, reason = detect_profile()
    assert name == "cpu-demo" and "Unsloth is not installed" in reason and "00_setup" in reason


def test_detection_picks_the_gpu_profile_by_memory_and_capability(fake_machine):
    fake_machine(_hardware(cuda=True, gpu_name="Tesla T4", capability=(7, 5), vram_gb=14.7), unsloth=True)
    assert detect_profile() == ("colab-t4", "Tesla T4 with 15 GB VRAM")
    fake_machine(_hardware(cuda=True, gpu_name="NVIDIA A100", capability=(8, 0), vram_gb=39.4), unsloth=True)
    name, reason = detect_profile()
    assert name == "gpu-large" and "NVIDIA A100 with 39 GB and compute capability (8, 0)" == reason
    fake_machine(_hardware(cuda=True, gpu_name="Quadro RTX 8000", capability=(7, 5), vram_gb=48.0), unsloth=True)
    assert detect_profile()[0] == "colab-t4"  # much memory, but no bf16: the T4 recipe


def test_course_model_env_selects_a_model(monkeypatch):
    monkeypatch.setenv("COURSE_MODEL", "gemma3-1b")
    assert get_profile("colab-t4").model == "gemma3-1b"
    assert get_profile("colab-t4", model="qwen2.5-3b").model == "qwen2.5-3b"  # an explicit choice wins
    monkeypatch.setenv("COURSE_MODEL", "nope")
    with pytest.raises(ProfileError, match="model='nope' is not in the registry"):
        get_profile("colab-t4")


def test_course_time_budget_sets_the_budget_and_an_explicit_one_wins(monkeypatch):
    monkeypatch.setenv("COURSE_TIME_BUDGET", "20")
    assert get_profile("colab-t4", use_vllm=False).time_budget_minutes == 20.0
    assert get_profile("cpu-demo").time_budget_minutes == 20.0
    assert get_profile("colab-t4", use_vllm=False, time_budget_minutes=15).time_budget_minutes == 15
    monkeypatch.setenv("COURSE_TIME_BUDGET", " ")
    assert get_profile("colab-t4", use_vllm=False).time_budget_minutes == 45


def test_a_bad_course_time_budget_names_the_variable(monkeypatch):
    monkeypatch.setenv("COURSE_TIME_BUDGET", "45min")
    with pytest.raises(ProfileError, match=r"COURSE_TIME_BUDGET='45min' is not a number of minutes"):
        get_profile("cpu-demo")


def test_a_vllm_profile_without_vllm_installed_is_the_same_profile_without_vllm(monkeypatch):
    """Unsloth's fast_inference=True raises without vLLM: say so and generate with transformers instead."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = get_profile("gpu-large")
    assert p.use_vllm is False and p.max_steps == PROFILES["gpu-large"].max_steps
    assert any("vLLM is not installed" in str(w.message) for w in caught)
    assert get_profile("gpu-large", use_vllm=True).use_vllm is True  # an explicit choice is kept (and checked later)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    assert get_profile("gpu-large").use_vllm is True


# --------------------------------------------------------------------------- the task


def test_every_profile_trains_the_arithmetic_task_with_the_course_prefill():
    for p in PROFILES.values():
        task = get_task(p.task)
        assert p.task == "arithmetic" and task.prefill == PREFILL, p.name
        assert p.task_level in task.levels and p.warmup_level in task.levels, p.name
        names = [f.__name__ for f, _ in task.rewards_for(p.task_level)]
        assert "prefilled_strict_format_reward" in names and "correctness_reward" in names, p.name
    assert {p.name: p.task_level for p in PROFILES.values()} == {
        "cpu-smoke": "add2-small", "cpu-demo": "add2", "colab-t4": "gsm8k", "gpu-large": "gsm8k"}
    assert "numeric_answer_reward" in [f.__name__ for f, _ in get_task("arithmetic").rewards_for("gsm8k")]


def test_cpu_tasks_can_generate_every_row_they_ask_for():
    for p in PROFILES.values():
        task = get_task(p.task)
        if p.task_level != "gsm8k":
            assert len(task.make_rows(p.task_level, p.train_rows + p.eval_rows, p.seed)) == p.train_rows + p.eval_rows
        if p.warmup_examples:
            assert len(task.make_rows(p.warmup_level, p.warmup_examples, p.seed + 1)) == p.warmup_examples


@pytest.mark.parametrize("name", ["cpu-smoke", "cpu-demo", "colab-t4"])
def test_switching_to_the_json_task_keeps_the_sizes_and_applies_the_tasks_settings(name):
    base = get_profile(name, use_vllm=False)
    p = get_profile(name, task="json", use_vllm=False)
    assert p.task == "json" and get_task(p.task).prefill == '{"'
    assert (p.seed, p.model, p.per_device_train_batch_size) == (base.seed, base.model, base.per_device_train_batch_size)
    gpu = p.backend == "unsloth"
    assert (p.task_level, p.warmup_level, p.max_completion_length) == (
        "orders-dated" if gpu else "orders", "orders-easy", 96 if gpu else 40)
    assert p.max_steps == (base.max_steps if gpu else min(base.max_steps, 15))  # a CPU: 15 steps at most
    # a CPU: groups of at most 4 at learning rate 1e-4 (the JSON task's own recipe); a GPU keeps the profile's
    assert (p.num_generations, p.learning_rate) == ((base.num_generations, base.learning_rate) if gpu else
                                                    (min(base.num_generations, 4), 1e-4))
    recipe = {k for k in ("max_steps", "num_generations", "learning_rate") if getattr(p, k) != getattr(base, k)}
    assert set(profile_delta(base, p)) == {"task", "task_level", "warmup_level", "max_completion_length"} | recipe
    assert recipe == (set() if name != "cpu-demo" else {"max_steps", "num_generations"})  # cpu-demo: 1e-4 too


def test_overrides_come_on_top_of_the_tasks_settings():
    p = get_profile("cpu-demo", task="json", task_level="orders-dated", max_completion_length=64)
    assert (p.task_level, p.warmup_level, p.max_completion_length) == ("orders-dated", "orders-easy", 64)
    back = get_profile("cpu-demo", task="arithmetic")  # the profile's own task: nothing is re-applied
    assert back == PROFILES["cpu-demo"]


def test_a_level_the_task_does_not_have_is_refused():
    with pytest.raises(ProfileError, match=r"task_level='add2' is not a level of task 'json': use one of \['orders-e"):
        get_profile("cpu-demo", task="json", task_level="add2")
    with pytest.raises(ProfileError, match="warmup_level='orders' is not a level of task 'arithmetic'"):
        get_profile("cpu-demo", warmup_level="orders")
    # no warm-up: its level is not looked at
    assert get_profile("cpu-demo", warmup_level="orders", warmup_examples=0).warmup_examples == 0


def test_an_unknown_task_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"Unknown task 'poetry': use one of \['arithmetic', 'json', 'tools'\]"):
        get_profile("cpu-smoke", task="poetry")


def test_a_learners_task_by_import_path():
    p = get_profile("cpu-smoke", task="tests.tasks.test_tasks:ToyTask")
    assert p.task == "tests.tasks.test_tasks:ToyTask" and (p.task_level, p.warmup_level) == ("short", "short")


# --------------------------------------------------------------------------- the model registry


def test_registry_has_the_course_models():
    assert {"smollm2-135m", "gemma3-1b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen3-1.7b", "qwen3-4b"} <= set(MODELS)
    assert get_model_spec("gemma3-1b").fp32_on_t4 and not get_model_spec("qwen2.5-1.5b").fp32_on_t4
    assert [k for k, m in MODELS.items() if m.bundled] == ["smollm2-135m"]
    assert all(m.unsloth_id for m in MODELS.values() if not m.bundled)


def test_unknown_model_lists_valid_ones():
    with pytest.raises(ProfileError, match="Unknown model 'llama-9000'. Valid models: smollm2-135m, .*qwen2.5-1.5b"):
        get_model_spec("llama-9000")


def test_qwen3_models_turn_thinking_off():
    for key, spec in MODELS.items():
        want = {"enable_thinking": False} if key.startswith("qwen3") else {}
        assert spec.chat_template_kwargs == want, key
    assert MODELS["smollm2-135m"].chat_template_kwargs is not MODELS["qwen2.5-1.5b"].chat_template_kwargs

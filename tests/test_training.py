"""helpers.training: config checks (fast), and a killed run resuming cleanly (slow)."""

import dataclasses

import pytest

from helpers.callbacks import read_jsonl
from helpers.config import PROFILES, get_profile
from helpers.training import (
    REMOVED_ARGS,
    TrainingConfigError,
    build_grpo_config,
    check_settings,
    choose_precision,
    grpo_settings,
    last_checkpoint,
    prepare_resume,
    split_rewards,
)

SMOKE = get_profile("cpu-smoke")
T4 = get_profile("colab-t4")
T4_CC, A100_CC = (7, 5), (8, 0)


def _check(profile=SMOKE, capability=None, vllm_installed=None, **overrides):
    s = grpo_settings(profile, "/tmp/run", capability=capability, **overrides)
    check_settings(s, profile, capability=capability, vllm_installed=vllm_installed)


def test_every_profile_gives_valid_settings_for_the_installed_trl():
    from trl import GRPOConfig

    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    for profile in PROFILES.values():
        cc = None if profile.backend == "transformers" else (A100_CC if profile.name == "gpu-large" else T4_CC)
        settings = grpo_settings(profile, "/tmp/run", capability=cc)
        assert set(settings) <= fields, (profile.name, set(settings) - fields)
        check_settings(settings, profile, capability=cc, vllm_installed=True)


def test_config_built_from_profile_and_overrides():
    cfg = build_grpo_config(SMOKE, "/tmp/run", learning_rate=2e-4, max_steps=3)
    assert (cfg.learning_rate, cfg.max_steps, cfg.num_generations) == (2e-4, 3, SMOKE.num_generations)
    assert cfg.output_dir.endswith("checkpoints") and cfg.use_cpu and not cfg.bf16 and not cfg.fp16
    assert cfg.beta == 0.0 and cfg.generation_batch_size % cfg.num_generations == 0


@pytest.mark.parametrize("overrides, message", [
    (dict(num_generations=3), "does not divide the generation batch of 2"),
    (dict(num_generations=1), "at least 2"),
    (dict(num_generations=4, per_device_train_batch_size=6), "multiple of 4"),
    (dict(max_prompt_length=128), "removed `max_prompt_length`"),
    (dict(num_generation=4), "Did you mean num_generations"),
    (dict(max_completion_length=8), "too short for the 'arithmetic' task"),
    (dict(max_completion_length=400), "exceeds max_seq_length=512"),
    (dict(bf16=True), "bf16=True on a CPU"),
    (dict(fp16=True), "fp16=True on a CPU"),
    (dict(use_vllm=True), "vLLM needs a CUDA GPU"),
    (dict(learning_rate=5.0), "learning_rate=5.0"),
])
def test_bad_settings_are_rejected_with_what_to_change(overrides, message):
    with pytest.raises(TrainingConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _check(**overrides)


def test_several_errors_are_reported_together():
    with pytest.raises(TrainingConfigError) as err:
        _check(num_generations=3, max_prompt_length=10)
    assert "num_generations=3" in str(err.value) and "max_prompt_length" in str(err.value)


def test_removed_args_all_have_advice():
    assert all(len(v) > 20 for v in REMOVED_ARGS.values())


def test_precision_follows_compute_capability_not_bf16_flag():
    assert choose_precision(T4, T4_CC) == {"bf16": False, "fp16": True}
    assert choose_precision(T4, A100_CC) == {"bf16": True, "fp16": False}
    gemma = get_profile("colab-t4", model="gemma3-1b")
    assert choose_precision(gemma, T4_CC) == {"bf16": False, "fp16": False}  # fp32: fp16 overflows
    assert choose_precision(SMOKE, None) == {"bf16": False, "fp16": False}
    _check(T4, T4_CC)  # the profile's own choice passes
    with pytest.raises(TrainingConfigError, match="compute capability 7.5"):
        _check(T4, T4_CC, bf16=True, fp16=False)
    with pytest.raises(TrainingConfigError, match="Gemma 3 overflows in fp16"):
        _check(gemma, T4_CC, fp16=True)
    _check(T4, A100_CC, bf16=True, fp16=False)


def test_vllm_only_where_installed_and_colocated():
    large = get_profile("gpu-large")
    assert grpo_settings(large, "/tmp/r", capability=A100_CC)["vllm_mode"] == "colocate"
    _check(large, A100_CC, vllm_installed=True)
    with pytest.raises(TrainingConfigError, match="vLLM is not installed"):
        _check(large, A100_CC, vllm_installed=False)
    with pytest.raises(TrainingConfigError, match="colocate"):
        _check(large, A100_CC, vllm_installed=True, vllm_mode="server")


def test_split_rewards_weights_and_errors():
    def a_reward(completions, **kw):
        return [0.0] * len(completions)

    def b_reward(completions, **kw):
        return [1.0] * len(completions)

    funcs, weights = split_rewards([(a_reward, 2.0), b_reward])
    assert funcs == [a_reward, b_reward] and weights == [2.0, 1.0]
    with pytest.raises(ValueError, match="appear twice"):
        split_rewards([a_reward, a_reward])
    with pytest.raises(ValueError, match="at least one"):
        split_rewards([])


def test_prepare_resume_truncates_logs_to_last_complete_checkpoint(tmp_path):
    from helpers.callbacks import append_jsonl
    from helpers.runs import write_json

    for step in (2, 4):
        write_json(tmp_path / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json", {"global_step": step})
    (tmp_path / "checkpoints" / "checkpoint-6").mkdir()  # killed while saving: no state file
    append_jsonl(tmp_path / "metrics.jsonl", [{"step": s} for s in range(1, 7)])
    append_jsonl(tmp_path / "completions.jsonl", [{"step": s} for s in (4, 5, 5, 6)])
    ckpt, step = prepare_resume(tmp_path)
    assert step == 4 and ckpt.name == "checkpoint-4" and last_checkpoint(tmp_path)[1] == 4
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]
    assert [r["step"] for r in read_jsonl(tmp_path / "completions.jsonl")] == [4]


# --------------------------------------------------------------------------- slow: real training


class Crash(Exception):
    pass


def _tiny_setup(profile):
    from datasets import Dataset

    from helpers.data import build_prompt
    from helpers.models import load_model
    from helpers.rewards import get_preset
    from helpers.tasks import generate_arithmetic

    model, tok = load_model(profile)
    rows = generate_arithmetic(8, "add2-small", seed=0)
    ds = Dataset.from_list([{"prompt": build_prompt(r["question"], prefill=True), "answer": r["answer"],
                             "question": r["question"]} for r in rows])
    return model, tok, ds, get_preset("arithmetic")


@pytest.mark.slow
def test_killed_run_resumes_without_repeating_or_losing_steps(tmp_path):
    from transformers import TrainerCallback

    from helpers.training import build_trainer, train

    profile = get_profile("cpu-smoke", max_steps=4, save_steps=2)

    class CrashAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                raise Crash("simulated disconnect")

    model, tok, ds, rewards = _tiny_setup(profile)
    trainer = build_trainer(model, tok, ds, rewards, build_grpo_config(profile, tmp_path), run=tmp_path,
                            dashboard=False)
    trainer.add_callback(CrashAt())  # after the logs: step 3's completions are written, then the kill
    with pytest.raises(Crash):
        train(trainer, tmp_path)
    assert last_checkpoint(tmp_path)[1] == 2
    assert {r["step"] for r in read_jsonl(tmp_path / "completions.jsonl")} == {1, 2, 3}

    model, tok, ds, rewards = _tiny_setup(profile)  # a fresh process after the disconnect
    trainer = build_trainer(model, tok, ds, rewards, build_grpo_config(profile, tmp_path), run=tmp_path,
                            dashboard=False)
    summary = train(trainer, tmp_path)
    assert summary["resumed_from_step"] == 2 and summary["global_step"] == 4
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert all("reward" in m and "frac_reward_zero_std" in m for m in metrics)
    completions = read_jsonl(tmp_path / "completions.jsonl")
    per_step = {s: sum(r["step"] == s for r in completions) for s in (1, 2, 3, 4)}
    assert per_step == {s: profile.per_device_train_batch_size for s in (1, 2, 3, 4)}
    row = completions[-1]
    assert row["prompt"].startswith("What is") and row["answer"] is not None
    assert set(row["rewards"]) == {getattr(f, "__name__") for f, _ in rewards}
    assert isinstance(row["reward"], float) and isinstance(row["advantage"], float)
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()


@pytest.mark.slow
def test_ensure_adapter_trains_once_and_leaves_a_self_describing_run(tmp_path):
    from helpers.runs import read_json
    from helpers.training import ensure_adapter

    profile = get_profile("cpu-smoke", max_steps=2, warmup_examples=4)
    path = ensure_adapter(profile, tmp_path)
    assert (path / "adapter_config.json").is_file()
    for name in ("train_config.json", "run.json", "metrics.jsonl", "completions.jsonl",
                 "train_summary.json", "figures/dashboard.png", "dataset"):
        assert (tmp_path / name).exists(), name
    cfg = read_json(tmp_path / "train_config.json")
    assert cfg["profile"]["name"] == "cpu-smoke" and cfg["warmup"]["examples"] == 4
    assert cfg["grpo_config"]["max_steps"] == 2 and cfg["prefill"] == "<reasoning>\n"
    assert read_json(tmp_path / "run.json")["versions"]["trl"]
    mtime = (path / "adapter_config.json").stat().st_mtime
    assert ensure_adapter(profile, tmp_path) == path  # present: no training
    assert (path / "adapter_config.json").stat().st_mtime == mtime

"""helpers.training: config checks, the GRPOConfig of every profile, the warm-up, and a real run that resumes."""

import copy
import json
import re
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from helpers import training
from helpers.config import PROFILES, get_profile
from helpers.prompts import PREFILL, build_prompt, encode, install_prefill
from helpers.rewards import answer_matches, extract_answer, get_preset, has_strict_format
from helpers.training import (
    REMOVED_ARGS,
    TrainingConfigError,
    check_config,
    ensure_adapter,
    explain_config_error,
    grpo_config,
    last_checkpoint,
    warmup_dataset,
)

SMOKE = get_profile("cpu-smoke")
T4, A100 = (7, 5), (8, 0)
NOTEBOOK_03 = Path(__file__).resolve().parents[1] / "notebooks" / "03_grpo_training.ipynb"


def cfg(**changes):
    """A stand-in for a GRPOConfig: check_config reads only these fields."""
    return NS(**{**dict(bf16=False, fp16=False, max_completion_length=256, use_vllm=False), **changes})


def weights(profile):
    return [w for _, w in get_preset(profile.reward_preset, prefill=profile.prefill)]


# --------------------------------------------------------------------------- check_config


@pytest.mark.parametrize("profile, config, capability, message", [
    (SMOKE, cfg(bf16=True), None, "bf16=True on a CPU"),
    (SMOKE, cfg(fp16=True), None, "fp16=True on a CPU"),
    (get_profile("colab-t4"), cfg(bf16=True), T4, "compute capability 7.5"),
    (get_profile("colab-t4", model="gemma3-1b"), cfg(fp16=True), T4, "Gemma 3 overflows in fp16"),
    (SMOKE, cfg(max_completion_length=19), None, "too short for the 'arithmetic' task: .* at least 20"),
    (get_profile("colab-t4"), cfg(max_completion_length=127, fp16=True), T4, "'gsm8k' task: .* at least 128"),
    (SMOKE, cfg(max_completion_length=None), None, "max_completion_length=None is too short"),
    (SMOKE, cfg(max_completion_length=300), None, r"300 \+ max_prompt_tokens=256 exceeds max_seq_length=512"),
    (SMOKE, cfg(use_vllm=True), None, "vLLM needs a CUDA GPU"),
])
def test_check_config_rejects_what_trl_accepts(profile, config, capability, message):
    with pytest.raises(TrainingConfigError, match=message):
        check_config(config, profile, capability=capability, vllm_installed=True)


@pytest.mark.parametrize("profile, config, capability", [
    (SMOKE, cfg(max_completion_length=20), None),
    (get_profile("colab-t4"), cfg(fp16=True), T4),
    (get_profile("colab-t4", model="gemma3-1b"), cfg(), T4),  # float32 on a T4
    (get_profile("gpu-large"), cfg(bf16=True, max_completion_length=512, use_vllm=True), A100),
])
def test_check_config_passes_what_the_profiles_choose(profile, config, capability):
    check_config(config, profile, capability=capability, vllm_installed=True)


def test_vllm_on_a_gpu_needs_it_installed():
    large = get_profile("gpu-large")
    config = cfg(bf16=True, max_completion_length=512, use_vllm=True)
    with pytest.raises(TrainingConfigError, match=r"vLLM is not installed: `pip install grpo-course\[vllm\]`"):
        check_config(config, large, capability=A100, vllm_installed=False)
    if training.importlib.util.find_spec("vllm") is None:  # detected when not told
        with pytest.raises(TrainingConfigError, match="not installed"):
            check_config(config, large, capability=A100)


def test_several_problems_are_reported_together():
    with pytest.raises(TrainingConfigError) as err:
        check_config(cfg(bf16=True, max_completion_length=8, use_vllm=True), SMOKE)
    lines = str(err.value).splitlines()
    assert lines[0] == "Fix these training settings:" and len(lines) == 4


def test_the_course_config_passes(tmp_path):
    check_config(grpo_config(SMOKE, tmp_path, weights(SMOKE)), SMOKE)


# --------------------------------------------------------------------------- explain_config_error


@pytest.mark.parametrize("name, fix", [("max_prompt_length", "TRL 0.28 removed `max_prompt_length`"),
                                       ("warmup_ratio", "give `warmup_steps`")])
def test_removed_arguments_get_their_fix(tmp_path, name, fix):
    from trl import GRPOConfig

    with pytest.raises(TypeError) as err:  # the pinned TRL / transformers really refuse them
        GRPOConfig(output_dir=str(tmp_path), **{name: 1})
    assert fix in explain_config_error(err.value) and explain_config_error(err.value) == REMOVED_ARGS[name]
    with pytest.raises(TypeError) as err:  # grpo_config passes overrides straight to GRPOConfig
        grpo_config(SMOKE, tmp_path, weights(SMOKE), **{name: 1})
    assert explain_config_error(err.value) == REMOVED_ARGS[name]


def test_other_errors_are_returned_as_they_are():
    err = TypeError("__init__() got an unexpected keyword argument 'num_generation'")
    assert explain_config_error(err) == str(err)
    assert explain_config_error(ValueError("boom")) == "boom"


# --------------------------------------------------------------------------- grpo_config


def test_cpu_config_from_the_profile_and_overrides(tmp_path):
    config = grpo_config(SMOKE, tmp_path, weights(SMOKE), max_steps=5, learning_rate=2e-4)
    assert config.output_dir == str(tmp_path / "grpo")
    assert (config.max_steps, config.learning_rate) == (5, 2e-4)
    assert (config.num_generations, config.per_device_train_batch_size) == (2, 2)
    assert config.max_completion_length == SMOKE.max_completion_length and config.beta == 0.0
    assert config.reward_weights == weights(SMOKE) == [1.0, 0.5, 0.5, 0.25]
    assert config.use_cpu and not config.bf16 and not config.fp16 and not config.use_vllm
    assert config.log_completions and config.logging_steps == 1 and config.save_steps == SMOKE.save_steps
    assert config.optim == "adamw_torch" and config.chat_template_kwargs is None
    assert config.generation_batch_size % config.num_generations == 0
    assert grpo_config(get_profile("cpu-demo"), tmp_path, weights(SMOKE)).num_generations == 8
    with pytest.raises(TrainingConfigError, match="too short"):  # checked after the overrides
        grpo_config(SMOKE, tmp_path, weights(SMOKE), max_completion_length=8)


def test_t4_configs_build_on_a_cpu_with_an_explicit_capability(tmp_path):
    t4 = grpo_config(get_profile("colab-t4"), tmp_path, [1.0] * 5, capability=T4)
    assert (t4.fp16, t4.bf16, t4.use_cpu, t4.use_vllm) == (True, False, False, False)
    assert t4.optim == "adamw_8bit" and t4.max_grad_norm == 0.1 and t4.mask_truncated_completions
    assert t4.epsilon_high == 0.28 and t4.loss_type == "dapo"
    gemma = grpo_config(get_profile("colab-t4", model="gemma3-1b"), tmp_path, [1.0] * 5, capability=T4)
    assert (gemma.fp16, gemma.bf16) == (False, False)


def test_gpu_large_config(tmp_path, monkeypatch):
    """bf16 cannot be built on a CPU (transformers checks the GPU) and vLLM is not installed here:
    the test pretends both, and checks the refusal without them."""
    large = get_profile("gpu-large", use_vllm=True)  # explicit: without vLLM the profile drops it
    if training.importlib.util.find_spec("vllm") is None:
        with pytest.raises((TrainingConfigError, ValueError), match="vLLM is not installed|bf16/gpu"):
            grpo_config(large, tmp_path, [1.0] * 5, capability=A100)
    monkeypatch.setattr("transformers.training_args.is_torch_bf16_gpu_available", lambda: True)
    monkeypatch.setattr(training, "importlib", NS(util=NS(find_spec=lambda name: object())))
    config = grpo_config(large, tmp_path, [1.0] * 5, capability=A100)
    assert (config.bf16, config.fp16, config.use_vllm, config.vllm_mode) == (True, False, True, "colocate")
    assert config.vllm_gpu_memory_utilization == large.gpu_memory_utilization
    assert config.chat_template_kwargs == {"enable_thinking": False}  # Qwen3: the course's own tags
    assert config.max_completion_length == 512 and config.optim == "adamw_8bit"


@pytest.mark.parametrize("name", list(PROFILES))
def test_every_profile_builds_a_checked_config(tmp_path, monkeypatch, name):
    """On an Ampere GPU with vLLM installed (pretended: this machine has neither)."""
    monkeypatch.setattr("transformers.training_args.is_torch_bf16_gpu_available", lambda: True)
    monkeypatch.setattr(training, "importlib", NS(util=NS(find_spec=lambda name: object())))
    profile = get_profile(name)
    capability = A100 if profile.backend == "unsloth" else None
    config = grpo_config(profile, tmp_path, weights(profile), capability=capability)
    assert (config.num_generations, config.max_steps, config.optim) == (
        profile.num_generations, profile.max_steps, profile.optim)
    assert config.bf16 == (profile.backend == "unsloth") and config.use_cpu == (profile.backend != "unsloth")
    assert len(config.reward_weights) == len(get_preset(profile.reward_preset))


# --------------------------------------------------------------------------- warm-up rows


@pytest.fixture(scope="module")
def tok():
    from helpers.models import load_tokenizer

    return load_tokenizer(SMOKE)


def test_warmup_rows_are_prompt_completion_conversations_in_the_format(tok):
    rows = warmup_dataset(SMOKE, tok)
    assert rows.num_rows == SMOKE.warmup_examples and rows.column_names == ["prompt", "completion"]
    for row in rows:
        question = row["prompt"][-1]["content"]
        assert row["prompt"] == build_prompt(question)
        (message,) = row["completion"]
        assert message["role"] == "assistant" and message["content"].startswith("<reasoning>\n")
        assert has_strict_format(message["content"])
        a, b = map(int, re.fullmatch(r"What is (\d) \+ (\d)\?", question).groups())  # level add1
        assert answer_matches(extract_answer(message["content"]), a + b)


def test_warmup_rows_carry_template_kwargs_and_fold_the_system_prompt_where_needed(tok):
    qwen3 = warmup_dataset(get_profile("cpu-smoke", model="qwen3-1.7b"), tok)
    assert qwen3[0]["chat_template_kwargs"] == {"enable_thinking": False}

    class NoSystemRole:  # a Gemma-style template that refuses a system message
        def apply_chat_template(self, msgs, **kwargs):
            if msgs[0]["role"] == "system":
                raise ValueError("System role not supported")
            return "".join(m["content"] for m in msgs)

    rows = warmup_dataset(SMOKE, NoSystemRole())
    assert [m["role"] for m in rows[0]["prompt"]] == ["user"]


# --------------------------------------------------------------------------- checkpoints, ensure_adapter


def _checkpoint(run, step, complete=True):
    folder = run / "grpo" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    if complete:
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))


def test_last_checkpoint_is_the_newest_complete_one(tmp_path):
    assert last_checkpoint(tmp_path) is None
    (tmp_path / "grpo" / "completions").mkdir(parents=True)
    assert last_checkpoint(tmp_path) is None
    for step in (2, 10):
        _checkpoint(tmp_path, step)
    assert last_checkpoint(tmp_path) == str(tmp_path / "grpo" / "checkpoint-10")  # by number, not by name
    _checkpoint(tmp_path, 12, complete=False)  # a disconnect while saving: no trainer_state.json
    assert last_checkpoint(tmp_path) == str(tmp_path / "grpo" / "checkpoint-10")


def test_ensure_adapter_returns_an_existing_adapter_without_training(tmp_path, monkeypatch, capsys):
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    monkeypatch.setattr(training, "train_grpo", lambda *a, **k: pytest.fail("trained again"))
    assert ensure_adapter(SMOKE, tmp_path) == tmp_path / "adapter"
    assert capsys.readouterr().out == ""


def test_ensure_adapter_says_what_it_will_do_then_trains_a_short_run(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_train(profile, run, **kwargs):
        calls.append((profile.name, profile.time_budget_minutes, profile.max_steps, Path(run), kwargs))

    monkeypatch.setattr(training, "train_grpo", fake_train)
    assert ensure_adapter(SMOKE, tmp_path, warmup=False) == tmp_path / "adapter"
    out = capsys.readouterr().out
    assert out.startswith(f"No adapter in {tmp_path / 'adapter'}. Training a short one now")
    assert f"stopped after {SMOKE.fallback_minutes:g} minutes" in out
    assert f"about {SMOKE.minutes['03_grpo_training']} minutes" in out      # what the full run would take
    assert calls == [("cpu-smoke", SMOKE.fallback_minutes, SMOKE.max_steps, tmp_path, {"warmup": False})]
    colab = get_profile("colab-t4", use_vllm=False)
    ensure_adapter(colab, tmp_path)
    out = capsys.readouterr().out
    assert "stopped after 10 minutes" in out and "about 50.0 minutes" in out
    assert calls[-1][1] == colab.fallback_minutes < colab.time_budget_minutes   # never the full budget


# --------------------------------------------------------------------------- the step timing of notebook 00


def test_step_timing_turns_a_timed_step_into_a_budget_in_steps():
    from helpers.training import StepTiming

    t4 = StepTiming("colab-t4", seconds=(40.0, 20.0), max_steps=250, budget_minutes=45, warmup=False)
    assert t4.step_seconds == 20.0
    assert t4.steps_in_budget == (45 * 60 - 20) // 20 == 134   # the first step's extra 20 s counted once
    assert not t4.fits
    assert "stops after about 134 of the 250 steps, with the adapter saved" in t4.plan()
    demo = StepTiming("cpu-demo", seconds=(9.0, 9.5), max_steps=60, budget_minutes=10, warmup=True)
    assert demo.steps_in_budget == 63 and demo.fits       # a first step faster than the next: no credit
    assert "all 60 steps fit" in demo.plan() and "warm-up before GRPO counts" in demo.plan()
    free = StepTiming("gpu-large", seconds=(6.0,), max_steps=100, budget_minutes=None, warmup=False)
    assert free.steps_in_budget is None and free.fits and "No time budget: all 100 steps take about 10 min" in free.plan()


# --------------------------------------------------------------------------- slow: the bundled model


@pytest.fixture(scope="module")
def lora_model():
    from helpers.models import load_model

    return load_model(SMOKE)


@pytest.mark.slow
def test_sft_trains_on_the_completion_after_the_prompt_grpo_will_see(lora_model, tmp_path):
    from trl import SFTConfig, SFTTrainer

    model, tok = lora_model
    args = SFTConfig(output_dir=str(tmp_path), completion_only_loss=True, use_cpu=True, report_to="none")
    for prefill in (PREFILL, ""):
        tokenizer = install_prefill(copy.deepcopy(tok), prefill)
        rows = warmup_dataset(SMOKE, tokenizer)
        sft = SFTTrainer(model=model, args=args, train_dataset=rows, processing_class=tokenizer)
        example, row = sft.train_dataset[0], rows[0]
        start = next(i for i, label in enumerate(example["labels"]) if label != -100)
        assert example["input_ids"][:start] == encode(tokenizer, [row["prompt"]])[0]
        learned = tokenizer.decode(example["input_ids"][start:])
        content = row["completion"][0]["content"]
        assert learned == content[len(prefill):] + "<|im_end|>\n"  # the model learns to continue and to stop


@pytest.mark.slow
def test_run_warmup_saves_the_warmup_adapter(lora_model, tmp_path):
    import torch
    from transformers import AutoTokenizer

    from helpers.prompts import installed_prefill
    from helpers.training import run_warmup

    model, tok = lora_model
    summary = run_warmup(model, tok, SMOKE, tmp_path)
    assert summary["examples"] == SMOKE.warmup_examples == 8 and summary["steps"] == 1
    assert isinstance(summary["final_loss"], float) and summary["final_loss"] > 0
    folder = tmp_path / "warmup-adapter"
    assert (folder / "adapter_config.json").is_file() and (folder / "adapter_model.safetensors").is_file()
    assert installed_prefill(AutoTokenizer.from_pretrained(str(folder))) == PREFILL
    assert any(torch.count_nonzero(p) for n, p in model.named_parameters() if "lora_B" in n)  # it learned


@pytest.mark.slow
def test_train_grpo_writes_a_run_and_a_stopped_run_resumes_where_it_stopped(tmp_path):
    from helpers.explorer import load_completions
    from helpers.runs import read_json
    from helpers.training import train_grpo

    # a time budget shorter than one step: GRPO stops after step 1 and saves a checkpoint there
    first = train_grpo(get_profile("cpu-smoke", max_steps=2, time_budget_minutes=0.01), tmp_path)["summary"]
    assert first["global_step"] == 1 and first["stopped_by_time_budget"] and first["resumed_from"] is None
    assert first["warmup"]["examples"] == 8
    assert last_checkpoint(tmp_path) == str(tmp_path / "grpo" / "checkpoint-1")
    for name in ("adapter/adapter_config.json", "adapter/chat_template.jinja", "warmup-adapter/adapter_config.json",
                 "train_config.json", "run.json", "metrics.jsonl", "figures/dashboard.png",
                 "grpo/completions/completions_00001.parquet", "dataset"):
        assert (tmp_path / name).exists(), name
    warmup_mtime = (tmp_path / "warmup-adapter" / "adapter_model.safetensors").stat().st_mtime_ns

    second = train_grpo(get_profile("cpu-smoke", max_steps=2), tmp_path)["summary"]
    assert second["resumed_from"] == str(tmp_path / "grpo" / "checkpoint-1")
    assert second["global_step"] == 2 and second["warmup"] is None and not second["stopped_by_time_budget"]
    assert (tmp_path / "warmup-adapter" / "adapter_model.safetensors").stat().st_mtime_ns == warmup_mtime

    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]  # each step once, the first from the checkpoint
    assert all("reward" in m and "frac_reward_zero_std" in m for m in metrics)
    assert sorted(load_completions(tmp_path / "grpo")["step"].unique()) == [1, 2]
    config = read_json(tmp_path / "train_config.json")
    assert config["profile"]["name"] == "cpu-smoke" and config["prefill"] == PREFILL
    assert config["grpo_config"]["max_steps"] == 2 and config["summary"]["global_step"] == 2
    assert [r["weight"] for r in config["rewards"]] == weights(SMOKE)
    assert read_json(tmp_path / "run.json")["versions"]["trl"] == "1.13.0"


@pytest.mark.slow
def test_time_grpo_step_times_real_steps_and_keeps_nothing(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))       # the scratch folder lands here
    timing = training.time_grpo_step(SMOKE, steps=2)
    assert len(timing.seconds) == 2 and all(s > 0 for s in timing.seconds)
    assert timing.max_steps == SMOKE.max_steps and timing.budget_minutes == SMOKE.time_budget_minutes
    assert timing.warmup                                         # cpu-smoke warms up: the plan says so
    assert list(tmp_path.iterdir()) == []                        # the throw-away run is gone
    with pytest.raises(ValueError, match="at least one step"):
        training.time_grpo_step(SMOKE, steps=0)

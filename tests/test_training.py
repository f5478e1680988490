"""helpers.training: config checks, precision, the GRPOConfig of every profile and task, the warm-up of both
tasks, the run's own record, and real runs (one that stops and resumes; the JSON task by its profile alone)."""

import json
import re
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from helpers import training
from helpers.profiles import PROFILES, get_profile
from helpers.prompts import build_prompt
from helpers.tasks import get_task
from helpers.tasks.arithmetic import PRESETS
from helpers.tasks.orders import JSON_PREFILL
from helpers.tasks.reasoning import PREFILL, SYSTEM_PROMPT
from helpers.training import (
    REMOVED_ARGS,
    TrainingConfigError,
    check_config,
    ensure_adapter,
    explain_config_error,
    grpo_config,
    grpo_kwargs,
    last_checkpoint,
    precision,
    sft_kwargs,
    torch_dtype,
    warmup_dataset,
    write_train_config,
)

SMOKE = get_profile("cpu-smoke")
JSON_SMOKE = get_profile("cpu-smoke", task="json")
T4, A100 = (7, 5), (8, 0)
TASKS = ["arithmetic", "json"]


def cfg(**changes):
    """A stand-in for a GRPOConfig: check_config reads only these fields."""
    return NS(**{**dict(bf16=False, fp16=False, max_completion_length=256, use_vllm=False), **changes})


def weights(profile):
    return [w for _, w in get_task(profile.task).rewards_for(profile.task_level)]


@pytest.fixture(autouse=True)
def cpu_without_bf16(monkeypatch):
    """Every test sees a CPU where bf16 is not faster (float32: the same answers on every machine); the tests of
    a bf16 CPU say so."""
    monkeypatch.setattr(training, "cpu_bf16", lambda: False)


def pretend_ampere_with_vllm(monkeypatch):
    """bf16 cannot be built on a CPU (transformers checks the GPU) and vLLM is not installed here."""
    monkeypatch.setattr("transformers.training_args.is_torch_bf16_gpu_available", lambda: True)
    monkeypatch.setattr(training, "installed", lambda name: True)


# --------------------------------------------------------------------------- precision


@pytest.mark.parametrize("profile, capability, bits, dtype", [
    (SMOKE, None, (False, False), "float32"),
    (SMOKE, A100, (False, False), "float32"),  # a CPU profile trains in float32 even beside a GPU
    (get_profile("colab-t4"), None, (False, False), "float32"),  # no GPU seen
    (get_profile("colab-t4"), T4, (False, True), "float16"),
    (get_profile("colab-t4"), A100, (True, False), "bfloat16"),
    (get_profile("colab-t4", model="gemma3-1b"), T4, (False, False), "float32"),  # Gemma 3 overflows in fp16
    (get_profile("colab-t4", model="gemma3-1b"), A100, (True, False), "bfloat16"),
])
def test_precision_follows_the_backend_the_capability_and_the_model(profile, capability, bits, dtype):
    assert precision(profile, capability) == {"bf16": bits[0], "fp16": bits[1]}
    assert torch_dtype(profile, capability) == dtype


def test_a_cpu_trains_in_float32_even_where_bf16_is_faster_but_may_ask_for_it(monkeypatch, tmp_path):
    """bf16 measured faster (AVX512-BF16 or AMX) is not shown to learn as well: the course picks float32 on every
    CPU; a learner who asks for bf16 there passes the check, and transformers accepts it with use_cpu."""
    monkeypatch.setattr(training, "cpu_bf16", lambda: True)
    assert precision(SMOKE, None) == precision(SMOKE, A100) == {"bf16": False, "fp16": False}
    assert torch_dtype(SMOKE, None) == "float32" and sft_kwargs(SMOKE, tmp_path)["bf16"] is False
    assert precision(get_profile("colab-t4"), T4) == {"bf16": False, "fp16": True}
    check_config(cfg(bf16=True, max_completion_length=20), SMOKE)
    config = grpo_config(SMOKE, tmp_path, bf16=True)  # transformers accepts bf16 with use_cpu (training_args.py:1745)
    assert config.bf16 and not config.fp16 and config.use_cpu and config.mixed_precision == "bf16"


def test_a_run_may_ask_for_another_precision_and_every_config_of_it_follows(tmp_path):
    """A benchmark's variant (bench/learning.py --precision bf16): the resolved run carries the precision, and the
    warm-up's and GRPO's configs take it; the check accepts bf16 on a CPU the run asked it of (issue 55)."""
    import dataclasses

    from helpers.models import resolve

    run = dataclasses.replace(resolve(SMOKE), precision={"bf16": True, "fp16": False})
    assert grpo_kwargs(run, tmp_path)["bf16"] and sft_kwargs(run, tmp_path)["bf16"]
    check_config(cfg(bf16=True, max_completion_length=20), run)  # helpers.machine.cpu_bf16() is False here
    with pytest.raises(TrainingConfigError, match="bf16=True on a CPU"):
        check_config(cfg(bf16=True, max_completion_length=20), SMOKE)
    assert torch_dtype(run, None) == "float32"  # a merged copy on a CPU stays float32 (bf16 was autocast)


def test_cpu_profiles_skip_gradient_checkpointing_gpu_profiles_keep_it(tmp_path):
    """TRL turns it on by default (one more forward per step); a 135M model on a CPU has memory to spare."""
    assert grpo_kwargs(SMOKE, tmp_path)["gradient_checkpointing"] is False
    assert sft_kwargs(get_profile("cpu-demo"), tmp_path)["gradient_checkpointing"] is False
    assert grpo_config(SMOKE, tmp_path).gradient_checkpointing is False
    assert grpo_kwargs(get_profile("colab-t4"), tmp_path, T4)["gradient_checkpointing"] is True


# --------------------------------------------------------------------------- check_config


@pytest.mark.parametrize("profile, config, capability, message", [
    (SMOKE, cfg(bf16=True), None, "bf16=True on a CPU where bf16 is not faster"),
    (SMOKE, cfg(fp16=True), None, "fp16=True on a CPU"),
    (get_profile("colab-t4"), cfg(bf16=True), None, "bf16=True on a CPU"),  # a GPU profile with no GPU seen
    (get_profile("colab-t4"), cfg(bf16=True), T4, "compute capability 7.5"),
    (get_profile("colab-t4", model="gemma3-1b"), cfg(fp16=True), T4, "Gemma 3 overflows in fp16"),
    (SMOKE, cfg(max_completion_length=19), None, "too short for the 'arithmetic' task: .* at least 20"),
    (JSON_SMOKE, cfg(max_completion_length=31), None, "too short for the 'json' task: .* at least 32"),
    (get_profile("colab-t4", task="json"), cfg(max_completion_length=31, fp16=True), T4, "'json' task: .* at least 32"),
    (SMOKE, cfg(max_completion_length=None), None, "max_completion_length=None is too short"),
    (SMOKE, cfg(max_completion_length=300), None, r"300 \+ max_prompt_tokens=256 exceeds max_seq_length=512"),
    (SMOKE, cfg(use_vllm=True), None, "vLLM needs a CUDA GPU"),
])
def test_check_config_rejects_what_trl_accepts(profile, config, capability, message):
    with pytest.raises(TrainingConfigError, match=message):
        check_config(config, profile, capability=capability, vllm_installed=True)


@pytest.mark.parametrize("profile, config, capability", [
    (SMOKE, cfg(max_completion_length=20), None),
    (JSON_SMOKE, cfg(max_completion_length=32), None),
    (get_profile("colab-t4"), cfg(fp16=True), T4),
    (get_profile("colab-t4", model="gemma3-1b"), cfg(), T4),  # float32 on a T4
    (get_profile("gpu-large", use_vllm=True), cfg(bf16=True, max_completion_length=512, use_vllm=True), A100),
])
def test_check_config_passes_what_the_profiles_choose(profile, config, capability):
    check_config(config, profile, capability=capability, vllm_installed=True)


def test_vllm_on_a_gpu_needs_it_installed(monkeypatch):
    large = get_profile("gpu-large", use_vllm=True)
    config = cfg(bf16=True, max_completion_length=512, use_vllm=True)
    with pytest.raises(TrainingConfigError, match=r"vLLM is not installed\. Set use_vllm=False"):
        check_config(config, large, capability=A100, vllm_installed=False)
    monkeypatch.setattr(training, "installed", lambda name: name != "vllm")  # detected when not told
    with pytest.raises(TrainingConfigError, match="not installed"):
        check_config(config, large, capability=A100)
    monkeypatch.setattr(training, "installed", lambda name: True)
    check_config(config, large, capability=A100)


def test_several_problems_are_reported_together():
    with pytest.raises(TrainingConfigError) as err:
        check_config(cfg(bf16=True, max_completion_length=8, use_vllm=True), SMOKE)
    lines = str(err.value).splitlines()
    assert lines[0] == "Fix these settings:" and len(lines) == 4
    assert "bf16=True on a CPU" in lines[1] and "too short" in lines[2] and "vLLM needs a CUDA GPU" in lines[3]


@pytest.mark.parametrize("task", TASKS)
def test_the_course_config_passes(tmp_path, task):
    profile = get_profile("cpu-smoke", task=task)
    check_config(grpo_config(profile, tmp_path), profile)


# --------------------------------------------------------------------------- explain_config_error


@pytest.mark.parametrize("name, fix", [("max_prompt_length", "TRL 0.28 removed `max_prompt_length`"),
                                       ("warmup_ratio", "give `warmup_steps`")])
def test_removed_arguments_get_their_fix(tmp_path, name, fix):
    from trl import GRPOConfig

    with pytest.raises(TypeError) as err:  # the pinned TRL / transformers really refuse them
        GRPOConfig(output_dir=str(tmp_path), **{name: 1})
    assert fix in explain_config_error(err.value) and explain_config_error(err.value) == REMOVED_ARGS[name]
    with pytest.raises(TypeError) as err:  # grpo_config passes overrides straight to GRPOConfig
        grpo_config(SMOKE, tmp_path, **{name: 1})
    assert explain_config_error(err.value) == REMOVED_ARGS[name]


def test_other_errors_are_returned_as_they_are():
    err = TypeError("__init__() got an unexpected keyword argument 'num_generation'")
    assert explain_config_error(err) == str(err)
    assert explain_config_error(ValueError("boom")) == "boom"


# --------------------------------------------------------------------------- grpo_kwargs, grpo_config


def test_cpu_config_from_the_profile_and_overrides(tmp_path):
    config = grpo_config(SMOKE, tmp_path, max_steps=5, learning_rate=2e-4)
    assert config.output_dir == str(tmp_path / "grpo")
    assert (config.max_steps, config.learning_rate) == (5, 2e-4)
    assert (config.num_generations, config.per_device_train_batch_size) == (2, 2)
    assert config.max_completion_length == SMOKE.max_completion_length and config.beta == 0.0
    assert config.reward_weights == weights(SMOKE) == [w for _, w in PRESETS["arithmetic"]] == [1.0, 0.5, 0.5, 0.25]
    assert config.use_cpu and not config.bf16 and not config.fp16 and not config.use_vllm
    assert config.log_completions and config.logging_steps == 1 and config.save_steps == SMOKE.save_steps
    assert config.optim == "adamw_torch" and config.chat_template_kwargs is None
    assert config.generation_batch_size % config.num_generations == 0
    assert grpo_config(get_profile("cpu-demo"), tmp_path).num_generations == 8
    with pytest.raises(TrainingConfigError, match="too short"):  # checked after the overrides
        grpo_config(SMOKE, tmp_path, max_completion_length=8)


def test_the_json_task_brings_its_rewards_weights_and_length(tmp_path):
    config = grpo_config(JSON_SMOKE, tmp_path)
    assert config.reward_weights == [w for _, w in get_task("json").rewards] == [0.5, 0.5, 2.0, 1.0, 1.0]
    assert config.max_completion_length == 40 == JSON_SMOKE.max_completion_length  # the task's CPU setting
    same = {k: v for k, v in grpo_kwargs(SMOKE, tmp_path).items() if k not in ("reward_weights",
                                                                             "max_completion_length", "run_name")}
    assert same == {k: v for k, v in grpo_kwargs(JSON_SMOKE, tmp_path).items() if k in same}  # the rest: the profile's
    assert grpo_kwargs(JSON_SMOKE, tmp_path)["run_name"] == "json-dapo-seed3407"  # trackio tells the tasks apart


def test_grpo_kwargs_log_to_trackio_in_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("COURSE_TRACKIO", raising=False)
    kwargs = grpo_kwargs(SMOKE, tmp_path)
    assert kwargs["report_to"] == "trackio" and kwargs["project"] == "grpo-course"
    assert kwargs["trackio_static_space_id"] is False  # no Space, ever
    monkeypatch.setenv("COURSE_TRACKIO", "0")
    assert grpo_kwargs(SMOKE, tmp_path)["report_to"] == "none"


def test_grpo_kwargs_name_every_reward_weight_of_the_level():
    assert grpo_kwargs(get_profile("colab-t4"), "/r", T4)["reward_weights"] == [w for _, w in PRESETS["gsm8k"]]
    assert grpo_kwargs(get_profile("colab-t4", task_level="add2"), "/r", T4)["reward_weights"] == [
        w for _, w in PRESETS["arithmetic"]]


def test_t4_configs_build_on_a_cpu_with_an_explicit_capability(tmp_path):
    t4 = grpo_config(get_profile("colab-t4"), tmp_path, capability=T4)
    assert (t4.fp16, t4.bf16, t4.use_cpu, t4.use_vllm) == (True, False, False, False)
    assert t4.optim == "adamw_8bit" and t4.max_grad_norm == 0.1 and t4.mask_truncated_completions
    assert t4.epsilon_high == 0.28 and t4.loss_type == "dapo"
    assert t4.reward_weights == [1.0, 1.0, 0.5, 0.5, 0.5]  # the GSM8K preset
    gemma = grpo_config(get_profile("colab-t4", model="gemma3-1b"), tmp_path, capability=T4)
    assert (gemma.fp16, gemma.bf16) == (False, False)


def test_gpu_large_config(tmp_path, monkeypatch):
    large = get_profile("gpu-large", use_vllm=True)  # explicit: without vLLM the profile drops it
    monkeypatch.setattr(training, "installed", lambda name: name != "vllm")
    with pytest.raises((TrainingConfigError, ValueError), match="vLLM is not installed|bf16/gpu"):
        grpo_config(large, tmp_path, capability=A100)
    pretend_ampere_with_vllm(monkeypatch)
    config = grpo_config(large, tmp_path, capability=A100)
    assert (config.bf16, config.fp16, config.use_vllm, config.vllm_mode) == (True, False, True, "colocate")
    assert config.vllm_gpu_memory_utilization == large.gpu_memory_utilization
    assert config.chat_template_kwargs == {"enable_thinking": False}  # Qwen3: the course's own tags
    assert config.max_completion_length == 512 and config.optim == "adamw_8bit"


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("name", list(PROFILES))
def test_every_profile_builds_a_checked_config_for_every_task(tmp_path, monkeypatch, name, task):
    """On an Ampere GPU with vLLM installed (pretended: this machine has neither)."""
    pretend_ampere_with_vllm(monkeypatch)
    profile = get_profile(name, task=task, use_vllm=PROFILES[name].use_vllm)  # as on a machine with vLLM
    capability = A100 if profile.backend == "unsloth" else None
    config = grpo_config(profile, tmp_path, capability=capability)
    assert (config.num_generations, config.max_steps, config.optim) == (
        profile.num_generations, profile.max_steps, profile.optim)
    assert config.bf16 == (profile.backend == "unsloth") and config.use_cpu == (profile.backend != "unsloth")
    assert config.reward_weights == weights(profile) and config.max_completion_length == profile.max_completion_length
    assert config.use_vllm is PROFILES[name].use_vllm


def test_sft_kwargs_are_the_warmup_settings_of_the_profile(tmp_path):
    values = sft_kwargs(SMOKE, tmp_path)
    assert values["output_dir"] == str(tmp_path / "warmup-adapter") and values["completion_only_loss"] is True
    assert (values["num_train_epochs"], values["learning_rate"], values["per_device_train_batch_size"]) == (
        SMOKE.warmup_epochs, SMOKE.warmup_learning_rate, SMOKE.warmup_batch_size)
    assert values["use_cpu"] and not values["bf16"] and not values["fp16"]
    assert sft_kwargs(get_profile("colab-t4"), tmp_path, T4)["fp16"] is True


# --------------------------------------------------------------------------- warm-up rows


@pytest.fixture(scope="module")
def tok():
    from helpers.models import load_tokenizer

    return load_tokenizer(SMOKE)


def test_arithmetic_warmup_rows_are_prompt_completion_conversations_in_the_format(tok):
    task = get_task("arithmetic")
    rows = warmup_dataset(SMOKE, tok)
    assert rows.num_rows == SMOKE.warmup_examples and rows.column_names == ["prompt", "completion"]
    for row in rows:
        question = row["prompt"][-1]["content"]
        assert row["prompt"] == build_prompt(question, SYSTEM_PROMPT)
        (message,) = row["completion"]
        assert message["role"] == "assistant" and message["content"].startswith(PREFILL)
        a, b = map(int, re.fullmatch(r"What is (\d) \+ (\d)\?", question).groups())  # level add1
        assert task.score(message["content"], {"answer": str(a + b)}) == {"accuracy": 1.0, "correct": 1.0,
                                                                          "format": 1.0}


def test_json_warmup_rows_are_the_exact_objects_of_the_easy_level(tok):
    task = get_task("json")
    rows = warmup_dataset(JSON_SMOKE, tok)
    made = task.make_rows(JSON_SMOKE.warmup_level, JSON_SMOKE.warmup_examples, JSON_SMOKE.seed + 1)
    assert JSON_SMOKE.warmup_level == "orders-easy" and rows.num_rows == JSON_SMOKE.warmup_examples == len(made)
    for row, source in zip(rows, made):
        assert row["prompt"] == build_prompt(source["question"], task.system_prompt_for(source))
        assert "quantity (integer)" in row["prompt"][0]["content"]  # the schema, in words
        (message,) = row["completion"]
        assert message["content"].startswith(JSON_PREFILL)
        scores = task.score(message["content"], source)
        assert (scores["exact_match"], scores["schema_valid"], scores["clean_json"]) == (1.0, 1.0, 1.0)


def test_warmup_rows_carry_template_kwargs_and_fold_the_system_prompt_where_needed(tok):
    qwen3 = warmup_dataset(get_profile("cpu-smoke", model="qwen3-1.7b"), tok)
    assert qwen3[0]["chat_template_kwargs"] == {"enable_thinking": False}

    class NoSystemRole:  # a Gemma-style template that refuses a system message
        def apply_chat_template(self, msgs, **kwargs):
            if msgs[0]["role"] == "system":
                raise ValueError("System role not supported")
            return "".join(m["content"] for m in msgs)

    for profile in (SMOKE, JSON_SMOKE):
        rows = warmup_dataset(profile, NoSystemRole())
        assert [m["role"] for m in rows[0]["prompt"]] == ["user"]
        assert rows[0]["prompt"][0]["content"].startswith(get_task(profile.task).system_prompt_for(
            get_task(profile.task).make_rows(profile.warmup_level, 1, profile.seed + 1)[0]))


# --------------------------------------------------------------------------- checkpoints, ensure_adapter, the record


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
        calls.append((profile.name, profile.task, profile.time_budget_minutes, profile.max_steps, Path(run), kwargs))

    monkeypatch.setattr(training, "train_grpo", fake_train)
    assert ensure_adapter(SMOKE, tmp_path, warmup=False) == tmp_path / "adapter"
    out = capsys.readouterr().out
    assert out.startswith(f"No adapter in {tmp_path / 'adapter'}. Training a short one now")
    assert f"stopped after {SMOKE.fallback_minutes:g} minutes" in out
    assert f"about {SMOKE.minutes['03_grpo_training']} minutes" in out      # what the full run would take
    assert calls == [("cpu-smoke", "arithmetic", SMOKE.fallback_minutes, SMOKE.max_steps, tmp_path,
                      {"warmup": False})]
    colab = get_profile("colab-t4", use_vllm=False)
    ensure_adapter(colab, tmp_path)
    out = capsys.readouterr().out
    assert "stopped after 10 minutes" in out and "about 50.0 minutes" in out
    assert calls[-1][2] == colab.fallback_minutes < colab.time_budget_minutes   # never the full budget
    ensure_adapter(JSON_SMOKE, tmp_path / "json")  # the JSON task: by its profile alone
    assert calls[-1][:3] == ("cpu-smoke", "json", JSON_SMOKE.fallback_minutes) and calls[-1][5] == {}


def test_write_train_config_records_the_run_and_keeps_what_run_json_held(tmp_path):
    from helpers.runs import read_json, write_json

    write_json(tmp_path / "run.json", {"created": "2020-01-01T00:00:00", "notes": "mine"})
    config = grpo_config(JSON_SMOKE, tmp_path)
    rewards = get_task("json").rewards
    path = write_train_config(tmp_path, JSON_SMOKE, config, rewards, summary={"global_step": 3})
    assert path == tmp_path / "train_config.json"
    record = read_json(path)
    assert record["profile"] == JSON_SMOKE.to_dict() and record["prefill"] == JSON_PREFILL
    assert record["rewards"] == [{"name": f.__name__, "weight": w} for f, w in rewards]
    assert record["rewards"][0] == {"name": "prefilled_json_format_reward", "weight": 0.5}
    assert record["grpo_config"]["reward_weights"] == [w for _, w in rewards] and record["summary"]["global_step"] == 3
    info = read_json(tmp_path / "run.json")
    assert (info["created"], info["notes"]) == ("2020-01-01T00:00:00", "mine")  # kept
    assert info["profile"]["task"] == "json" and info["training"] == {"adapter": "adapter", "config": path.name}
    assert info["versions"]["trl"] == "1.13.0" and info["machine"]["cpus"] >= 1
    write_train_config(tmp_path / "fresh", SMOKE, grpo_config(SMOKE, tmp_path), PRESETS["arithmetic"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", read_json(tmp_path / "fresh" / "run.json")["created"])


# --------------------------------------------------------------------------- slow: the bundled model


@pytest.fixture(scope="module")
def lora_model():
    from helpers.models import load_model

    return load_model(SMOKE)


# SFT's prompt/label parity (labels start after the prompt GRPO will see; the rest is the completion after the
# prefill, then <|im_end|>) for arithmetic, no prefill and JSON: tests/test_prompt_parity.py, first test.


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
def test_train_grpo_runs_the_callbacks_it_is_given_beside_the_courses(tmp_path_factory):
    """The shared 2-step cpu-smoke run (tests/shared.py): it passes a callback recording the steps it sees and
    ``config_overrides={"top_entropy_quantile": 0.2}``."""
    from .shared import smoke_run

    out = smoke_run(tmp_path_factory)
    run = Path(out["run"])
    assert out["steps_seen"] == [1, 2]
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert out["top_entropy_quantile"] == 0.2  # the trainer ran with it, and the run folder records it
    assert json.loads((run / "train_config.json").read_text())["grpo_config"]["top_entropy_quantile"] == 0.2


@pytest.mark.slow
def test_train_grpo_writes_a_run_and_a_stopped_run_resumes_where_it_stopped(tmp_path):
    from helpers.explorer import load_completions
    from helpers.runs import read_json
    from helpers.training import train_grpo

    # a time budget shorter than one step: GRPO stops after step 1 and saves a checkpoint there
    short = get_profile("cpu-smoke", max_steps=2, time_budget_minutes=0.01, fallback_minutes=0.01)
    first = train_grpo(short, tmp_path)["summary"]
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
def test_ensure_adapter_trains_the_json_task_by_its_profile_alone(tmp_path, capsys):
    """What failed before issue 17: no dataset or rewards passed by hand, the task comes from the profile."""
    from helpers.explorer import load_completions
    from helpers.prompts import installed_prefill
    from helpers.runs import read_json
    from transformers import AutoTokenizer

    profile = get_profile("cpu-smoke", task="json", max_steps=1, warmup_examples=4, warmup_batch_size=4)
    assert ensure_adapter(profile, tmp_path) == tmp_path / "adapter"
    assert "Training a short one now" in capsys.readouterr().out
    assert installed_prefill(AutoTokenizer.from_pretrained(str(tmp_path / "adapter"))) == JSON_PREFILL
    record = read_json(tmp_path / "train_config.json")
    assert record["summary"]["global_step"] == 1 and record["summary"]["warmup"]["examples"] == 4
    assert [r["name"] for r in record["rewards"]] == [f.__name__ for f, _ in get_task("json").rewards]
    assert record["profile"]["time_budget_minutes"] == profile.fallback_minutes
    card = read_json(tmp_path / "dataset" / "card.json")
    assert card["source"] == {"task": "json", "level": "orders"} and "schema" in card["columns"]
    steps = load_completions(tmp_path / "grpo")
    assert "prefilled_exact_match_reward" in steps.columns and len(steps) == profile.per_device_train_batch_size


@pytest.mark.slow
def test_the_task_instance_given_is_the_one_that_trains(tmp_path, monkeypatch):
    """Notebook 05's ``TASK``, changed in a cell, trains: ``train_grpo(..., task=TASK)`` gives the trainer its rewards
    and weights and the watch its headline, and looks no task up again (issue 55: a fresh lookup would not see the
    change)."""
    import helpers.models
    from helpers.rewards import completion_text
    from helpers.training import train_grpo

    def short_reward(completions, **kwargs):
        """A learner's extra reward: 0.1 for an object under 60 characters."""
        return [0.1 if len(completion_text(c)) < 60 else 0.0 for c in completions]

    task = get_task("json")
    task.rewards = [*task.rewards, (short_reward, 0.25)]  # the instance changed, not its class
    task.headline = "schema_valid"
    monkeypatch.setattr(helpers.models, "get_task", lambda key: pytest.fail(f"task {key!r} looked up again"))
    profile = get_profile("cpu-smoke", task="json", max_steps=1, warmup_examples=0, watch_prompts=0,
                          time_budget_minutes=None)
    trainer = train_grpo(profile, tmp_path, task=task)["trainer"]
    assert trainer.reward_funcs == [f for f, _ in task.rewards] and short_reward not in get_task("json").rewards
    assert trainer.args.reward_weights == [w for _, w in task.rewards]
    assert "rewards/short_reward/mean" in trainer.state.log_history[0]
    assert {getattr(c, "headline", None) for c in trainer.callback_handler.callbacks} >= {"schema_valid"}
    assert [r["name"] for r in json.loads((tmp_path / "train_config.json").read_text())["rewards"]][-1] == "short_reward"


@pytest.mark.slow
def test_a_bf16_cpu_trains_on_a_bf16_base_with_float32_lora(tmp_path, monkeypatch):
    """bf16 on a CPU, asked for: the frozen base loaded in bf16 (train_grpo asks load_model for it), LoRA in float32, and
    accelerate's autocast around the loss's forward. Sampling, which autocast does not reach (accelerate wraps only
    the top-level ``model.forward``, accelerate/accelerator.py:1825-1835), runs in bf16 too because the base weights
    are bf16 (notebooks 00, 03, 06)."""
    import dataclasses
    import math

    import torch

    from helpers.models import resolve
    from helpers.training import train_grpo

    # small: on a CPU without bf16 kernels (AVX2 only) a bf16 backward is several times slower than float32, so the
    # warm-up keeps 2 examples and no held-out slice is scored (the steps sample in bf16 already)
    profile = get_profile("cpu-smoke", max_steps=1, time_budget_minutes=None, watch_prompts=0, warmup_examples=2,
                          warmup_batch_size=2)
    run = dataclasses.replace(resolve(profile), precision={"bf16": True, "fp16": False})  # asked for
    seen = []  # (grad enabled: training, not sampling; the output dtype) of every call
    real_load = training.load_model

    def load_and_hook(*args, **kwargs):
        model, tokenizer = real_load(*args, **kwargs)
        layer = next(m for name, m in model.named_modules() if name.endswith("q_proj.base_layer"))
        layer.register_forward_hook(lambda module, args, output: seen.append((torch.is_grad_enabled(), output.dtype)))
        return model, tokenizer

    monkeypatch.setattr(training, "load_model", load_and_hook)
    out = train_grpo(run, tmp_path)  # the warm-up too
    trainer = out["trainer"]
    assert trainer.args.bf16 and trainer.accelerator.native_amp and not trainer.args.gradient_checkpointing
    assert {p.dtype for p in out["model"].parameters() if p.requires_grad} == {torch.float32}
    assert {p.dtype for p in out["model"].parameters() if not p.requires_grad} == {torch.bfloat16}
    assert {dtype for grad, dtype in seen if grad} == {torch.bfloat16}  # the warm-up's and the loss's forwards
    sampling = [dtype for grad, dtype in seen if not grad]
    assert len(sampling) >= 2 and set(sampling) == {torch.bfloat16}  # the prompt, then a call per new token
    assert math.isfinite(next(h["loss"] for h in trainer.state.log_history if "loss" in h))

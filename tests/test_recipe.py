"""helpers.recipe: the course's recipe as `trl grpo` / `trl sft` YAML, run by TRL's own commands.

The slow tests run the cpu-smoke recipe for real in subprocesses: `trl sft`, the merge, `trl grpo`
on one process and on two (torchrun; two ranks checked, not assumed), the adapters combined, and the
result reloaded as notebook 04 loads an adapter. The GPU commands of the README and notebook 04
(DeepSpeed ZeRO-2, a vLLM server), which no machine here can run, go through TRL's own command-line
code up to the point where `accelerate launch` would start them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from helpers.profiles import PROFILES, get_model_spec, get_profile
from helpers.prompts import build_prompt, installed_prefill, render
from helpers.recipe import (
    GRPO_YAML,
    SFT_YAML,
    WARMUP_ROWS,
    Recipe,
    RecipeError,
    main,
    recipe_texts,
    reward_path,
    write_recipe,
)
from helpers.rewards import Prefilled
from helpers.tasks import get_task
from helpers.tasks.arithmetic import PRESETS, ArithmeticTask
from helpers.tasks.orders import JSON_PREFILL
from helpers.tasks.reasoning import PREFILL, strict_format_reward
from helpers.training import TrainingConfigError, check_config, grpo_config, sft_kwargs

ROOT = Path(__file__).resolve().parents[1]
SMOKE = get_profile("cpu-smoke")
A100 = (8, 0)
BIN = Path(sys.executable).parent
SCALING = ROOT / "docs" / "scaling-out.md"  #: the README's scaling-out page
#: Where the docs and notebook 04 say the run folder is; the tests put their own folder there.
DOC_RUN = "runs/my-run"
TRL_CONFIGS_LINE = 'TRL_CONFIGS=$(python -c "import trl, os; print(os.path.dirname(trl.__file__))")/accelerate_configs'

#: A reward wrapped at a module-level name of this file, for a task defined here (a learner's own task module).
THINK_FORMAT = Prefilled(strict_format_reward, "<think>\n")


class ThinkTask(ArithmeticTask):
    """A learner's task whose reward lives in the task's own module (this file), not beside the one it wraps."""

    rewards = [(THINK_FORMAT, 1.0)]

    def rewards_for(self, level):
        return list(self.rewards)


class UnnamedRewardTask(ArithmeticTask):
    """A task whose reward is built where no module-level name holds it: `trl grpo` could not import it."""

    rewards = [(Prefilled(strict_format_reward, "<think>\n"), 1.0)]

    def rewards_for(self, level):
        return list(self.rewards)


def gpu_profile(name: str, task: str = "arithmetic"):
    return get_profile(name, task=task, use_vllm=PROFILES[name].use_vllm)


def torchrun_line(recipe: Recipe, processes: int = 2) -> str:
    """The README's GRPO line on ``processes`` CPU processes: the per-process batch split, the global batch kept."""
    batch = yaml.safe_load(recipe.grpo.read_text())["per_device_train_batch_size"]
    assert batch % processes == 0, f"per_device_train_batch_size={batch} does not split over {processes} processes"
    return (f"torchrun --nproc_per_node {processes} -m trl.scripts.grpo --config {shlex.quote(str(recipe.grpo))} "
            f"--per_device_train_batch_size {batch // processes}")


def imported(path: str):
    """What `trl grpo` gets for a `reward_funcs` entry: ``importlib.import_module(module)`` then the name."""
    import importlib

    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


# --------------------------------------------------------------------------- what the YAML says


def parse(text: str, tmp_path: Path, script: str, argv: tuple[str, ...] = ()):
    """The YAML through TRL's own parser of `trl <script>` (the dataclasses its script builds)."""
    import importlib

    path = tmp_path / f"{script}.yaml"
    path.write_text(text)
    parser = importlib.import_module(f"trl.scripts.{script}").make_parser()
    return parser.parse_args_and_config(["--config", str(path), *argv])  # fails on any unknown key


@pytest.mark.parametrize("task", ["arithmetic", "json"])
@pytest.mark.parametrize("name", ["cpu-smoke", "cpu-demo"])
def test_cpu_recipe_is_the_notebooks_config_through_trls_parser(name, task, tmp_path):
    profile = get_profile(name, task=task)
    texts = recipe_texts(profile, tmp_path / "run")
    script_args, config, model_args, data_args = parse(texts[GRPO_YAML], tmp_path, "grpo")
    notebook = grpo_config(profile, tmp_path / "run" / "cli")  # notebook 03's GRPOConfig (its save point)
    assert config.to_dict() == notebook.to_dict()  # every field, defaults included
    rewards = get_task(task).rewards_for(profile.task_level)
    assert script_args.reward_funcs == [reward_path(f, get_task(task)) for f, _ in rewards]
    assert [imported(p) for p in script_args.reward_funcs] == [f for f, _ in rewards]  # the very functions
    assert config.reward_weights == [w for _, w in rewards]
    assert (model_args.use_peft, model_args.lora_r, model_args.lora_alpha) == (True, profile.lora_rank,
                                                                               profile.lora_alpha)
    assert model_args.load_in_4bit is profile.load_in_4bit and model_args.dtype == "float32"
    [dataset] = data_args.datasets
    assert (dataset.path, dataset.split) == ("arrow", "train")
    assert dataset.data_files == str((tmp_path / "run" / "dataset" / "train" / "data-*.arrow").absolute())
    assert f"({task})" in texts[GRPO_YAML].splitlines()[0] and repr(get_task(task).prefill) in texts[GRPO_YAML]
    if profile.warmup_examples:
        _, sft, sft_model, _ = parse(texts[SFT_YAML], tmp_path, "sft")
        from trl import SFTConfig

        assert sft.to_dict() == SFTConfig(**sft_kwargs(profile, tmp_path / "run" / "cli")).to_dict()
        assert model_args.model_name_or_path.endswith("cli/warmup-merged")
        assert sft_model.model_name_or_path.endswith("recipe/model")


@pytest.mark.parametrize("task", ["arithmetic", "json"])
@pytest.mark.parametrize("name", ["colab-t4", "gpu-large"])
def test_gpu_recipes_use_only_fields_trl_knows(name, task, tmp_path):
    from trl.scripts.grpo import make_parser

    profile = gpu_profile(name, task)
    texts = recipe_texts(profile, tmp_path / "run", capability=A100, vllm_installed=True)
    assert list(texts) == [GRPO_YAML]  # the GPU profiles have no warm-up
    values = yaml.safe_load(texts[GRPO_YAML])
    assert make_parser().set_defaults_with_config(**values) == []  # every key is a trl grpo argument
    assert values["bf16"] is True and values["use_cpu"] is False and values["dtype"] == "bfloat16"
    assert values["load_in_4bit"] is True and values["bnb_4bit_quant_type"] == "nf4"
    assert values["use_vllm"] is PROFILES[name].use_vllm
    rewards = get_task(task).rewards_for(profile.task_level)
    assert values["reward_funcs"] == [reward_path(f, get_task(task)) for f, _ in rewards] and values["reward_weights"] == [
        w for _, w in rewards]
    if task == "arithmetic":  # GSM8K on a GPU: its own preset
        assert profile.task_level == "gsm8k" and "helpers.tasks.reasoning.numeric_answer_reward" in values["reward_funcs"]


def test_rewards_are_found_by_the_import_path_trl_uses():
    presets = [(r, get_task("arithmetic")) for preset in PRESETS.values() for r, _ in preset]
    per_level = [(r, get_task(key)) for key in ("arithmetic", "json") for level in get_task(key).levels
                 for r, _ in get_task(key).rewards_for(level)]
    for func, task in presets + per_level:
        assert imported(reward_path(func, task)) is func
    assert reward_path(get_task("json").rewards[0][0], get_task("json")) == (
        "helpers.tasks.orders.prefilled_json_format_reward")  # found in the task's module
    with pytest.raises(RecipeError, match="module-level name"):
        reward_path(Prefilled(strict_format_reward, "<think>\n"))
    # a Prefilled reward in the learner's task module (not beside the reward it wraps) is found through the task
    assert reward_path(THINK_FORMAT, ThinkTask()) == f"{__name__}.THINK_FORMAT"
    with pytest.raises(RecipeError, match="no module-level name in its module"):
        reward_path(THINK_FORMAT)
    texts = recipe_texts(get_profile("cpu-smoke", task=f"{__name__}:ThinkTask"), "/tmp/never-written")
    assert yaml.safe_load(texts[GRPO_YAML])["reward_funcs"] == [f"{__name__}.THINK_FORMAT"]
    with pytest.raises(RecipeError, match="module-level name"):
        recipe_texts(get_profile("cpu-smoke", task=f"{__name__}:UnnamedRewardTask"), "/tmp/never-written")

    def written_in_a_notebook(completions, **kwargs):
        return [0.0 for _ in completions]

    written_in_a_notebook.__module__ = "__main__"  # what a reward defined in a notebook cell says
    sys.modules["__main__"].written_in_a_notebook = written_in_a_notebook
    try:
        with pytest.raises(RecipeError, match=r"defined in this notebook \(__main__\), which no other process can import"):
            reward_path(written_in_a_notebook)
    finally:
        del sys.modules["__main__"].written_in_a_notebook


def test_a_recipe_that_would_fail_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(TrainingConfigError, match="max_completion_length"):
        write_recipe(SMOKE.with_overrides(max_completion_length=4), tmp_path)
    assert not (tmp_path / "recipe").exists()
    with pytest.raises(TrainingConfigError, match="too short for the 'json' task"):
        write_recipe(get_profile("cpu-smoke", task="json", max_completion_length=24), tmp_path)
    assert not (tmp_path / "recipe").exists()


def test_check_config_accepts_vllm_server_mode_on_several_gpus():
    values = yaml.safe_load(recipe_texts(gpu_profile("gpu-large"), "/tmp/run", capability=A100,
                                         vllm_installed=True)[GRPO_YAML])
    server = SimpleNamespace(**{**values, "use_vllm": True, "vllm_mode": "server"})
    check_config(server, gpu_profile("gpu-large"), capability=A100, vllm_installed=True)
    # the trainer talks to the server through TRL's VLLMClient, which needs vLLM importable (vllm_client.py)
    with pytest.raises(TrainingConfigError, match="vLLM is not installed"):
        check_config(server, gpu_profile("gpu-large"), capability=A100, vllm_installed=False)
    with pytest.raises(TrainingConfigError, match="CPU profile"):
        check_config(server, SMOKE)


def test_the_json_task_recipe_names_the_orders_rewards_and_trl_reads_it(tmp_path, capsys):
    """write_recipe for the JSON task by its profile alone: the rewards by import path, TRL's parser and
    TRL's own dataset loader on the YAML, the tokenizer with the task's prefill, the warm-up rows."""
    from transformers import AutoTokenizer
    from trl import get_dataset

    profile = get_profile("cpu-smoke", task="json")
    task = get_task("json")
    recipe = write_recipe(profile, tmp_path / "run")
    assert recipe == Recipe.of(tmp_path / "run") and recipe.sft is not None
    values = yaml.safe_load(recipe.grpo.read_text())
    assert values["reward_funcs"] == [f"helpers.tasks.orders.{f.__name__}" for f, _ in task.rewards]
    assert [imported(p) for p in values["reward_funcs"]] == [f for f, _ in task.rewards]
    script_args, config, _, data_args = parse(recipe.grpo.read_text(), tmp_path, "grpo")
    assert script_args.reward_funcs == values["reward_funcs"] and config.reward_weights == [w for _, w in task.rewards]
    assert config.max_completion_length == profile.max_completion_length == 40
    train = get_dataset(data_args)["train"]  # what `trl grpo` trains on: notebook 01's rows with their schema
    assert train.num_rows == profile.train_rows and {"prompt", "answer", "schema"} <= set(train.column_names)
    assert train[0]["prompt"][0]["content"] == task.system_prompt_for(train[0])
    assert installed_prefill(AutoTokenizer.from_pretrained(str(recipe.model))) == JSON_PREFILL
    _, sft, _, sft_data = parse(recipe.sft.read_text(), tmp_path, "sft")
    warmup = get_dataset(sft_data)["train"]
    assert warmup.num_rows == profile.warmup_examples and (recipe.folder / WARMUP_ROWS).is_file()
    made = task.make_rows(profile.warmup_level, profile.warmup_examples, profile.seed + 1)  # level orders-easy
    assert [r["prompt"][-1]["content"] for r in warmup] == [m["question"] for m in made]
    assert [r["completion"][0]["content"] for r in warmup] == [m["answer"] for m in made]  # starts with '{"'
    assert sft.completion_only_loss is True

    # the command line writes the same recipe: `python -m helpers.recipe write RUN --profile P --task json`
    assert main(["write", str(tmp_path / "cli-run"), "--profile", "cpu-smoke", "--task", "json"]) == 0
    assert capsys.readouterr().out.split() == " ".join(Recipe.of(tmp_path / "cli-run").commands()).split()
    cli = (tmp_path / "cli-run" / "recipe" / GRPO_YAML).read_text()
    assert cli == recipe.grpo.read_text().replace(str(tmp_path / "run"), str(tmp_path / "cli-run"))


# --------------------------------------------------------------------------- the commands the docs show


def doc_commands() -> dict[str, list[str]]:
    """Command lines in the bash blocks of docs/scaling-out.md (what the README links for scaling out) and notebook 04's."""
    import nbformat

    section = SCALING.read_text()
    nb = nbformat.read(ROOT / "notebooks" / "04_merge_and_inference.ipynb", as_version=4)
    cells = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown" and "trl grpo --config" in c.source)
    out = {}
    for where, text in (("README", section), ("notebook 04", cells)):
        blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
        out[where] = [line.strip() for block in blocks for line in block.splitlines()
                      if line.strip() and not line.strip().startswith("#")]
    return out


def test_readme_and_notebook_show_the_same_commands():
    docs = doc_commands()
    assert docs["README"] and docs["notebook 04"]
    assert set(docs["notebook 04"]) <= set(docs["README"])


def _in_run(line: str, run: Path) -> str:
    return line.replace(DOC_RUN, str(run))


def test_the_gpu_commands_go_through_trls_own_command_line(tmp_path, monkeypatch):
    """`trl grpo ... --accelerate_config zero2`, `accelerate launch ...` and the vLLM server: parsed by TRL's
    and accelerate's own code, stopped where `accelerate launch` would start the processes."""
    import transformers.training_args
    from accelerate.commands.launch import launch_command_parser

    import trl.cli.accelerate_launcher as launcher
    from trl.cli.main import main as trl_main
    from trl.scripts.grpo import make_parser

    run = tmp_path / "my-run"
    profile = gpu_profile("gpu-large")
    (run / "recipe").mkdir(parents=True)
    (run / "recipe" / GRPO_YAML).write_text(recipe_texts(profile, run, capability=A100,
                                                         vllm_installed=True)[GRPO_YAML])
    # the configs say bf16, which this CPU has not: TrainingArguments would refuse before anything is checked
    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)
    launched = []
    original = launcher.launch_training_script
    monkeypatch.setattr(launcher, "launch_training_script", lambda **kw: original(
        **kw, launch_command_fn=launched.append))
    trl_configs = Path(launcher.__file__).parents[1] / "accelerate_configs"

    def check_training(args: list[str], processes: int):
        _, config, _, _ = make_parser().parse_args_and_config(args)
        per_step = config.per_device_train_batch_size * processes * config.steps_per_generation
        assert per_step % config.num_generations == 0, "the global batch must divide by the group size"
        check_config(config, profile, capability=A100, vllm_installed=True)
        return config

    lines = [_in_run(line, run) for line in doc_commands()["README"]]
    assert TRL_CONFIGS_LINE in lines and str(trl_configs) == os.path.join(
        os.path.dirname(__import__("trl").__file__), "accelerate_configs")
    gpu = [line for line in lines if "CUDA_VISIBLE_DEVICES" in line or "accelerate " in line
           or "--accelerate_config" in line]
    assert len(gpu) == 4 and any("zero2" in line for line in gpu) and any("vllm serve" in line for line in gpu)
    env = re.compile(r"^(?:[A-Z_]+=\S+ )+")
    for line in gpu:
        argv = shlex.split(env.sub("", line).replace("$TRL_CONFIGS", str(trl_configs)))
        if argv[0] == "trl":
            launched.clear()
            assert trl_main(argv[1:]) == 0
            [accel] = launched
            assert Path(accel.config_file).is_file() and Path(accel.config_file).parent == trl_configs
            assert accel.training_script.endswith("trl/scripts/grpo.py")
            config = check_training(accel.training_script_args, accel.num_processes)
            if "--vllm_mode" in argv:
                assert (config.use_vllm, config.vllm_mode) == (True, "server")
                assert "CUDA_VISIBLE_DEVICES=1" in line  # the server keeps GPU 0
        elif argv[:2] == ["accelerate", "launch"]:
            accel = launch_command_parser().parse_args(argv[2:])
            assert Path(accel.config_file).is_file() and accel.module
            assert accel.training_script == "trl.scripts.grpo"
            check_training(accel.training_script_args, accel.num_processes)
        else:
            assert argv[0] == "vllm" and "CUDA_VISIBLE_DEVICES=0" in line
            printed = trl_vllm_serve_line(str(run / "recipe" / "model"))  # what TRL tells you to run
            assert line == "CUDA_VISIBLE_DEVICES=0 " + printed


def trl_vllm_serve_line(model: str, **server) -> str:
    """The line TRL 1.13 prints when you run its deprecated `trl vllm-serve` for ``model``: its own
    ``trl.scripts.vllm_serve.main``, stopped where it would replace the process with vLLM's server."""
    from unittest import mock

    from trl.scripts import vllm_serve

    with mock.patch.object(vllm_serve.os, "execve") as execve, pytest.warns(FutureWarning) as warned:
        vllm_serve.main(vllm_serve.ScriptArguments(model=model, **server))
    [(executable, command, env)] = [c.args for c in execve.call_args_list]
    assert command == vllm_serve.build_command(vllm_serve.ScriptArguments(model=model, **server))
    assert (env["VLLM_SERVER_DEV_MODE"], env["VLLM_WORKER_MULTIPROC_METHOD"]) == ("1", "spawn")
    [line] = [ln.strip() for w in warned for ln in str(w.message).splitlines() if "vllm serve" in ln]
    return line


def test_the_vllm_serve_line_is_the_one_trl_prints_and_builds():
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    line = trl_vllm_serve_line("/m", port=8001)
    command = build_command(ScriptArguments(model="/m", port=8001))
    assert line == "VLLM_SERVER_DEV_MODE=1 VLLM_WORKER_MULTIPROC_METHOD=spawn " + shlex.join(
        ["vllm", *command[command.index("serve"):]])
    assert line.startswith("VLLM_SERVER_DEV_MODE=1 VLLM_WORKER_MULTIPROC_METHOD=spawn vllm serve /m ")
    assert "--port 8001" in line and "--weight-transfer-config" in line


# --------------------------------------------------------------------------- run for real


def run_command(line: str, cwd: Path, timeout: int = 600, env: dict | None = None) -> str:
    argv = shlex.split(line)
    exe = argv[0] if argv[0] != "python" else sys.executable
    argv[0] = str(BIN / exe) if (BIN / exe).exists() else exe
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                "PYTHONPATH": str(ROOT), **(env or {})}
    done = subprocess.run(argv, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{line}\n--- stderr:\n{done.stderr[-4000:]}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def warm_recipe(tmp_path_factory):
    """The cpu-smoke recipe written, its warm-up trained with `trl sft` and merged."""
    run = tmp_path_factory.mktemp("recipe-run")
    printed = run_command(f"python -m helpers.recipe write {run} --profile cpu-smoke", cwd=run)
    recipe = Recipe.of(run)
    first = recipe.commands()
    assert all(line in printed for line in first)
    docs = [_in_run(line, run) for line in doc_commands()["README"]]
    assert f"python -m helpers.recipe write {run} --profile cpu-smoke" in docs
    assert set(first) | {torchrun_line(recipe)} <= set(docs)  # the README's commands: these
    assert first[0].startswith("trl sft --config") and first[1].startswith("python -m helpers.recipe merge")
    for line in first[:2]:
        run_command(line, cwd=run)
    return recipe


@pytest.mark.slow
def test_trl_commands_run_the_recipe_and_notebook_04_loads_the_adapter(warm_recipe):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from helpers.models import model_source

    recipe = warm_recipe
    assert (recipe.output / "warmup-adapter" / "adapter_config.json").is_file()
    rest = recipe.commands()[2:]
    assert rest == [f"trl grpo --config {recipe.grpo}", f"python -m helpers.recipe combine {recipe.folder}"]
    log = "".join(run_command(line, cwd=recipe.folder.parent) for line in rest)
    grpo = recipe.output / "grpo"
    assert json.loads((grpo / f"checkpoint-{SMOKE.max_steps}" / "trainer_state.json").read_text())[
        "global_step"] == SMOKE.max_steps
    assert "rewards/prefilled_strict_format_reward/mean" in log and log.count("Training completed") == 1
    assert sorted(p.name for p in (grpo / "completions").iterdir()) == [
        f"completions_{s:05d}.parquet" for s in range(1, SMOKE.max_steps + 1)]

    # notebook 04's way: the base model, the adapter on top, the tokenizer saved with the adapter
    adapter = recipe.adapter
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 2 * SMOKE.lora_rank
    base = AutoModelForCausalLM.from_pretrained(model_source(get_model_spec(SMOKE.model)), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(adapter))
    tokenizer = AutoTokenizer.from_pretrained(str(adapter))
    assert render(tokenizer, build_prompt("What is 2 + 3?")).endswith(PREFILL)
    ids = tokenizer.apply_chat_template(build_prompt("What is 2 + 3?"), add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        combined = model(ids).logits
        # what trl grpo trained: its adapter on the warm-up-merged weights
        merged = AutoModelForCausalLM.from_pretrained(yaml.safe_load(recipe.grpo.read_text())["model_name_or_path"],
                                                      dtype=torch.float32)
        trained = PeftModel.from_pretrained(merged, str(grpo))(ids).logits
    assert torch.allclose(combined, trained, atol=1e-3)
    with model.disable_adapter(), torch.no_grad():
        assert not torch.allclose(model(ids).logits, trained, atol=1e-3)  # the adapter does change the model


@pytest.mark.slow
def test_the_same_recipe_runs_on_two_cpu_processes(warm_recipe, tmp_path):
    from trl import GRPOConfig

    recipe = warm_recipe
    line = torchrun_line(recipe)
    assert line == (f"torchrun --nproc_per_node 2 -m trl.scripts.grpo --config {recipe.grpo} "
                    f"--per_device_train_batch_size {SMOKE.per_device_train_batch_size // 2}")
    out = recipe.output / "grpo-2-processes"
    logs = tmp_path / "ranks"
    # the README's command, with torchrun's per-rank logs, another output folder and one step (two ranks, a group
    # gathered from both, one log line and the checkpoint all show in one step)
    run_command(line.replace("torchrun ", f"torchrun --log-dir {logs} --redirects 3 ", 1)
                + f" --output_dir {out} --max_steps 1", cwd=recipe.folder.parent)

    ranks = sorted(logs.glob("*/attempt_0/*"))
    assert [p.name for p in ranks] == ["0", "1"]  # torchrun started two workers, and both exited 0
    stdout = [(p / "stdout.log").read_text() for p in ranks]
    assert stdout[0].count("Training completed") == 1 and "Training completed" not in stdout[1]  # logs: once
    # one process could not even build this config: 1 per device x 1 process does not hold a group of 2
    with pytest.raises(ValueError, match="divisible by num_generations"):
        GRPOConfig(output_dir=str(tmp_path / "x"), use_cpu=True, per_device_train_batch_size=1,
                   num_generations=SMOKE.num_generations)
    import pandas as pd

    steps = sorted((out / "completions").glob("completions_*.parquet"))
    assert len(steps) == 1  # written once per step, by the main process
    for step in steps:  # each step's group gathered from both ranks: the same global batch as one process
        assert len(pd.read_parquet(step)) == SMOKE.per_device_train_batch_size
    assert [p.name for p in out.glob("adapter_model*.safetensors")] == ["adapter_model.safetensors"]
    state = json.loads((out / "checkpoint-1" / "trainer_state.json").read_text())
    assert state["global_step"] == 1



def test_readme_quotes_what_two_processes_cost_as_measured():
    measured = json.loads((ROOT / "bench" / "measured" / "speed" / "cpu_processes.json").read_text())
    section = SCALING.read_text()
    sides = [measured[k] for k in ("processes_1", "processes_1_one_thread", "processes_2")]
    for side in sides:
        row = f"| {side['threads_per_process']} | {side['median_step_s']:.1f} s | {side['completions_per_s']:.2f} |"
        assert row in section, row
    for quoted in (f"{measured['speedup']:.2f}x", f"{measured['speedup_vs_one_thread']:.2f}x",
                   f"global batch of {measured['global_batch']}"):
        assert quoted in section, quoted

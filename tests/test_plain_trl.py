"""examples/grpo_plain_trl.py: notebook 03's run in plain TRL + PEFT (issue 50, item 8). It trains the course's recipe
(the profiles' sizes, the arithmetic task's rewards), imports no `helpers`, and really runs: two GRPO steps on
cpu-smoke's sizes, steps logged, an adapter written, every reward called with the completions TRL logged."""

from __future__ import annotations

import ast
import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.profiles import CPU_DEMO, CPU_SMOKE
from helpers.tasks.arithmetic import LEVELS, PRESETS
from helpers.tasks.reasoning import PREFILL, SYSTEM_PROMPT

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "grpo_plain_trl.py"


def _script():
    spec = importlib.util.spec_from_file_location("grpo_plain_trl", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _keywords(call: str) -> dict:
    """The literal keywords of the script's ``call(...)``."""
    for node in ast.walk(ast.parse(SCRIPT.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == call:
            return {k.arg: k.value.value for k in node.keywords if isinstance(k.value, ast.Constant)}
    raise AssertionError(f"no {call}(...) in {SCRIPT.name}")


def test_the_script_imports_no_helpers_and_stays_short():
    tree = ast.parse(SCRIPT.read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if n.split(".")[0] in ("helpers", "tools", "dev")], names
    assert {"peft", "trl", "transformers"} <= {n.split(".")[0] for n in names}
    assert len(SCRIPT.read_text().splitlines()) <= 150, "a script to read in one sitting"


@pytest.mark.parametrize("profile", [CPU_SMOKE, CPU_DEMO], ids=lambda p: p.name)
def test_the_script_trains_the_profiles_recipe(profile):
    s = _script().SIZES[profile.name]
    level = LEVELS[profile.task_level]
    assert (s["low"], s["high"], s["rows"]) == (level.low, level.high, profile.train_rows)
    assert (s["tokens"], s["group"], s["batch"], s["steps"], s["warmup"]) == (
        profile.max_completion_length, profile.num_generations, profile.per_device_train_batch_size,
        profile.max_steps, profile.warmup_examples)
    grpo, lora, sft = _keywords("GRPOConfig"), _keywords("LoraConfig"), _keywords("SFTConfig")
    for field in ("temperature", "learning_rate", "lr_scheduler_type", "optim", "weight_decay", "max_grad_norm",
                  "beta", "loss_type", "scale_rewards", "epsilon_high", "gradient_checkpointing"):
        assert grpo[field] == getattr(profile, field), field
    assert (lora["r"], lora["lora_alpha"]) == (profile.lora_rank, profile.lora_alpha)
    assert (sft["num_train_epochs"], sft["learning_rate"], sft["per_device_train_batch_size"],
            sft["gradient_checkpointing"]) == (profile.warmup_epochs, profile.warmup_learning_rate,
                                               profile.warmup_batch_size, profile.gradient_checkpointing)
    assert LEVELS[profile.warmup_level].high == 9 and profile.gradient_accumulation_steps == 1


def test_the_rewards_written_out_score_as_the_courses_do():
    """The same completions, scored by the script's four rewards and by the task's preset (with its prefill)."""
    script = _script()
    assert script.PREFILL == PREFILL and script.SYSTEM == SYSTEM_PROMPT
    assert [w for _, w in script.REWARDS] == [w for _, w in PRESETS["arithmetic"]]
    texts = ["7 + 5 = 12\n</reasoning>\n<answer>\n12\n</answer>", "7 + 5 = 12\n</reasoning>\n<answer>\n13\n</answer>",
             "sum\n</reasoning>\n<answer>\nit is 12\n</answer>", "7 + 5 = 12</reasoning><answer>12</answer> more",
             "the answer is 12", "</reasoning>\n<answer>\n12\n</answer>\n<answer>\n12\n</answer>", "",
             "7 + 5 = 12\n</reasoning>\n<answer>\n12.0\n</answer>" + "x" * 80, "12\n</reasoning>\n<answer>\n12",
             " \n</reasoning>\n<answer>\n12\n</answer>", "7 + 5\n</reasoning>\n<answer>\n1,2\n</answer>",
             "so 12\n</reasoning>\n\n<answer>\n 12 \n</answer>\n", "5 + 7 = 12 and 3"]
    completions = [[{"role": "assistant", "content": t}] for t in texts]
    answer = ["12"] * len(texts)
    for (mine, _), (theirs, _) in zip(script.REWARDS, PRESETS["arithmetic"]):
        assert mine(completions, answer=answer) == theirs(completions, answer=answer), theirs.__name__


@pytest.mark.slow
def test_the_script_runs_two_grpo_steps_on_cpu_smoke(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "cpu-smoke", "--steps", "2", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = re.findall(r"^step (\d+): reward (-?[\d.]+), correct", proc.stdout, re.M)
    assert [s for s, _ in steps] == ["1", "2"], proc.stdout
    assert f"adapter saved to {out / 'adapter'}" in proc.stdout
    adapter = out / "adapter"
    assert (adapter / "adapter_model.safetensors").stat().st_size > 0
    assert '"r": 16' in (adapter / "adapter_config.json").read_text()

    import pandas as pd
    script = _script()
    logged = pd.concat([pd.read_parquet(p) for p in sorted((out / "grpo" / "completions").glob("*.parquet"))])
    assert sorted(logged["step"].unique()) == [1, 2] and len(logged) == 2 * CPU_SMOKE.per_device_train_batch_size
    for _, row in logged.iterrows():  # TRL's log: the prompt's own answer, and each reward as the function scores it
        a, b = map(int, re.search(r"What is (\d+) \+ (\d+)\?", str(row["prompt"])).groups())
        assert row["answer"] == str(a + b)
        completion = [[{"role": "assistant", "content": row["completion"]}]]
        for func, _ in script.REWARDS:
            score = func(completion, answer=[row["answer"]])[0]
            assert math.isclose(score, row[func.__name__]), (func.__name__, row["completion"])

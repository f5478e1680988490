"""The GPU path of notebook 07, as far as a CPU can: Unsloth's patched GRPO trainer (``UnslothGRPOTrainer``, generated
from TRL's source at import on a GPU) built with ``tools=[calculator]`` and ``max_tool_calling_iterations``, training
one step whose rollouts call the tool, via ``tests/unsloth_tools_cpu.py`` in the contract environment (the approach of
``tests/test_unsloth_trainer.py``)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from helpers.calculator import calculate
from helpers.tasks.tool_arithmetic import ToolArithmeticTask

from .contract import contract_python

pytestmark = pytest.mark.contract
SCRIPT = Path(__file__).with_name("unsloth_tools_cpu.py")
ROOT = SCRIPT.parents[1]


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    run = tmp_path_factory.mktemp("unsloth-tools")
    env = dict(os.environ, UNSLOTH_ALLOW_CPU="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore",
               UNSLOTH_COMPILE_DISABLE="1")  # Unsloth's compiled backward recompiles every step on a CPU
    proc = subprocess.run([contract_python(), str(SCRIPT), str(run)], capture_output=True, text=True, env=env,
                          timeout=900)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("UNSLOTH-TOOLS-JSON ")), None)
    assert proc.returncode == 0 and line is not None, (
        f"Unsloth's trainer did not run ({proc.returncode}). If Unsloth moved "
        f"`unsloth.models.rl._patch_trl_rl_trainers_impl`, update tests/unsloth_cpu.py.\n{proc.stderr[-4000:]}")
    return json.loads(line[len("UNSLOTH-TOOLS-JSON "):])


def test_unsloths_trainer_is_built_with_the_tools(out):
    assert out["trainer_class"] == "UnslothGRPOTrainer" == out["trl_GRPOTrainer"] and out["config_is_unsloths"]
    assert out["tools"] == ["calculator"]
    assert out["max_tool_calling_iterations"] == ToolArithmeticTask.max_tool_calling_iterations
    assert out["config"]["max_tool_calling_iterations"] == ToolArithmeticTask.max_tool_calling_iterations
    assert out["config"]["loss_type"] == "dapo" and out["config"]["mask_truncated_completions"] is True


def test_a_step_with_tool_calls_trains_through_unsloths_loop_and_loss(out):
    assert out["error"] is None and out["global_step"] == 1
    batch = out["config"]["generation_batch_size"]  # Unsloth sizes it (its gradient accumulation)
    assert out["scripted_turns"] == [batch, batch]  # the calls, then the answers after the replies
    assert out["log"]["tools/call_frequency"] == 1.0 and out["log"]["tools/failure_frequency"] == 0.0
    assert out["log"]["reward"] == 0.5  # every other rollout right: each group has a winner
    for turns, answer in zip(out["turns"], out["answers"]):
        call, reply = turns[0], turns[1]
        expression = call["tool_calls"][0]["function"]["arguments"]["expression"]
        assert reply == {"role": "tool", "name": "calculator", "content": calculate(expression)}
        assert calculate(expression) == answer  # the calculator ran inside Unsloth's loop
    # the loss saw each tool reply masked: ones (the call), zeros (the reply and its turn markers), ones (the answer)
    masks = [m for micro_batch in out["tool_masks"] for m in micro_batch]
    assert len(masks) == batch
    for mask in masks:
        runs = [v for i, v in enumerate(mask) if i == 0 or mask[i - 1] != v]
        assert runs[:3] == [1, 0, 1], runs
    before, after = out["lora_B_abs_sum"]
    assert before == 0.0 < after  # LoRA's B starts at zero: the step changed the adapter

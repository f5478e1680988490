"""The GPU path of notebook 07, as far as a CPU can: Unsloth's patched GRPO trainer (``UnslothGRPOTrainer``, generated
from TRL's source at import on a GPU) built with ``tools=[calculator]`` and ``max_tool_calling_iterations``, training
one step whose rollouts call the tool: the ``tools`` case of ``tests/unsloth_cpu.py`` in the contract environment, run
in the same process as the cases of ``tests/test_unsloth_trainer.py``, once per test session.

The model is that script's stand-in (the bundled model's config with 2 of its 30 layers, random weights, the bundled
tokenizer). Which properties checked here depend on the model's size: none. The model's turns are scripted (no model
writes tool calls reliably), so the calls, the replies, the masks, the rewards and the step are the same on any model.
"""

from __future__ import annotations

import pytest

from helpers.calculator import calculate
from helpers.tasks.tool_arithmetic import ToolArithmeticTask

from .contract import unsloth_case

pytestmark = pytest.mark.contract


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return unsloth_case("tools", tmp_path_factory)


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

"""helpers.tool_rollouts: rollouts through GRPOTrainer's own tool loop (its private ``_generate``, pinned here), the
tool mask TRL builds, and the scores of an evaluation."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

from helpers.calculator import calculate, calculator
from helpers.tool_rollouts import Rollout, greedy, rollouts, segments, summarize


def test_the_private_method_the_helper_calls_keeps_its_contract():
    """``_generate(prompts)`` returns (prompt_ids, completion_ids, tool_mask, completions, ...) and reads the
    per-rollout tool dicts that ``_generate_and_score_completions`` builds first (TRL 1.13)."""
    from trl import GRPOTrainer

    assert list(inspect.signature(GRPOTrainer._generate).parameters) == ["self", "prompts"]
    source = inspect.getsource(GRPOTrainer._generate)
    assert ("return prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images"
            in source)
    assert "self._sync_tool_dicts[idx_with_tool]" in inspect.getsource(GRPOTrainer._tool_call_loop)
    assert "self._sync_tool_dicts = []" in inspect.getsource(GRPOTrainer._generate_and_score_completions)


def test_summarize_counts_per_problem_and_per_attempt():
    right = {"accuracy": 1.0, "called": 1.0, "calls": 1.0, "unparsed": 0.0, "malformed": 0.0, "answered": 1.0}
    retry = {"accuracy": 1.0, "called": 1.0, "calls": 2.0, "unparsed": 0.0, "malformed": 1.0, "answered": 1.0}
    forever = {"accuracy": 0.0, "called": 1.0, "calls": 2.0, "unparsed": 0.0, "malformed": 0.0, "answered": 0.0}
    unparsed = {"accuracy": 0.0, "called": 0.0, "calls": 0.0, "unparsed": 1.0, "malformed": 1.0, "answered": 0.0}
    out = summarize([right, retry, forever, unparsed])
    assert out == {"accuracy": 0.5, "tool_call_rate": 0.75, "calls_per_answer": 1.5,  # (1 + 2) / 2 answered
                   "malformed_call_rate": 2 / 6, "answered": 0.5, "n": 4}             # 2 failed of 6 attempts
    assert summarize([])["malformed_call_rate"] == 0.0 and summarize([])["accuracy"] == 0.0


def test_greedy_sets_and_restores_the_trainers_sampling():
    from transformers import GenerationConfig

    model = SimpleNamespace(training=True)
    model.eval = lambda: setattr(model, "training", False)
    model.train = lambda mode=True: setattr(model, "training", mode)
    config = GenerationConfig(do_sample=True, temperature=1.0, top_p=0.9, max_new_tokens=8)
    trainer = SimpleNamespace(generation_config=config, generation_kwargs={"do_sample": True, "temperature": 1.0},
                              model=model)
    with greedy(trainer):
        assert trainer.generation_config.do_sample is False and trainer.generation_config.temperature is None
        assert trainer.generation_kwargs["do_sample"] is False and not model.training
        assert trainer.generation_config.max_new_tokens == 8
    assert trainer.generation_config is config and config.do_sample is True and model.training
    assert trainer.generation_kwargs == {"do_sample": True, "temperature": 1.0}


def test_segments_group_the_tokens_by_the_mask():
    class Letters:
        def decode(self, ids):
            return "".join(chr(96 + i) for i in ids)
    assert segments(Letters(), Rollout([], [], [], [1, 2, 3, 4, 5], [1, 0, 0, 1, 1])) == [
        ("a", True), ("bc", False), ("de", True)]


def test_a_trainer_without_tools_is_refused():
    with pytest.raises(ValueError, match="tools=\\[your_function\\]"):
        rollouts(SimpleNamespace(tools=[]), [[{"role": "user", "content": "hi"}]])


# --------------------------------------------------------------------------- TRL's real loop, with scripted turns

ROW = {"question": "What is 347 times 58?", "expression": "347 * 58", "answer": "20126"}
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "347 * 58"}}\n</tool_call><|im_end|>'


_LOADED: list = []


def bundled_with_tool_template():
    """The bundled model (cpu-smoke, tools task) and its tokenizer with the tool template, loaded once per module:
    the turns are scripted and nothing trains, so every test may build its trainer on the same model (each gets its
    own copy of the tokenizer)."""
    import copy

    if not _LOADED:
        from helpers.models import load_model
        from helpers.profiles import get_profile
        from helpers.tool_template import use_tool_template

        model, tok = load_model(get_profile("cpu-smoke", task="tools"))
        use_tool_template(tok)
        _LOADED.append((model, tok))
    model, tok = _LOADED[0]
    return model, copy.deepcopy(tok)


def scripted_trainer(tools, turns, **config):
    """A GRPOTrainer on the bundled model (tool template, cpu-smoke sizes) whose model writes ``turns`` in order:
    each generation call of TRL's loop returns the next scripted text for every rollout of the batch."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from helpers.prompts import build_prompt
    from helpers.tasks.tool_arithmetic import SYSTEM_PROMPT, tool_answer_reward

    model, tok = bundled_with_tool_template()
    data = Dataset.from_list([dict(ROW, prompt=build_prompt(ROW["question"], SYSTEM_PROMPT))] * 2)
    args = GRPOConfig(output_dir="/tmp/unused-tool-rollouts", num_generations=2, per_device_train_batch_size=2,
                      max_completion_length=config.pop("max_completion_length", 64), report_to="none", use_cpu=True,
                      **config)
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=[tool_answer_reward], args=args,
                          train_dataset=data, tools=tools)
    queue = list(turns)

    def next_turn(prompt_ids, *args, **kwargs):
        text = queue.pop(0)
        return [tok(text, add_special_tokens=False)["input_ids"] for _ in prompt_ids], None

    trainer._generate_single_turn = next_turn
    return trainer, tok, data[0]["prompt"]


@pytest.mark.slow
def test_trls_loop_runs_the_tool_and_masks_its_reply():
    trainer, tok, prompt = scripted_trainer([calculator], [CALL, "20126<|im_end|>"], max_tool_calling_iterations=2)
    (shown,) = rollouts(trainer, [prompt])
    assert shown.messages == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "347 * 58"}}}]},
        {"role": "tool", "name": "calculator", "content": "20126"},
        {"role": "assistant", "content": "20126"}]
    parts = segments(tok, shown)
    assert [trained for _, trained in parts] == [True, False, True]
    assert parts[0][0] == CALL and parts[2][0] == "20126<|im_end|>"
    assert parts[1][0] == "\n<|im_start|>tool\n20126<|im_end|>\n<|im_start|>assistant\n"  # the reply and its markers
    assert len(shown.tool_mask) == len(shown.completion_ids)
    assert shown.prompt_ids[-3:] == tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"][-3:]


@pytest.mark.slow
def test_the_loop_stops_after_max_tool_calling_iterations():
    """The model that calls for ever: after the allowed rounds the rollout ends on an unanswered call."""
    from helpers.tasks.tool_arithmetic import ToolArithmeticTask

    trainer, _, prompt = scripted_trainer([calculator], [CALL, CALL, CALL], max_tool_calling_iterations=1,
                                          max_completion_length=128)
    (shown,) = rollouts(trainer, [prompt])
    assert [m["role"] for m in shown.messages] == ["assistant", "tool", "assistant"]
    assert shown.messages[-1]["tool_calls"]  # a second call, never run
    scores = ToolArithmeticTask().score_messages(shown.messages, ROW)
    assert (scores["calls"], scores["answered"], scores["accuracy"]) == (2.0, 0.0, 0.0)


@pytest.mark.slow
def test_a_turn_after_a_reply_is_cut_at_the_completion_budget():
    """Call (28 tokens) + reply (12) + a second call (28) exceed 64 tokens: TRL truncates the model's next turn
    (grpo_trainer.py 2171-2183), so the second call is cut, unparsable, and no tool runs for it."""
    from helpers.tasks.tool_arithmetic import ToolArithmeticTask

    trainer, tok, prompt = scripted_trainer([calculator], [CALL, CALL], max_tool_calling_iterations=2,
                                            max_completion_length=64)
    (shown,) = rollouts(trainer, [prompt])
    assert len(shown.completion_ids) == 64 and [m["role"] for m in shown.messages] == ["assistant", "tool", "assistant"]
    assert shown.messages[-1]["content"].startswith("<tool_call>") and "tool_calls" not in shown.messages[-1]
    assert ToolArithmeticTask().score_messages(shown.messages, ROW)["unparsed"] == 1.0


@pytest.mark.slow
def test_a_reply_longer_than_the_completion_budget_is_dropped():
    """TRL drops a tool reply that would push the rollout past max_completion_length (grpo_trainer.py 2094-2103):
    the rollout ends on its call, and the model never sees the reply."""
    def verbose_calculator(expression: str) -> str:
        """Evaluates an arithmetic expression and explains it at length.

        Args:
            expression: The arithmetic to evaluate.
        """
        return calculate(expression) + " because " + "and so on " * 100

    trainer, _, prompt = scripted_trainer([verbose_calculator], [CALL.replace('"calculator"', '"verbose_calculator"'),
                                                                 "20126<|im_end|>"], max_tool_calling_iterations=2)
    (shown,) = rollouts(trainer, [prompt])
    assert [m["role"] for m in shown.messages] == ["assistant"] and shown.messages[0]["tool_calls"]
    assert 0 not in shown.tool_mask  # nothing appended: the call is the whole completion


@pytest.mark.slow
def test_evaluate_with_tools_scores_the_rollouts():
    from helpers.tasks.tool_arithmetic import ToolArithmeticTask
    from helpers.tool_rollouts import evaluate_with_tools

    trainer, _, prompt = scripted_trainer([calculator], [CALL, "It is 20126.<|im_end|>"],
                                          max_tool_calling_iterations=2)
    seen = []
    out = evaluate_with_tools(trainer, [dict(ROW, prompt=prompt)] * 2, ToolArithmeticTask(), progress=seen.append)
    assert out["summary"]["accuracy"] == 1.0 and out["summary"]["tool_call_rate"] == 1.0
    assert out["summary"]["calls_per_answer"] == 1.0 and out["summary"]["malformed_call_rate"] == 0.0
    assert [r["index"] for r in out["rows"]] == [0, 1] and "accuracy 100%" in seen[0]
    assert trainer._metrics["eval"] == {} and trainer._metrics["train"] == {}  # no stray log line for training

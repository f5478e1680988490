"""Build Unsloth's patched GRPO trainer with ``tools=`` on a CPU, and train one step whose rollouts call the tool.

``tool_step(run)``: the ``tools`` case of ``tests/unsloth_cpu.py`` (run there, after the trainer cases, in the same
process, for ``tests/test_unsloth_tools.py``), in the contract environment: Unsloth is made to patch TRL as on a T4
(``import_unsloth_as_on_a_t4``), and the stand-in model of that script (the bundled model's config with 2 layers,
random weights, the bundled tokenizer), loaded with transformers + PEFT in float32, stands in for
``FastLanguageModel``'s.

A model, trained or not, rarely writes a tool call, so the model's turns are *scripted*: the trainer's own
``_generate_single_turn`` is replaced by one that returns the reference call's tokens for a prompt and, after the
tool's reply, the right answer in every other rollout and a wrong one in the rest. Everything else (TRL's parsing,
the tool, ``tool_mask``, the rewards and advantages, Unsloth's loss and the optimizer step) is the patched
trainer's own.

Returns the trainer class, the step's tool metrics, the loss, the rollouts' turns from the completion log and the tool
masks the loss used.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("UNSLOTH_ALLOW_CPU", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from unsloth_cpu import import_unsloth_as_on_a_t4  # noqa: E402  (the same patch as notebook 03's check)


def tool_step(run: Path) -> dict:
    """Notebook 07's trainer on colab-t4 with ``tools=[calculator]``, one step of scripted turns: what ran."""
    from helpers.profiles import get_profile

    profile = get_profile("colab-t4", task="tools")
    import_unsloth_as_on_a_t4(profile)
    import trl
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from helpers.calculator import calculator
    from helpers.models import _load_transformers
    from helpers.profiles import get_model_spec
    from helpers.prompts import build_prompt
    from helpers.tasks import get_task
    from helpers.tool_template import use_tool_template
    from helpers.training import grpo_kwargs

    task = get_task(profile.task)
    cpu = profile.with_overrides(model="smollm2-135m", backend="transformers", load_in_4bit=False)
    model, tokenizer = _load_transformers(cpu, get_model_spec("smollm2-135m"), None, True, False)
    import types
    model.for_training = types.MethodType(lambda self, *a, **k: self.train(), model)
    model.for_inference = types.MethodType(lambda self, *a, **k: self.eval(), model)
    from helpers.models import prepare_tokenizer
    prepare_tokenizer(tokenizer, model)
    use_tool_template(tokenizer)
    rows = task.make_rows("products", 2, seed=0)
    dataset = Dataset.from_list([dict(r, prompt=build_prompt(r["question"], task.system_prompt)) for r in rows])
    # notebook 07's config on colab-t4 (notebook 03's recipe, grpo_kwargs, plus the tool loop's knob) at CPU sizes
    config = GRPOConfig(**{**grpo_kwargs(profile, run), **dict(
        num_generations=2, per_device_train_batch_size=2, max_completion_length=64, max_steps=1, save_strategy="no",
        use_cpu=True, optim="adamw_torch", report_to="none")},
        max_tool_calling_iterations=task.max_tool_calling_iterations)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[f for f, _ in task.rewards],
                          args=config, train_dataset=dataset, tools=[calculator])
    trainer.remove_callback(PrinterCallback)

    prompts = [(tokenizer.apply_chat_template(r["prompt"], tools=[calculator], add_generation_prompt=True,
                                              tokenize=True, return_dict=False), r) for r in dataset]
    scripted = []

    def scripted_turns(prompt_ids, *args, **kwargs):
        """The model's turns, scripted: the reference call first; after the reply, the right answer in every
        other rollout and a wrong one in the rest (so each group of two has a reward to compare)."""
        turns = []
        for i, ids in enumerate(prompt_ids):
            row = next(r for p, r in prompts if list(ids[:len(p)]) == list(p))
            if len(ids) == len(next(p for p, r in prompts if r is row)):
                call = task.reference_messages(row)[0]["tool_calls"][0]["function"]
                text = ('<tool_call>\n{"name": "calculator", "arguments": ' + json.dumps(call["arguments"])
                        + "}\n</tool_call><|im_end|>")
            else:
                text = (row["answer"] if i % 2 == 0 else "0") + "<|im_end|>"
            turns.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        scripted.append(len(turns))
        return turns, None

    trainer._generate_single_turn = scripted_turns
    lora_before = sum(p.abs().sum().item() for n, p in model.named_parameters() if "lora_B" in n)
    masks = []
    real_compute_loss = trainer.compute_loss

    def recording_loss(model, inputs, *args, **kwargs):
        if "tool_mask" in inputs:
            masks.append(inputs["tool_mask"].tolist())
        return real_compute_loss(model, inputs, *args, **kwargs)

    trainer.compute_loss = recording_loss
    error = None
    try:
        trainer.train()
    except Exception as exc:  # noqa: BLE001 - reported, not hidden
        error = f"{type(exc).__name__}: {exc}"
    import pandas as pd
    lora_after = sum(p.abs().sum().item() for n, p in model.named_parameters() if "lora_B" in n)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    files = sorted((run / "grpo" / "completions").glob("*.parquet"))
    log = pd.read_parquet(files[0]) if files else None
    return {
        "trainer_class": type(trainer).__name__, "trl_GRPOTrainer": trl.GRPOTrainer.__name__,
        "config_is_unsloths": hasattr(config, "unsloth_num_chunks"), "error": error,
        "global_step": trainer.state.global_step, "scripted_turns": scripted,
        "lora_B_abs_sum": [lora_before, lora_after],
        "tools": [t.__name__ for t in trainer.tools],
        "config": {k: getattr(config, k, None) for k in ("per_device_train_batch_size", "gradient_accumulation_steps",
                                                         "generation_batch_size", "num_generations", "loss_type",
                                                         "mask_truncated_completions", "max_tool_calling_iterations",
                                                         "learning_rate", "lr_scheduler_type", "warmup_steps")},
        "max_tool_calling_iterations": trainer.max_tool_calling_iterations,
        "log": {k: logs[0].get(k) for k in ("loss", "tools/call_frequency", "tools/failure_frequency",
                                             "completions/mean_length", "reward")} if logs else None,
        "turns": [json.loads(t) for t in log["turns"]] if log is not None else None,
        "answers": log["answer"].tolist() if log is not None else None,
        "tool_masks": masks,
    }

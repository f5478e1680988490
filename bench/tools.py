"""Does GRPO teach the bundled model to use a calculator? The tool benchmark of notebook 07.

    python bench/tools.py [--profile cpu-demo] [--eval-rows 100] [--threads N] [--template compact|qwen2.5]
                          [--skip-base] [--set key=value ...] [--json PATH]

Notebook 07's recipe, cell for cell: the bundled model with LoRA, a chat template that renders tool calls
(``helpers.tool_template``), ``GRPOTrainer(tools=[calculator])`` with ``GRPOConfig(max_tool_calling_iterations=...)``
on products of a 3-digit and a 2-digit number, after a format warm-up (``SFTTrainer``, the tools' replies masked)
on sums of 4-digit numbers: the warm-up shows the call, GRPO must teach the model to use it for a product. The
same held-out products are answered three times, greedy, through the trainer's own tool loop
(``helpers.tool_rollouts.evaluate_with_tools``): by the base model, after the warm-up and after GRPO. Prints ONE
JSON object:

    {"before": {accuracy, tool_call_rate, calls_per_answer, malformed_call_rate, answered, n, seconds},
     "after_warmup": {...}, "after": {...}, "warmup_gain", "grpo_gain", "train_seconds" (warm-up + GRPO),
     "warmup_seconds", "grpo_seconds", "steps", "seconds_per_step", "history": [per step], "examples": {side: [...]},
     "prompt_tokens", "recipe", "machine"}

The profile's time budget covers the warm-up and GRPO; the evaluations are not counted. Progress goes to stderr.
Not a test: it never gates CI.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

TASK_KEY = "tools"  # helpers.tasks.tool_arithmetic:ToolArithmeticTask
HISTORY_KEYS = ("step", "reward", "reward_std", "frac_reward_zero_std", "tools/call_frequency",
                "tools/failure_frequency", "completions/mean_length", "completions/clipped_ratio", "loss", "step_time")


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="cpu-demo")
    ap.add_argument("--eval-rows", type=int, default=100)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--template", default="compact", choices=["compact", "qwen2.5"])
    ap.add_argument("--skip-base", action="store_true", help="do not evaluate the base model")
    ap.add_argument("--examples", type=int, default=3, help="rollouts kept per side in the JSON")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json", default=None, help="also write the JSON here")
    args = ap.parse_args()

    from helpers.tracking import use_trackio

    run = Path(tempfile.mkdtemp(prefix="bench-tools-"))
    tracking = use_trackio(run)  # before TRL imports trackio: its folder is read once, at import
    import torch
    from datasets import Dataset
    from transformers import PrinterCallback
    from transformers.utils import get_json_schema
    from trl import GRPOTrainer, SFTConfig, SFTTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    from helpers.calculator import calculator
    from helpers.callbacks import TimeBudgetCallback
    from helpers.models import load_model
    from helpers.profiles import get_profile
    from helpers.prompts import build_prompt
    from helpers.tasks import get_task
    from helpers.tool_rollouts import evaluate_with_tools
    from helpers.tool_template import use_tool_template
    from helpers.training import grpo_config, precision, sft_kwargs

    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = {k: _value(v) for k, v in (kv.split("=", 1) for kv in args.set)}
    profile = get_profile(args.profile, task=TASK_KEY, **overrides)
    task = get_task(profile.task)
    say = lambda msg: print(f"[bench/tools] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    load_start = os.getloadavg()[0]
    say(f"profile {profile.name}, run {run}, threads {torch.get_num_threads()}, load {load_start:.1f}; {tracking}")

    model, tokenizer = load_model(profile, bf16=precision(profile, None)["bf16"])
    use_tool_template(tokenizer, args.template)
    rows = task.make_rows(profile.task_level, profile.train_rows + args.eval_rows, seed=profile.seed)
    train_rows, held_out = rows[:profile.train_rows], rows[profile.train_rows:]
    prompt = lambda r: build_prompt(r["question"], task.system_prompt)  # noqa: E731
    train_set = Dataset.from_list([dict(r, prompt=prompt(r)) for r in train_rows])
    held_out = [dict(r, prompt=prompt(r)) for r in held_out]
    config = grpo_config(profile, run, max_tool_calling_iterations=task.max_tool_calling_iterations)
    budget = TimeBudgetCallback(profile.time_budget_minutes) if profile.time_budget_minutes else None
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[f for f, _ in task.rewards],
                          args=config, train_dataset=train_set, tools=[calculator],
                          callbacks=[budget] if budget else [])
    trainer.remove_callback(PrinterCallback)
    count = lambda template=None: len(tokenizer.apply_chat_template(  # noqa: E731
        held_out[0]["prompt"], tools=[calculator], add_generation_prompt=True, return_dict=False,
        chat_template=template))
    prompt_tokens, prompt_tokens_qwen = count(), count(qwen2_5_chat_template)
    results, examples = {}, {}

    def measure(label: str) -> None:
        res = evaluate_with_tools(trainer, held_out, task, progress=say, label=label)
        results[label] = res["summary"]
        examples[label] = [r["messages"] for r in res["rows"][:args.examples]]

    if not args.skip_base:
        measure("before")
    start = time.time()
    with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the one JSON object
        warm_rows = task.make_rows(profile.warmup_level, profile.warmup_examples, seed=profile.seed + 1)
        tools_json = json.dumps([get_json_schema(calculator)])  # SFTTrainer renders a `tools` column
        warmup_set = Dataset.from_list([{"prompt": prompt(r), "completion": task.reference_messages(r),
                                         "tools": tools_json} for r in warm_rows])
        sft = SFTTrainer(model=model, args=SFTConfig(**{**sft_kwargs(profile, run), "assistant_only_loss": True}),
                         train_dataset=warmup_set, processing_class=tokenizer)
        sft.remove_callback(PrinterCallback)
        sft.train()
        warmup_seconds = time.time() - start
        paused = time.time()
        measure("after_warmup")
        paused = time.time() - paused
        if budget is not None:
            budget.start = start + paused  # the budget counts the warm-up and GRPO, not the evaluation
        grpo_start = time.time()
        trainer.train()
        grpo_seconds = time.time() - grpo_start
    measure("after")
    logs = [h for h in trainer.state.log_history if "reward" in h]
    steps = trainer.state.global_step
    def gain(after: str, before: str) -> float | None:
        return round(results[after]["accuracy"] - results[before]["accuracy"], 4) if before in results else None

    out = {
        "task": profile.task, "template": args.template, "prompt_tokens": prompt_tokens,
        "prompt_tokens_with_qwen2_5_template": prompt_tokens_qwen,
        "before": results.get("before"), "after_warmup": results["after_warmup"], "after": results["after"],
        "warmup_gain": gain("after_warmup", "before"), "grpo_gain": gain("after", "after_warmup"),
        "train_seconds": round(warmup_seconds + grpo_seconds, 1), "warmup_seconds": round(warmup_seconds, 1),
        "grpo_seconds": round(grpo_seconds, 1), "steps": steps,
        "seconds_per_step": round(grpo_seconds / max(1, steps), 2),
        "stopped_by_time_budget": bool(budget and budget.stopped_at_step is not None),
        "history": [{k: round(v, 4) if isinstance(v, float) else v for k, v in h.items() if k in HISTORY_KEYS}
                    for h in logs],
        "examples": examples,
        "recipe": {k: getattr(profile, k) for k in (
            "task_level", "warmup_level", "warmup_examples", "warmup_epochs", "warmup_learning_rate",
            "warmup_batch_size", "train_rows", "num_generations", "per_device_train_batch_size",
            "max_completion_length", "learning_rate", "lora_rank", "lora_alpha", "beta", "loss_type",
            "scale_rewards", "temperature", "mask_truncated_completions", "epsilon_high", "max_steps",
            "time_budget_minutes", "seed")}
        | {"max_tool_calling_iterations": task.max_tool_calling_iterations,
           "rewards": [[f.__name__, w] for f, w in task.rewards], "system_prompt": task.system_prompt,
           "eval": {"n": len(held_out), "decoding": "greedy", "max_new_tokens": profile.max_completion_length}},
        "precision": precision(profile, None),
        "machine": {"cpus": os.cpu_count(), "threads": torch.get_num_threads(),
                    "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                    "loadavg_1min_start": round(load_start, 2), "loadavg_1min_end": round(os.getloadavg()[0], 2)},
    }
    from archive import stamped  # bench/archive.py: the command, commit, date and machine
    text = json.dumps(stamped(out), default=str)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Does GRPO teach the bundled model the JSON task (notebook 05)? The CPU learning benchmark for structured output.

    python bench/learning_json.py [--profile cpu-demo] [--eval-rows 200] [--threads 2] [--set key=value ...]

Trains the bundled model with notebook 05's recipe through the save points of
notebook 03 (``helpers.training.run_warmup`` with the task's format-only warm-up
rows of the easier ``orders-easy`` level, then ``train_grpo`` with the JSON
rewards on the ``orders`` level) and evaluates the SAME held-out rows (greedy,
the task's completion length, prompts rendered as in training) three times:
the base model, after the warm-up and after GRPO. Prints ONE JSON object:

    {"before": {...}, "after_warmup": {...}, "after": {...},
     "grpo_gain_exact_match": after - after_warmup, "train_seconds": ..., "recipe": {...}, "machine": {...}}

Each side reports ``valid_json_rate`` (an object was found), ``clean_json_rate``
(the object and nothing else), ``schema_valid_rate`` (``jsonschema`` accepts it),
``exact_match_rate`` (all fields right, none extra), ``field_rate`` and the
right rate per field. The profile's time budget (10 minutes on cpu-demo) covers
the warm-up and GRPO; evaluations are not counted. The machine's load average
is recorded at the start and the end (a shared CPU slows every step). Progress
goes to stderr. Not a test: it never gates CI. ``--set`` overrides task-profile
fields (``--set learning_rate=2e-4 --set task_level=orders-dated``).
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


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="cpu-demo")
    ap.add_argument("--eval-rows", type=int, default=200)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--run", default=None, help="run folder (default: a fresh temporary one)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()

    import torch

    from helpers.config import get_model_spec, get_profile
    from helpers.evaluation import eval_settings
    from helpers.json_eval import evaluate_json
    from helpers.json_rewards import json_preset
    from helpers.json_task import generate_orders, json_dataset, json_task_profile, json_warmup_dataset
    from helpers.models import load_model
    from helpers.prompts import install_prefill
    from helpers.training import run_warmup, train_grpo

    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = {k: _value(v) for k, v in (kv.split("=", 1) for kv in args.set)}
    task = json_task_profile(get_profile(args.profile), eval_rows=args.eval_rows, **overrides)
    run = Path(args.run or tempfile.mkdtemp(prefix="bench-learning-json-"))
    load_start = os.getloadavg()
    say = lambda msg: print(f"[bench/learning_json] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    say(f"profile {task.name}, level {task.task_level}, run {run}, threads {torch.get_num_threads()}, "
        f"load {load_start[0]:.1f}")

    model, tok = load_model(task)
    install_prefill(tok, task.prefill)
    kwargs = get_model_spec(task.model).chat_template_kwargs
    rows = generate_orders(task.train_rows + task.eval_rows, task.task_level, seed=task.seed)
    data = json_dataset(rows, eval_rows=task.eval_rows, seed=task.seed, tokenizer=tok, train_rows=task.train_rows)
    held_out = data["eval"]
    settings = eval_settings(task)
    rewards = json_preset(task.prefill)
    results: dict = {}

    def score(label: str) -> float:
        t = time.time()
        res = evaluate_json(model, tok, held_out, settings, chat_template_kwargs=kwargs)
        s = res["summary"]
        results[label] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in s.items()}
        results[label]["fields"] = {k: round(v, 4) for k, v in s["fields"].items()}
        say(f"{label}: valid {s['valid_json_rate']:.3f}, schema {s['schema_valid_rate']:.3f}, exact "
            f"{s['exact_match_rate']:.3f} ({time.time() - t:.0f} s); e.g. {res['rows'][0]['completion']!r}")
        return time.time() - t

    with model.disable_adapter():
        score("before")
    start = time.time()
    warm, paused = None, 0.0
    with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the one JSON object
        if task.warmup_examples:
            warm = run_warmup(model, tok, task, run, dataset=json_warmup_dataset(
                task.warmup_examples, task.warmup_level, seed=task.seed + 1, tokenizer=tok,
                chat_template_kwargs=kwargs))
            paused = score("after_warmup")
        out = train_grpo(task, run, model=model, tokenizer=tok, rewards=rewards, resume=False, warmup=False,
                         budget_start=start + paused, live=False, dataset=data)
    train_seconds = time.time() - start - paused
    score("after")
    logs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    fifth = max(1, len(logs) // 5)

    def avg(part, key):
        vals = [r[key] for r in part if r.get(key) is not None]
        return round(sum(vals) / len(vals), 4) if vals else None

    steps = out["summary"]["global_step"]
    baseline = results.get("after_warmup") or results["before"]
    print(json.dumps({
        "task": "json", "before": results["before"], "after_warmup": results.get("after_warmup"),
        "after": results["after"],
        "grpo_gain_exact_match": round(results["after"]["exact_match_rate"] - baseline["exact_match_rate"], 4),
        "grpo_gain_schema_valid": round(results["after"]["schema_valid_rate"] - baseline["schema_valid_rate"], 4),
        "train_seconds": round(train_seconds, 1), "warmup_seconds": warm and warm["seconds"], "steps": steps,
        "seconds_per_step": round((train_seconds - (warm["seconds"] if warm else 0)) / max(1, steps), 2),
        "stopped_by_time_budget": out["summary"]["stopped_by_time_budget"],
        "reward_first_fifth": avg(logs[:fifth], "reward"), "reward_last_fifth": avg(logs[-fifth:], "reward"),
        "frac_reward_zero_std_first_fifth": avg(logs[:fifth], "frac_reward_zero_std"),
        "frac_reward_zero_std_last_fifth": avg(logs[-fifth:], "frac_reward_zero_std"),
        "recipe": {k: getattr(task, k) for k in (
            "task_level", "warmup_level", "warmup_examples", "warmup_epochs", "warmup_learning_rate", "prefill",
            "num_generations", "per_device_train_batch_size", "max_completion_length", "learning_rate",
            "lora_rank", "beta", "loss_type", "scale_rewards", "temperature", "mask_truncated_completions",
            "max_steps", "time_budget_minutes", "train_rows")}
        | {"rewards": [[f.__name__, w] for f, w in rewards],
           "eval": {"n": len(held_out), "decoding": "greedy", "max_new_tokens": settings.max_new_tokens}},
        "machine": {"cpus": os.cpu_count(), "threads": torch.get_num_threads(),
                    "loadavg_start": [round(x, 2) for x in load_start],
                    "loadavg_end": [round(x, 2) for x in os.getloadavg()],
                    "note": "measured on a 2-core machine shared with other work: the load average says how busy"},
        "run": str(run),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

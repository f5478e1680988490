"""Does GRPO itself make the bundled model better? The CPU learning benchmark.

    python bench/learning.py [--profile cpu-demo] [--eval-rows 200] [--threads 2] [--set key=value ...]

Trains the bundled model with notebook 03's recipe through its save point
(``helpers.training``: the format-only SFT warm-up on an easier level, then
``GRPOTrainer``) and evaluates the SAME held-out problems (greedy, the
profile's completion length, the prompts rendered as in training) three
times: the base model, after the warm-up and after GRPO. Prints ONE JSON object:

    {"before": {...}, "after_warmup": {...} | null, "after": {...},
     "grpo_gain": after - after_warmup accuracy, "train_seconds": warm-up + GRPO wall time,
     "steps": ..., "recipe": {...}}

Accuracy means "answer right and in the required format". The profile's time
budget (10 minutes on cpu-demo) covers the warm-up and GRPO; the evaluation
after the warm-up is not counted. Progress goes to stderr. Not a test: it
never gates CI. ``--set`` overrides profile fields
(``--set learning_rate=3e-4 --set max_steps=40``) to try other recipes.
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
    from helpers.data import ensure_prepared
    from helpers.evaluation import eval_settings, evaluate
    from helpers.models import load_model
    from helpers.training import run_warmup, train_grpo

    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = {k: _value(v) for k, v in (kv.split("=", 1) for kv in args.set)}
    profile = get_profile(args.profile, eval_rows=args.eval_rows, **overrides)
    run = Path(args.run or tempfile.mkdtemp(prefix="bench-learning-"))
    say = lambda msg: print(f"[bench/learning] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    say(f"profile {profile.name}, run {run}, threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.1f}")

    model, tok = load_model(profile)
    held_out = ensure_prepared(profile, run, tokenizer=tok, verbose=False)["eval"]
    settings = eval_settings(profile)
    kwargs = get_model_spec(profile.model).chat_template_kwargs
    results: dict = {}

    def score(label: str) -> float:
        t = time.time()
        res = evaluate(model, tok, held_out["prompt"], held_out["answer"], settings, chat_template_kwargs=kwargs)
        s = res["summary"]
        results[label] = {k: s[k] for k in ("format_rate", "accuracy", "correct_rate", "mean_length", "n_prompts")}
        say(f"{label}: format {s['format_rate']:.3f}, accuracy {s['accuracy']:.3f} ({time.time() - t:.0f} s); "
            f"e.g. {res['rows'][0]['completion']!r}")
        return time.time() - t

    with model.disable_adapter():
        score("before")
    start = time.time()
    warm, paused = None, 0.0
    with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the one JSON object
        if profile.warmup_examples:
            warm = run_warmup(model, tok, profile, run)
            paused = score("after_warmup")
        out = train_grpo(profile, run, model=model, tokenizer=tok, resume=False, warmup=False,
                         budget_start=start + paused, live=False)
    train_seconds = time.time() - start - paused
    score("after")
    logs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    fifth = max(1, len(logs) // 5)

    def avg(rows, key):
        vals = [r[key] for r in rows if r.get(key) is not None]
        return round(sum(vals) / len(vals), 4) if vals else None

    steps = out["summary"]["global_step"]
    baseline = results.get("after_warmup") or results["before"]
    print(json.dumps({
        "before": results["before"], "after_warmup": results.get("after_warmup"), "after": results["after"],
        "grpo_gain": round(results["after"]["accuracy"] - baseline["accuracy"], 4),
        "train_seconds": round(train_seconds, 1), "warmup_seconds": warm and warm["seconds"], "steps": steps,
        "seconds_per_step": round((train_seconds - (warm["seconds"] if warm else 0)) / max(1, steps), 2),
        "stopped_by_time_budget": out["summary"]["stopped_by_time_budget"],
        "reward_first_fifth": avg(logs[:fifth], "reward"), "reward_last_fifth": avg(logs[-fifth:], "reward"),
        "frac_reward_zero_std_first_fifth": avg(logs[:fifth], "frac_reward_zero_std"),
        "frac_reward_zero_std_last_fifth": avg(logs[-fifth:], "frac_reward_zero_std"),
        "recipe": {k: getattr(profile, k) for k in (
            "task_level", "warmup_level", "warmup_examples", "warmup_epochs", "warmup_learning_rate", "prefill",
            "reward_preset", "num_generations", "per_device_train_batch_size", "max_completion_length",
            "learning_rate", "lora_rank", "beta", "loss_type", "scale_rewards", "temperature",
            "mask_truncated_completions", "epsilon_high", "max_steps", "time_budget_minutes")}
        | {"eval": {"n": len(held_out), "decoding": "greedy", "max_new_tokens": settings.max_new_tokens}},
        "machine": {"cpus": os.cpu_count(), "threads": torch.get_num_threads(),
                    "loadavg_1min_end": round(os.getloadavg()[0], 2)},
        "run": str(run),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

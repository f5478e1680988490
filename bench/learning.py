"""Does GRPO itself make the bundled model better? The CPU learning benchmark.

    python bench/learning.py [--profile cpu-demo] [--eval-rows 200] [--threads 2] [--set key=value ...]

Trains the bundled model with the profile's recipe (format-only SFT warm-up on
an easier level, then GRPO) through ``helpers.training.run_grpo`` and
evaluates the SAME held-out problems (greedy, the profile's completion length,
the same prefill as training) three times: the base model, after the warm-up
and after GRPO. Prints ONE JSON object:

    {"before": {"format_rate", "accuracy"}, "after_warmup": {...} | null,
     "after": {...}, "grpo_gain": after - after_warmup accuracy,
     "train_seconds": warm-up + GRPO wall time, "steps": ..., "recipe": {...}}

Accuracy means "answer correct and in the required format". Progress goes to
stderr. Not a test: it never gates CI. ``--set`` overrides profile fields
(``--set learning_rate=3e-4 --set max_steps=40``) to try other recipes.
"""

from __future__ import annotations

import argparse
import contextlib
import ast
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

    from helpers.config import get_profile
    from helpers.evaluation import eval_settings, eval_split, evaluate
    from helpers.data import ensure_prepared
    from helpers.models import load_model
    from helpers.training import run_grpo

    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = dict(kv.split("=", 1) for kv in args.set)
    overrides = {k: _value(v) for k, v in overrides.items()}
    profile = get_profile(args.profile, eval_rows=args.eval_rows, **overrides)
    run = Path(args.run or tempfile.mkdtemp(prefix="bench-learning-"))
    say = lambda msg: print(f"[bench/learning] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    say(f"profile {profile.name}, run {run}, threads {torch.get_num_threads()}, "
        f"load {os.getloadavg()[0]:.1f}")

    model, tok = load_model(profile)
    data = ensure_prepared(profile, run, tokenizer=tok, verbose=False)
    split = eval_split(data["eval"], prefill=profile.prefill or None)
    settings = eval_settings(profile)
    results: dict = {}

    def score(label: str) -> dict:
        t = time.time()
        res = evaluate(model, tok, split["prompts"], split["answers"], settings, batch_size=50)
        s = res["summary"]
        results[label] = {"format_rate": s["format_rate"], "accuracy": s["accuracy"],
                          "mean_length": s.get("mean_length"), "n_prompts": s["n_prompts"]}
        example = res["rows"][0]["completion"] if res.get("rows") else ""
        say(f"{label}: format {s['format_rate']:.3f}, accuracy {s['accuracy']:.3f} "
            f"({time.time() - t:.0f} s); e.g. {example!r}")
        return results[label]

    with model.disable_adapter():
        score("before")
    warm_evals: list[float] = []

    def after_warmup(m, t) -> None:
        start = time.time()
        score("after_warmup")
        warm_evals.append(time.time() - start)

    t0 = time.time()
    with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the one JSON object
        out = run_grpo(profile, run, model=model, tokenizer=tok, resume=False, dashboard=False,
                       progress=say, after_warmup=after_warmup)
    train_seconds = time.time() - t0 - sum(warm_evals)
    score("after")
    summary = out["summary"]
    metrics = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if l.strip()]
    first, last = metrics[: max(1, len(metrics) // 5)], metrics[-max(1, len(metrics) // 5):]

    def avg(rows, key):
        vals = [r[key] for r in rows if r.get(key) is not None]
        return round(sum(vals) / len(vals), 4) if vals else None

    warm = summary.get("warmup") or {}
    result = {
        "before": results["before"],
        "after_warmup": results.get("after_warmup"),
        "after": results["after"],
        "grpo_gain": round(results["after"]["accuracy"]
                           - (results.get("after_warmup") or results["before"])["accuracy"], 4),
        "train_seconds": round(train_seconds, 1),
        "warmup_seconds": warm.get("seconds"),
        "steps": summary["global_step"],
        "seconds_per_step": round((train_seconds - (warm.get("seconds") or 0)) / max(1, summary["global_step"]), 2),
        "stopped_by_time_budget": summary["stopped_by_time_budget"],
        "reward_first_fifth": avg(first, "reward"),
        "reward_last_fifth": avg(last, "reward"),
        "frac_reward_zero_std_first_fifth": avg(first, "frac_reward_zero_std"),
        "frac_reward_zero_std_last_fifth": avg(last, "frac_reward_zero_std"),
        "recipe": {
            "task_level": profile.task_level, "warmup_level": profile.warmup_level,
            "warmup_examples": profile.warmup_examples, "warmup_epochs": profile.warmup_epochs,
            "warmup_learning_rate": profile.warmup_learning_rate, "prefill": profile.prefill,
            "reward_preset": profile.reward_preset, "num_generations": profile.num_generations,
            "completions_per_step": profile.per_device_train_batch_size * profile.gradient_accumulation_steps,
            "max_completion_length": profile.max_completion_length,
            "learning_rate": profile.learning_rate, "lora_rank": profile.lora_rank,
            "beta": profile.beta, "loss_type": profile.loss_type, "scale_rewards": profile.scale_rewards,
            "temperature": profile.temperature, "max_steps": profile.max_steps,
            "time_budget_minutes": profile.time_budget_minutes,
            "eval": {"n": args.eval_rows, "decoding": "greedy", "max_new_tokens": settings.max_new_tokens},
        },
        "machine": {"cpus": os.cpu_count(), "threads": torch.get_num_threads(),
                    "loadavg_1min_end": round(os.getloadavg()[0], 2)},
        "run": str(run),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

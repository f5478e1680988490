"""Evaluation throughput on CPU: completions per second of the before/after evaluation.

    python bench/eval_throughput.py [--profile cpu-demo] [--prompts 64] [--batch-size 16]

Loads the bundled model with a fresh LoRA (a fresh LoRA computes exactly what
the base does, so speed is what matters here), prepares the profile's eval
split in a temporary run folder, and runs ``evaluate_before_after`` on the
first ``--prompts`` prompts with the profile's evaluation settings (greedy,
``max_completion_length`` tokens, the training prefill). Prints one JSON
object: completions/second per side and overall, tokens/second, seconds, and
the projected time of the notebook's evaluation on ``profile.eval_rows``
prompts. Progress goes to stderr. Not a test: it never gates CI.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="cpu-demo")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args()

    import torch

    from helpers.config import get_profile
    from helpers.data import ensure_prepared
    from helpers.evaluation import eval_settings, eval_split, evaluate_before_after
    from helpers.models import load_model

    profile = get_profile(args.profile)
    say = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    t0 = time.perf_counter()
    model, tok = load_model(profile)
    load_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as run:
        splits = ensure_prepared(profile, run, tokenizer=tok, verbose=False)
    split = eval_split(splits, n=args.prompts, prefill=getattr(profile, "prefill", None))
    settings = eval_settings(profile)
    say(f"{len(split['prompts'])} prompts x 2 sides, {settings.max_new_tokens} new tokens, "
        f"batch {args.batch_size}, {torch.get_num_threads()} threads")
    res = evaluate_before_after(model, tok, split["prompts"], split["answers"], settings,
                                batch_size=args.batch_size, progress=say)
    n = len(split["prompts"])
    secs = res["seconds"]
    total = secs["base"] + secs["trained"]
    tokens = sum(res[s]["summary"]["mean_length"] * res[s]["summary"]["n_completions"]
                 for s in ("base", "trained"))
    per_completion = total / (2 * n)
    out = {
        "bench": "eval_throughput",
        "profile": profile.name,
        "prompts": n,
        "max_new_tokens": settings.max_new_tokens,
        "batch_size": args.batch_size,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "model_load_seconds": round(load_s, 1),
        "seconds": {"base": secs["base"], "trained": secs["trained"], "total": round(total, 2)},
        "completions_per_second": round(2 * n / total, 3),
        "completions_per_second_base": round(n / secs["base"], 3),
        "completions_per_second_trained": round(n / secs["trained"], 3),
        "generated_tokens_per_second": round(tokens / total, 1),
        "projected_eval_seconds_for_eval_rows": round(per_completion * 2 * profile.eval_rows, 1),
        "eval_rows": profile.eval_rows,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

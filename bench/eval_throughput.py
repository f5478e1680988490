"""Evaluation throughput on CPU: completions per second of notebook 04's evaluation.

    python bench/eval_throughput.py [--profile cpu-demo] [--prompts 64] [--batch-size 64] [--rounds 3]

Loads the bundled model with a fresh LoRA (a fresh LoRA computes exactly what
the base does, so speed is what matters here), prepares the profile's eval
split in a temporary run folder, and runs ``evaluate`` on the base side and
the adapter side on the first ``--prompts`` prompts with the profile's
evaluation settings (greedy, ``max_completion_length`` tokens, the prompts as
training renders them). The adapter side runs ``--rounds`` times live and as
many with the adapter merged while it samples, as ``evaluate_adapters`` does on
a CPU (``merged``, its merging and restoring timed too), interleaved; each side
counts its median. Prints one JSON object: completions/second of the first two
sides, tokens/second, seconds of all three, merged over live, and the
projected time of notebook 04's three-sided evaluation on
``profile.eval_prompts`` prompts. Progress goes to stderr. Not a test: it
never gates CI.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="cpu-demo")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=64, help="sequences per generate call")
    ap.add_argument("--rounds", type=int, default=3, help="runs of the adapter side, live and merged (medians)")
    args = ap.parse_args()

    import torch

    from helpers.data import ensure_prepared
    from helpers.evaluation import eval_settings, evaluate, merged
    from helpers.models import load_model
    from helpers.profiles import get_profile
    from helpers.tasks import get_task

    profile = get_profile(args.profile)
    task = get_task(profile.task)
    say = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    t0 = time.perf_counter()
    model, tok = load_model(profile)
    load_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as run:
        held_out = ensure_prepared(profile, run, tokenizer=tok, verbose=False)["eval"].select(range(args.prompts))
    settings = eval_settings(profile)
    say(f"{len(held_out)} prompts x 2 sides, {settings.max_new_tokens} new tokens, "
        f"batch {args.batch_size}, {torch.get_num_threads()} threads")
    tokens = 0.0
    contexts = {"base": model.disable_adapter, "adapter": contextlib.nullcontext,
                "adapter_merged": lambda: merged(model, "default")}
    runs: dict[str, list[float]] = {side: [] for side in contexts}
    order = ["base"] + [side for r in range(args.rounds)  # live and merged interleaved: a busy moment slows both
                        for side in (("adapter", "adapter_merged") if r % 2 == 0 else ("adapter_merged", "adapter"))]
    for side in order:
        t = time.perf_counter()
        with contexts[side]():
            res = evaluate(model, tok, held_out, task, settings, batch_size=args.batch_size)
        runs[side].append(time.perf_counter() - t)
        if len(runs[side]) == 1 and side != "adapter_merged":
            tokens += res["summary"]["mean_length"] * res["summary"]["n_completions"]
        say(f"{side}: {runs[side][-1]:.2f} s")
    secs = {side: round(statistics.median(v), 2) for side, v in runs.items()}
    n = len(held_out)
    total = secs["base"] + secs["adapter"]
    out = {
        "bench": "eval_throughput", "profile": profile.name, "prompts": n,
        "max_new_tokens": settings.max_new_tokens, "batch_size": args.batch_size,
        "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "model_load_seconds": round(load_s, 1),
        "seconds": {**secs, "total": round(total, 2)},
        "merged_over_live": round(secs["adapter_merged"] / secs["adapter"], 3),
        "completions_per_second": round(2 * n / total, 3),
        "generated_tokens_per_second": round(tokens / total, 1),
        "projected_notebook_04_eval_seconds": round(total / (2 * n) * 3 * profile.eval_prompts, 1),
        "eval_prompts": profile.eval_prompts,
    }
    from archive import stamped  # bench/archive.py: the command, commit, date and machine
    print(json.dumps(stamped(out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

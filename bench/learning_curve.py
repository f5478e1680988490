"""How fast does GRPO learn, step by step? Held-out accuracy every few steps of notebook 03's recipe.

    python bench/learning_curve.py [--task arithmetic|json] [--every 10] [--eval-rows 100] [--set key=value ...]

Trains like ``bench/learning.py`` (the task's warm-up, then ``helpers.training.train_grpo`` on ``cpu-demo``) but with
no time budget and ``max_steps`` steps (``--set max_steps=40``), and evaluates the same ``--eval-rows`` held-out rows
(greedy) after the warm-up and after every ``--every`` GRPO steps, through a callback (the evaluations are not in
the step times). Prints ONE JSON object: ``{"task", "headline", "curve": [[step, headline, format], ...],
"seconds_per_step", "recipe", "precision", "machine"}``. It chose ``cpu-demo``'s earlier 20 steps at 3e-4, where that
curve flattens (``bench/checkpoints.py``, scoring a sweep's checkpoints, chose the present 30 at 1e-4). Not a test: it
never gates CI.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time

from learning import _value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="arithmetic")
    ap.add_argument("--profile", default="cpu-demo")
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--eval-rows", type=int, default=100)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()

    import torch
    from transformers import TrainerCallback

    from helpers.data import ensure_prepared
    from helpers.evaluation import eval_settings, evaluate
    from helpers.models import load_model
    from helpers.profiles import get_profile
    from helpers.tasks import get_task
    from helpers.training import precision, run_warmup, train_grpo

    overrides = {k: _value(v) for k, v in (kv.split("=", 1) for kv in args.set)}
    profile = get_profile(args.profile, task=args.task, time_budget_minutes=None, **overrides)
    task, run = get_task(profile.task), tempfile.mkdtemp(prefix="bench-curve-")
    bits = precision(profile, None)
    model, tok = load_model(profile, bf16=bits["bf16"])
    held_out = ensure_prepared(profile, run, tokenizer=tok, verbose=False)["eval"].select(range(args.eval_rows))
    curve: list[list] = []

    def point(step: int) -> None:
        summary = evaluate(model, tok, held_out, task, eval_settings(profile))["summary"]
        curve.append([step, round(summary[task.headline], 4), round(summary[task.format_metric], 4)])
        print(f"[bench/learning_curve] step {step}: {task.headline} {curve[-1][1]}, {task.format_metric} "
              f"{curve[-1][2]}", file=sys.stderr, flush=True)

    class Curve(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):  # noqa: ANN001, D102
            if state.global_step % args.every == 0 or state.global_step == profile.max_steps:
                point(state.global_step)

    with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the one JSON object
        if profile.warmup_examples:
            run_warmup(model, tok, profile, run)
        point(0)
        out = train_grpo(profile, run, model=model, tokenizer=tok, resume=False, warmup=False, live=False,
                         callbacks=[Curve()])
    times = [h["step_time"] for h in out["trainer"].state.log_history if "step_time" in h]
    from archive import stamped  # bench/archive.py: the command, commit, date and machine
    print(json.dumps(stamped({
        "task": profile.task, "headline": task.headline, "format_metric": task.format_metric, "curve": curve,
        "eval": {"rows": len(held_out), "decoding": "greedy"}, "steps": out["summary"]["global_step"],
        "seconds_per_step": round(sum(times) / max(1, len(times)), 2),
        "recipe": {k: getattr(profile, k) for k in ("task_level", "warmup_level", "warmup_examples", "num_generations",
                                                     "per_device_train_batch_size", "learning_rate", "max_steps",
                                                     "temperature", "lora_rank", "lora_alpha", "seed")},
        "precision": bits, "machine": {"cpus": os.cpu_count(), "threads": torch.get_num_threads(),
                                       "loadavg_1min_end": round(os.getloadavg()[0], 2)},
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
    })))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

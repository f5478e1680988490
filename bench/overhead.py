"""What do the course's extras cost? TRL's GRPOTrainer as notebook 03 runs it, against a bare one.

    python bench/overhead.py [--profile cpu-demo] [--steps 6] [--rounds 2] [--threads 2]

Builds the same ``GRPOConfig`` (``helpers.training.grpo_config``), the same data
and the same reward functions, then times optimizer steps of ``trl.GRPOTrainer``

* bare: no callbacks, ``log_completions=False``, no checkpoints, and
* as notebook 03 runs it: the course's callbacks (dashboard headless, run log,
  time budget), TRL's completion log (``log_completions=True``, a parquet file
  per step) and checkpoints as the profile saves them,

alternating the two ``--rounds`` times on freshly loaded models (same seed).
The first step of every run is dropped (warm-up of kernels and caches); the
median step time of each side is compared. Prints ONE JSON object with both
medians and ``ratio`` = course / bare (target <= 1.05). Progress goes to stderr.
Not a test.
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
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="cpu-demo")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()

    import torch
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    from helpers.callbacks import DashboardCallback, RunLogCallback, TimeBudgetCallback
    from helpers.data import ensure_prepared
    from helpers.models import load_model
    from helpers.profiles import get_profile
    from helpers.tasks import get_task
    from helpers.training import grpo_config

    if args.threads:
        torch.set_num_threads(args.threads)
    say = lambda msg: print(f"[bench/overhead] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    profile = get_profile(args.profile, max_steps=args.steps, save_steps=max(2, args.steps // 2))

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self._t = 0.0

        def on_step_begin(self, a, state, control, **kw):
            self._t = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            self.times.append(time.perf_counter() - self._t)

    def one(kind: str) -> list[float]:
        run = Path(tempfile.mkdtemp(prefix=f"bench-overhead-{kind}-"))
        model, tok = load_model(profile)
        data = ensure_prepared(profile, run, tokenizer=tok, verbose=False)["train"]
        rewards = get_task(profile.task).rewards_for(profile.task_level)
        timer = StepTimer()
        if kind == "bare":
            config = grpo_config(profile, run, log_completions=False, save_strategy="no")
            callbacks = [timer]
        else:
            config = grpo_config(profile, run)
            callbacks = [DashboardCallback(run, live=False, print_fn=lambda _: None), RunLogCallback(run),
                         TimeBudgetCallback(60), timer]
        trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=[f for f, _ in rewards],
                              args=config, train_dataset=data, callbacks=callbacks)
        trainer.remove_callback(PrinterCallback)
        # the timer must wrap the other callbacks' on_step_end work: move it last
        trainer.callback_handler.callbacks.remove(timer)
        trainer.callback_handler.callbacks.append(timer)
        with contextlib.redirect_stdout(sys.stderr):
            trainer.train()
        say(f"{kind}: " + ", ".join(f"{t:.2f}" for t in timer.times) + " s/step")
        return timer.times[1:]

    times: dict[str, list[float]] = {"bare": [], "course": []}
    for r in range(args.rounds):
        for kind in (("bare", "course") if r % 2 == 0 else ("course", "bare")):
            times[kind] += one(kind)
    bare, course = statistics.median(times["bare"]), statistics.median(times["course"])
    from archive import stamped  # bench/archive.py: the command, commit, date and machine
    print(json.dumps(stamped({
        "profile": profile.name,
        "steps_timed_per_side": len(times["bare"]),
        "bare_trl_median_step_s": round(bare, 3),
        "course_median_step_s": round(course, 3),
        "ratio": round(course / bare, 3),
        "target": 1.05,
        "bare_steps": [round(t, 3) for t in times["bare"]],
        "course_steps": [round(t, 3) for t in times["course"]],
        "threads": torch.get_num_threads(),
        "loadavg_1min_end": round(os.getloadavg()[0], 2),
    })))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What do the course's trainer extras cost? The kit's trainer against plain TRL.

    python bench/overhead.py [--profile cpu-demo] [--steps 6] [--rounds 2] [--threads 2]

Builds the same ``GRPOConfig`` (``helpers.training.build_grpo_config``), the
same data and the same reward functions, then times optimizer steps of

* plain ``trl.GRPOTrainer``, and
* ``helpers.training.build_trainer`` (completions and metrics logs, dashboard
  callback headless, checkpoints as the profile saves them),

alternating the two ``--rounds`` times on freshly loaded models (same seed).
The first step of every run is dropped (warm-up of kernels and caches); the
median step time of each side is compared. Prints ONE JSON object with both
medians and ``ratio`` = kit / plain (target <= 1.05). Progress goes to stderr.
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
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from helpers.config import get_profile
    from helpers.data import ensure_prepared
    from helpers.models import load_model
    from helpers.rewards import get_preset
    from helpers.training import build_grpo_config, build_trainer, split_rewards, with_prefill
    from helpers.models import align_eos_with_chat_template

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
        align_eos_with_chat_template(tok, model)  # the same tokenizer fix for both sides
        data = with_prefill(ensure_prepared(profile, run, tokenizer=tok, verbose=False)["train"],
                            profile.prefill or None)
        funcs, weights = split_rewards(get_preset(profile.reward_preset))
        config = build_grpo_config(profile, run)
        timer = StepTimer()
        if kind == "plain":
            config.reward_weights = weights
            trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=funcs, args=config,
                                  train_dataset=data, callbacks=[timer])
        else:
            trainer = build_trainer(model, tok, data, list(zip(funcs, weights)), config, run=run,
                                    dashboard=None, callbacks=[timer])
        # the timer must wrap the other callbacks' on_step_end work: move it last
        trainer.callback_handler.callbacks.remove(timer)
        trainer.callback_handler.callbacks.append(timer)
        with contextlib.redirect_stdout(sys.stderr):  # TRL/transformers print logs to stdout
            trainer.train()
        say(f"{kind}: " + ", ".join(f"{t:.2f}" for t in timer.times) + " s/step")
        return timer.times[1:]

    times: dict[str, list[float]] = {"plain": [], "kit": []}
    for r in range(args.rounds):
        for kind in (("plain", "kit") if r % 2 == 0 else ("kit", "plain")):
            times[kind] += one(kind)
    plain, kit = statistics.median(times["plain"]), statistics.median(times["kit"])
    print(json.dumps({
        "profile": profile.name,
        "steps_timed_per_side": len(times["plain"]),
        "plain_trl_median_step_s": round(plain, 3),
        "kit_median_step_s": round(kit, 3),
        "ratio": round(kit / plain, 3),
        "target": 1.05,
        "plain_steps": [round(t, 3) for t in times["plain"]],
        "kit_steps": [round(t, 3) for t in times["kit"]],
        "threads": torch.get_num_threads(),
        "loadavg_1min_end": round(os.getloadavg()[0], 2),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

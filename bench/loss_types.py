"""What ``loss_type`` does to learning and completion length: grpo, dr_grpo, dapo and GSPO at equal budget.

    python bench/loss_types.py [--task arithmetic] [--profile cpu-demo] [--variants grpo,dr_grpo,dapo,gspo]
                               [--steps 30] [--seeds 3407] [--steps-per-generation 2] [--eval-rows 50]
                               [--threads N] [--set key=value ...]

Notebook 03's recipe through its save point (``helpers.training``: the task's format-only warm-up, then
``GRPOTrainer``), once per variant and seed. For each seed the warm-up runs once and every variant starts
from its adapter, with the same prompts in the same order (same seed), the same generations, completion
length, learning rate and number of optimizer steps; only the ``GRPOConfig`` fields of the variant differ.
A generation batch (the profile's, 2 prompts x 8 completions on cpu-demo) is cut into
``--steps-per-generation`` optimizer steps, so from the second step of each batch on the trainer is
off-policy: the ratio leaves 1, the clip can act, and GSPO differs from grpo (on-policy, with the ratio at
exactly 1, their gradients are the same: notebook 06, exercise 3).

Recorded per optimizer step (TRL's logs): the total reward, each reward's mean, completion length,
truncation (these on the steps that generate: every ``--steps-per-generation``-th), the clip share; on the
held-out rows (greedy, the task's metrics) at step 0, half-way and at the
end: the headline metric (accuracy), the format metric and the mean completion length. Prints ONE JSON
object; progress goes to stderr; ``--json PATH`` also writes it (after every run, so a cut-off bench keeps
what finished). Not a test: it never gates CI.
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

#: GRPOConfig changes that make each variant.
VARIANTS: dict[str, dict] = {
    "grpo": {"loss_type": "grpo"},
    "bnpo": {"loss_type": "bnpo"},
    "dr_grpo": {"loss_type": "dr_grpo"},
    "dapo": {"loss_type": "dapo"},
    "gspo": {"loss_type": "grpo", "importance_sampling_level": "sequence"},
}
#: TRL's per-step log keys kept (the reward means are added by name).
STEP_KEYS = ("reward", "reward_std", "frac_reward_zero_std", "completions/mean_length", "completions/clipped_ratio",
             "clip_ratio/region_mean", "entropy", "loss", "step_time")


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="arithmetic")
    ap.add_argument("--profile", default="cpu-demo")
    ap.add_argument("--variants", default="grpo,dr_grpo,dapo,gspo", help=f"from {', '.join(VARIANTS)}")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps per run")
    ap.add_argument("--seeds", default="3407", help="comma-separated; each seed: its own warm-up, every variant")
    ap.add_argument("--steps-per-generation", type=int, default=2)
    ap.add_argument("--eval-rows", type=int, default=50)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--json", default=None, help="also write the JSON here, after every run")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="profile overrides")
    args = ap.parse_args()
    names = [v for v in args.variants.split(",") if v]
    if unknown := [v for v in names if v not in VARIANTS]:
        ap.error(f"unknown variant(s) {unknown}: choose from {', '.join(VARIANTS)}")

    import torch
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    from helpers.callbacks import step_logs
    from helpers.data import ensure_prepared
    from helpers.evaluation import eval_settings, evaluate
    from helpers.models import load_model
    from helpers.profiles import get_model_spec, get_profile
    from helpers.tasks import get_task
    from helpers.training import grpo_config, run_warmup

    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = {k: _value(v) for k, v in (kv.split("=", 1) for kv in args.set)}
    base = get_profile(args.profile, task=args.task, eval_rows=args.eval_rows, time_budget_minutes=None, **overrides)
    task = get_task(base.task)
    spg = args.steps_per_generation
    if base.per_device_train_batch_size % spg or (base.per_device_train_batch_size // spg) % base.num_generations:
        ap.error(f"--steps-per-generation {spg} must cut the generation batch ({base.per_device_train_batch_size}) "
                 f"into whole groups of {base.num_generations}")
    rewards = task.rewards_for(base.task_level)
    root = Path(tempfile.mkdtemp(prefix="bench-loss-types-"))
    say = lambda msg: print(f"[bench/loss_types] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    load_start, t0 = os.getloadavg()[0], time.time()
    say(f"variants {names}, seeds {args.seeds}, {args.steps} steps, profile {base.name}, threads "
        f"{torch.get_num_threads()}, load {load_start:.1f}, run {root}")
    model, tok = load_model(base)
    snapshot = lambda: {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}  # noqa: E731
    fresh = snapshot()
    data = ensure_prepared(base, root, tokenizer=tok, verbose=False)  # one split for every seed: the seeds vary
    held_out = data["eval"]                                             # the warm-up rows, prompt order, sampling
    kwargs = get_model_spec(base.model).chat_template_kwargs

    def held_out_eval(step: int) -> dict:
        summary = evaluate(model, tok, held_out, task, eval_settings(base), chat_template_kwargs=kwargs)["summary"]
        return {"step": step, **{k: round(summary[k], 4) for k in (task.headline, task.format_metric, "mean_length")}}

    class MidwayEval(TrainerCallback):
        def __init__(self, sink: list):
            self.sink = sink

        def on_step_end(self, cb_args, state, control, **kw):
            if state.global_step == args.steps // 2:
                self.sink.append(held_out_eval(state.global_step))

    out: dict = {"bench": "loss_types", "task": base.task, "headline": task.headline,
                 "format_metric": task.format_metric, "variants": {n: VARIANTS[n] for n in names},
                 "seeds": [int(s) for s in args.seeds.split(",")], "steps": args.steps,
                 "recipe": {k: getattr(base, k) for k in (
                     "task_level", "warmup_level", "warmup_examples", "num_generations", "max_completion_length",
                     "learning_rate", "lora_rank", "beta", "scale_rewards", "temperature", "epsilon_high",
                     "mask_truncated_completions")}
                 | {"generation_batch": base.per_device_train_batch_size, "steps_per_generation": spg,
                    "per_device_train_batch_size": base.per_device_train_batch_size // spg,
                    "gradient_accumulation_steps": 1, "eval": {"rows": len(held_out), "decoding": "greedy"}},
                 "runs": []}
    for seed in out["seeds"]:
        profile = base.with_overrides(seed=seed)
        set_peft_model_state_dict(model, fresh)
        with contextlib.redirect_stdout(sys.stderr):
            warm = run_warmup(model, tok, profile, root / f"seed-{seed}")
        start = snapshot()
        step0 = held_out_eval(0)
        say(f"seed {seed}: warm-up {warm['seconds']} s; held-out at step 0 {step0}")
        for name in names:
            set_peft_model_state_dict(model, start)
            config = grpo_config(profile, root / f"seed-{seed}" / name, **VARIANTS[name], max_steps=args.steps,
                                 per_device_train_batch_size=base.per_device_train_batch_size // spg,
                                 gradient_accumulation_steps=1, steps_per_generation=spg, save_strategy="no",
                                 log_completions=False)
            evals = [step0]
            trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=[f for f, _ in rewards], args=config,
                                  train_dataset=data["train"],
                                  callbacks=[MidwayEval(evals)])
            trainer.remove_callback(PrinterCallback)
            t = time.time()
            with contextlib.redirect_stdout(sys.stderr):
                trainer.train()
            seconds = time.time() - t
            evals.append(held_out_eval(args.steps))
            keys = STEP_KEYS + tuple(f"rewards/{f.__name__}/mean" for f, _ in rewards)
            steps = [{"step": r["step"], **{k: round(r[k], 4) for k in keys if r.get(k) is not None}}
                     for r in step_logs(trainer.state.log_history)]
            out["runs"].append({"variant": name, "seed": seed, "train_seconds": round(seconds, 1),
                                "seconds_per_step": round(seconds / max(1, len(steps)), 2), "eval": evals,
                                "steps": steps})
            say(f"{name} seed {seed}: {seconds:.0f} s, held-out {evals[-1]}")
            out["seeds_complete"] = [s for s in out["seeds"] if {r["variant"] for r in out["runs"] if r["seed"] == s}
                                     == set(names)]
            out["seconds"] = round(time.time() - t0, 1)
            out["machine"] = {"cpus": os.cpu_count(), "threads": torch.get_num_threads(),
                              "loadavg_1min_start": round(load_start, 2), "loadavg_1min_end": round(os.getloadavg()[0], 2)}
            if args.json:
                Path(args.json).write_text(json.dumps(out) + "\n")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Does GRPO itself make the bundled model better, for a task? The CPU learning benchmark.

    python bench/learning.py [--task arithmetic|json|module:Class] [--profile cpu-demo] [--eval-rows 200]
                             [--passk-prompts 50] [--passk-n 8] [--threads N] [--precision auto|fp32|bf16]
                             [--skip-base] [--set key=value ...] [--config key=value ...] [--rewards NAME ...]
                             [--preflight-groups 8]

Trains the bundled model with notebook 03's recipe through its save point (``helpers.training``: the
task's format-only warm-up on an easier level, then ``GRPOTrainer``, watched as notebook 03 watches it: a
held-out slice scored every few steps, the named warnings, trackio in the run folder) and evaluates the SAME
held-out rows (greedy, the profile's completion length, the prompts rendered as in training) three times: the
base model (unless ``--skip-base``: it scores 0% on both tasks), after the warm-up and after GRPO, with the
task's own metrics. Then pass@k: ``--passk-n`` samples (temperature 1) for each of the first ``--passk-prompts``
held-out rows, on each side, with the unbiased estimator (``helpers.evaluation.pass_at_k``). Before GRPO, on the
model as it will train, notebook 03's pre-flight (``helpers.readiness.check``, ``--preflight-groups`` training prompts,
a group each; 0: none): its figures, verdict and seconds are ``readiness``, not counted in the time budget (like the
evaluations), so the run trains as it would without it. Prints ONE JSON object:

    {"task", "headline", "format_metric", "before": {...} | null, "after_warmup": {...} | null, "after": {...},
     "grpo_gain": after - after_warmup on the headline metric, "pass_at_k": {side: {k: value}},
     "train_seconds", "steps", "seconds_per_step", "heldout_curve": [[step, headline, format], ...],
     "heldout_seconds", "warnings", "selection", "history": [per-step logs], "readiness": {"figures", "verdict",
     "seconds", "budget_share"} | null, "recipe": {...}, "machine": {...}}

The profile's time budget (6 minutes, at most 30 steps on cpu-demo; the JSON task 15, in groups of 4) covers the
warm-up and GRPO, the held-out slice scored while training included; the final evaluations are not counted.
Progress goes to stderr. Not a test: it never gates CI. ``--set`` overrides profile fields, ``--config`` sets
``GRPOConfig`` values the profile has no field for (recorded as the recipe's ``config``), ``--rewards`` trains on
only the named ones of the task's rewards (the recipe's ``rewards`` lists those used); ``--precision``
overrides what ``helpers.training.precision`` picks (float32 on every CPU): ``bf16`` loads the frozen base in
bf16, keeps LoRA in float32 and trains under bf16 autocast, to compare the two on one recipe.
The evaluations run on the model as trained (a bf16 base where asked; notebook 04 evaluates in float32).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _pairs(items: list[str]) -> dict:
    """``["lr=1e-4", "name=x"]`` -> ``{"lr": 0.0001, "name": "x"}``: the ``--set`` and ``--config`` values."""
    return {k: _value(v) for k, v in (kv.split("=", 1) for kv in items)}


HISTORY_KEYS = ("step", "reward", "reward_std", "frac_reward_zero_std", "entropy", "completions/mean_length",
                "completions/clipped_ratio", "clip_ratio/region_mean", "loss", "step_time", "diversity/distinct",
                "diversity/overlap")


def compact_history(logs: list[dict]) -> list[dict]:
    """The per-step logs the warnings read (helpers.watch.diagnose), rounded: TRL's keys, held-out ``eval_*`` too."""
    keep = lambda k: k in HISTORY_KEYS or k.startswith("eval_") or (k.startswith("rewards/") and k.endswith("/mean"))  # noqa: E731
    return [{k: round(v, 4) if isinstance(v, float) else v for k, v in row.items() if keep(k)} for row in logs]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="arithmetic")
    ap.add_argument("--profile", default="cpu-demo")
    ap.add_argument("--eval-rows", type=int, default=200)
    ap.add_argument("--passk-prompts", type=int, default=50, help="held-out rows sampled for pass@k (0: none)")
    ap.add_argument("--passk-n", type=int, default=8, help="samples per row for pass@k")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"],
                    help="auto: helpers.training.precision's choice for this machine")
    ap.add_argument("--run", default=None, help="run folder (default: a fresh temporary one)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                    help="a GRPOConfig value the profile has no field for (e.g. top_entropy_quantile=0.2)")
    ap.add_argument("--rewards", nargs="+", default=None, metavar="NAME",
                    help="train on only these of the task's rewards, by function name (their weights kept)")
    ap.add_argument("--skip-base", action="store_true", help="do not evaluate the base model (it scores 0%% here)")
    ap.add_argument("--preflight-groups", type=int, default=8,
                    help="training prompts the pre-flight samples before GRPO, a group each (0: no pre-flight)")
    args = ap.parse_args()

    import torch

    from helpers.data import ensure_prepared
    from helpers.evaluation import eval_settings, evaluate, pass_at_k_curve
    from helpers.models import load_model, resolve
    from helpers.profiles import get_profile
    from helpers.readiness import SETTINGS, check
    from helpers.training import run_warmup, train_grpo

    if args.threads:
        torch.set_num_threads(args.threads)
    overrides, config_overrides = _pairs(args.set), _pairs(args.config)
    profile = get_profile(args.profile, task=args.task, eval_rows=args.eval_rows, **overrides)
    resolved = resolve(profile)  # the task, model entry and precision the load, warm-up and GRPO below all read
    if args.precision != "auto":  # what the base's load, SFTConfig and GRPOConfig ask for (check_config accepts it)
        resolved = dataclasses.replace(resolved, precision={"bf16": args.precision == "bf16", "fp16": False})
    task = resolved.task
    if args.rewards:  # a variant: the task's class answers rewards_for with only the asked ones, for every caller
        every = type(task).rewards_for
        missing = set(args.rewards) - {f.__name__ for f, _ in every(task, profile.task_level)}
        if missing:
            ap.error(f"--rewards {' '.join(sorted(missing))}: not among the rewards of task {task.name!r} at level "
                     f"{profile.task_level!r}; name some of: "
                     f"{', '.join(f.__name__ for f, _ in every(task, profile.task_level))}")
        type(task).rewards_for = lambda self, level: [(f, w) for f, w in every(self, level)  # type: ignore
                                                      if f.__name__ in args.rewards]
    run = Path(args.run or tempfile.mkdtemp(prefix=f"bench-learning-{task.name}-"))
    say = lambda msg: print(f"[bench/learning] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    load_start = os.getloadavg()[0]
    say(f"task {task.name}, profile {profile.name}, run {run}, threads {torch.get_num_threads()}, load {load_start:.1f}")

    model, tok = load_model(resolved, bf16=resolved.precision["bf16"])  # notebook 03's base dtype
    with contextlib.redirect_stdout(sys.stderr):  # its notes (references that do not fit) are not the JSON
        held_out = ensure_prepared(profile, run, tokenizer=tok, verbose=False)["eval"]
    kwargs = resolved.spec.chat_template_kwargs
    sample = held_out.select(range(min(args.passk_prompts, held_out.num_rows)))
    results: dict = {}
    passk: dict = {}

    def measure(label: str) -> float:
        t = time.time()
        res = evaluate(model, tok, held_out, task, eval_settings(profile), chat_template_kwargs=kwargs)
        results[label] = {k: v for k, v in res["summary"].items() if k != "rewards"}
        if len(sample):
            drawn = evaluate(model, tok, sample, task, eval_settings(profile, 1.0, args.passk_n),
                             chat_template_kwargs=kwargs)
            passk[label] = {k: round(v, 4) for k, v in pass_at_k_curve(drawn, task.headline).items()}
        say(f"{label}: {task.headline} {results[label][task.headline]:.3f}, {task.format_metric} "
            f"{results[label][task.format_metric]:.3f}, pass@{args.passk_n} {passk.get(label, {}).get(args.passk_n)} "
            f"({time.time() - t:.0f} s); e.g. {res['rows'][0]['completion']!r}")
        return time.time() - t

    if not args.skip_base:
        with model.disable_adapter():
            measure("before")
    start = time.time()
    warm, paused = None, 0.0
    with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the one JSON object
        if profile.warmup_examples:
            warm = run_warmup(model, tok, resolved, run)
            paused = measure("after_warmup")
        readiness = None
        if args.preflight_groups:  # on the model as GRPO gets it, the training prompts, the config's sampling
            t = time.time()
            asked = {k: config_overrides.get(k, getattr(profile, k)) for k in SETTINGS}  # --config wins, as in GRPO
            report = check(model, tok, profile, run=run, groups=args.preflight_groups,
                           config=SimpleNamespace(**asked, chat_template_kwargs=kwargs or None),
                           warmup_seconds=warm and warm["seconds"])
            seconds = time.time() - t
            paused += seconds
            budget = profile.time_budget_minutes and profile.time_budget_minutes * 60
            readiness = {**report.to_dict(), "seconds": round(seconds, 1),
                         "budget_share": round(seconds / budget, 4) if budget else None}
            say(str(report))
        out = train_grpo(resolved, run, model=model, tokenizer=tok, resume=False, warmup=False,
                         budget_start=start + paused, live=False,
                         config_overrides=config_overrides)
    train_seconds = time.time() - start - paused
    measure("after")
    logs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    fifth = max(1, len(logs) // 5)

    def avg(rows, key):
        vals = [r[key] for r in rows if r.get(key) is not None]
        return round(sum(vals) / len(vals), 4) if vals else None

    steps = out["summary"]["global_step"]
    baseline = results.get("after_warmup") or results.get("before") or {task.headline: 0.0}
    from archive import stamped  # bench/archive.py: the command, commit, date and machine
    print(json.dumps(stamped({
        "task": profile.task, "headline": task.headline, "format_metric": task.format_metric,
        "before": results.get("before"), "after_warmup": results.get("after_warmup"), "after": results["after"],
        "grpo_gain": round(results["after"][task.headline] - baseline[task.headline], 4),
        "pass_at_k": passk, "pass_at_k_setup": {"prompts": len(sample), "n": args.passk_n, "temperature": 1.0},
        "train_seconds": round(train_seconds, 1), "warmup_seconds": warm and warm["seconds"], "steps": steps,
        "seconds_per_step": round((train_seconds - (warm["seconds"] if warm else 0)) / max(1, steps), 2),
        "stopped_by_time_budget": out["summary"]["stopped_by_time_budget"],
        "heldout_seconds": out["summary"]["heldout_seconds"],
        "heldout_curve": [[step, m.get(task.headline), m.get(task.format_metric)] for step, m in out["heldout"]],
        "heldout_rows": profile.watch_prompts, "warnings": out["summary"]["warnings"],
        "selection": out["summary"]["selection"],
        "history": compact_history(logs), "readiness": readiness,
        "reward_first_fifth": avg(logs[:fifth], "reward"), "reward_last_fifth": avg(logs[-fifth:], "reward"),
        "frac_reward_zero_std_first_fifth": avg(logs[:fifth], "frac_reward_zero_std"),
        "frac_reward_zero_std_last_fifth": avg(logs[-fifth:], "frac_reward_zero_std"),
        "recipe": {k: getattr(profile, k) for k in (
            "task_level", "warmup_level", "warmup_examples", "warmup_epochs", "warmup_learning_rate",
            "num_generations", "per_device_train_batch_size", "max_completion_length", "learning_rate", "lora_rank",
            "beta", "loss_type", "scale_rewards", "temperature", "mask_truncated_completions", "epsilon_high",
            "max_steps", "time_budget_minutes", "seed", "split_seed", "gradient_checkpointing", "lora_alpha",
            "max_grad_norm", "select_prompts", "select_samples", "select_mode", "lr_scheduler_type")}
        | {"config": config_overrides, "prefill": task.prefill,
           "rewards": [[f.__name__, w] for f, w in task.rewards_for(profile.task_level)],
           "eval": {"n": len(held_out), "decoding": "greedy", "max_new_tokens": profile.max_completion_length}},
        "precision": {"asked": args.precision, **resolved.precision},
        "machine": {"cpus": os.cpu_count(), "threads": torch.get_num_threads(),
                    "cpu_capability": torch.backends.cpu.get_cpu_capability(), "loadavg_1min_start": round(load_start, 2),
                    "loadavg_1min_end": round(os.getloadavg()[0], 2)},
        "run": str(run),
    })))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

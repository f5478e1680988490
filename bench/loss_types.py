"""What ``loss_type`` does to learning and completion length: grpo, dr_grpo, dapo and GSPO at equal budget.

    python bench/loss_types.py [--task arithmetic] [--profile cpu-demo] [--variants grpo,dr_grpo,dapo,gspo,gspo_seqclip]
                               [--steps 30] [--seeds 3407] [--steps-per-generation 2] [--eval-rows 50]
                               [--threads N] [--set key=value ...] [--json PATH]
    python bench/loss_types.py --summarize bench/measured/loss_types/loss_types.json   # add the summary to a stored result

Notebook 03's recipe through its save point (``helpers.training``: the task's format-only warm-up, then
``GRPOTrainer``), once per variant and seed. For each seed the warm-up runs once and every variant starts
from its adapter, with the same prompts in the same order (same seed), the same generations, completion
length, learning rate and number of optimizer steps; only the ``GRPOConfig`` fields of the variant differ.
A generation batch (the profile's, 2 prompts x 8 completions on cpu-demo) is cut into
``--steps-per-generation`` optimizer steps, so from the second step of each batch on the trainer is
off-policy: the ratio leaves 1, the clip can act, and GSPO differs from grpo (on-policy, with the ratio at
exactly 1, their gradients are the same: notebook 06, section 4). GSPO runs twice: ``gspo`` with the profile's
token-level clip range (0.2 / 0.28), which its sequence ratios never reached in the stored runs, and
``gspo_seqclip`` at the range TRL's paper index gives GSPO (3e-4 / 4e-4).

Recorded per optimizer step (TRL's logs): the total reward, each reward's mean, completion length,
truncation (these on the steps that generate: every ``--steps-per-generation``-th), the clip share; on the
held-out rows (greedy, the task's metrics) at step 0, half-way and at the
end: the headline metric (accuracy), the format metric and the mean completion length. Prints ONE JSON
object; progress goes to stderr; ``--json PATH`` also writes it (after every run, so a cut-off bench keeps
what finished), with a ``summary`` per variant and seed (the numbers notebook 06 quotes: final accuracy, the
clipped share on the off-policy steps, lengths). Not a test: it never gates CI.
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
    # GSPO with the profile's token-level clip range (epsilon 0.2 / epsilon_high 0.28 on cpu-demo): what
    # bench/measured/loss_types/loss_types.json calls "gspo". Sequence ratios stay near 1, so this range hardly ever clips.
    "gspo": {"loss_type": "grpo", "importance_sampling_level": "sequence"},
    # GSPO at its own clip range, as TRL's paper index sets it for the GSPO paper (v2, section 5.1):
    # epsilon=3e-4, epsilon_high=4e-4 (https://huggingface.co/docs/trl/paper_index, "Group Sequence Policy
    # Optimization"). Everything else as the other variants (the paper index also sets beta=0, the course's
    # default, and 4 steps per generation; here every variant keeps --steps-per-generation).
    "gspo_seqclip": {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4,
                     "epsilon_high": 4e-4},
}
#: What each variant is, in words (written into the JSON beside its settings).
LABELS: dict[str, str] = {
    "grpo": "grpo: per-completion token mean, token-level clip",
    "bnpo": "bnpo: token mean of the micro-batch, token-level clip",
    "dr_grpo": "dr_grpo: token sum / (B * max_completion_length), token-level clip",
    "dapo": "dapo: token sum / tokens of the optimizer step, token-level clip",
    "gspo": "GSPO (sequence-level ratio) with the token-level clip range (epsilon 0.2 / epsilon_high 0.28)",
    "gspo_seqclip": "GSPO (sequence-level ratio) at its own clip range (epsilon 3e-4 / epsilon_high 4e-4)",
}
#: TRL's per-step log keys kept (the reward means are added by name).
STEP_KEYS = ("reward", "reward_std", "frac_reward_zero_std", "completions/mean_length", "completions/clipped_ratio",
             "clip_ratio/region_mean", "entropy", "loss", "step_time")


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def summarize(out: dict) -> dict:
    """Per variant and seed (and ``"all"`` seeds): the numbers notebook 06 quotes, computed from the stored runs.

    Off-policy steps are those that do not generate (every step but each ``steps_per_generation``-th's first)."""
    spg = out["recipe"]["steps_per_generation"]
    headline = out["headline"]
    summary: dict = {}
    for run in out["runs"]:
        steps = run["steps"]
        off = [s["clip_ratio/region_mean"] for s in steps if (s["step"] - 1) % spg and "clip_ratio/region_mean" in s]
        on = [s["clip_ratio/region_mean"] for s in steps if not (s["step"] - 1) % spg and "clip_ratio/region_mean" in s]
        generated = [s for s in steps if "completions/mean_length" in s]
        summary.setdefault(run["variant"], {})[str(run["seed"])] = {
            "start_accuracy": run["eval"][0][headline], "final_accuracy": run["eval"][-1][headline],
            "final_format": run["eval"][-1][out["format_metric"]], "final_mean_length": run["eval"][-1]["mean_length"],
            "offpolicy_clip_mean": round(sum(off) / len(off), 4) if off else None,
            "offpolicy_clip_max": max(off) if off else None, "onpolicy_clip_max": max(on) if on else None,
            "train_length_first": generated[0]["completions/mean_length"] if generated else None,
            "train_length_last": generated[-1]["completions/mean_length"] if generated else None,
            "truncated_mean": round(sum(s["completions/clipped_ratio"] for s in generated) / len(generated), 4)
            if generated else None}
    for variant, seeds in summary.items():
        runs = list(seeds.values())
        finals = [r["final_accuracy"] for r in runs]
        clips = [r["offpolicy_clip_mean"] for r in runs if r["offpolicy_clip_mean"] is not None]
        seeds["all"] = {"final_accuracy_min": min(finals), "final_accuracy_max": max(finals),
                        "final_accuracy_spread": round(max(finals) - min(finals), 4),
                        "offpolicy_clip_mean_min": min(clips, default=None),
                        "offpolicy_clip_mean_max": max(clips, default=None),
                        "offpolicy_clip_max": max((r["offpolicy_clip_max"] or 0.0) for r in runs)}
    return summary


def main() -> int:
    from archive import stamped  # bench/archive.py: the command, commit, date and machine
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="arithmetic")
    ap.add_argument("--profile", default="cpu-demo")
    ap.add_argument("--variants", default="grpo,dr_grpo,dapo,gspo,gspo_seqclip", help=f"from {', '.join(VARIANTS)}")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps per run")
    ap.add_argument("--seeds", default="3407", help="comma-separated; each seed: its own warm-up, every variant")
    ap.add_argument("--steps-per-generation", type=int, default=2)
    ap.add_argument("--eval-rows", type=int, default=50)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--json", default=None, help="also write the JSON here, after every run")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="profile overrides")
    ap.add_argument("--summarize", metavar="JSON", default=None,
                    help="only add the summary to a stored result (e.g. bench/measured/loss_types/loss_types.json), in place")
    args = ap.parse_args()
    if args.summarize:
        stored = json.loads(Path(args.summarize).read_text())
        stored["summary"] = summarize(stored)
        Path(args.summarize).write_text(json.dumps(stored) + "\n")
        print(json.dumps(stored["summary"]))
        return 0
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
    from helpers.training import grpo_config, precision, run_warmup

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
                 "labels": {n: LABELS[n] for n in names},
                 "seeds": [int(s) for s in args.seeds.split(",")], "steps": args.steps,
                 "recipe": {k: getattr(base, k) for k in (
                     "task_level", "warmup_level", "warmup_examples", "num_generations", "max_completion_length",
                     "learning_rate", "lora_rank", "beta", "scale_rewards", "temperature", "epsilon_high",
                     "mask_truncated_completions")}
                 | {"generation_batch": base.per_device_train_batch_size, "steps_per_generation": spg,
                    "per_device_train_batch_size": base.per_device_train_batch_size // spg,
                    "gradient_accumulation_steps": 1, "eval": {"rows": len(held_out), "decoding": "greedy"},
                    "precision": precision(base, None)},
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
            out["runs"].append({"variant": name, "seed": seed, "epsilon": config.epsilon,
                                "epsilon_high": config.epsilon_high, "train_seconds": round(seconds, 1),
                                "seconds_per_step": round(seconds / max(1, len(steps)), 2), "eval": evals,
                                "steps": steps})
            say(f"{name} seed {seed}: {seconds:.0f} s, held-out {evals[-1]}")
            out["seeds_complete"] = [s for s in out["seeds"] if {r["variant"] for r in out["runs"] if r["seed"] == s}
                                     == set(names)]
            out["seconds"] = round(time.time() - t0, 1)
            out["machine"] = {"cpus": os.cpu_count(), "threads": torch.get_num_threads(),
                              "loadavg_1min_start": round(load_start, 2), "loadavg_1min_end": round(os.getloadavg()[0], 2)}
            out["summary"] = summarize(out)
            if args.json:
                Path(args.json).write_text(json.dumps(stamped(out)) + "\n")
    print(json.dumps(stamped(out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

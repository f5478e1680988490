"""One recipe over several seeds, in one or both precisions: how far apart do its runs land, and is bf16 worse?

    python bench/learning_seeds.py [--seeds 3407 1 2] [--precisions bf16 fp32] [--steps 74] [--task arithmetic]
                                   [--set KEY=VALUE ...] [--config KEY=VALUE ...] [--rewards NAME ...]
                                   [--eval-rows 200] [--threads N] [--out DIR] [--include SWEEP.json ...]

Runs ``bench/learning.py`` once per (precision, seed), each for exactly ``--steps`` GRPO steps (no time budget, so
both precisions train the same number of steps whatever their speed; pass@k off; ``--set``, ``--config`` and
``--rewards`` go to every run), and keeps each run's JSON in ``--out`` (a run whose JSON is there already is not
repeated: an interrupted sweep resumes). ``--include`` keeps the runs of earlier sweeps of the same settings (a sweep
finished in parts, on another day or machine): their seeds are not run again, and each run records the CPU it ran on.
Prints ONE JSON object:

    {"task", "steps", "seeds", "set", "eval_rows", "threads", "command", "runs": [{"precision", "seed",
     "after_warmup", "after", "grpo_gain", "format", "seconds_per_step", "train_seconds", "heldout_seconds",
     "eval_rows", "loadavg_1min", "cpu_capability", "heldout_curve", "heldout_rows", "warnings", "history",
     "split_seed"}], "included": [{"file", "command", "seeds"} of each earlier sweep kept],
     "by_precision": {p: {metric: {"mean", "min", "max"}}}, "paired": {metric: [bf16 - fp32 for each seed]}}

Each run's ``history`` is its per-step log (TRL's metrics and the held-out slice, ``helpers.watch`` reads it) and
``heldout_curve`` the held-out slice's accuracy by step; ``split_seed`` the profile's, which drew the rows and the
held-out split (the same for every seed unless ``--set split_seed=...``). The base model is not evaluated
(``--skip-base``).
Not a test: it never gates CI. A 20-step run takes 5-6 minutes on the project's 2-core machine when it is quiet,
two to four times that when other work shares it (each run records its load average).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
METRICS = ("after_warmup", "after", "grpo_gain", "format")


def summary(run: dict) -> dict:
    """The numbers this bench compares, from one ``bench/learning.py`` output."""
    head, fmt = run["headline"], run["format_metric"]
    return {"after_warmup": run["after_warmup"][head] if run["after_warmup"] else None, "after": run["after"][head],
            "grpo_gain": run["grpo_gain"], "format": run["after"][fmt], "steps": run["steps"],
            "seconds_per_step": run["seconds_per_step"], "train_seconds": run.get("train_seconds"),
            "heldout_seconds": run.get("heldout_seconds"), "eval_rows": run["after"].get("n_prompts"),
            "loadavg_1min": [run["machine"].get("loadavg_1min_start"), run["machine"].get("loadavg_1min_end")],
            "cpu_capability": run["machine"].get("cpu_capability"),
            "heldout_curve": run.get("heldout_curve"), "heldout_rows": run.get("heldout_rows"),
            "warnings": run.get("warnings"), "history": run.get("history"),
            "split_seed": run["recipe"].get("split_seed")}  # None: before split_seed, each seed drew its own rows


#: What a sweep given to ``--include`` must share with this one: the same runs, apart from their seeds.
SAME = ("task", "steps", "set", "config", "rewards", "eval_rows")


def included_runs(paths: list[Path], args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """The runs of earlier sweeps of the same settings, and where each came from; SystemExit naming the first
    setting that differs."""
    ours = {"task": args.task, "steps": args.steps, "set": args.set, "config": args.config or None,
            "rewards": args.rewards, "eval_rows": args.eval_rows}
    runs: list[dict] = []
    sources: list[dict] = []
    for path in paths:
        earlier = json.loads(path.read_text())
        for key in SAME:
            if earlier.get(key) != ours[key]:
                raise SystemExit(f"--include {path}: its {key} is {earlier.get(key)!r}, this sweep's {ours[key]!r}. "
                                 "Include only a sweep of the same settings (its 'command' says how it ran).")
        kept = [r for r in earlier["runs"] if r["precision"] in args.precisions]
        runs += kept
        sources.append({"file": str(path), "command": earlier.get("command"), "seeds": [r["seed"] for r in kept]})
    return runs, sources


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[3407, 1, 2])
    ap.add_argument("--precisions", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"])
    ap.add_argument("--steps", type=int, default=74, help="GRPO steps of every run")
    ap.add_argument("--task", default="arithmetic")
    ap.add_argument("--out", type=Path, default=Path("runs") / "learning_seeds")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a profile field for every run")
    ap.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                    help="a GRPOConfig value the profile has no field for, for every run")
    ap.add_argument("--rewards", nargs="+", default=None, metavar="NAME",
                    help="train every run on only these of the task's rewards (bench/learning.py --rewards)")
    ap.add_argument("--eval-rows", type=int, default=200, help="held-out rows of the final evaluations")
    ap.add_argument("--threads", type=int, default=None, help="torch threads of every run (default: all cores)")
    ap.add_argument("--include", type=Path, nargs="+", default=[], metavar="SWEEP.json",
                    help="earlier sweeps of the same settings: their runs are kept and their seeds not run again")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs, sources = included_runs(args.include, args)
    done_before = {(r["precision"], r["seed"]) for r in runs}
    args.seeds = [*dict.fromkeys([*(r["seed"] for r in runs), *args.seeds])]
    for seed in args.seeds:
        for p in args.precisions:
            if (p, seed) in done_before:
                continue
            path = args.out / f"{args.task}-{p}-{seed}.json"
            if not path.is_file() or not path.read_text().strip():
                print(f"[learning_seeds] {p}, seed {seed} -> {path}", file=sys.stderr, flush=True)
                done = subprocess.run([sys.executable, str(HERE / "learning.py"), "--task", args.task,
                                       "--precision", p, "--passk-prompts", "0", "--skip-base",
                                       "--eval-rows", str(args.eval_rows),
                                       *(["--threads", str(args.threads)] if args.threads else []),
                                       "--set", f"max_steps={args.steps}",
                                       "--set", "time_budget_minutes=None", "--set", f"seed={seed}",
                                       *(x for kv in args.set for x in ("--set", kv)),
                                       *(x for kv in args.config for x in ("--config", kv)),
                                       *(["--rewards", *args.rewards] if args.rewards else [])],
                                      stdout=subprocess.PIPE, text=True)
                if done.returncode != 0:
                    print(f"[learning_seeds] {p}, seed {seed} failed (exit {done.returncode})", file=sys.stderr)
                    return done.returncode
                path.write_text(done.stdout)
            runs.append({"precision": p, "seed": seed, **summary(json.loads(path.read_text()))})
    by_precision = {p: {m: {"mean": round(statistics.fmean(vals), 4), "min": min(vals), "max": max(vals)}
                        for m in METRICS if (vals := [r[m] for r in runs if r["precision"] == p and r[m] is not None])}
                    for p in args.precisions}
    paired = {}
    if set(args.precisions) == {"bf16", "fp32"}:
        of = {(r["precision"], r["seed"]): r for r in runs}
        paired = {m: [round(of["bf16", s][m] - of["fp32", s][m], 4) for s in args.seeds] for m in METRICS
                  if all(of[p, s][m] is not None for p in ("bf16", "fp32") for s in args.seeds)}
    from archive import stamped  # bench/archive.py: the command, commit, date and machine
    print(json.dumps(stamped({"task": args.task, "steps": args.steps, "seeds": args.seeds, "set": args.set,
                      **({"config": args.config} if args.config else {}),
                      **({"rewards": args.rewards} if args.rewards else {}),
                      "eval_rows": args.eval_rows, "threads": args.threads,
                      **({"included": sources} if sources else {}),
                      "command": " ".join(["python bench/learning_seeds.py", *sys.argv[1:]]), "runs": runs,
                      "by_precision": by_precision, "paired": paired}), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

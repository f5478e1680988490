"""What do two CPU processes buy? The course's recipe through TRL's own command, 1 process against 2.

    python bench/cpu_processes.py [--profile cpu-smoke] [--steps 5] [--global-batch 4] [--cores 2]

Writes the profile's recipe (``helpers.recipe.write_recipe``) into a temporary run folder and runs
its GRPO step (no warm-up: only GRPO steps are timed) as the README shows it:

* 1 process:   ``trl grpo --config grpo.yaml``, with torch on all ``--cores`` threads, and again on one
  thread (as each rank below),
* 2 processes: ``torchrun --nproc_per_node 2 -m trl.scripts.grpo --config grpo.yaml`` (``--cores / 2``
  threads each: the same cores, shared out),

both at the same global batch (``--global-batch`` completions per step: the per-process batch is
halved for two processes), the same steps, lengths and seed, with checkpoints and the completion log
off. Step times are TRL's own ``step_time`` (generation, rewards, loss and backward of one step) read
from the main process's log; the first step is dropped (one-off costs). Prints ONE JSON object:
median step seconds and completions per second for each, ``speedup`` (1 process on every core / 2
processes, by median step time) and ``speedup_vs_one_thread`` (1 process on one thread / 2 processes). Progress goes to stderr. Not a test.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def step_logs(output: str) -> list[dict]:
    """The per-step metric dicts TRL prints (``{'loss': ..., 'step_time': ...}``), values as floats."""
    rows = []
    for line in output.splitlines():
        line = line.strip()
        if line.startswith("{") and "'step_time'" in line:
            rows.append({k: float(v) for k, v in ast.literal_eval(line).items()})
    return rows


def run(argv: list[str], threads: int, cwd: Path) -> tuple[list[dict], float]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return step_logs(done.stdout + done.stderr), wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="cpu-smoke")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--cores", type=int, default=2)
    args = ap.parse_args()

    from helpers.profiles import get_profile
    from helpers.recipe import write_recipe

    say = lambda msg: print(f"[bench/cpu_processes] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    profile = get_profile(args.profile)
    if args.global_batch % 2 or args.global_batch % profile.num_generations:
        raise SystemExit(f"--global-batch {args.global_batch} must be even and a multiple of num_generations "
                         f"({profile.num_generations}).")
    run_dir = Path(tempfile.mkdtemp(prefix="bench-cpu-processes-"))
    recipe = write_recipe(profile, run_dir)
    common = ["--config", str(recipe.grpo), "--model_name_or_path", str(recipe.model), "--max_steps", str(args.steps),
              "--save_strategy", "no", "--log_completions", "false"]
    one = [str(BIN / "trl"), "grpo", *common, "--per_device_train_batch_size", str(args.global_batch)]
    two = [str(BIN / "torchrun"), "--nproc_per_node", "2", "-m", "trl.scripts.grpo", *common,
           "--per_device_train_batch_size", str(args.global_batch // 2)]
    sides = {  # name: (command, torch threads per process)
        "processes_1": (one, args.cores),                      # one process on every core
        "processes_1_one_thread": (one, 1),                   # one process, one thread: as each rank below
        "processes_2": (two, max(1, args.cores // 2)),        # two ranks sharing the cores
    }
    out: dict = {"profile": profile.name, "global_batch": args.global_batch,
                 "num_generations": profile.num_generations, "max_completion_length": profile.max_completion_length,
                 "steps": args.steps, "steps_timed": args.steps - 1, "cores": args.cores,
                 "cpu_count": os.cpu_count()}
    for side, (argv, threads) in sides.items():
        say(f"{side}, {threads} thread(s) each: {' '.join(argv[:4])} ...")
        logs, wall = run(argv, threads, run_dir)
        if len(logs) != args.steps:
            raise SystemExit(f"expected {args.steps} logged steps, found {len(logs)}")
        steps = [round(r["step_time"], 3) for r in logs[1:]]
        median = statistics.median(steps)
        out[side] = {
            "threads_per_process": threads, "median_step_s": round(median, 3),
            "completions_per_s": round(args.global_batch / median, 3), "step_times_s": steps,
            "wall_s_with_model_load": round(wall, 1)}
    out["speedup"] = round(out["processes_1"]["median_step_s"] / out["processes_2"]["median_step_s"], 2)
    out["speedup_vs_one_thread"] = round(out["processes_1_one_thread"]["median_step_s"]
                                         / out["processes_2"]["median_step_s"], 2)
    out["loadavg_1min_end"] = round(os.getloadavg()[0], 2)
    from archive import stamped  # bench/archive.py: the command, commit, date and machine
    print(json.dumps(stamped(out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Is the pre-flight's verdict right? Notebook 03's pre-flight at the start of runs whose outcome is known.

    python bench/readiness.py [--only NAME ...] [--groups 8] [--threads 1] [--verify] [--out runs/readiness]

For each case below, the same starting point as the stored run (``bench/learning.py``'s: the profile with the run's
``--set`` values and seed, the bundled model, notebook 03's warm-up through ``helpers.training.run_warmup``), then
only the pre-flight (``helpers.readiness.check``): its figures and verdict beside the stored run's GRPO gain
(``bench/measured/<family>/<file>``, found by its name: ``bench.archive``). ``--verify`` also scores the warmed model on the stored run's held-out rows (greedy) and
records it beside the stored ``after_warmup``: the same starting point, reproduced. Cases with no stored run (``new``)
run ``bench/learning.py`` whole, which records the pre-flight in its JSON. Each case's result is kept in ``--out``
(an interrupted validation resumes). A run *learned* when GRPO's gain on the headline is at least ``LEARNED``; the
verdict *hits* when it says go to a run that learned or fix first to one that did not. Prints ONE JSON object:

    {"command", "commands" (every part of a validation run in parts), "commit", "date", "cpu", "groups", "learned_min", "runs": [{"name", "family", "seed", "set", "stored",
     "outcome": {"grpo_gain", "after_warmup", "after", "steps", "warnings"}, "readiness": {"figures", "verdict",
     "plan", "seconds", "budget_share"}, "verified": {...} | null, "learned", "hit"}], "hits", "hit_rate",
     "missed": [names], "first_rule_hits"}

The verdict is decided again, by the rule as it is now, from each case's stored figures and plan (``decide`` is pure);
``first_rule`` is the verdict of the rule as first written, which counted cut completions against a run whether or not
the loss masks them (the same runs: not an independent test of the rule that replaced it).

Not a test: it never gates CI. CPU-bound: run it niced, one at a time.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from bench import archive  # noqa: E402 - after the project is on the path
from bench.record import commit, cpu_name, stamp  # noqa: E402
LEARNED = 0.05  #: a GRPO gain on the headline of at least this much (5 points) counts as "learned"

#: The recipe of the runs before split_seed (learning rate 3e-4, 20 steps, each seed its own rows and split).
OLD = {"learning_rate": 3e-4, "max_steps": 20}
CASES = [
    *[dict(name=f"recipe, seed {s}", family="the recipe (cpu-demo)", seed=s, set={},
           stored=("learning_seeds_lr1e4_30_split3407.json", s)) for s in (3407, 1)],
    *[dict(name=f"groups of 4, seed {s}", family="groups of 4, lr 3e-4", seed=s,
           set={**OLD, "num_generations": 4, "split_seed": s, "eval_rows": 100}, stored=("learning_seeds_ng4.json", s))
      for s in (3407, 1)],
    dict(name="no warm-up, 32 tokens", family="no warm-up", seed=3407,
         set={**OLD, "warmup_examples": 0, "mask_truncated_completions": True, "eval_rows": 20, "max_steps": 8},
         stored=("history_trunc.json", None)),
    dict(name="no warm-up, 20 tokens", family="no warm-up", seed=3407,
         set={**OLD, "warmup_examples": 0, "mask_truncated_completions": True, "max_completion_length": 20,
              "eval_rows": 20, "max_steps": 6}, stored=("history_trunc20.json", None)),
    dict(name="learning rate 1e-3", family="a learning rate that collapses", seed=3407,
         set={**OLD, "learning_rate": 1e-3, "eval_rows": 100}, stored=("history_lr1e3.json", None)),
    *[dict(name=f"warm-up on add2, seed {s}", family="warm-up on the training level", seed=s,
           set={"warmup_level": "add2"}, stored=("learning_seeds_wuadd2_30.json", s)) for s in (3407,)],
    *[dict(name=f"{how} level {level}", family="easy and hard levels (20 steps)", seed=3407,
           set={"task_level": level, "eval_rows": 100, "max_steps": 20, **rows}, stored=None)
      for how, level, rows in (("easy", "add2-small", {"train_rows": 250}), ("hard", "mixed", {}))],
]


def stored_outcome(file: str, seed: int | None) -> dict:
    """The stored run's GRPO outcome: one run of a ``learning_seeds`` sweep (by seed) or a ``bench/learning.py`` JSON."""
    data = archive.load(file)
    if "runs" in data:
        run = next(r for r in data["runs"] if r["seed"] == seed)
        return {k: run.get(k) for k in ("grpo_gain", "after_warmup", "after", "steps", "warnings")}
    head = data["headline"]
    return {"grpo_gain": data["grpo_gain"], "after_warmup": (data["after_warmup"] or {}).get(head),
            "after": data["after"][head], "steps": data["steps"], "warnings": data["warnings"]}


def pre_flight(case: dict, groups: int, verify: bool) -> dict:
    """The stored run's starting point rebuilt as ``bench/learning.py`` builds it, then the pre-flight alone."""
    from helpers.data import ensure_prepared
    from helpers.evaluation import eval_settings, evaluate
    from helpers.models import load_model
    from helpers.profiles import get_model_spec, get_profile
    from helpers.readiness import check, decide, summarize
    from helpers.tasks import get_task
    from helpers.training import run_warmup
    profile = get_profile("cpu-demo", seed=case["seed"], time_budget_minutes=None, **case["set"])
    model, tok = load_model(profile)
    with tempfile.TemporaryDirectory(prefix="bench-readiness-") as run, contextlib.redirect_stdout(sys.stderr):
        data = ensure_prepared(profile, run, tokenizer=tok, verbose=False)
        warm = run_warmup(model, tok, profile, run) if profile.warmup_examples else None
        t = time.time()
        report = check(model, tok, profile, rows=data["train"], groups=groups, warmup_seconds=warm and warm["seconds"])
        seconds = time.time() - t
        f, task = report.figures, get_task(profile.task)
        fewer = {}  # the same completions, only the first n groups: is a smaller pre-flight enough?
        for n in (2, 4):
            part = summarize(report.completions[:n * f.group_size], f.group_size, f.limit, f.masked, f.temperature,
                             f.probe_limit, task)
            fewer[str(n)] = decide(part, report.plan).verdict
        verified = None
        if verify:
            res = evaluate(model, tok, data["eval"], task, eval_settings(profile),
                           chat_template_kwargs=get_model_spec(profile.model).chat_template_kwargs)
            verified = {"after_warmup": res["summary"][task.headline], "eval_rows": data["eval"].num_rows}
    budget = 6 * 60  # cpu-demo's time budget, which covers the warm-up and GRPO
    return {"readiness": {**report.to_dict(), "seconds": round(seconds, 1), "budget_share": round(seconds / budget, 4),
                          "fewer_groups": fewer}, "verified": verified}


def new_run(case: dict, groups: int, threads: int | None, out: Path) -> dict:
    """``bench/learning.py`` whole (the recipe's 30 steps unless the case sets others, no time budget), its pre-flight
    and its outcome."""
    sets = {"max_steps": 30, "time_budget_minutes": None, "seed": case["seed"], **case["set"]}
    eval_rows = sets.pop("eval_rows", 200)
    done = subprocess.run([sys.executable, str(HERE / "learning.py"), "--skip-base", "--passk-prompts", "0",
                           "--eval-rows", str(eval_rows), "--preflight-groups", str(groups),
                           *(["--threads", str(threads)] if threads else []),
                           *(x for k, v in sets.items() for x in ("--set", f"{k}={v}"))],
                          stdout=subprocess.PIPE, text=True, check=True)
    result = json.loads(done.stdout)
    (out / f"learning-{case['name'].replace(' ', '_').replace(',', '')}.json").write_text(done.stdout)
    head = result["headline"]
    return {"readiness": result["readiness"], "verified": None,
            "outcome": {"grpo_gain": result["grpo_gain"], "after_warmup": result["after_warmup"][head],
                        "after": result["after"][head], "steps": result["steps"], "warnings": result["warnings"],
                        "seconds_per_step": result["seconds_per_step"]}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", default=None, metavar="NAME", help="cases whose name starts with one of these")
    ap.add_argument("--groups", type=int, default=8, help="training prompts the pre-flight samples, a group each")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--verify", action="store_true", help="score the warmed model on the stored run's held-out rows")
    ap.add_argument("--out", type=Path, default=Path("runs") / "readiness")
    args = ap.parse_args()
    import torch

    from helpers.readiness import Figures, Plan, decide
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python bench/readiness.py", *sys.argv[1:]])
    with (args.out / "commands.txt").open("a") as log:  # a validation run in parts: every part's command
        log.write(command + "\n")
    runs, first_hits = [], 0
    for case in CASES:
        if args.only and not any(case["name"].startswith(o) for o in args.only):
            continue
        path = args.out / f"{case['name'].replace(' ', '_').replace(',', '')}-g{args.groups}.json"
        if not path.is_file():
            print(f"[readiness] {case['name']}", file=sys.stderr, flush=True)
            if case["stored"] is None:
                result = new_run(case, args.groups, args.threads, args.out)
            else:
                result = {**pre_flight(case, args.groups, args.verify), "outcome": stored_outcome(*case["stored"])}
            path.write_text(json.dumps(result))
        result = json.loads(path.read_text())
        ready = result["readiness"]
        figures, plan = Figures(**ready["figures"]), Plan(**ready["plan"])
        ready["verdict"] = dataclasses.asdict(decide(figures, plan))  # the rule as it is now, on the stored figures
        # the rule as first written counted cut completions whether or not the loss masks them
        ready["first_rule"] = decide(dataclasses.replace(figures, masked=True), plan).verdict
        if "fewer_groups" in ready:  # computed, when the case ran, with the first rule
            ready["fewer_groups_first_rule"] = ready.pop("fewer_groups")
        learned = result["outcome"]["grpo_gain"] >= LEARNED
        hit = (ready["verdict"]["verdict"] == "go") == learned
        first_hits += (ready["first_rule"] == "go") == learned
        runs.append({"name": case["name"], "family": case["family"], "seed": case["seed"], "set": case["set"],
                     "stored": case["stored"] and str(archive.path(case["stored"][0]).relative_to(HERE.parent)), **result,
                     "learned": learned, "hit": hit})
    made_at = commit()
    if subprocess.run(["git", "status", "--porcelain", "--", "readiness.py", "../helpers/readiness.py"],
                      capture_output=True, text=True, cwd=HERE).stdout.strip():
        made_at += " + this script and helpers/readiness.py uncommitted"
    hits = sum(r["hit"] for r in runs)
    print(json.dumps({"command": command, "commands": (args.out / "commands.txt").read_text().splitlines(),
                      "commit": made_at, "date": stamp(utc=True),
                      "cpu": {"model": cpu_name(), "cores": os.cpu_count(),
                              "amx": "amx_tile" in Path("/proc/cpuinfo").read_text(),
                              "capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()},
                      "groups": args.groups, "learned_min": LEARNED, "runs": runs, "hits": hits,
                      "hit_rate": round(hits / max(1, len(runs)), 3),
                      "missed": [r["name"] for r in runs if not r["hit"]], "first_rule_hits": first_hits},
                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Score the GRPO checkpoints a ``bench/learning.py`` run left, on that run's own held-out sums, as it scored its end.

    python bench/checkpoints.py RUN_JSON [RUN_JSON ...] --steps 30 40 [--threads 1] [--held-out-of RUN_JSON]

``RUN_JSON`` is a run's ``bench/learning.py`` output (``bench/learning_seeds.py`` keeps one per seed in its ``--out``);
its ``run`` folder must still hold ``grpo/checkpoint-STEP`` and ``dataset``. With a constant learning rate the
checkpoint at step 30 of a 40-step run is where a 30-step run of the same seed stands (the schedule does not depend on
``max_steps``), so this reads a shorter recipe off a longer one without training again: the 30-step runs of
``learning_seeds_lr1e4_30.json`` ended where ``checkpoints_lr1e4_40.json`` scored the same seeds' step-30 checkpoints,
on every seed (one thread a run).

``--held-out-of OTHER_JSON`` scores every checkpoint on OTHER's held-out sums instead of its own: each seed draws its
own 200, so this separates how hard a seed's sums are from how well its run trained. The rows a run saw while
training (its ``grpo/completions`` logs) are left out of its score and counted (``seen_left_out``). Prints ONE JSON
object:

    {"command", "held_out_of", "runs": [{"seed", "step", "rows", "seen_left_out", "accuracy", "format"}],
     "by_step": {step: {"mean", "min", "max"}}}

Not a test: it never gates CI. Scoring one checkpoint on 200 sums takes about a minute on one thread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def seen_questions(completions: Path) -> set[str]:
    """The user turns of every prompt a GRPO run sampled (TRL's ``log_completions`` parquet files)."""
    import pandas as pd

    files = sorted(completions.glob("completions_*.parquet"))
    if not files:
        raise SystemExit(f"{completions} holds no completions_*.parquet: the run did not log its completions, so "
                         "the sums it trained on cannot be left out; score its own held-out sums (no --held-out-of)")
    prompts = pd.concat([pd.read_parquet(f, columns=["prompt"]) for f in files])["prompt"]
    return {p.split("\nuser\n", 1)[1].split("\nassistant\n", 1)[0] for p in prompts.unique()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="bench/learning.py JSON files")
    ap.add_argument("--steps", nargs="+", type=int, required=True, help="checkpoint steps to score")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--held-out-of", type=Path, default=None, metavar="RUN_JSON",
                    help="score on this run's held-out sums instead of each run's own")
    args = ap.parse_args()

    import torch
    from datasets import load_from_disk

    from helpers.evaluation import eval_settings, evaluate
    from helpers.models import load_model
    from helpers.profiles import get_model_spec, get_profile
    from helpers.tasks import get_task

    if args.threads:
        torch.set_num_threads(args.threads)
    scored, headline = [], "accuracy"
    other, other_seed = None, None
    if args.held_out_of:
        of = json.loads(args.held_out_of.read_text())
        other, other_seed = load_from_disk(str(Path(of["run"]) / "dataset"))["eval"], of["recipe"]["seed"]
    for path in args.runs:
        out = json.loads(path.read_text())
        run, recipe = Path(out["run"]), out["recipe"]
        missing = [s for s in args.steps if not (run / "grpo" / f"checkpoint-{s}").is_dir()]
        if missing:
            raise SystemExit(f"{path}: its run folder {run} holds no checkpoint for step(s) {missing}; score the "
                             "steps its save_steps kept (ls RUN/grpo), or train again with a smaller save_steps and "
                             "--config save_total_limit=N (the course keeps only the newest checkpoint)")
        profile = get_profile("cpu-demo", task=out["task"], seed=recipe["seed"], check=False,
                              max_completion_length=recipe["max_completion_length"])
        task, kwargs = get_task(profile.task), get_model_spec(profile.model).chat_template_kwargs
        headline = task.headline
        if other is None:
            held_out, seen_left_out = load_from_disk(str(run / "dataset"))["eval"], 0
        else:
            seen = seen_questions(run / "grpo" / "completions")
            held_out = other.filter(lambda row: row["question"] not in seen)
            seen_left_out = other.num_rows - held_out.num_rows
        for step in args.steps:
            model, tok = load_model(profile, adapter=run / "grpo" / f"checkpoint-{step}")
            summary = evaluate(model, tok, held_out, task, eval_settings(profile),
                               chat_template_kwargs=kwargs)["summary"]
            scored.append({"seed": recipe["seed"], "step": step, "rows": held_out.num_rows,
                           **({"seen_left_out": seen_left_out} if other is not None else {}),
                           task.headline: round(summary[task.headline], 4),
                           task.format_metric: round(summary[task.format_metric], 4)})
            print(f"[bench/checkpoints] seed {recipe['seed']}, step {step}: {task.headline} "
                  f"{summary[task.headline]:.3f}", file=sys.stderr, flush=True)
    by_step = {str(s): {"mean": round(statistics.fmean(v), 4), "min": min(v), "max": max(v)}
               for s in args.steps if (v := [r[headline] for r in scored if r["step"] == s])}
    from archive import stamped  # bench/archive.py: the command, commit, date and machine
    print(json.dumps(stamped({"command": "python bench/checkpoints.py " + " ".join(sys.argv[1:]),
                      **({"held_out_of": other_seed} if other is not None else {}),
                      "runs": scored, "by_step": by_step}), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

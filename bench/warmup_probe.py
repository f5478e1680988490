"""What does the warm-up alone give? Held-out accuracy after ``cpu-demo``'s warm-up, no GRPO (issue 37's probe).

    python bench/warmup_probe.py TASK SEED [EVAL_ROWS] [FIELD=VALUE ...]
    python bench/warmup_probe.py worked_sums:WorkedSums 3407 200 warmup_epochs=4

Runs notebook 03's warm-up (``helpers.training.run_warmup``) for the task on one thread and scores the profile's
held-out sums greedily (``helpers.evaluation.evaluate``). ``bench/worked_sums.py`` holds two variants of the sums;
``FIELD=VALUE`` overrides a profile field. Prints ONE JSON object: {"task", "seed", "warmup_level", "max_len",
"summary", "warmup", "ref_tokens", "overlap_warmup_heldout" (warm-up questions among the held-out ones), "seconds",
"wrong": [[answer, completion] of the first 10 wrong rows]}. Not a test: it never gates CI.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

task_key, seed = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
from helpers.data import ensure_prepared  # noqa: E402 - after the thread count
from helpers.evaluation import eval_settings, evaluate  # noqa: E402
from helpers.models import load_model  # noqa: E402
from helpers.profiles import get_model_spec, get_profile  # noqa: E402
from helpers.tasks import get_task  # noqa: E402
from helpers.training import run_warmup  # noqa: E402

fields = {k: eval(v) for k, v in (a.split("=", 1) for a in sys.argv[4:])}  # noqa: S307 - the command line's numbers
profile = get_profile("cpu-demo", task=task_key, seed=seed, eval_rows=int(sys.argv[3]) if len(sys.argv) > 3 else 200,
                      **fields)
task = get_task(profile.task)
run = Path(tempfile.mkdtemp(prefix="probe-"))
model, tok = load_model(profile, bf16=False)
with contextlib.redirect_stdout(sys.stderr):
    held = ensure_prepared(profile, run, tokenizer=tok, verbose=False)["eval"]
    warm_q = {r["question"] for r in task.make_rows(profile.warmup_level, profile.warmup_examples, profile.seed + 1)}
    overlap = sum(q in warm_q for q in held["question"]) if "question" in held.column_names else None
    t = time.time()
    w = run_warmup(model, tok, profile, run)
    res = evaluate(model, tok, held, task, eval_settings(profile),
                   chat_template_kwargs=get_model_spec(profile.model).chat_template_kwargs)
lens = [len(tok(task.reference(r))["input_ids"]) for r in task.make_rows(profile.warmup_level, 4, 0)]
from archive import stamped  # bench/archive.py: the command, commit, date and machine
print(json.dumps(stamped({"task": task_key, "seed": seed, "warmup_level": profile.warmup_level,
                  "max_len": profile.max_completion_length,
                  "summary": {k: v for k, v in res["summary"].items() if k != "rewards"}, "warmup": w,
                  "ref_tokens": lens, "overlap_warmup_heldout": overlap, "seconds": round(time.time() - t),
                  "wrong": [(r["answer"], r["completion"]) for r in res["rows"] if not r["accuracy"]][:10]})))

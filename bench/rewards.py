"""Reward throughput, and TRL's math-verify reward on pathological answers.

    python bench/rewards.py [--n 10000] [--batch 8] [--math-verify-n 2000]

Builds ``--n`` realistic completions for the course's tasks (well formatted
and right, wrong numbers, prefilled, missing or repeated tags, rambling and
truncated text, LaTeX answers; GSM8K-length reasoning from the real GSM8K
solutions when ``../shared/data/gsm8k`` or ``COURSE_GSM8K_DIR`` exists,
synthetic otherwise) and times every reward on them, called the way TRL
calls it (one call per group of ``--batch`` completions, conversational).
TRL's ``accuracy_reward`` (math-verify) is slower, so it is timed on the first
``--math-verify-n`` completions, then on pathological answers (power towers,
deep nesting) to show how long its own time limits let one completion take.

Prints one JSON object to stdout; progress goes to stderr. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _gsm8k_solutions(limit: int = 2000) -> list[tuple[str, str]]:
    cands = [os.environ.get("COURSE_GSM8K_DIR", ""), str(ROOT.parent / "shared" / "data" / "gsm8k")]
    for c in cands:
        f = Path(c) / "train.jsonl" if c else None
        if f is not None and f.is_file():
            out = []
            with f.open() as fh:
                for line in fh:
                    row = json.loads(line)
                    sol, _, ans = row["answer"].rpartition("####")
                    out.append((re.sub(r"<<[^>]*>>", "", sol).strip(), ans.strip().replace(",", "")))
                    if len(out) >= limit:
                        break
            return out
    return []


def build_completions(n: int, seed: int = 0) -> tuple[list[str], list[str], list[list[int]], list, str]:
    """``(completions, answers, fake completion_ids, prompts, source)``."""
    from helpers.tasks.arithmetic import generate_arithmetic

    rng = random.Random(seed)
    arith = generate_arithmetic(500, "add2", seed=seed)
    gsm = _gsm8k_solutions()
    source = "gsm8k+arithmetic" if gsm else "arithmetic (GSM8K files not found)"
    plain = [{"role": "user", "content": "q"}]
    comps, answers, ids, prompts = [], [], [], []
    for i in range(n):
        if gsm and rng.random() < 0.4:
            sol, ans = gsm[rng.randrange(len(gsm))]
        else:
            row = arith[rng.randrange(len(arith))]
            sol, ans = row["solution"], row["answer"]
        shown = ans if rng.random() < 0.6 else str(int(float(ans)) + rng.choice([-1, 1, 10]))
        kind = rng.choice(["good", "good", "prefilled", "inline", "no_tags", "truncated", "ramble",
                           "repeat_tags", "latex", "trailing"])
        prompt = plain
        if kind == "good":
            c = f"<reasoning>\n{sol}\n</reasoning>\n<answer>\n{shown}\n</answer>"
        elif kind == "prefilled":
            c = f"{sol}\n</reasoning>\n<answer>\n{shown}\n</answer>"  # the template prefilled the tag
        elif kind == "inline":
            c = f"<reasoning>{sol}</reasoning><answer>{shown}</answer>"
        elif kind == "no_tags":
            c = f"{sol} So the answer is {shown}."
        elif kind == "truncated":
            c = f"<reasoning>\n{sol}"[: rng.randint(5, 200)]
        elif kind == "ramble":
            c = f"<reasoning>\n{sol}\n" + " ".join(["Let me check again."] * rng.randint(5, 40))
        elif kind == "repeat_tags":
            c = f"<reasoning>\n{sol}\n</reasoning>\n<answer>\n{shown}\n</answer>" * rng.randint(2, 4)
        elif kind == "latex":
            c = f"<reasoning>\n{sol}\n</reasoning>\n<answer>\n$\\boxed{{{shown}}}$\n</answer>"
        else:
            c = f"<reasoning>\n{sol}\n</reasoning>\n<answer>\n{shown}\n</answer>\nI hope this helps! " * 1
        comps.append(c)
        answers.append(ans)
        ids.append(list(range(max(1, len(c) // 4))))  # ~4 characters per token
        prompts.append(prompt)
    return comps, answers, ids, prompts, source


def throughput(func, comps, answers, ids, prompts, batch: int) -> dict:
    n = len(comps)
    start = time.perf_counter()
    for s in range(0, n, batch):
        func(prompts=prompts[s : s + batch], completions=comps[s : s + batch],
             completion_ids=ids[s : s + batch], answer=answers[s : s + batch])
    sec = time.perf_counter() - start
    return {"completions_per_s": round(n / sec, 1), "n": n, "seconds": round(sec, 3)}


PATHOLOGICAL = ["9**9**9**9", "9^{9^{9^{9}}}", "\\frac{" * 40 + "1" + "}{2}" * 40]


def trl_accuracy_worst_case() -> dict:
    """TRL's own accuracy_reward (math-verify, with its main-thread time limits) on pathological answers."""
    from trl.rewards import accuracy_reward

    per = []
    for text in PATHOLOGICAL:
        t0 = time.perf_counter()
        accuracy_reward([[{"role": "assistant", "content": f"\\boxed{{{text}}}"}]], solution=["18"])
        per.append(time.perf_counter() - t0)
    worst = max(range(len(per)), key=per.__getitem__)
    return {"worst_seconds": round(per[worst], 3), "worst_input": PATHOLOGICAL[worst][:40], "n": len(per)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--math-verify-n", type=int, default=2000)
    args = ap.parse_args()

    from trl.rewards import accuracy_reward, get_repetition_penalty_reward, get_soft_overlong_punishment

    from helpers.tasks import reasoning as R

    log(f"building {args.n} completions")
    comps, answers, ids, prompts, source = build_completions(args.n)
    comps = [[{"role": "assistant", "content": c}] for c in comps]  # what TRL hands over with chat prompts
    funcs = [
        R.strict_format_reward, R.soft_format_reward, R.xmlcount_reward, R.correctness_reward,
        R.numeric_answer_reward, R.partial_correctness_reward, R.prefilled_strict_format_reward,
        get_repetition_penalty_reward(),
        get_soft_overlong_punishment(256, 64),
    ]
    result: dict = {"n_completions": args.n, "batch": args.batch, "source": source,
                    "mean_chars": round(sum(len(c[0]["content"]) for c in comps) / len(comps), 1), "throughput": {}}
    for f in funcs:
        log(f"timing {f.__name__}")
        result["throughput"][f.__name__] = throughput(f, comps, answers, ids, prompts, args.batch)
    m = min(args.math_verify_n, args.n)
    log(f"timing trl accuracy_reward on {m}")
    accuracy_reward(comps[:1], solution=answers[:1])  # import + warm-up, not timed
    start = time.perf_counter()
    for s in range(0, m, args.batch):
        accuracy_reward(comps[s:s + args.batch], solution=answers[s:s + args.batch])
    sec = time.perf_counter() - start
    result["throughput"]["trl_accuracy_reward"] = {"completions_per_s": round(m / sec, 1), "n": m,
                                                   "seconds": round(sec, 3)}
    log("trl accuracy_reward on pathological answers")
    result["trl_accuracy_reward_worst_case"] = trl_accuracy_worst_case()
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    from archive import stamped  # bench/archive.py: the command, commit, date and machine
    print(json.dumps(stamped(result)))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())

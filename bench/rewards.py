"""Reward throughput, and math-verify's worst case with the guard on.

    python bench/rewards.py [--n 10000] [--batch 8] [--math-verify-n 2000]

Builds ``--n`` realistic completions for the course's tasks (well formatted
and right, wrong numbers, prefilled, missing or repeated tags, rambling and
truncated text, LaTeX answers; GSM8K-length reasoning from the real GSM8K
solutions when ``../shared/data/gsm8k`` or ``COURSE_GSM8K_DIR`` exists,
synthetic otherwise) and times every reward on them, called the way TRL
calls it (one call per group of ``--batch`` completions). math-verify is
slower, so it is timed on the first ``--math-verify-n`` completions.

Then it feeds math-verify pathological answers (power towers, huge
factorials, deep nesting, very long answers) with the guard on, in the main
thread (SIGALRM timer) and in a worker thread (killable child process),
both with the pattern screen on and with it off, and reports the worst
seconds per completion.

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
import threading
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
    from helpers.tasks import generate_arithmetic

    rng = random.Random(seed)
    arith = generate_arithmetic(500, "add2", seed=seed)
    gsm = _gsm8k_solutions()
    source = "gsm8k+arithmetic" if gsm else "arithmetic (GSM8K files not found)"
    prefilled = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<reasoning>\n"}]
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
            c, prompt = f"{sol}\n</reasoning>\n<answer>\n{shown}\n</answer>", prefilled
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


PATHOLOGICAL = [
    "9**9**9**9", "9^{9^{9^{9}}}", "2**(2**(2**20))", "99999999999999999999^99999999999999999",
    "10^{10^{10}}", "1000000000!", "(" * 300 + "1" + ")" * 300, "1+" * 140 + "1",
    "\\frac{" * 40 + "1" + "}{2}" * 40, "x" * 5000, "1" * 5000, "\\sqrt{" * 50 + "2" + "}" * 50,
]


def worst_case(screen: bool, threaded: bool, time_limit: float) -> dict:
    import helpers.rewards as R

    saved = R._DANGEROUS
    if not screen:
        R._DANGEROUS = re.compile(r"(?!x)x")  # matches nothing: everything reaches math-verify
    mv = R.get_math_verify_reward(time_limit=time_limit)
    per = []

    def run() -> None:
        mv(completions=["<answer>1</answer>"], answer=["1"])  # warm-up / worker start, not timed
        for text in PATHOLOGICAL:
            t0 = time.perf_counter()
            mv(completions=[f"<answer>{text}</answer>"], answer=["18"])
            per.append(time.perf_counter() - t0)

    try:
        if threaded:
            th = threading.Thread(target=run)
            th.start()
            th.join()
        else:
            run()
    finally:
        R._DANGEROUS = saved
        mv.worker.close()
    worst = max(range(len(per)), key=per.__getitem__)
    return {"worst_seconds": round(per[worst], 3), "worst_input": PATHOLOGICAL[worst][:40],
            "mean_seconds": round(sum(per) / len(per), 3), "n": len(per), "stats": dict(mv.stats)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--math-verify-n", type=int, default=2000)
    ap.add_argument("--time-limit", type=float, default=1.0)
    args = ap.parse_args()

    from helpers import rewards as R

    log(f"building {args.n} completions")
    comps, answers, ids, prompts, source = build_completions(args.n)
    funcs = [
        R.strict_format_reward, R.soft_format_reward, R.xmlcount_reward, R.correctness_reward,
        R.numeric_answer_reward, R.partial_correctness_reward, R.get_prefilled_format_reward(),
        R.get_target_length_reward(200, unit="tokens"), R.get_repetition_penalty_reward(),
        R.get_soft_overlong_punishment_reward(256, 64),
    ]
    result: dict = {"n_completions": args.n, "batch": args.batch, "source": source,
                    "mean_chars": round(sum(map(len, comps)) / len(comps), 1), "throughput": {}}
    for f in funcs:
        log(f"timing {f.__name__}")
        result["throughput"][f.__name__] = throughput(f, comps, answers, ids, prompts, args.batch)
    m = min(args.math_verify_n, args.n)
    log(f"timing math_verify_reward on {m}")
    mv = R.get_math_verify_reward(time_limit=args.time_limit)
    mv(completions=["<answer>1</answer>"], answer=["1"])  # import + warm-up, not timed
    result["throughput"]["math_verify_reward"] = throughput(mv, comps[:m], answers[:m], ids[:m], prompts[:m],
                                                            args.batch)
    result["throughput"]["math_verify_reward"]["guard_stats"] = dict(mv.stats)
    result["math_verify_worst_case"] = {"time_limit_s": args.time_limit}
    for screen in (True, False):
        for threaded in (False, True):
            key = f"{'main' if not threaded else 'thread'}_screen_{'on' if screen else 'off'}"
            log(f"math-verify worst case: {key}")
            result["math_verify_worst_case"][key] = worst_case(screen, threaded, args.time_limit)
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())

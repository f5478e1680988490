"""The LLM judge of notebook 08, measured: notebook 08 itself, run headless on a profile, and what it found.

    python bench/judge.py [--profile cpu-demo] [--json PATH]
    python bench/judge.py --agreement RUN [--prompts 100] [--json PATH]

Runs ``notebooks/08_rewards_from_a_model.ipynb`` top to bottom with nbclient (``tools/course.py``'s runner) in a fresh
run folder, on the profile given (the bundled 135M model as the judge, behind llama.cpp's server on 127.0.0.1), and
reads back the results the notebook's last cell writes (``RUN/judge/judge_results.json``). Prints ONE JSON object:

    {"command", "commit", "date", "machine": {cpu, cpus, loadavg}, "profile", "notebook_minutes", "steps",
     "agreement": {side: {n, answered, agreement, kappa, false_yes, false_no}, "all": {...}},
     "runs": {"verifier" | "judge" | "rubric": {accuracy, judge_score, seconds, seconds_per_step, judge_share,
              history}}, "async_ratio", "async_seconds": {"4": s, "1": s}, "samples": {side: {correct, format, ...}},
     "hacked": [the judge's run's wrong held-out answers it scored highest], "fault": [per step of section 7's run],
     "resumed": [per step: the rewards logged, after resuming with the verifier only]}

``judge_share``: the median over steps of the judge's wall time within the step (its ``judge/seconds`` metric) over
TRL's ``step_time``. Not a test: it never gates CI.

``--agreement RUN`` measures the judge against the verifier only, on a finished run folder of the course (its
``dataset``, ``merged`` tokenizer and ``gguf/model-f16.gguf``, as notebook 04 and ``bench/serve.py`` leave them): the
held-out prompts answered by llama.cpp with the bundled GGUF (the base model, sampled) and with the run's GGUF (the
trained model, greedy and sampled), every answer judged through the server as notebook 08 judges them; agreement per
side, by format and by length. The JSON says ``complete: false`` and names what this mode does not measure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.record import commit, load, machine, stamp  # noqa: E402 - after the project is on the path

NOTEBOOK = ROOT / "notebooks" / "08_rewards_from_a_model.ipynb"


def step_figures(history: list[dict]) -> dict:
    """Seconds per step (median of TRL's ``step_time``) and the judge's median share of a step."""
    times = [h["step_time"] for h in history if h.get("step_time")]
    shares = [(h.get("judge/seconds") or 0.0) / h["step_time"] for h in history if h.get("step_time")]
    return {"seconds_per_step": round(statistics.median(times), 2) if times else None,
            "judge_share": round(statistics.median(shares), 3) if shares else None}


def agreement_only(run: Path, profile_name: str, n: int) -> dict:
    """The judge against the verifier on the base and trained models' answers to ``n`` held-out prompts of ``run``."""
    import asyncio

    from transformers import AutoTokenizer

    from helpers.data import ensure_prepared, records
    from helpers.export import bundled_gguf
    from helpers.judge import agreement, judge_reward
    from helpers.profiles import get_profile
    from helpers.prompts import render
    from helpers.serve import llama_server, load_llama
    from helpers.tasks import get_task

    profile = get_profile(profile_name)
    task, tok = get_task(profile.task), AutoTokenizer.from_pretrained(str(run / "merged"))
    rows = records(ensure_prepared(profile, run, tokenizer=tok, verbose=False)["eval"])[:n]
    prompts = [render(tok, r["prompt"]) for r in rows]
    sides = {"base_sampled": (bundled_gguf(), 1.0), "trained_greedy": (run / "gguf" / "model-f16.gguf", 0.0),
             "trained_sampled": (run / "gguf" / "model-f16.gguf", 1.0)}
    samples, started = [], time.time()
    for side, (gguf, temperature) in sides.items():
        llm = load_llama(gguf, threads=os.cpu_count())
        for i, (row, prompt) in enumerate(zip(rows, prompts)):
            out = llm.create_completion(prompt, max_tokens=profile.max_completion_length, temperature=temperature,
                                        top_k=0 if temperature else 1, top_p=1.0, seed=profile.seed + i)
            text = out["choices"][0]["text"]
            scored = task.score(task.prefill + text, row)
            samples.append({"side": side, "row": row, "completion": text, "right": bool(scored["correct"]),
                            "format": bool(scored["format"]), "tokens": out["usage"]["completion_tokens"]})
        del llm
    generate_seconds, started = time.time() - started, time.time()
    with llama_server(bundled_gguf(), threads=os.cpu_count()) as server:
        judge = judge_reward(server.base_url, prefill=task.prefill)
        scores = asyncio.run(judge(prompts=[s["row"]["prompt"] for s in samples],
                                   completions=[s["completion"] for s in samples]))
    judge_seconds = time.time() - started
    for sample, score in zip(samples, scores):
        sample["judge"] = score

    def table(group: list[dict]) -> dict:
        return {k: round(v, 3) for k, v in agreement([s["judge"] for s in group], [s["right"] for s in group]).items()}

    by_length = {"short": lambda s: s["tokens"] < 15, "medium": lambda s: 15 <= s["tokens"] < 25,  # tokens
                 "long": lambda s: s["tokens"] >= 25}
    worst = sorted((s for s in samples if not s["right"] and s["judge"] is not None), key=lambda s: -s["judge"])[:3]
    return {"run": str(run), "prompts": len(rows), "generate_seconds": round(generate_seconds, 1),
            "judge_seconds": round(judge_seconds, 1), "judge_requests": judge.stats.requests,
            "judge_latency_median_s": round(statistics.median(judge.stats.latencies), 3),
            "agreement": {"all": table(samples), **{side: table([s for s in samples if s["side"] == side])
                                                    for side in sides}},
            "by_format": {str(f): table([s for s in samples if s["format"] == f]) for f in (True, False)},
            "by_length": {name: table([s for s in samples if test(s)]) for name, test in by_length.items()},
            "right_share": round(sum(s["right"] for s in samples) / len(samples), 3),
            "highest_scored_wrong": [{"question": s["row"]["question"], "completion": s["completion"],
                                      "judge": round(s["judge"], 3)} for s in worst],
            "complete": False, "missing": ["runs (notebook 08's three GRPO runs)", "async_ratio", "notebook_minutes"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="cpu-demo")
    ap.add_argument("--json", default=None, help="also write the JSON here (e.g. bench/measured/judge/judge.json)")
    ap.add_argument("--agreement", default=None, metavar="RUN", help="only the judge against the verifier, on RUN")
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--from-run", default=None, metavar="RUN",
                    help="read RUN/judge/judge_results.json of a finished run of notebook 08 (tools/course.py run --only 08) "
                         "instead of running it; its minutes from RUN/summary.json")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.agreement:
        found = agreement_only(Path(args.agreement), args.profile, args.prompts)
        out = {"command": " ".join(["python", *sys.argv]), "commit": commit(), "date": stamp(),
               "machine": machine(loadavg_1min_end=load()),
               "profile": args.profile, **found}
        text = json.dumps(out, indent=1)
        print(text)
        if args.json:
            Path(args.json).write_text(text + "\n")
        return 0
    from tools.course import execute_notebook

    load_start = load()
    if args.from_run:
        run = Path(args.from_run)
        seconds = json.loads((run / "summary.json").read_text())["notebooks"][NOTEBOOK.stem]
        found = json.loads((run / "judge" / "judge_results.json").read_text())
    else:
        with tempfile.TemporaryDirectory(prefix="bench-judge-") as tmp:
            run = Path(tmp) / "run"
            run.mkdir()
            env = {"COURSE_PROFILE": args.profile, "COURSE_RUN_DIR": str(run), "MPLBACKEND": "Agg",
                   "COURSE_HEADLESS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
            seconds = execute_notebook(NOTEBOOK, Path(tmp) / NOTEBOOK.name, env, timeout=3600, echo=False)
            found = json.loads((run / "judge" / "judge_results.json").read_text())
    runs = {}
    for name, r in found["runs"].items():
        runs[name] = {"accuracy": r["accuracy"], "judge_score": round(r["judge_score"], 3),
                      "seconds": round(r["seconds"], 1), **step_figures(r["history"]),
                      "history": [{k: h.get(k) for k in ("step", "reward", "step_time", "judge/seconds",
                                                         "judge/failed", "judge/latency_s", "frac_reward_zero_std")
                                   if k in h} for h in r["history"]]}
    timings = found["timings"]
    out = {"command": " ".join(["python", *sys.argv]), "commit": commit(), "date": stamp(),
           "machine": machine(loadavg_1min_start=load_start, loadavg_1min_end=load()),
           "profile": args.profile, "notebook_minutes": round(seconds / 60, 1), "steps": found["steps"],
           "agreement": {side: {k: round(v, 3) for k, v in a.items()} for side, a in found["agreement"].items()},
           "runs": runs, "async_seconds": {k: round(v, 2) for k, v in timings.items()},
           "async_ratio": round(timings["1"] / timings["4"], 2),
           "samples": {side: {k: round(v, 3) for k, v in summary.items() if k in ("correct", "format", "accuracy",
                                                                              "mean_length", "n_completions")}
                       for side, summary in found["samples"].items()},
           "hacked": found["hacked"],
           "fault": [{k: h.get(k) for k in ("step", "judge/failed", "rewards/judge_reward/mean",
                                           "rewards/format_reward/mean")} for h in found["fault"]],
           "resumed": [{"step": h["step"], "rewards": sorted(k.split("/")[1] for k in h if k.startswith("rewards/")
                                                            and k.endswith("/mean"))} for h in found["resumed"]]}
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

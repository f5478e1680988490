"""llama.cpp against transformers on the same held-out prompts, and the server's latency: notebook 04's GGUF section.

    python bench/serve.py [--run RUN] [--profile cpu-demo] [--prompts 100] [--threads N]

Reads a trained run folder (``RUN/adapter``; default: the newest run under runs/ with one, else a short run trained
as notebook 04 trains it), merges the adapter as notebook 04 does (float32, PEFT's ``merge_and_unload``) where
``RUN/merged`` is missing, and converts with llama.cpp's own converters (``helpers.export``): the merged model at
16-bit (``f16``) and 8-bit (``q8_0``), and the adapter alone as a LoRA GGUF on the bundled Q4_1 GGUF. Then, greedy,
at most the profile's completion length, on the first ``--prompts`` held-out prompts rendered by the run's tokenizer
(prefill included): transformers' merged model (batched, as notebook 04 evaluates) and llama.cpp on each of the three
routes (one prompt at a time, as a server answers), each scored with the task's ``score``; tokens are counted with the
run's tokenizer on every side alike. Last, llama.cpp's server on the 16-bit file: seconds to answer, and one chat
request through the ``openai`` client, timed, its answer compared with transformers' for the same prompt.

Prints ONE JSON object: {"command", "commit", "date", "machine", "prompts", "files": {name: {"bytes", "seconds"}},
"transformers": {...}, "llama_cpp": {route: {...}}, "server": {...}}. Progress goes to stderr. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path


def say(msg: str) -> None:
    print(f"[bench/serve] {msg}", file=sys.stderr, flush=True)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def trained_summary(run: Path) -> dict:
    """How the adapter was trained (``RUN/train_config.json``): GRPO steps, stopped by the time budget or not."""
    path = run / "train_config.json"
    summary = json.loads(path.read_text()).get("summary", {}) if path.is_file() else {}
    return {k: summary.get(k) for k in ("global_step", "stopped_by_time_budget")} | {
        "warmup_examples": (json.loads(path.read_text())["profile"].get("warmup_examples") if path.is_file() else None)}


def side(rows, completions, task, prefill, tok, seconds, reference=None) -> dict:
    """Accuracy, format and speed of one side; ``reference``: transformers' completions, for the agreement."""
    from helpers.evaluation import score
    scored = score([[c] for c in completions], rows, task, prefill=prefill, tokenizer=tok)["summary"]
    tokens = sum(len(tok(c, add_special_tokens=False)["input_ids"]) for c in completions)
    out = {task.headline: round(scored[task.headline], 4), task.format_metric: round(scored[task.format_metric], 4),
           "correct": round(scored.get("correct", 0.0), 4), "tokens": tokens, "seconds": round(seconds, 1),
           "tokens_per_second": round(tokens / seconds, 1)}
    if reference is not None:
        out["agreement"] = round(sum(a.strip() == b.strip() for a, b in zip(completions, reference)) / len(rows), 4)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default=None)
    ap.add_argument("--profile", default="cpu-demo")
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from helpers.data import ensure_prepared, records
    from helpers.evaluation import eval_settings
    from helpers.export import bundled_gguf, check_prefill, convert_adapter, convert_merged
    from helpers.generation import generate
    from helpers.models import bundled_model_path, model_source, prepare_tokenizer
    from helpers.profiles import get_model_spec, get_profile
    from helpers.prompts import installed_prefill, render
    from helpers.runs import runs_root
    from helpers.serve import llama_complete, llama_server, load_llama
    from helpers.tasks import get_task
    from helpers.training import ensure_adapter

    torch.set_num_threads(args.threads)
    profile, load_start = get_profile(args.profile), os.getloadavg()[0]
    task, spec = get_task(profile.task), get_model_spec(profile.model)
    trained = sorted(runs_root().glob("*/adapter/adapter_config.json"), key=lambda p: p.stat().st_mtime)
    run = Path(args.run) if args.run else trained[-1].parent.parent if trained else runs_root() / "bench-serve"
    say(f"run {run}, profile {profile.name}, {args.threads} threads, load {load_start:.1f}")
    adapter = ensure_adapter(profile, run)
    tok = AutoTokenizer.from_pretrained(str(adapter))
    prefill = installed_prefill(tok)
    merged = run / "merged"
    if not (merged / "config.json").is_file():  # notebook 04's merge cell, CPU branch
        say("merging the adapter (float32)")
        base = AutoModelForCausalLM.from_pretrained(model_source(spec), dtype=torch.float32)
        model = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
        model.save_pretrained(str(merged))
        tok.save_pretrained(str(merged))

    files, gguf = {}, run / "gguf"
    for name, make in [("model-f16.gguf", lambda out: convert_merged(merged, out, "f16")),
                       ("model-q8_0.gguf", lambda out: convert_merged(merged, out, "q8_0")),
                       ("adapter-f16.gguf", lambda out: convert_adapter(adapter, bundled_model_path(), out))]:
        t = time.time()
        path = make(gguf / name)
        files[name] = {"bytes": path.stat().st_size, "seconds": round(time.time() - t, 1)}
        say(f"{name}: {path.stat().st_size / 1e6:.1f} MB in {files[name]['seconds']} s")
    check_prefill(gguf / "model-f16.gguf", prefill)
    base_gguf = bundled_gguf()
    files[base_gguf.name] = {"bytes": base_gguf.stat().st_size, "seconds": None}

    rows = records(ensure_prepared(profile, run, tokenizer=tok, verbose=False)["eval"])[:args.prompts]
    prompts = [render(tok, r["prompt"], **spec.chat_template_kwargs) for r in rows]
    settings = eval_settings(profile)
    model = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32)
    prepare_tokenizer(tok, model)
    t = time.time()
    reference = [o[0] for o in generate(model, tok, [r["prompt"] for r in rows], settings,
                                        chat_template_kwargs=spec.chat_template_kwargs)]
    result = {"transformers": side(rows, reference, task, prefill, tok, time.time() - t)}
    say(f"transformers: {result['transformers']}")
    del model

    result["llama_cpp"], first = {}, {}
    for route, model_file, lora in [("f16", gguf / "model-f16.gguf", None), ("q8_0", gguf / "model-q8_0.gguf", None),
                                    ("lora_on_q4_1", base_gguf, gguf / "adapter-f16.gguf")]:
        llm = load_llama(model_file, lora=lora, threads=args.threads)
        t = time.time()
        texts, _ = llama_complete(llm, prompts, settings.max_new_tokens)
        first[route] = texts[0]
        result["llama_cpp"][route] = side(rows, texts, task, prefill, tok, time.time() - t, reference)
        result["llama_cpp"][route]["speed_vs_transformers"] = round(
            result["llama_cpp"][route]["tokens_per_second"] / result["transformers"]["tokens_per_second"], 2)
        say(f"llama.cpp {route}: {result['llama_cpp'][route]}")
        del llm

    from openai import OpenAI
    t = time.time()
    with llama_server(gguf / "model-f16.gguf", threads=args.threads) as server:
        ready = time.time() - t
        client = OpenAI(base_url=server.base_url, api_key="local", max_retries=0)
        messages = rows[0]["prompt"]
        t = time.time()
        reply = client.chat.completions.create(model="local", messages=messages, temperature=0.0,
                                               max_tokens=settings.max_new_tokens)
        latency = time.time() - t
    answer = reply.choices[0].message.content
    result["server"] = {"ready_seconds": round(ready, 1), "chat_request_seconds": round(latency, 2),
                        "completion_tokens": reply.usage.completion_tokens,
                        "same_as_transformers": answer.strip() == reference[0].strip(),
                        "same_as_llama_cpp_f16_in_process": answer == first["f16"]}
    say(f"server: {result['server']}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(json.dumps({
        "command": " ".join(["python", *sys.argv]), "commit": commit, "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpu": cpu_name(), "cpus": os.cpu_count(), "threads": args.threads,
                    "loadavg_1min_start": round(load_start, 2), "loadavg_1min_end": round(os.getloadavg()[0], 2)},
        "profile": profile.name, "prompts": len(rows), "max_new_tokens": settings.max_new_tokens,
        "decoding": "greedy", "prefill": prefill, "run": str(run), "trained": trained_summary(run), "files": files,
        **result,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

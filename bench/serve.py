"""llama.cpp against transformers on the same held-out prompts, and the server's latency: notebook 04's GGUF section.

    python bench/serve.py [--run RUN] [--profile cpu-demo] [--prompts 100] [--threads N]

Reads a trained run folder (``RUN/adapter``; default: the newest run under runs/ with one, else a short run trained
as notebook 04 trains it), merges the adapter as notebook 04 does (float32, PEFT's ``merge_and_unload``) where
``RUN/merged`` is missing, and converts with llama.cpp's own converters (``helpers.export``): the merged model at
16-bit (``f16``), that file quantised to 8-bit by llama.cpp (``q8_0``), and the adapter alone as a LoRA GGUF on the
bundled Q4_1 GGUF. Then, greedy,
at most the profile's completion length, on the first ``--prompts`` held-out prompts rendered by the run's tokenizer
(prefill included): transformers' merged model (batched, as notebook 04 evaluates) and llama.cpp on each of the three
routes (one prompt at a time, as a server answers), each scored with the task's ``score``; tokens are counted with the
run's tokenizer on every side alike. Last, llama.cpp's server on the 16-bit file: seconds to answer, and one chat
request through the ``openai`` client, timed, its answer compared with transformers' for the same prompt.

``--only lora_on_q4_1,server`` measures some parts (f16, q8_0, lora_on_q4_1, server) and converts only the files they
need; transformers always runs, the reference every agreement and speed ratio is taken against. ``--into FILE``
completes a stored result of the same run: it checks that transformers wrote the same answers (accuracy, format and
tokens equal to the stored ones), adds the parts measured now (each route's speed ratio against this invocation's
transformers) and records them under ``parts`` with their own command, commit, date and machine.

Prints ONE JSON object: {"command", "commit", "date", "machine", "prompts", "gguf_mb": {file: MB}, "convert_seconds",
"routes": {"transformers": {...}, "llama_cpp_<route>": {...}}, "server": {...}, "complete", "missing"}. Progress
goes to stderr. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.record import commit, load, machine, stamp  # noqa: E402 - after the project is on the path


def say(msg: str) -> None:
    print(f"[bench/serve] {msg}", file=sys.stderr, flush=True)


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


PARTS = ("f16", "q8_0", "lora_on_q4_1", "server")


def missing_parts(data: dict) -> list[str]:
    """The parts a (possibly merged) result lacks."""
    have = {k.removeprefix("llama_cpp_") for k in data.get("routes", {})} | ({"server"} if "server" in data else set())
    return [p for p in PARTS if p not in have]


def merge_into(stored: dict, new: dict, measured: list[str]) -> dict:
    """``stored`` completed with the parts of ``new``: refused unless transformers reproduced the stored answers."""
    old_t, new_t = stored["routes"]["transformers"], new["routes"]["transformers"]
    same = ("accuracy", "format", "correct", "tokens")
    if (stored["prompts"], *(old_t[k] for k in same)) != (new["prompts"], *(new_t[k] for k in same)):
        raise SystemExit(f"transformers did not reproduce the stored run ({ {k: old_t[k] for k in same} } against "
                         f"{ {k: new_t[k] for k in same} }, {stored['prompts']} against {new['prompts']} prompts): "
                         "not the same run folder or prompts. Measure every part again, without --into.")
    for name, mb in new["gguf_mb"].items():
        if name in stored["gguf_mb"] and stored["gguf_mb"][name] != mb:
            raise SystemExit(f"{name}: {mb} MB now, {stored['gguf_mb'][name]} MB stored: not the same files.")
    out = dict(stored)
    out["gguf_mb"] = {**new["gguf_mb"], **stored["gguf_mb"]}
    out["convert_seconds"] = {**stored["convert_seconds"], **new["convert_seconds"]}  # a file made again: its new time
    out["routes"] = {**stored["routes"], **{f"llama_cpp_{m}": new["routes"][f"llama_cpp_{m}"]
                                            for m in measured if m != "server"}}
    if "server" in measured:
        out["server"] = new["server"]
    part = {k: new[k] for k in ("command", "commit", "date", "machine")}
    part.update(measured=measured, transformers_this_run=new_t)
    out["parts"] = [*stored.get("parts", []), part]
    out["missing"] = missing_parts(out)
    out["complete"] = not out["missing"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default=None)
    ap.add_argument("--profile", default="cpu-demo")
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)} (default: all)")
    ap.add_argument("--into", default=None, help="a stored result of the same run to complete (printed, not written)")
    args = ap.parse_args()
    parts = [p for p in PARTS if p in args.only.split(",")]
    if not parts or set(args.only.split(",")) - set(PARTS):
        raise SystemExit(f"--only {args.only}: choose among {', '.join(PARTS)}")

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from helpers.data import ensure_prepared, records
    from helpers.evaluation import eval_settings
    from helpers.export import bundled_gguf, check_prefill, convert_adapter, convert_merged, quantize
    from helpers.generation import generate
    from helpers.models import bundled_model_path, model_source, prepare_tokenizer
    from helpers.profiles import get_model_spec, get_profile
    from helpers.prompts import installed_prefill, render
    from helpers.runs import runs_root
    from helpers.serve import llama_complete, llama_server, load_llama
    from helpers.tasks import get_task
    from helpers.training import ensure_adapter

    torch.set_num_threads(args.threads)
    profile, load_start = get_profile(args.profile), load()
    task, spec = get_task(profile.task), get_model_spec(profile.model)
    trained = sorted(runs_root().glob("*/adapter/adapter_config.json"), key=lambda p: p.stat().st_mtime)
    run = Path(args.run) if args.run else trained[-1].parent.parent if trained else runs_root() / "bench-serve"
    say(f"run {run}, profile {profile.name}, {args.threads} threads, parts {parts}, load {load_start:.1f}")
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

    gguf, base_gguf = run / "gguf", bundled_gguf()
    makers = {"model-f16.gguf": (("f16", "q8_0", "server"), lambda out: convert_merged(merged, out, "f16")),
              "model-q8_0.gguf": (("q8_0",), lambda out: quantize(gguf / "model-f16.gguf", out, "q8_0", args.threads)),
              "adapter-f16.gguf": (("lora_on_q4_1",), lambda out: convert_adapter(adapter, bundled_model_path(), out))}
    sizes, seconds = {}, {}
    for name, (needed_by, make) in makers.items():
        if set(needed_by) & set(parts):
            t = time.time()
            path = make(gguf / name)
            sizes[name], seconds[name] = round(path.stat().st_size / 1e6, 1), round(time.time() - t, 1)
            say(f"{name}: {sizes[name]} MB in {seconds[name]} s")
    if "model-f16.gguf" in sizes:
        check_prefill(gguf / "model-f16.gguf", prefill)
    if "lora_on_q4_1" in parts:
        sizes[base_gguf.name] = round(base_gguf.stat().st_size / 1e6, 1)

    rows = records(ensure_prepared(profile, run, tokenizer=tok, verbose=False)["eval"])[:args.prompts]
    prompts = [render(tok, r["prompt"], **spec.chat_template_kwargs) for r in rows]
    settings = eval_settings(profile)
    model = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32)
    prepare_tokenizer(tok, model)
    t = time.time()
    reference = [o[0] for o in generate(model, tok, [r["prompt"] for r in rows], settings,
                                        chat_template_kwargs=spec.chat_template_kwargs)]
    routes = {"transformers": side(rows, reference, task, prefill, tok, time.time() - t)}
    say(f"transformers: {routes['transformers']}")
    del model

    first = {}
    for route, model_file, lora in [("f16", gguf / "model-f16.gguf", None), ("q8_0", gguf / "model-q8_0.gguf", None),
                                    ("lora_on_q4_1", base_gguf, gguf / "adapter-f16.gguf")]:
        if route not in parts:
            continue
        llm = load_llama(model_file, lora=lora, threads=args.threads)
        t = time.time()
        texts, _ = llama_complete(llm, prompts, settings.max_new_tokens)
        first[route] = texts[0]
        key = f"llama_cpp_{route}"
        routes[key] = side(rows, texts, task, prefill, tok, time.time() - t, reference)
        routes[key]["speed_vs_transformers"] = round(
            routes[key]["tokens_per_second"] / routes["transformers"]["tokens_per_second"], 2)
        say(f"llama.cpp {route}: {routes[key]}")
        del llm

    result = {"routes": routes}
    if "server" in parts:
        from openai import OpenAI
        t = time.time()
        with llama_server(gguf / "model-f16.gguf", threads=args.threads) as server:
            ready = time.time() - t
            client = OpenAI(base_url=server.base_url, api_key="local", max_retries=0)
            t = time.time()
            reply = client.chat.completions.create(model="local", messages=rows[0]["prompt"], temperature=0.0,
                                                   max_tokens=settings.max_new_tokens)
            latency = time.time() - t
        answer = reply.choices[0].message.content
        result["server"] = {"ready_seconds": round(ready, 1), "chat_request_seconds": round(latency, 2),
                            "completion_tokens": reply.usage.completion_tokens,
                            "same_as_transformers": answer.strip() == reference[0].strip()}
        if "f16" in first:
            result["server"]["same_as_llama_cpp_f16_in_process"] = answer == first["f16"]
        say(f"server: {result['server']}")
    out = {
        "command": " ".join(["python", *sys.argv]), "commit": commit(), "date": stamp(),
        "machine": machine(threads=args.threads, loadavg_1min_start=load_start, loadavg_1min_end=load()),
        "profile": profile.name, "prompts": len(rows), "max_new_tokens": settings.max_new_tokens,
        "decoding": "greedy", "prefill": prefill, "run": str(run), "trained": trained_summary(run),
        "gguf_mb": sizes, "convert_seconds": seconds, **result,
    }
    if args.into:
        out = merge_into(json.loads(Path(args.into).read_text()), out, parts)
    else:
        out["missing"] = missing_parts(out)
        out["complete"] = not out["missing"]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Held-out evaluation of any task: every side (base, warm-up, GRPO) sampled from one model with the same settings.

Serves notebooks 03, 04, 05, 06 and 08 (and the held-out callback of every training run).

Example:
    >>> round(pass_at_k(n=8, c=2, k=4), 3)
    0.786
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from .data import records
from .generation import SamplingSettings, generate
from .prompts import installed_prefill, text_tokenizer
from .rewards import clip
from .runs import read_json, write_json
from .tasks import Task


def eval_settings(profile: Any, temperature: float = 0.0, num_return_sequences: int = 1) -> SamplingSettings:
    """The one set of sampling settings for every side: greedy by default, the profile's length and seed."""
    return SamplingSettings(max_new_tokens=profile.max_completion_length, temperature=temperature,
                            num_return_sequences=num_return_sequences, seed=profile.seed)


def score(completions: Sequence[Sequence[str]], rows: Any, task: Task, prefill: str = "",
          rewards: Sequence[Callable] = (), tokenizer: Any = None) -> dict[str, Any]:
    """Score completions (one list per row) with the task's metrics and the ``rewards``: ``{"summary", "rows"}``."""
    rows = records(rows)
    if len(completions) != len(rows):
        raise ValueError(f"{len(completions)} completion lists for {len(rows)} rows: pass one list per row.")
    flat = [(i, c) for i, group in enumerate(completions) for c in group]
    columns = {k: [rows[i][k] for i, _ in flat] for k in (rows[0] if rows else {}) if k != "prompt"}
    scores = {}
    for func in rewards:  # the rewards see what TRL hands them: completions without the prefill
        values = func(completions=[[{"role": "assistant", "content": c}] for _, c in flat], **columns)
        scores[func.__name__] = [math.nan if v is None else float(v) for v in values]
    tok = text_tokenizer(tokenizer) if tokenizer is not None else None
    out = []
    for k, (i, c) in enumerate(flat):
        length = len(tok(c, add_special_tokens=False)["input_ids"]) if tok is not None else len(c.split())
        out.append({"index": i, "completion": c, "answer": rows[i].get("answer"), **task.score(prefill + c, rows[i]),
                    "length": length, "rewards": {name: v[k] for name, v in scores.items()}})
    metrics = list(dict.fromkeys(m for r in out for m in r if m not in ("index", "completion", "answer", "rewards")))
    summary: dict[str, Any] = {m: sum(r.get(m, 0.0) for r in out) / max(1, len(out)) for m in metrics}
    summary["mean_length"] = summary.pop("length", 0.0)
    applied = {n: [x for x in v if not math.isnan(x)] for n, v in scores.items()}  # NaN: the reward did not apply
    summary.update(n_prompts=len(rows), n_completions=len(out),
                   rewards={n: sum(v) / len(v) if v else None for n, v in applied.items()})
    return {"summary": summary, "rows": out}


def evaluate(model: Any, tokenizer: Any, rows: Any, task: Task, settings: SamplingSettings,
             adapter: str | Path | None = None, rewards: Sequence[Callable] = (),
             chat_template_kwargs: dict | None = None, batch_size: int = 64) -> dict[str, Any]:
    """Sample every row's ``prompt`` with ``settings`` and :func:`score` it (``adapter``: a vLLM LoRA request)."""
    rows = records(rows)
    outs = generate(model, tokenizer, [r["prompt"] for r in rows], settings, batch_size=batch_size, adapter=adapter,
                    chat_template_kwargs=chat_template_kwargs)
    return score(outs, rows, task, prefill=installed_prefill(tokenizer), rewards=rewards, tokenizer=tokenizer)


def evaluate_adapters(model: Any, tokenizer: Any, rows: Any, task: Task, settings: SamplingSettings,
                      sides: dict[str, str | None], rewards: Sequence[Callable] = (),
                      chat_template_kwargs: dict | None = None, folders: dict[str, str | Path] | None = None,
                      progress: Callable[[str], None] | None = print,
                      cache: str | Path | None = None) -> dict[str, Any]:
    """Evaluate each ``{side: adapter name}`` of one PEFT model (``None``: the base; on vLLM ``folders[name]``).

    ``cache``: a JSON file of results, read back while the rows, task, settings, rewards and the adapter files of
    ``folders`` have not changed since it was written (notebook 06 reuses notebook 04's samples so)."""
    vllm = getattr(model, "vllm_engine", None) is not None
    if not vllm and not hasattr(model, "disable_adapter"):
        raise TypeError(f"evaluate_adapters needs a PEFT model (or an Unsloth vLLM model), got {type(model).__name__}: "
                        "load the base with PeftModel.from_pretrained(base, adapter).")
    if cache is not None:
        if missing := [n for n in sides.values() if n is not None and n not in (folders or {})]:
            raise ValueError(f"cache= needs folders= to name the folder of adapter(s) {missing}, or no cache=.")
        files = [(s, str(f), f.stat().st_mtime_ns, f.stat().st_size) for s, n in sides.items() if n is not None
                 for f in sorted(Path(folders[n]).glob("adapter_model*"))]  # type: ignore[index]
        key = hashlib.sha256(json.dumps([[r["prompt"] for r in records(rows)], task.name, dataclasses.asdict(settings),
                                         [f.__name__ for f in rewards], chat_template_kwargs or None, list(sides),
                                         files], default=str).encode()).hexdigest()
        if Path(cache).is_file() and (saved := read_json(cache)).get("key") == key:
            if progress is not None:
                progress(f"read {cache}: these rows were sampled before, with the same settings and adapters")
            return saved["results"]
    results: dict[str, Any] = {"sides": {}, "seconds": {}, "settings": dataclasses.asdict(settings)}
    active = None if vllm else model.active_adapter
    merge = not vllm and mergeable(model)
    for side, name in sides.items():
        t0 = time.perf_counter()
        if not vllm and name is not None:
            model.set_adapter(name)
        lora = (folders or {})[name] if vllm and name is not None else None
        with (model.disable_adapter() if name is None and not vllm else
              merged(model, name) if merge else contextlib.nullcontext()):
            results["sides"][side] = evaluate(model, tokenizer, rows, task, settings, adapter=lora, rewards=rewards,
                                              chat_template_kwargs=chat_template_kwargs)
        results["seconds"][side] = round(time.perf_counter() - t0, 1)
        s = results["sides"][side]["summary"]
        if progress is not None:
            progress(f"{side}: {task.headline} {s[task.headline]:.0%}, {task.format_metric} "
                     f"{s[task.format_metric]:.0%} ({s['n_prompts']} prompts, {results['seconds'][side]} s)")
    if active is not None:
        model.set_adapter(active)  # leave the model as it came
    if cache is not None:
        write_json(cache, {"key": key, "results": results})
    return results


def mergeable(model: Any) -> bool:
    """True for a PEFT model in float32 on a CPU, where it samples faster with the adapter merged (in bf16 or 4 bits
    the merge would round the adapter's small update), up to 1B parameters (:func:`merged` copies the weights)."""
    return (hasattr(model, "merge_adapter") and getattr(getattr(model, "device", None), "type", None) == "cpu"
            and str(getattr(model, "dtype", None)) == "torch.float32"
            and getattr(getattr(model, "config", None), "quantization_config", None) is None
            and model.get_nb_trainable_parameters()[1] <= 1_000_000_000)


@contextlib.contextmanager
def merged(model: Any, name: str) -> Iterator[Any]:
    """PEFT ``model`` with adapter ``name`` merged into its weights inside the block, bit for bit as before after it.

    An unmerged LoRA adds two small matmuls to every adapted layer at every generated token: on a CPU, 100 prompts,
    greedy, took 16.3 s live and 15.1 s merged, restoring included (``bench/eval_throughput.py``)."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    weights = [p for m in model.modules() if isinstance(m, BaseTunerLayer)
               for p in m.get_base_layer().parameters(recurse=False)]
    saved = [p.detach().clone() for p in weights]  # unmerging subtracts, which rounds: restore the originals
    model.merge_adapter(adapter_names=[name])
    try:
        yield model
    finally:
        model.unmerge_adapter()
        for p, original in zip(weights, saved):
            p.data.copy_(original)


def comparison_table(results: dict[str, Any]) -> Any:
    """One row per metric and reward, one column per side, and each side's gain over the one before."""
    import pandas as pd
    sides = {k: v.get("summary", v) for k, v in results["sides"].items()}
    metrics = list(dict.fromkeys(k for s in sides.values() for k, v in s.items()
                                 if isinstance(v, (int, float)) and not k.startswith("n_")))
    rewards = sorted({name for s in sides.values() for name in s.get("rewards", {})})
    table = pd.DataFrame({side: [s.get(k) for k in metrics] + [s.get("rewards", {}).get(r) for r in rewards]
                          for side, s in sides.items()}, index=metrics + [f"reward: {r}" for r in rewards])
    names = list(table.columns)
    for before, after in zip(names, names[1:]):
        table[f"gain: {after}"] = [None if b is None or a is None else round(float(a) - float(b), 4)
                                   for b, a in zip(table[before], table[after])]
    return table


def side_by_side(results: dict[str, Any], questions: Sequence[str], metric: str, n: int = 5,
                 max_chars: int = 120) -> Any:
    """The first completion of each side for the first ``n`` prompts, marked ✓ when ``metric`` is met."""
    import pandas as pd
    table = {"question": [clip(q, max_chars) for q in questions[:n]]}
    for side, result in results["sides"].items():
        first = {row["index"]: row for row in reversed(result["rows"])}  # reversed: each prompt's first row wins
        table[side] = [("\u2713 " if first[i][metric] >= 1 else "\u2717 ") + clip(first[i]["completion"], max_chars)
                       for i in range(min(n, len(first)))]
    return pd.DataFrame(table)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021) of ``n`` samples, ``c`` right: ``1 - C(n-c, k) / C(n, k)``."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n (got n={n}, c={c}, k={k}).")
    return 1.0 if n - c < k else 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_at_k_curve(result: dict[str, Any], metric: str) -> dict[int, float]:
    """``{k: pass@k}`` for k = 1..n, averaged over prompts, from one side's rows (passing: ``metric`` is 1)."""
    groups: dict[int, list[float]] = {}
    for row in result["rows"]:
        groups.setdefault(row["index"], []).append(row[metric])
    n = min(len(g) for g in groups.values())
    return {k: sum(pass_at_k(len(g), sum(v >= 1 for v in g), k) for g in groups.values()) / len(groups)
            for k in range(1, n + 1)}


def write_eval(run: str | Path, results: dict[str, Any], **extra: Any) -> Path:
    """Write ``RUN/eval.json``: every side's summary, the settings, timings and ``extra``."""
    return write_json(Path(run) / "eval.json", {"sides": {k: v["summary"] for k, v in results["sides"].items()},
                                                "settings": results.get("settings"), "seconds": results.get("seconds"),
                                                **extra})

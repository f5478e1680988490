"""Held-out evaluation: several adapters of one loaded model, on the same prompts, the same way.

Every side (the base model, the model after the format warm-up, after GRPO)
is sampled from ONE loaded model with the same prompts, settings and seeds:
PEFT switches adapters (``disable_adapter()`` gives the exact base), a vLLM
engine gets a LoRA request per adapter. Each side reports:

* ``accuracy``: the answer is right AND in the required format (what the course trains for);
* ``correct_rate``: the answer is right, whatever the format;
* ``format_rate``: the strict ``<reasoning>…</reasoning><answer>…</answer>`` layout;
* ``mean_length`` (tokens) and the mean of every reward function.

A right answer is :func:`helpers.rewards.answer_matches`, the rewards' own
rule. The template's prefill is not in the completions (as in training), so
format and answer are judged on ``prefill + completion``.

Example:
    >>> good = "<reasoning>\\n2 + 2 = 4\\n</reasoning>\\n<answer>\\n4\\n</answer>"
    >>> s = score_completions([[good], ["4"]], answers=["4", "4"])
    >>> s["summary"]["accuracy"], s["summary"]["format_rate"]
    (0.5, 0.5)
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .generation import SamplingSettings, generate
from .prompts import installed_prefill
from .rewards import answer_matches, extract_answer, has_strict_format

#: The keys every side of ``eval.json`` holds.
SUMMARY_KEYS = ("accuracy", "format_rate", "correct_rate", "mean_length", "n_prompts", "n_completions")


def eval_settings(profile: Any, temperature: float = 0.0, num_return_sequences: int = 1) -> SamplingSettings:
    """The one set of sampling settings for every side: greedy by default, the profile's length and seed.

    Example:
        >>> from helpers.config import get_profile
        >>> eval_settings(get_profile("cpu-smoke")).max_new_tokens
        24
    """
    return SamplingSettings(max_new_tokens=profile.max_completion_length, temperature=temperature,
                            num_return_sequences=num_return_sequences, seed=profile.seed)


def score_completions(completions: Sequence[Sequence[str]], answers: Sequence[Any], prefill: str = "",
                      reward_funcs: Sequence[Callable] = (), tokenizer: Any = None) -> dict[str, Any]:
    """Score sampled completions (one list per prompt) against the gold answers.

    Returns ``{"summary": {SUMMARY_KEYS..., "rewards": {name: mean}}, "rows": [...]}``,
    one row per completion (``index, completion, answer, extracted, correct,
    format, accurate, length, rewards``). Lengths are tokens with a tokenizer,
    else words.

    Example:
        >>> score_completions([["<answer>3</answer>"]], ["3"])["summary"]["correct_rate"]
        1.0
    """
    if len(completions) != len(answers):
        raise ValueError(f"{len(completions)} completion lists for {len(answers)} answers: pass one list per prompt.")
    flat = [(i, c, a) for i, (group, a) in enumerate(zip(completions, answers)) for c in group]
    texts = [c for _, c, _ in flat]
    scores = {}
    for func in reward_funcs:  # the rewards see what TRL hands them: completions without the prefill
        values = func(completions=[[{"role": "assistant", "content": t}] for t in texts],
                      answer=[a for _, _, a in flat])
        scores[func.__name__] = [math.nan if v is None else float(v) for v in values]
    text_tok = getattr(tokenizer, "tokenizer", tokenizer)
    rows = []
    for k, (i, c, gold) in enumerate(flat):
        full = prefill + c
        extracted = extract_answer(full)
        correct, fmt = answer_matches(extracted, gold), has_strict_format(full)
        length = len(text_tok(c, add_special_tokens=False)["input_ids"]) if tokenizer is not None else len(c.split())
        rows.append({"index": i, "completion": c, "answer": gold, "extracted": extracted, "correct": correct,
                     "format": fmt, "accurate": correct and fmt, "length": length,
                     "rewards": {name: v[k] for name, v in scores.items()}})
    n = max(1, len(rows))
    summary = {"accuracy": sum(r["accurate"] for r in rows) / n, "format_rate": sum(r["format"] for r in rows) / n,
               "correct_rate": sum(r["correct"] for r in rows) / n, "mean_length": sum(r["length"] for r in rows) / n,
               "n_prompts": len(answers), "n_completions": len(rows),
               "rewards": {name: _nanmean(v) for name, v in scores.items()}}
    return {"summary": summary, "rows": rows}


def _nanmean(values: Sequence[float]) -> float | None:
    ok = [v for v in values if not math.isnan(v)]
    return sum(ok) / len(ok) if ok else None


def evaluate(model: Any, tokenizer: Any, prompts: Sequence[Any], answers: Sequence[Any], settings: SamplingSettings,
             adapter: str | Path | None = None, reward_funcs: Sequence[Callable] = (),
             chat_template_kwargs: dict | None = None, batch_size: int = 16) -> dict[str, Any]:
    """Sample ``prompts`` with ``settings`` and score them (:func:`score_completions`).

    ``adapter`` is the LoRA request on a vLLM engine; a PEFT model uses its active adapter.
    """
    outs = generate(model, tokenizer, prompts, settings, batch_size=batch_size, adapter=adapter,
                    chat_template_kwargs=chat_template_kwargs)
    return score_completions(outs, answers, prefill=installed_prefill(tokenizer), reward_funcs=reward_funcs,
                             tokenizer=tokenizer)


def evaluate_adapters(model: Any, tokenizer: Any, prompts: Sequence[Any], answers: Sequence[Any],
                      settings: SamplingSettings, sides: dict[str, str | None], reward_funcs: Sequence[Callable] = (),
                      chat_template_kwargs: dict | None = None, folders: dict[str, str | Path] | None = None,
                      progress: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Evaluate every ``{side: adapter name}`` of one loaded PEFT model (``None``: the base model).

    Each named adapter is activated in turn (``model.set_adapter(name)``); the
    base side runs inside ``model.disable_adapter()``. On an Unsloth vLLM engine
    (``fast_inference=True``) a side is sampled with a LoRA request for
    ``folders[name]`` instead. The adapter active before the call is active again after it.
    Returns ``{"sides": {side: result}, "settings", "seconds"}``.

    Example:
        ev = evaluate_adapters(model, tok, prompts, answers, eval_settings(PROFILE),
                               {"base": None, "after GRPO": "default"})
    """
    import dataclasses

    vllm = getattr(model, "vllm_engine", None) is not None
    if not vllm and not hasattr(model, "disable_adapter"):
        raise TypeError(f"evaluate_adapters needs a PEFT model (or an Unsloth vLLM model), got "
                        f"{type(model).__name__}: load the base with PeftModel.from_pretrained(base, adapter).")
    say = progress or (lambda _msg: None)
    results: dict[str, Any] = {"sides": {}, "seconds": {}, "settings": dataclasses.asdict(settings)}
    active = None if vllm else model.active_adapter
    for side, name in sides.items():
        t0 = time.perf_counter()
        lora = None
        if vllm:
            lora = None if name is None else (folders or {})[name]
        elif name is not None:
            model.set_adapter(name)
        with model.disable_adapter() if name is None and not vllm else contextlib.nullcontext():
            results["sides"][side] = evaluate(model, tokenizer, prompts, answers, settings, adapter=lora,
                                              reward_funcs=reward_funcs, chat_template_kwargs=chat_template_kwargs)
        results["seconds"][side] = round(time.perf_counter() - t0, 1)
        s = results["sides"][side]["summary"]
        say(f"{side}: accuracy {s['accuracy']:.0%}, format {s['format_rate']:.0%} "
            f"({len(prompts)} prompts, {results['seconds'][side]} s)")
    if active is not None:
        model.set_adapter(active)  # leave the model as it came
    return results


def comparison_table(results: dict[str, Any]) -> Any:
    """One row per metric, one column per side, and the gain of each side over the one before.

    Accepts :func:`evaluate_adapters`' result or a loaded ``eval.json``.

    Example:
        >>> t = comparison_table({"sides": {"base": {"summary": {"accuracy": 0.1}},
        ...                                 "after GRPO": {"summary": {"accuracy": 0.5}}}})
        >>> float(t.loc["accuracy", "gain: after GRPO"])
        0.4
    """
    import pandas as pd

    sides = {k: v.get("summary", v) for k, v in results["sides"].items()}
    metrics = [k for k in ("accuracy", "format_rate", "correct_rate", "mean_length")
               if any(k in s for s in sides.values())]
    rewards = sorted({name for s in sides.values() for name in s.get("rewards", {})})
    table = pd.DataFrame({side: [s.get(k) for k in metrics] + [s.get("rewards", {}).get(r) for r in rewards]
                          for side, s in sides.items()}, index=metrics + [f"reward: {r}" for r in rewards])
    return with_gains(table)


def with_gains(table: Any) -> Any:
    """Add a ``gain: <side>`` column per side after the first: its values minus the previous side's.

    Example:
        >>> import pandas as pd
        >>> with_gains(pd.DataFrame({"base": [0.5], "after": [0.75]}))["gain: after"].tolist()
        [0.25]
    """
    names = list(table.columns)
    for before, after in zip(names, names[1:]):
        table[f"gain: {after}"] = [None if b is None or a is None else round(float(a) - float(b), 4)
                                   for b, a in zip(table[before], table[after])]
    return table


def side_by_side(results: dict[str, Any], questions: Sequence[str], n: int = 5, max_chars: int = 120) -> Any:
    """The first completion of each side for the first ``n`` prompts, with a ✓ when accurate.

    Example:
        side_by_side(ev, split["questions"], n=3)
    """
    import pandas as pd

    def clip(text: str) -> str:
        text = text.replace("\n", " \u21b5 ")
        return text if len(text) <= max_chars else text[: max_chars - 1] + "\u2026"

    table = {"question": [clip(q) for q in questions[:n]]}
    for side, result in results["sides"].items():
        first = {}
        for row in result["rows"]:
            first.setdefault(row["index"], row)
        table[side] = [("\u2713 " if first[i]["accurate"] else "\u2717 ") + clip(first[i]["completion"])
                       for i in range(min(n, len(first)))]
    return pd.DataFrame(table)


def write_eval(run: str | Path, results: dict[str, Any], **extra: Any) -> Path:
    """Write ``RUN/eval.json``: every side's summary, the settings, timings and ``extra``."""
    from .runs import write_json

    record = {"sides": {k: v["summary"] for k, v in results["sides"].items()},
              "settings": results.get("settings"), "seconds": results.get("seconds"), **extra}
    return write_json(Path(run) / "eval.json", record)

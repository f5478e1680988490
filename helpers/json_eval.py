"""Held-out evaluation of the JSON task: valid JSON, schema-valid, exact match, and per field.

The same rules as the rewards (:mod:`helpers.json_rewards`): the object is
found by :func:`~helpers.json_rewards.find_json_object`, checked by
``jsonschema``, and compared field by field with
:func:`~helpers.json_rewards.same_value`. The template's prefill (``{``) is not
in the completions, as in training, so everything is judged on
``prefill + completion``. Several adapters of one model are compared with
:func:`evaluate_json_adapters` (the base model, after the warm-up, after GRPO).

Example:
    >>> s = score_json([['"name": "Ava"}'], ['oops']], ['{"name": "Ava"}'] * 2, prefill="{")
    >>> s["summary"]["valid_json_rate"], s["summary"]["exact_match_rate"], s["summary"]["fields"]
    (0.5, 0.5, {'name': 0.5})
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Sequence

from .evaluation import with_gains
from .json_rewards import as_object, field_accuracy, find_json_object, is_exact_match, same_value, schema_errors

#: The rates every side reports (fractions of completions).
JSON_METRICS = ("valid_json_rate", "clean_json_rate", "schema_valid_rate", "exact_match_rate", "field_rate")


def score_json(completions: Sequence[Sequence[str]], answers: Sequence[Any], schemas: Sequence[Any] | None = None,
               prefill: str = "") -> dict[str, Any]:
    """Score sampled completions (one list per prompt) against the expected objects.

    ``summary``: ``valid_json_rate`` (an object was found), ``clean_json_rate``
    (the object and nothing else), ``schema_valid_rate`` (when ``schemas`` are
    given), ``exact_match_rate`` (every field right, no key extra),
    ``field_rate`` (the mean share of right fields), ``fields`` (right rate per
    field), ``mean_chars``, ``n_prompts``, ``n_completions``. ``rows``: one per completion.

    Example:
        >>> score_json([['{"n": 2}']], ['{"n": 2}'], ['{"required": ["n"]}'])["summary"]["schema_valid_rate"]
        1.0
    """
    if len(completions) != len(answers) or (schemas is not None and len(schemas) != len(answers)):
        raise ValueError(f"{len(completions)} completion lists, {len(answers)} answers and "
                         f"{'no' if schemas is None else len(schemas)} schemas: pass one of each per prompt.")
    rows = []
    for i, (group, answer) in enumerate(zip(completions, answers)):
        for c in group:
            f = find_json_object(prefill + c)
            errors = None if schemas is None or f.obj is None else schema_errors(f.obj, schemas[i])
            want, obj = as_object(answer) or {}, f.obj or {}
            right = sum(k in obj and same_value(obj[k], v) for k, v in want.items())
            rows.append({"index": i, "completion": c, "expected": answer, "object": f.obj, "valid_json": f.obj is not None,
                         "clean_json": f.clean, "schema_valid": bool(f.obj is not None and errors == []),
                         "schema_errors": errors or [], "exact_match": is_exact_match(f.obj, want),
                         "field_rate": right / max(1, len(want))})
    n = max(1, len(rows))
    summary: dict[str, Any] = {
        "valid_json_rate": sum(r["valid_json"] for r in rows) / n,
        "clean_json_rate": sum(r["clean_json"] for r in rows) / n,
        "schema_valid_rate": None if schemas is None else sum(r["schema_valid"] for r in rows) / n,
        "exact_match_rate": sum(r["exact_match"] for r in rows) / n,
        "field_rate": sum(r["field_rate"] for r in rows) / n,
        "fields": field_accuracy([r["object"] for r in rows], [r["expected"] for r in rows]),
        "mean_chars": sum(len(r["completion"]) for r in rows) / n,
        "n_prompts": len(answers), "n_completions": len(rows)}
    return {"summary": summary, "rows": rows}


def evaluate_json(model: Any, tokenizer: Any, rows: Any, settings: Any, adapter: Any = None,
                  chat_template_kwargs: dict | None = None, batch_size: int = 16) -> dict[str, Any]:
    """Sample the ``prompt`` of every row (a dataset split) and score it with :func:`score_json`.

    ``adapter`` is the LoRA request on a vLLM engine; a PEFT model uses its active adapter.
    """
    from .generation import generate
    from .prompts import installed_prefill

    outs = generate(model, tokenizer, rows["prompt"], settings, batch_size=batch_size, adapter=adapter,
                    chat_template_kwargs=chat_template_kwargs)
    return score_json(outs, rows["answer"], rows["schema"], prefill=installed_prefill(tokenizer))


def evaluate_json_adapters(model: Any, tokenizer: Any, rows: Any, settings: Any, sides: dict[str, str | None],
                           chat_template_kwargs: dict | None = None, folders: dict[str, Any] | None = None,
                           progress: Callable[[str], None] | None = print) -> dict[str, Any]:
    """:func:`evaluate_json` for every ``{side: adapter name}`` of one PEFT model (``None``: the base,
    inside ``disable_adapter()``); on an Unsloth vLLM engine each side gets a LoRA request for
    ``folders[name]``. The adapter active before is active again after. ``{"sides": {...}, "seconds": {...}}``.

    Example:
        ev = evaluate_json_adapters(model, tok, data["eval"], eval_settings(TASK),
                                    {"base": None, "warm-up": "warmup", "GRPO": "default"})
    """
    vllm = getattr(model, "vllm_engine", None) is not None
    if not vllm and not hasattr(model, "disable_adapter"):
        raise TypeError(f"evaluate_json_adapters needs a PEFT model (or an Unsloth vLLM model), got "
                        f"{type(model).__name__}: load the base with PeftModel.from_pretrained(base, adapter).")
    say = progress or (lambda _msg: None)
    results: dict[str, Any] = {"sides": {}, "seconds": {}}
    active = None if vllm else model.active_adapter
    for side, name in sides.items():
        t0 = time.perf_counter()
        lora = (folders or {}).get(name) if vllm and name is not None else None
        if not vllm and name is not None:
            model.set_adapter(name)
        with model.disable_adapter() if name is None and not vllm else contextlib.nullcontext():
            results["sides"][side] = evaluate_json(model, tokenizer, rows, settings, adapter=lora,
                                                   chat_template_kwargs=chat_template_kwargs)
        results["seconds"][side] = round(time.perf_counter() - t0, 1)
        s = results["sides"][side]["summary"]
        say(f"{side}: valid JSON {s['valid_json_rate']:.0%}, schema-valid {s['schema_valid_rate']:.0%}, "
            f"exact match {s['exact_match_rate']:.0%} ({len(rows)} rows, {results['seconds'][side]} s)")
    if active is not None:
        model.set_adapter(active)
    return results


def json_comparison(results: dict[str, Any]) -> Any:
    """One row per metric and per field, one column per side, and each side's gain over the one before.

    Example:
        >>> t = json_comparison({"sides": {"a": {"summary": {"exact_match_rate": 0.1, "fields": {"n": 0.5}}},
        ...                                "b": {"summary": {"exact_match_rate": 0.4, "fields": {"n": 0.9}}}}})
        >>> float(t.loc["exact_match_rate", "gain: b"]), float(t.loc["field: n", "b"])
        (0.3, 0.9)
    """
    import pandas as pd

    sides = {k: v.get("summary", v) for k, v in results["sides"].items()}
    metrics = [m for m in JSON_METRICS if any(s.get(m) is not None for s in sides.values())]
    fields = list(dict.fromkeys(f for s in sides.values() for f in s.get("fields", {})))
    table = pd.DataFrame({side: [s.get(m) for m in metrics] + [s.get("fields", {}).get(f) for f in fields]
                          for side, s in sides.items()}, index=metrics + [f"field: {f}" for f in fields])
    return with_gains(table)

"""Choosing GRPO's prompts by how often the starting model solves them, estimated from its own samples.

No notebook calls it: helpers.training runs it when a profile sets ``select_prompts`` (no built-in profile does),
as bench/learning.py's filtered-prompt experiments did (docs/measured.md); it stays beside the training it feeds.

A prompt whose group is all right or all wrong teaches nothing (every advantage is 0). Before training, sample
each candidate prompt a few times at the training temperature, score the samples with the task's ``score``, and
keep the prompts the model sometimes solves (:func:`select_by_pass_rate`), or put them first (``order``).

Example:
    >>> keep_indices([0.0, 0.25, 1.0, 0.5, 0.0], drop_never=True, drop_always=True)
    [1, 3]
"""

from __future__ import annotations

import time
from typing import Any, Sequence


def pass_rates(model: Any, tokenizer: Any, rows: Any, task: Any, profile: Any, samples: int,
               chat_template_kwargs: dict | None = None) -> list[float]:
    """Each row's share of ``samples`` completions (the profile's temperature and length) scored right."""
    from .evaluation import eval_settings, evaluate
    out = evaluate(model, tokenizer, rows, task, eval_settings(profile, profile.temperature, samples),
                   chat_template_kwargs=chat_template_kwargs)
    right: dict[int, list[float]] = {}
    for r in out["rows"]:
        right.setdefault(r["index"], []).append(float(r[task.headline]))
    return [sum(right[i]) / len(right[i]) for i in range(len(right))]


def keep_indices(rates: Sequence[float], drop_never: bool = True, drop_always: bool = True) -> list[int]:
    """The rows a pass-rate filter keeps: not those never solved (``drop_never``), nor those always solved."""
    return [i for i, r in enumerate(rates) if not (drop_never and r <= 0.0) and not (drop_always and r >= 1.0)]


def select_by_pass_rate(model: Any, tokenizer: Any, dataset: Any, task: Any, profile: Any, candidates: int,
                        samples: int, mode: str = "filter", chat_template_kwargs: dict | None = None,
                        min_rows: int | None = None) -> tuple[Any, dict[str, Any]]:
    """The training rows to use, and what was measured: ``{"candidates", "samples", "kept", "never", "always", ...}``.

    ``mode``: ``"filter"`` keeps the first ``candidates`` rows the model solves sometimes (at least ``min_rows``:
    the rest come from the rows after the candidates, unmeasured); ``"order"`` keeps every row, the candidates
    first, from the most often solved to the least (train with ``shuffle_dataset=False``)."""
    if mode not in ("filter", "order"):
        raise ValueError(f"mode={mode!r}: use 'filter' (drop the rows always or never solved) or 'order'.")
    start = time.time()
    candidates = min(candidates, dataset.num_rows)
    rates = pass_rates(model, tokenizer, dataset.select(range(candidates)), task, profile, samples,
                       chat_template_kwargs=chat_template_kwargs)
    rest = list(range(candidates, dataset.num_rows))
    if mode == "filter":
        kept = keep_indices(rates)
        need = max(0, (min_rows or 0) - len(kept))
        chosen = kept + rest[:need]
    else:
        chosen = sorted(range(candidates), key=lambda i: -rates[i]) + rest
        kept = list(range(candidates))
    info = {"mode": mode, "candidates": candidates, "samples": samples, "kept": len(kept),
            "padded_with_unmeasured": len(chosen) - len(kept) if mode == "filter" else 0,
            "never": sum(r <= 0 for r in rates), "always": sum(r >= 1 for r in rates),
            "mean_pass_rate": round(sum(rates) / max(1, len(rates)), 4), "seconds": round(time.time() - start, 1)}
    return dataset.select(chosen), info


def select_for_profile(model: Any, tokenizer: Any, rows: Any, profile: Any) -> tuple[Any, dict[str, Any]]:
    """:func:`select_by_pass_rate` with ``profile``'s ``select_*`` settings (a profile, or the run's
    ``helpers.models.Resolved``: its task instance), as ``helpers.training.train_grpo`` runs it.

    At least enough rows for ``max_steps``; the sampling leaves training's random stream as it was."""
    import torch

    from .models import resolve
    r = resolve(profile, probe=False)
    profile = r.profile
    per_step = profile.per_device_train_batch_size * profile.gradient_accumulation_steps // profile.num_generations
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        return select_by_pass_rate(model, tokenizer, rows, r.task, profile, profile.select_prompts,
                                   profile.select_samples, profile.select_mode,
                                   chat_template_kwargs=r.spec.chat_template_kwargs,
                                   min_rows=profile.max_steps * per_step)

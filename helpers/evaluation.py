"""Before/after evaluation: the base model against the trained adapter.

Both are sampled on the same held-out prompts with the same
:class:`~helpers.generation.SamplingSettings` (and seeds), from ONE loaded
model: the base is the same PEFT model inside ``model.disable_adapter()``
(on a vLLM GPU profile, the same engine without the LoRA request). Each side
gets:

* ``accuracy``: answer correct AND in the required format (what the course
  trains for);
* ``correct_rate``: answer correct whatever the format;
* ``format_rate``: the strict ``<reasoning>...</reasoning><answer>...</answer>`` format;
* ``mean_length``: mean completion length in tokens;
* ``rewards``: the mean of every reward function (TRL's call convention);
* ``n_prompts`` / ``n_completions``.

When a prompt ends with a prefilled assistant message (e.g. ``<reasoning>``),
the completion lacks that text (TRL behaves the same), so format and answer
are judged on ``prefill + completion``.

Example:
    >>> from helpers.evaluation import score_completions
    >>> good = "<reasoning>\\n2 + 2 = 4\\n</reasoning>\\n<answer>\\n4\\n</answer>"
    >>> s = score_completions([[good], ["4"]], answers=["4", "4"])
    >>> s["summary"]["accuracy"], s["summary"]["correct_rate"]
    (0.5, 0.5)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Sequence

#: Keys every side of ``eval.json`` holds (the interface with other notebooks).
SUMMARY_KEYS = ("accuracy", "format_rate", "correct_rate", "mean_length", "n_prompts",
                "n_completions")


def eval_settings(profile: Any, max_new_tokens: int | None = None, temperature: float = 0.0,
                  num_return_sequences: int = 1) -> Any:
    """The one set of sampling settings used for both sides (greedy by default).

    Example:
        >>> from helpers.config import get_profile
        >>> eval_settings(get_profile("cpu-smoke")).max_new_tokens
        24
    """
    from .generation import SamplingSettings

    return SamplingSettings(
        max_new_tokens=int(max_new_tokens or profile.max_completion_length),
        temperature=temperature,
        top_p=1.0,
        num_return_sequences=num_return_sequences,
        seed=profile.seed,
    )


#: On CPU profiles the notebook evaluates at most this many held-out prompts (x 2 sides):
#: about 2-3 minutes on 2 cores for the bundled model (bench/eval_throughput.py).
CPU_EVAL_PROMPTS = 100


def eval_prompt_count(profile: Any) -> int:
    """How many held-out prompts notebook 04 evaluates on ``profile``.

    ``profile.eval_prompts`` when the profile has that field, else all of
    ``profile.eval_rows`` on a GPU and at most :data:`CPU_EVAL_PROMPTS` on CPU.

    Example:
        >>> from helpers.config import get_profile
        >>> eval_prompt_count(get_profile("cpu-smoke")), eval_prompt_count(get_profile("cpu-demo"))
        (16, 100)
    """
    wanted = getattr(profile, "eval_prompts", None)
    if wanted:
        return min(int(wanted), profile.eval_rows)
    if profile.backend == "transformers":
        return min(profile.eval_rows, CPU_EVAL_PROMPTS)
    return profile.eval_rows


def eval_split(dataset: Any, n: int | None = None, prefill: str | None = None) -> dict[str, list]:
    """``prompts``, ``answers`` and ``questions`` of the first ``n`` rows of an eval split.

    ``dataset`` is a ``datasets.Dataset`` or a ``DatasetDict`` with an ``"eval"`` split.
    ``prefill`` (``profile.prefill``) is appended as an assistant turn, exactly
    as training did, so the model is evaluated on the prompts it was trained on.

    Example:
        >>> rows = [{"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"}]
        >>> eval_split(rows)["answers"]
        ['2']
        >>> eval_split(rows, prefill="<reasoning>\\n")["prompts"][0][-1]["content"]
        '<reasoning>\\n'
    """
    if hasattr(dataset, "keys") and "eval" in dataset.keys():
        dataset = dataset["eval"]
    rows = list(dataset)
    if n is not None:
        rows = rows[: int(n)]
    missing = [i for i, r in enumerate(rows) if "prompt" not in r or "answer" not in r]
    if missing:
        raise ValueError(
            f"Eval rows {missing[:5]} lack a 'prompt' or 'answer' column; evaluate the "
            "dataset written by notebook 01 (helpers.data.ensure_prepared)."
        )
    prompts = [r["prompt"] for r in rows]
    if prefill:
        prompts = [list(p) + [{"role": "assistant", "content": prefill}]
                   if not isinstance(p, str) and (not p or p[-1].get("role") != "assistant")
                   else p for p in prompts]
    return {
        "prompts": prompts,
        "answers": [None if r["answer"] is None else str(r["answer"]) for r in rows],
        "questions": [r.get("question") or _question_text(r["prompt"]) for r in rows],
    }


def _question_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content", "") for m in prompt if m.get("role") == "user"]
    return users[-1] if users else ""


def default_checks() -> tuple[Callable[[str, str | None], bool], Callable[[str], bool]]:
    """``(is_correct(text, answer), has_format(text))`` built from ``helpers.rewards``."""
    from . import rewards

    def is_correct(text: str, answer: str | None) -> bool:
        if answer is None:
            return False
        got = rewards.normalize_number(rewards.extract_answer(text) or "")
        return got is not None and got == rewards.normalize_number(str(answer))

    def has_format(text: str) -> bool:
        return rewards.strict_format_reward(completions=[text])[0] == 1.0

    return is_correct, has_format


def default_reward_funcs(task: str | None = None) -> list[Callable[..., list]]:
    """The reward functions whose means are reported.

    ``task`` (``profile.task``) gives that task's training preset (same names as
    the training logs); otherwise correctness plus the prefill-aware format rewards.

    Example:
        >>> [f.__name__ for f in default_reward_funcs()][:2]
        ['correctness_reward', 'prefilled_strict_format_reward']
    """
    from . import rewards

    if task is not None:
        return rewards.split_preset(rewards.get_preset(task))[0]
    return [rewards.correctness_reward,
            rewards.with_prefill(rewards.strict_format_reward),
            rewards.with_prefill(rewards.soft_format_reward),
            rewards.with_prefill(rewards.xmlcount_reward)]


def _reward_name(func: Callable) -> str:
    return getattr(func, "__name__", None) or type(func).__name__


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return sum(vals) / len(vals) if vals else None


def score_completions(
    completions: Sequence[Sequence[str]],
    answers: Sequence[str | None],
    prompts: Sequence[Any] | None = None,
    reward_funcs: Sequence[Callable[..., list]] | None = None,
    tokenizer: Any = None,
    checks: tuple[Callable, Callable] | None = None,
) -> dict[str, Any]:
    """Score sampled completions (one list per prompt) against the gold answers.

    Returns ``{"summary": {...SUMMARY_KEYS, "rewards": {name: mean}}, "rows": [...]}``
    with one row per completion (``index, completion, answer, extracted,
    correct, format, length, rewards``). A reward function that raises is
    recorded as ``None`` for that batch and counted in ``summary["reward_errors"]``.

    Example:
        >>> score_completions([["<answer>3</answer>"]], ["3"])["summary"]["correct_rate"]
        1.0
    """
    if len(completions) != len(answers):
        raise ValueError(f"{len(completions)} completion lists for {len(answers)} answers; "
                         "pass one list of completions per prompt.")
    prompts = list(prompts) if prompts is not None else [""] * len(answers)
    is_correct, has_format = checks or default_checks()
    funcs = list(default_reward_funcs() if reward_funcs is None else reward_funcs)
    from .rewards import extract_answer, prefill_of

    flat_prompts, flat_comps, flat_answers, flat_index = [], [], [], []
    for i, (comps, ans) in enumerate(zip(completions, answers)):
        for c in comps:
            flat_prompts.append(prompts[i])
            flat_comps.append(c)
            flat_answers.append(ans)
            flat_index.append(i)
    conversational = any(isinstance(p, (list, tuple)) for p in flat_prompts)
    trl_comps = ([[{"role": "assistant", "content": c}] for c in flat_comps]
                 if conversational else list(flat_comps))

    reward_values: dict[str, list[float | None]] = {}
    errors: dict[str, str] = {}
    for func in funcs:
        name = _reward_name(func)
        try:
            vals = list(func(prompts=flat_prompts, completions=trl_comps,
                             completion_ids=None, answer=flat_answers))
            if len(vals) != len(flat_comps):
                raise ValueError(f"returned {len(vals)} values for {len(flat_comps)} completions")
        except Exception as exc:  # a reward must never stop an evaluation
            errors[name] = f"{type(exc).__name__}: {exc}"
            vals = [None] * len(flat_comps)
        reward_values[name] = vals

    rows = []
    for k, (p, c, ans, i) in enumerate(zip(flat_prompts, flat_comps, flat_answers, flat_index)):
        full = prefill_of(p) + c
        length = (len(tokenizer(c, add_special_tokens=False)["input_ids"])
                  if tokenizer is not None else len(c.split()))
        correct = bool(is_correct(full, ans))
        fmt = bool(has_format(full))
        rows.append({
            "index": i, "completion": c, "answer": ans,
            "extracted": extract_answer(full),
            "correct": correct, "format": fmt, "accurate": correct and fmt,
            "length": length,
            "rewards": {name: vals[k] for name, vals in reward_values.items()},
        })
    n = len(rows)
    summary: dict[str, Any] = {
        "accuracy": sum(r["accurate"] for r in rows) / n if n else 0.0,
        "format_rate": sum(r["format"] for r in rows) / n if n else 0.0,
        "correct_rate": sum(r["correct"] for r in rows) / n if n else 0.0,
        "mean_length": sum(r["length"] for r in rows) / n if n else 0.0,
        "length_unit": "tokens" if tokenizer is not None else "words",
        "n_prompts": len(answers),
        "n_completions": n,
        "rewards": {name: _mean(vals) for name, vals in reward_values.items()},
    }
    if errors:
        summary["reward_errors"] = errors
    return {"summary": summary, "rows": rows}


def evaluate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Any],
    answers: Sequence[str | None],
    settings: Any,
    adapter: str | Path | None = None,
    reward_funcs: Sequence[Callable[..., list]] | None = None,
    batch_size: int = 16,
) -> dict[str, Any]:
    """Sample ``prompts`` with ``settings`` and score them (see :func:`score_completions`).

    ``adapter`` is only used on a vLLM GPU model (the LoRA request); a PEFT
    model on CPU already carries its adapter.

    Example:
        >>> res = evaluate(model, tok, split["prompts"], split["answers"],
        ...                eval_settings(PROFILE))              # doctest: +SKIP
        >>> res["summary"]["accuracy"]                          # doctest: +SKIP
        0.25
    """
    from .generation import generate

    outs = generate(model, tokenizer, prompts, settings, batch_size=batch_size, adapter=adapter)
    return score_completions(outs, answers, prompts=prompts, reward_funcs=reward_funcs,
                             tokenizer=tokenizer)


def evaluate_before_after(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Any],
    answers: Sequence[str | None],
    settings: Any,
    adapter: str | Path | None = None,
    reward_funcs: Sequence[Callable[..., list]] | None = None,
    batch_size: int = 16,
    progress: Callable[[str], None] | None = print,
) -> dict[str, Any]:
    """Evaluate the base model and the trained adapter from one loaded model.

    ``model`` is a PEFT model holding the trained adapter. The base side runs
    inside ``model.disable_adapter()``; on a vLLM engine (Unsloth
    ``fast_inference=True``) the base side simply gets no LoRA request and the
    trained side gets ``adapter``.

    Returns ``{"base": result, "trained": result, "settings": {...}}`` where each
    result is what :func:`score_completions` returns.

    Example:
        >>> model, tok = load_model(PROFILE, adapter=RUN / "adapter")    # doctest: +SKIP
        >>> ev = evaluate_before_after(model, tok, ps, ans, eval_settings(PROFILE))  # doctest: +SKIP
        >>> ev["trained"]["summary"]["accuracy"] >= ev["base"]["summary"]["accuracy"]  # doctest: +SKIP
        True
    """
    import dataclasses
    import time

    say = progress or (lambda _msg: None)
    vllm = getattr(model, "vllm_engine", None) is not None
    if not vllm and not hasattr(model, "disable_adapter"):
        raise TypeError(
            "evaluate_before_after needs a PEFT model with the trained adapter loaded "
            "(helpers.models.load_model(PROFILE, adapter=RUN / 'adapter')); got "
            f"{type(model).__name__}, which has no disable_adapter()."
        )
    if vllm and adapter is None:
        raise ValueError("On a vLLM model pass adapter=<adapter folder> so the trained side "
                         "gets its LoRA request.")
    results: dict[str, Any] = {}
    t0 = time.perf_counter()
    if vllm:
        results["base"] = evaluate(model, tokenizer, prompts, answers, settings, adapter=None,
                                   reward_funcs=reward_funcs, batch_size=batch_size)
    else:
        with model.disable_adapter():
            results["base"] = evaluate(model, tokenizer, prompts, answers, settings,
                                       reward_funcs=reward_funcs, batch_size=batch_size)
    t1 = time.perf_counter()
    say(f"base model: {len(prompts)} prompts in {t1 - t0:.1f} s")
    results["trained"] = evaluate(model, tokenizer, prompts, answers, settings,
                                  adapter=adapter if vllm else None,
                                  reward_funcs=reward_funcs, batch_size=batch_size)
    t2 = time.perf_counter()
    say(f"trained adapter: {len(prompts)} prompts in {t2 - t1:.1f} s")
    results["settings"] = dataclasses.asdict(settings) if dataclasses.is_dataclass(settings) \
        else dict(settings)
    results["seconds"] = {"base": round(t1 - t0, 2), "trained": round(t2 - t1, 2)}
    return results


def eval_record(results: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The ``eval.json`` content: both summaries, settings, timings and ``extra``.

    Example:
        >>> eval_record({"base": {"summary": {"accuracy": 0.1}},
        ...              "trained": {"summary": {"accuracy": 0.4}}})["trained"]
        {'accuracy': 0.4}
    """
    record: dict[str, Any] = {
        "base": dict(results["base"]["summary"]),
        "trained": dict(results["trained"]["summary"]),
    }
    for key in ("settings", "seconds"):
        if key in results:
            record[key] = results[key]
    record.update(extra)
    return record


def write_eval(run: str | Path, results: dict[str, Any], **extra: Any) -> Path:
    """Write ``RUN/eval.json`` (atomically) and return its path.

    Example:
        >>> write_eval(RUN, ev, profile=PROFILE.name)      # doctest: +SKIP
        PosixPath('.../eval.json')
    """
    from .runs import write_json

    return write_json(Path(run) / "eval.json", eval_record(results, **extra))


def comparison_table(results: dict[str, Any]) -> Any:
    """A pandas DataFrame: one row per metric, columns ``base``, ``trained``, ``change``.

    Accepts either the result of :func:`evaluate_before_after` or a loaded ``eval.json``.

    Example:
        >>> t = comparison_table({"base": {"accuracy": 0.1, "n_prompts": 4},
        ...                       "trained": {"accuracy": 0.5, "n_prompts": 4}})
        >>> float(t.loc["accuracy", "change"])
        0.4
    """
    import pandas as pd

    sides = {}
    for side in ("base", "trained"):
        s = results[side]
        sides[side] = s["summary"] if "summary" in s else s
    index: list[str] = [k for k in ("accuracy", "format_rate", "correct_rate", "mean_length")
                        if k in sides["base"]]
    reward_names = sorted(set(sides["base"].get("rewards", {})) | set(sides["trained"].get("rewards", {})))
    data: dict[str, list] = {"base": [], "trained": []}
    for side in data:
        for k in index:
            data[side].append(sides[side].get(k))
        for name in reward_names:
            data[side].append(sides[side].get("rewards", {}).get(name))
    rows = index + [f"reward: {n}" for n in reward_names]
    for k in ("n_prompts",):
        if k in sides["base"]:
            rows.append(k)
            for side in data:
                data[side].append(sides[side].get(k))
    table = pd.DataFrame(data, index=rows)
    table["change"] = [
        None if b is None or t is None else round(float(t) - float(b), 4)
        for b, t in zip(table["base"], table["trained"])
    ]
    if "n_prompts" in table.index:
        table.loc["n_prompts", "change"] = None
    return table


def side_by_side(results: dict[str, Any], questions: Sequence[str] | None = None,
                 n: int = 5, max_chars: int = 160) -> Any:
    """Per-prompt base vs trained completions (first completion of each), as a DataFrame.

    Example:
        >>> side_by_side(ev, questions, n=3)        # doctest: +SKIP
    """
    import pandas as pd

    def first(side: str) -> dict[int, dict]:
        out: dict[int, dict] = {}
        for r in results[side]["rows"]:
            out.setdefault(r["index"], r)
        return out

    base, trained = first("base"), first("trained")
    records = []
    for i in sorted(base)[:n]:
        b, t = base[i], trained.get(i, {})
        records.append({
            "question": (questions[i] if questions else "")[:max_chars],
            "answer": b["answer"],
            "base": _clip(b["completion"], max_chars),
            "base ok": b["accurate"],
            "trained": _clip(t.get("completion", ""), max_chars),
            "trained ok": t.get("accurate"),
        })
    return pd.DataFrame.from_records(records)


def _clip(text: str, n: int) -> str:
    text = text.replace("\n", " \u21b5 ")
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def plot_comparison(results: dict[str, Any], path: str | Path | None = None) -> Any:
    """Bar chart of accuracy, format rate and correct rate, base vs trained (plus lengths).

    Saves a PNG when ``path`` is given. Returns the matplotlib Figure.

    Example:
        >>> fig = plot_comparison(ev, RUN / "figures" / "eval.png")     # doctest: +SKIP
    """
    import matplotlib.pyplot as plt

    table = comparison_table(results)
    rates = [k for k in ("accuracy", "format_rate", "correct_rate") if k in table.index]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6),
                                   gridspec_kw={"width_ratios": [3, 1]})
    xs = range(len(rates))
    width = 0.38
    for offset, side, colour in ((-width / 2, "base", "#9aa5b1"), (width / 2, "trained", "#2f6fdf")):
        vals = [float(table.loc[k, side] or 0.0) for k in rates]
        bars = ax1.bar([x + offset for x in xs], vals, width, label=side, color=colour)
        ax1.bar_label(bars, labels=[f"{v:.0%}" for v in vals], fontsize=8)
    ax1.set_xticks(list(xs), [r.replace("_", " ") for r in rates])
    ax1.set_ylim(0, 1.1)
    ax1.set_ylabel("fraction of completions")
    n = table.loc["n_prompts", "base"] if "n_prompts" in table.index else "?"
    ax1.set_title(f"Held-out evaluation ({n} prompts)")
    ax1.legend(loc="upper left")
    if "mean_length" in table.index:
        vals = [float(table.loc["mean_length", s] or 0.0) for s in ("base", "trained")]
        bars = ax2.bar(["base", "trained"], vals, color=["#9aa5b1", "#2f6fdf"])
        ax2.bar_label(bars, labels=[f"{v:.0f}" for v in vals], fontsize=8)
        ax2.set_title("mean length (tokens)")
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    return fig

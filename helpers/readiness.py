"""Will this run learn? Notebook 03's pre-flight: sample a few groups as GRPO will, then "go" or what to fix first.

:func:`check` samples training prompts from the model as it will train, with the config's temperature, group size and
``max_completion_length``, scores them with the task's rewards and reports (:class:`Figures`) the groups that can
teach, the completions cut (masked when ``mask_truncated_completions``), format, pass@G on the task's headline and
lengths; :func:`decide` (pure) gives the :class:`Verdict`. Alone: ``python -m helpers.readiness`` (``COURSE_PROFILE``).

Example:
    >>> decide(Figures(groups=8, group_size=8, limit=20, masked=True, temperature=1.0, spread=0.5, learnable=0.0,
    ...                truncated=1.0, format=0.0, headline=0.0, pass_at_g=0.0, solved_all=0.0, distinct=1.0,
    ...                length_p95=40, probe_limit=40), Plan(steps=30, warmup_examples=0)).change
    'warm up first (warmup_examples=16): the model does not end its answers within 40 tokens'
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .generation import SamplingSettings, generate
from .profiles import Profile, get_model_spec
from .prompts import installed_prefill, text_tokenizer
from .reward_lab import group_advantages, score_table
from .tasks import Task, get_task

TRUNCATED_MAX = 0.5  #: more completions cut and masked than this: fix the length first (unmasked, a cut one teaches)
LEARNABLE_MIN = 0.25  #: fewer groups that teach (rewards differ among the completions that count) than this: fix first
SOLVED_ALL_MAX = 0.75  #: more groups solved by every completion than this: the level is too easy
FORMAT_MIN = 0.5  #: below this format rate a warm-up, not a longer limit or an easier level, comes first
DISTINCT_MIN = 0.5  #: groups with fewer distinct completions than this share: a higher temperature first
WARMUP_FIRST = 16  #: warm-up examples to start from when a profile has none (cpu-demo's)


@dataclass(frozen=True)
class Figures:
    """What the pre-flight measured: shares of groups or completions (0..1), lengths in tokens."""

    groups: int
    group_size: int
    limit: int  #: max_completion_length
    masked: bool  #: mask_truncated_completions
    temperature: float
    spread: float  #: groups whose total rewards differ (1 - TRL's frac_reward_zero_std, by group)
    learnable: float  #: groups with an advantage that is not 0 on a completion in the loss (not masked)
    truncated: float  #: completions cut at the limit
    format: float  #: completions in the task's format
    headline: float  #: completions that solve the task (its headline metric)
    pass_at_g: float  #: groups with at least one completion that solves it
    solved_all: float  #: groups whose every completion solves it
    distinct: float  #: distinct completions per group, as a share of the group
    length_p95: float  #: 95th percentile of the completions' own length, sampled up to probe_limit
    probe_limit: int  #: how far each completion was sampled (beyond the limit, to measure the length it needs)
    length_mean: float = 0.0
    seconds: float = 0.0  #: the pre-flight's sampling and scoring


@dataclass(frozen=True)
class Plan:
    """What a change is weighed against: the run's steps and level, and what the warm-up and a step cost."""

    steps: int
    warmup_examples: int
    easier: str | None = None  #: the task's level before this one (None: it is the easiest)
    harder: str | None = None
    room: int | None = None  #: max_seq_length - max_prompt_tokens: the longest completion that fits
    warmup_seconds_per_example: float | None = None
    step_seconds: float | None = None  #: a step's time, or a lower bound on it (its generation)


@dataclass(frozen=True)
class Verdict:
    """``go`` or ``fix first``, why, the change (profile fields) and its cost in training steps (None: unknown)."""

    verdict: str
    reason: str
    change: str = ""
    settings: dict = field(default_factory=dict)
    cost_steps: int | None = None
    cost: str = ""

    def __str__(self) -> str:
        if self.verdict == "go":
            return f"go: {self.reason}"
        return f"fix first: {self.change}. Why: {self.reason}. Cost: {self.cost}"


def decide(f: Figures, plan: Plan) -> Verdict:
    """The verdict from the measured figures alone; the first problem found is the one named.

    Cut completions first where the loss drops them (``mask_truncated_completions``; unmasked, a cut completion
    scores low and teaches the model to stop), then groups that teach nothing:
    never solved (format missing: warm up; else an easier level), always solved (a harder level), alike (a higher
    temperature) or too few differ (a larger group)."""
    shares = (f"{f.learnable:.0%} of {f.groups} groups can teach, {f.truncated:.0%} cut at {f.limit} tokens, "
              f"format {f.format:.0%}, pass@{f.group_size} {f.pass_at_g:.0%}")
    fix = lambda change, settings, *cost: Verdict("fix first", shares, change, settings, *cost)  # noqa: E731
    free = (0, "no steps (the same step time)")

    def slower(old: float, new: float, what: str) -> tuple[int, str]:
        lost = int(round(plan.steps * (1 - old / new)))
        return lost, (f"about {lost} of the {plan.steps} steps a time budget pays for (an estimate: a step's time "
                      f"grows about in proportion to its {what})")

    def warm_up(why: str) -> Verdict:
        more = max(plan.warmup_examples * 2, WARMUP_FIRST)
        cost: tuple = (None, "the warm-up's time (not measured here)")
        if plan.warmup_seconds_per_example and plan.step_seconds:
            extra = (more - plan.warmup_examples) * plan.warmup_seconds_per_example
            cost = (math.ceil(extra / plan.step_seconds), f"at most {math.ceil(extra / plan.step_seconds)} step(s) "
                    f"of time ({extra:.0f} s of warm-up)")
        change = "warm up first" if plan.warmup_examples == 0 else "warm up longer"
        return fix(f"{change} (warmup_examples={more}): {why}", {"warmup_examples": more}, *cost)

    if f.masked and f.truncated > TRUNCATED_MAX:
        needed = int(math.ceil(f.length_p95 / 16) * 16) if f.length_p95 < f.probe_limit else None
        if needed is None and f.format < FORMAT_MIN:
            return warm_up(f"the model does not end its answers within {f.probe_limit} tokens")
        target = needed or f.probe_limit
        if plan.room is not None and target > plan.room:
            return warm_up(f"its answers need {target} tokens, more than the {plan.room} the sequence leaves")
        how = (f"95% of the sampled answers end within {f.length_p95:.0f} tokens" if needed else
               f"most answers run past {f.probe_limit} tokens: raise it and run the pre-flight again")
        return fix(f"raise max_completion_length {f.limit} -> {target} ({how})", {"max_completion_length": target},
                   *slower(f.limit, target, "completion length"))
    if f.learnable >= LEARNABLE_MIN and f.pass_at_g > 0:
        return Verdict("go", shares)
    if f.pass_at_g == 0 and f.format < FORMAT_MIN:
        return warm_up("no completion solves a problem and most miss the format")
    if f.pass_at_g == 0 and plan.easier is None:
        return fix("an easier task: no completion solves a problem, and this is its easiest level", {}, None,
                   "a new task")
    if f.pass_at_g == 0:
        return fix(f"an easier level (task_level={plan.easier!r}): no completion solves a problem",
                   {"task_level": plan.easier}, *free)
    if f.solved_all > SOLVED_ALL_MAX and plan.harder is not None:
        return fix(f"a harder level (task_level={plan.harder!r}): {f.solved_all:.0%} of the groups solve every "
                   "problem", {"task_level": plan.harder}, *free)
    if f.distinct < DISTINCT_MIN:
        hotter = round(f.temperature + 0.2, 1)
        return fix(f"a higher temperature ({f.temperature:g} -> {hotter}): a group's completions are mostly the same",
                   {"temperature": hotter}, 0, "no steps (a sampling knob)")
    return fix(f"a larger group (num_generations {f.group_size} -> {f.group_size * 2}, and the batch a multiple of "
               "it): too few groups differ", {"num_generations": f.group_size * 2},
               *slower(f.group_size, f.group_size * 2, "group size"))


def plan_for(profile: Profile, warmup_seconds: float | None = None, step_seconds: float | None = None) -> Plan:
    """The :class:`Plan` of a profile: its steps, warm-up, neighbouring levels and the room a completion has."""
    levels = list(get_task(profile.task).levels)
    at = levels.index(profile.task_level) if profile.task_level in levels else -1
    per_example = warmup_seconds / profile.warmup_examples if warmup_seconds and profile.warmup_examples else None
    return Plan(steps=profile.max_steps, warmup_examples=profile.warmup_examples,
                easier=levels[at - 1] if at > 0 else None,
                harder=levels[at + 1] if 0 <= at < len(levels) - 1 else None,
                room=profile.max_seq_length - profile.max_prompt_tokens,
                warmup_seconds_per_example=per_example, step_seconds=step_seconds)


#: The ``GRPOConfig`` values the pre-flight reads, as ``helpers.training.grpo_kwargs`` sets them (a test keeps them
#: equal): without a config, these profile fields.
SETTINGS = ("num_generations", "max_completion_length", "temperature", "mask_truncated_completions",
            "per_device_train_batch_size")


def _settings(config: Any, profile: Profile) -> dict[str, Any]:
    """The :data:`SETTINGS` and ``chat_template_kwargs`` of ``config`` (the ``GRPOConfig`` training uses), or else
    of the profile."""
    kwargs = getattr(config, "chat_template_kwargs", None) or get_model_spec(profile.model).chat_template_kwargs
    return {k: getattr(profile if config is None else config, k) for k in SETTINGS} | {"chat_template_kwargs": kwargs}


def measure(model: Any, tokenizer: Any, profile: Profile, rows: Any, config: Any = None, groups: int = 8,
            probe: float = 2.0, task: Task | None = None) -> tuple[Figures, list[dict]]:
    """Sample ``groups`` training prompts as GRPO will; the :class:`Figures` and one row per completion.

    Each completion is sampled up to ``probe`` x the limit (the same first tokens as at the limit) to measure the
    length it needs; lengths are the text re-tokenised, within a token or two of the sampled count."""
    t0, task, asked = time.time(), task or get_task(profile.task), _settings(config, profile)
    size, limit, temperature = asked["num_generations"], asked["max_completion_length"], asked["temperature"]
    picked = sorted(random.Random(profile.seed).sample(range(len(rows)), min(groups, len(rows))))
    rows = [dict(rows[i]) for i in picked]
    room = profile.max_seq_length - profile.max_prompt_tokens
    top = max(limit, min(int(math.ceil(limit * probe)), room))
    settings = SamplingSettings(max_new_tokens=top, temperature=temperature, num_return_sequences=size,
                                seed=profile.seed)
    texts = generate(model, tokenizer, [r["prompt"] for r in rows], settings,
                     chat_template_kwargs=asked["chat_template_kwargs"])
    tok, prefill = text_tokenizer(tokenizer), installed_prefill(tokenizer)
    out: list[dict] = []
    for row, group in zip(rows, texts):
        for text in group:
            ids = tok(text, add_special_tokens=False)["input_ids"]
            cut = len(ids) >= limit  # no end-of-sequence within the limit: TRL calls it truncated
            seen = tok.decode(ids[:limit]) if len(ids) > limit else text
            out.append({"row": row, "completion": seen, "length": min(len(ids), top), "truncated": cut,
                        **task.score(prefill + seen, row)})
    rewards = task.rewards_for(profile.task_level)
    columns = {k: [o["row"][k] for o in out] for k in out[0]["row"] if k != "prompt"}
    totals = score_table([[{"role": "assistant", "content": o["completion"]}] for o in out], rewards, width=None,
                         **columns)["total"].tolist()
    for o, total, a in zip(out, totals, group_advantages(totals, size).advantages):
        o.update(reward=total, advantage=a, counted=not (asked["mask_truncated_completions"] and o["truncated"]))
    rows = [{k: v for k, v in o.items() if k != "row"} | {"question": o["row"].get("question")} for o in out]
    return summarize(rows, size, limit, asked["mask_truncated_completions"], temperature, top, task,
                     time.time() - t0), rows


def summarize(rows: list[dict], size: int, limit: int, masked: bool, temperature: float, probe_limit: int,
              task: Task, seconds: float = 0.0) -> Figures:
    """The :class:`Figures` of :func:`measure`'s completion rows (consecutive groups of ``size``), or of a part."""
    grouped = [rows[i:i + size] for i in range(0, len(rows), size)]
    share = lambda test: sum(map(test, grouped)) / len(grouped)  # noqa: E731
    lengths = sorted(o["length"] for o in rows)
    return Figures(
        groups=len(grouped), group_size=size, limit=limit, masked=bool(masked), temperature=float(temperature),
        spread=share(lambda g: max(o["reward"] for o in g) - min(o["reward"] for o in g) > 1e-9),
        learnable=share(lambda g: any(o["counted"] and abs(o["advantage"]) > 1e-6 for o in g)),
        truncated=sum(o["truncated"] for o in rows) / len(rows),
        format=sum(o[task.format_metric] >= 1 for o in rows) / len(rows),
        headline=sum(o[task.headline] >= 1 for o in rows) / len(rows),
        pass_at_g=share(lambda g: any(o[task.headline] >= 1 for o in g)),
        solved_all=share(lambda g: all(o[task.headline] >= 1 for o in g)),
        distinct=sum(len({o["completion"] for o in g}) / size for g in grouped) / len(grouped),
        length_p95=float(lengths[min(len(lengths) - 1, int(math.ceil(0.95 * len(lengths))) - 1)]),
        probe_limit=probe_limit, length_mean=sum(lengths) / len(lengths), seconds=round(seconds, 1))


@dataclass(frozen=True)
class Report:
    """The pre-flight's figures, its verdict, and the completions it sampled."""

    figures: Figures
    verdict: Verdict
    plan: Plan
    completions: list = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        """Figures, verdict and plan as JSON-ready dicts (what ``bench/learning.py`` records)."""
        return {k: dataclasses.asdict(getattr(self, k)) for k in ("figures", "verdict", "plan")}

    def __str__(self) -> str:
        f = self.figures
        return (f"pre-flight ({f.groups} groups of {f.group_size}, {f.seconds:.0f} s): {f.spread:.0%} of groups' "
                f"rewards differ, {f.learnable:.0%} can teach{' (cut ones masked)' if f.masked else ''}; "
                f"{f.truncated:.0%} cut at {f.limit} tokens (95% end within {f.length_p95:.0f}); format "
                f"{f.format:.0%}; pass@{f.group_size} {f.pass_at_g:.0%}\n{self.verdict}")


def check(model: Any, tokenizer: Any, profile: Profile, rows: Any = None, run: str | Path | None = None,
          config: Any = None, groups: int = 8, warmup_seconds: float | None = None) -> Report:
    """The pre-flight in one call: :func:`measure` on the training prompts (``rows``, or ``RUN``'s prepared train
    split), then :func:`decide`. ``config``: the ``GRPOConfig`` training will use (default: the profile's values)."""
    if rows is None:
        from .data import ensure_prepared
        if run is None:
            raise ValueError("check() needs the training rows (rows=data['train']) or the run folder (run=RUN).")
        rows = ensure_prepared(profile, run, tokenizer=tokenizer, verbose=False)["train"]
    figures, completions = measure(model, tokenizer, profile, rows, config=config, groups=groups)
    per_step = _settings(config, profile)["per_device_train_batch_size"] // figures.group_size
    generation = figures.seconds / figures.groups * max(1, per_step)  # a step generates per_step groups, then learns
    plan = plan_for(profile, warmup_seconds, generation)
    return Report(figures, decide(figures, plan), plan, completions)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m helpers.readiness [--profile NAME] [--task KEY] [--adapter DIR] [--groups N]``."""
    import argparse
    import tempfile

    from .models import load_model
    from .profiles import get_profile
    from .training import run_warmup
    parser = argparse.ArgumentParser(prog="python -m helpers.readiness", description=__doc__.split("\n\n")[0])
    for flag, text in (("--profile", "profile (default: COURSE_PROFILE or detected)"), ("--task", "task key or "
                       "module:Class"), ("--adapter", "a warm-up adapter to start from (default: warm up here)")):
        parser.add_argument(flag, default=None, help=text)
    parser.add_argument("--groups", type=int, default=8, help="training prompts sampled, a group each")
    args = parser.parse_args(argv)
    profile = get_profile(args.profile, **({"task": args.task} if args.task else {}))
    model, tok = load_model(profile, adapter=args.adapter)
    with tempfile.TemporaryDirectory(prefix="readiness-") as run:
        warm = run_warmup(model, tok, profile, run) if profile.warmup_examples and args.adapter is None else None
        report = check(model, tok, profile, run=run, groups=args.groups, warmup_seconds=warm and warm["seconds"])
    print(report)
    return 0 if report.verdict.verdict == "go" else 2


if __name__ == "__main__":
    raise SystemExit(main())

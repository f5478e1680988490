"""What a GRPO step costs here, and what the profile's time budget buys with it (notebook 00).

Notebook 03's budget runs from the first step and pays for the held-out evaluations scored while training too (timed
here); before it come the warm-up, one evaluation and the pre-flight (:mod:`helpers.readiness`, estimated here).
"""

from __future__ import annotations

import inspect
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .profiles import Profile
from .training import train_grpo
from .watch import watch_every

#: Minutes of the install cell each fresh Colab runtime repeats on a GPU profile: estimated (not timed on Colab).
INSTALL_MINUTES = 3.0


@dataclass(frozen=True)
class StepTiming:
    """TRL's ``step_time`` of each timed step (the first carries one-off costs, the last is every later step's price),
    a held-out evaluation's seconds and the pre-flight's estimate (None: not timed)."""

    profile: str
    seconds: tuple[float, ...]
    max_steps: int
    budget_minutes: float | None
    warmup: bool
    eval_seconds: float | None = None
    eval_every: int = 0  #: steps between held-out evaluations (0: none while training)
    preflight_seconds: float | None = None

    @property
    def step_seconds(self) -> float:
        return self.seconds[-1]

    def evaluations(self, steps: int) -> int:
        """Held-out evaluations inside the budget in ``steps`` steps (every ``eval_every`` and at ``max_steps``)."""
        if not self.eval_every or not self.eval_seconds:
            return 0
        return steps // self.eval_every + (steps == self.max_steps and steps % self.eval_every != 0)

    def seconds_for(self, steps: int) -> float:
        """Budget seconds of ``steps`` steps: the first step's extra cost, the steps and the evaluations."""
        extra = max(0.0, self.seconds[0] - self.step_seconds) if steps else 0.0
        return extra + steps * self.step_seconds + self.evaluations(steps) * (self.eval_seconds or 0.0)

    @property
    def steps_in_budget(self) -> int | None:
        """Steps that fit the budget at this pace (at most ``max_steps``), evaluations counted; None: no budget."""
        budget = (self.budget_minutes or 0) * 60
        return next((n for n in range(self.max_steps, 0, -1) if self.seconds_for(n) <= budget), 0) if budget else None

    def plan(self) -> str:
        """A few lines for notebook 00: the timed step, the evaluations and pre-flight, the budget in steps."""
        lines = [f"One GRPO step of profile {self.profile!r} takes {self.step_seconds:.1f} s here "
                 f"(the first took {self.seconds[0]:.1f} s: one-off costs)."]
        evals = self.evaluations(self.max_steps)
        if evals:
            lines.append(f"A held-out evaluation takes {self.eval_seconds:.1f} s here: {evals} while training "
                         f"(every {self.eval_every} steps) cost {evals * self.eval_seconds / 60:.1f} min of the budget.")
        if not self.budget_minutes:
            lines.append(f"No time budget: all {self.max_steps} steps take about "
                         f"{self.seconds_for(self.max_steps) / 60:.0f} min.")
        else:
            fit = self.steps_in_budget
            fit = (f"all {self.max_steps} steps fit (about {self.seconds_for(self.max_steps) / 60:.1f} min)"
                   if fit >= self.max_steps else f"training stops after about {fit} of the {self.max_steps} "
                   "steps, with the adapter saved; run notebook 03 again to go on from there")
            lines.append(f"Time budget: {self.budget_minutes:g} min (COURSE_TIME_BUDGET changes it): {fit}.")
        before = ["the format warm-up"] if self.warmup else []
        if self.eval_seconds and self.eval_every:
            before.append(f"one held-out evaluation ({self.eval_seconds:.0f} s)")
        if self.preflight_seconds is not None:
            share = (f", {self.preflight_seconds / (self.budget_minutes * 60):.0%} of the budget"
                     if self.budget_minutes else "")
            before.append(f"the pre-flight (about {self.preflight_seconds:.0f} s, estimated{share})")
        if before:
            lines.append("Before the first step, outside the budget: " + ", ".join(before) + ".")
        return "\n".join(lines)


def preflight_estimate(profile: Profile, eval_seconds: float, eval_rows: int) -> float:
    """The pre-flight's seconds, estimated from a held-out evaluation's (``eval_rows`` completions of up to the limit,
    through the same ``generate``): it samples ``groups`` x ``num_generations`` of up to ``probe`` x the limit
    (``helpers.readiness``' defaults), taken as growing with completions x tokens (on a GPU an upper bound)."""
    from . import readiness

    groups = inspect.signature(readiness.check).parameters["groups"].default
    probe = inspect.signature(readiness.measure).parameters["probe"].default
    room = profile.max_seq_length - profile.max_prompt_tokens
    tokens = max(profile.max_completion_length, min(int(profile.max_completion_length * probe), room))
    completions = groups * profile.num_generations
    return eval_seconds * completions / max(1, eval_rows) * tokens / profile.max_completion_length


def notebook_minutes(profile: Profile) -> dict[str, tuple[float, float]]:
    """``{notebook: (minutes, install minutes)}``: on a GPU profile each fresh Colab runtime repeats the install cell
    (:data:`INSTALL_MINUTES`; notebook 00's minutes hold it already); CPU profiles install once (``make setup``)."""
    install = INSTALL_MINUTES if profile.backend == "unsloth" else 0.0
    return {nb: (minutes, 0.0 if nb.startswith("00_") else install) for nb, minutes in profile.minutes.items()}


def time_grpo_step(profile: Profile, steps: int = 2, **kwargs: Any) -> StepTiming:
    """Time ``steps`` real GRPO steps of ``profile`` on a throw-away adapter (``kwargs`` go to ``train_grpo``) and the
    held-out evaluation after each; the pre-flight is estimated from it."""
    if steps < 1:
        raise ValueError(f"steps={steps}: time at least one step (2 shows the one-off costs of the first).")
    with tempfile.TemporaryDirectory(prefix="grpo-step-timing-", ignore_cleanup_errors=True) as folder:
        timed = profile.with_overrides(max_steps=steps, time_budget_minutes=None, save_steps=steps + 1)
        out = train_grpo(timed, Path(folder), resume=False, warmup=False, **kwargs)
        seconds = tuple(round(float(r["step_time"]), 2) for r in out["trainer"].state.log_history if "step_time" in r)
    if not seconds:
        raise RuntimeError("TRL logged no `step_time`: the pinned TRL logs it every step (logging_steps=1).")
    points = len(out.get("heldout") or [])
    eval_seconds = round(float(out["summary"]["heldout_seconds"]) / points, 2) if points else None
    rows = min(profile.watch_prompts, profile.eval_rows)
    preflight = round(preflight_estimate(profile, eval_seconds, rows), 1) if eval_seconds and rows else None
    every = watch_every(profile.max_steps, profile.watch_evals) if profile.watch_prompts else 0
    return StepTiming(profile.name, seconds, profile.max_steps, profile.time_budget_minutes,
                      warmup=profile.warmup_examples > 0, eval_seconds=eval_seconds, eval_every=every,
                      preflight_seconds=preflight)

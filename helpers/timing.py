"""What a GRPO step costs on this machine, and what the profile's time budget buys with it (notebook 00)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .profiles import Profile
from .training import train_grpo


@dataclass(frozen=True)
class StepTiming:
    """TRL's ``step_time`` of each timed step: the first carries one-off costs, the last is every later step's price."""

    profile: str
    seconds: tuple[float, ...]
    max_steps: int
    budget_minutes: float | None
    warmup: bool

    @property
    def step_seconds(self) -> float:
        return self.seconds[-1]

    @property
    def steps_in_budget(self) -> int | None:
        """Steps that fit the budget at this pace (the first step's extra cost counted); None: no budget."""
        if not self.budget_minutes:
            return None
        extra = max(0.0, self.seconds[0] - self.step_seconds)
        return max(0, int((self.budget_minutes * 60 - extra) // max(self.step_seconds, 1e-9)))

    def plan(self) -> str:
        """Two or three sentences for notebook 00: the timed step, the budget in steps, what happens."""
        lines = [f"One GRPO step of profile {self.profile!r} takes {self.step_seconds:.1f} s here "
                 f"(the first took {self.seconds[0]:.1f} s: one-off costs)."]
        if not self.budget_minutes:
            lines.append(f"No time budget: all {self.max_steps} steps take about "
                         f"{self.max_steps * self.step_seconds / 60:.0f} min.")
        else:
            fit = (f"all {self.max_steps} steps fit (about {self.max_steps * self.step_seconds / 60:.1f} min)"
                   if self.steps_in_budget >= self.max_steps else f"training stops after about {self.steps_in_budget} "
                   f"of the {self.max_steps} steps, with the adapter saved; run notebook 03 again to go on from there")
            lines.append(f"Time budget: {self.budget_minutes:g} min (COURSE_TIME_BUDGET changes it): {fit}.")
            if self.warmup:
                lines.append("The format warm-up before GRPO counts in the budget too.")
        return "\n".join(lines)


def time_grpo_step(profile: Profile, steps: int = 2, **kwargs: Any) -> StepTiming:
    """Time ``steps`` real GRPO steps of ``profile`` on a throw-away adapter (``kwargs`` go to ``train_grpo``)."""
    if steps < 1:
        raise ValueError(f"steps={steps}: time at least one step (2 shows the one-off costs of the first).")
    with tempfile.TemporaryDirectory(prefix="grpo-step-timing-", ignore_cleanup_errors=True) as folder:
        timed = profile.with_overrides(max_steps=steps, time_budget_minutes=None, save_steps=steps + 1)
        out = train_grpo(timed, Path(folder), resume=False, warmup=False, **kwargs)
        seconds = tuple(round(float(r["step_time"]), 2) for r in out["trainer"].state.log_history if "step_time" in r)
    if not seconds:
        raise RuntimeError("TRL logged no `step_time`: the pinned TRL logs it every step (logging_steps=1).")
    return StepTiming(profile.name, seconds, profile.max_steps, profile.time_budget_minutes,
                      warmup=profile.warmup_examples > 0)

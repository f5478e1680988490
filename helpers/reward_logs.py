"""What each reward returned and printed, step by step, kept in the run folder (notebook 08; the judge's log too).

:func:`logged` wraps a reward function, sync or ``async def``: each call appends the step and every returned reward
to ``LOG_DIR/<name>.jsonl``, and what the function printed (still shown as usual) to ``LOG_DIR/<name>.log`` under a
``--- step N ---`` line, so a run's reward prints outlive the notebook's output.

Example:
    >>> import tempfile
    >>> def shout(completions, **kwargs):
    ...     print("scored", len(completions))
    ...     return [1.0] * len(completions)
    >>> folder = Path(tempfile.mkdtemp())
    >>> logged(shout, folder)(completions=["a", "b"])
    scored 2
    [1.0, 1.0]
    >>> print((folder / "shout.log").read_text().strip())
    --- step None ---
    scored 2
"""

from __future__ import annotations

import contextlib
import inspect
import json
import sys
import threading
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

_PRINTED: ContextVar[list[str] | None] = ContextVar("reward_prints", default=None)  # the running reward's, per task
_LOCK = threading.Lock()
_USERS = [0]   # logged rewards running now (async ones overlap): sys.stdout is the tee while any is


def step_of(state: Any) -> int | None:
    """The training step a reward call scores (TRL calls it while ``global_step`` is still the step before)."""
    return None if getattr(state, "global_step", None) is None else state.global_step + 1


def write_lines(path: Path, rows: list[dict]) -> None:
    """Append JSON lines to ``path`` (its folder made); a reward's log, one line per completion."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as out:
        out.writelines(json.dumps(row, default=str) + "\n" for row in rows)


class _Tee:
    """``sys.stdout`` while a logged reward runs: text goes out as before, and into that reward's buffer."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def write(self, text: str) -> int:
        if (printed := _PRINTED.get()) is not None:   # a context variable: each concurrent reward its own
            printed.append(text)
        return self.out.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.out, name)


@contextlib.contextmanager
def _capture() -> Iterator[list[str]]:
    printed: list[str] = []
    token = _PRINTED.set(printed)
    with _LOCK:
        if _USERS[0] == 0:
            sys.stdout = _Tee(sys.stdout)  # type: ignore[assignment]
        _USERS[0] += 1
    try:
        yield printed
    finally:
        with _LOCK:
            _USERS[0] -= 1
            if _USERS[0] == 0 and isinstance(sys.stdout, _Tee):
                sys.stdout = sys.stdout.out
        _PRINTED.reset(token)


def logged(func: Callable[..., Any], log_dir: str | Path) -> Callable[..., Any]:
    """``func`` (sync or async) that also keeps each call's step, rewards and printed text in ``log_dir``."""
    name, folder = func.__name__, Path(log_dir)
    folder.mkdir(parents=True, exist_ok=True)

    def keep(kwargs: dict, printed: list[str], out: list | None) -> None:
        step = step_of(kwargs.get("trainer_state"))
        if text := "".join(printed):   # kept even when the reward raised: that is when its prints matter most
            with open(folder / f"{name}.log", "a") as log:
                log.write(f"--- step {step} ---\n{text}" + ("" if text.endswith("\n") else "\n"))
        if out is not None:
            write_lines(folder / f"{name}.jsonl", [{"step": step, "reward": r} for r in out])

    if inspect.iscoroutinefunction(func):
        async def wrapper(**kwargs: Any) -> list:
            out = None
            with _capture() as printed:
                try:
                    out = await func(**kwargs)
                finally:
                    keep(kwargs, printed, out)
            return out
    else:
        def wrapper(**kwargs: Any) -> list:
            out = None
            with _capture() as printed:
                try:
                    out = func(**kwargs)
                finally:
                    keep(kwargs, printed, out)
            return out
    wrapper.__name__ = wrapper.__qualname__ = name
    return wrapper

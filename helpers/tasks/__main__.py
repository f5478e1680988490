"""``python -m helpers.tasks check my_module:MyTask [--profile cpu-demo]``: every check of a task, as a report.

No notebook runs it: it is the command line notebook 05 and docs/your-own-task.md hand a learner for their own task.

Runs :func:`helpers.tasks.check.check_task` with the profile's tokenizer (the bundled model's on a CPU profile), so
the references' lengths are checked too. Exits 0 when the task is ready to train, 1 when a check failed, 2 when the
task cannot be found. Loads no model.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m helpers.tasks", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="check a task before training it")
    check.add_argument("task", help="'module:Class' (the module importable: beside you, or on PYTHONPATH), or a "
                                    "built-in name (arithmetic, json)")
    check.add_argument("--profile", default="cpu-demo", help="the profile whose levels and lengths to check")
    args = ap.parse_args(argv)

    from ..profiles import ProfileError, get_profile
    from . import get_task
    from .check import check_task
    try:
        task = get_task(args.task)
        profile = get_profile(args.profile, check=False, task=args.task)
    except (ValueError, TypeError) as exc:  # not importable, not a Task, a level the profile cannot use
        print(f"cannot check {args.task!r}: {exc}", file=sys.stderr)
        return 2
    tokenizer = None
    try:
        from ..models import load_tokenizer
        tokenizer = load_tokenizer(profile)
    except Exception as exc:  # noqa: BLE001 - e.g. a GPU profile's tokenizer offline: the other checks still run
        print(f"note: no tokenizer for {profile.model} ({type(exc).__name__}), so the references' lengths are not "
              "checked; run on a CPU profile (--profile cpu-demo) to check them with the bundled model's.")
    levels = [profile.task_level] + ([profile.warmup_level] if profile.warmup_examples else [])
    print(f"task {args.task} ({task.name}) on profile {profile.name!r}: levels {list(dict.fromkeys(levels))}, "
          f"max_completion_length={profile.max_completion_length}, rewards "
          f"{[getattr(f, '__name__', f) for f, _ in task.rewards_for(profile.task_level)]}")
    try:
        findings = check_task(task, profile, tokenizer=tokenizer)
    except ProfileError as exc:
        print(f"cannot check {args.task!r}: {exc}", file=sys.stderr)
        return 2
    for finding in findings:
        print(f"{finding.kind.upper():8} {finding.where}: {finding.message}")
    errors = sum(f.kind == "error" for f in findings)
    print(f"{errors} error(s), {len(findings) - errors} warning(s): "
          + ("fix the errors before training." if errors else "ready to train."))
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())

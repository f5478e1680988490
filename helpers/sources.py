"""Lines of an installed library's source, as a notebook cites them: printed with their numbers, and checked.

Serves notebook 06 (its citations of TRL's source).

A notebook that says "TRL does X (trl/trainer/grpo_trainer.py:3239-3240)" can show those lines from the package
that is installed, and fail when they no longer say what it claims (another version, moved code).

Example:
    >>> lines = library_lines("trl/trainer/grpo_trainer.py", 3113, 3113)
    >>> lines[0].strip()
    'def _compute_loss(self, model, inputs):'
"""

from __future__ import annotations

import importlib.util
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


class SourceMismatch(AssertionError):
    """The cited lines do not hold what the citation says they hold."""


def source_file(path: str) -> Path:
    """The installed file ``path`` names, as ``package/sub/module.py`` (nothing is imported).

    Raises ``ModuleNotFoundError`` when the package is not installed here."""
    package, _, rest = path.partition("/")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"{package} is not installed in this environment, so {path} cannot be read.")
    found = Path(next(iter(spec.submodule_search_locations))) / rest
    if not found.is_file():
        raise FileNotFoundError(f"{path}: no such file in the installed {package} ({found}).")
    return found


def library_lines(path: str, first: int, last: int) -> list[str]:
    """Lines ``first`` to ``last`` (1-based, inclusive) of the installed ``path``."""
    lines = source_file(path).read_text(encoding="utf-8").splitlines()
    if not 1 <= first <= last <= len(lines):
        raise SourceMismatch(f"{path} has {len(lines)} lines: {first}-{last} is not a range of it.")
    return lines[first - 1:last]


def package_version(path: str) -> str:
    """The installed version of the package ``path`` starts with, or ``"not installed"``."""
    package = path.partition("/")[0]
    try:
        return version(package.replace("_", "-"))
    except PackageNotFoundError:
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"


def show_lines(path: str, first: int, last: int, expect: str | tuple[str, ...] = ()) -> list[str]:
    """Print ``path:first-last`` from the installed package, numbered, and check each of ``expect`` is there.

    ``expect`` is compared with whitespace runs collapsed, so a citation survives re-indenting but not a change of
    code. Raises :class:`SourceMismatch` naming what is missing and the installed version."""
    lines = library_lines(path, first, last)
    print(f"{path}:{first}-{last} ({path.partition('/')[0]} {package_version(path)})")
    for number, line in enumerate(lines, first):
        print(f"{number:>5}  {line}")
    text = " ".join(" ".join(lines).split())
    missing = [e for e in ((expect,) if isinstance(expect, str) else expect) if " ".join(e.split()) not in text]
    if missing:
        raise SourceMismatch(f"{path}:{first}-{last} in {path.partition('/')[0]} {package_version(path)} does not "
                             f"contain {missing}: the citation is stale; find where the code moved and cite that.")
    return lines

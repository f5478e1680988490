"""Installed versions against the course's pins (read from the package metadata).

The pins live in ``pyproject.toml``; once installed they are also in the
package's metadata, so this works on Colab without the repository.

Example:
    >>> from helpers.versions import pinned_versions
    >>> pinned_versions()["trl"]
    '1.13.0'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata

DIST = "grpo-course"
_REQ = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*==\s*([^;\s]+)\s*(?:;\s*extra\s*==\s*[\"']([\w\-]+)[\"'])?\s*$")

#: Packages whose versions every run records.
TRACKED_PACKAGES = [
    "torch", "transformers", "trl", "peft", "datasets", "accelerate",
    "bitsandbytes", "math-verify", "unsloth", "unsloth_zoo", "vllm", DIST,
]


def canonical(name: str) -> str:
    """PEP 503 name: ``Unsloth_Zoo`` -> ``unsloth-zoo``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_versions(packages: list[str] | None = None) -> dict[str, str | None]:
    """Installed version of each package (None when missing).

    Example:
        >>> installed_versions(["pip"])["pip"] is not None
        True
    """
    out: dict[str, str | None] = {}
    for name in packages or TRACKED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def pinned_versions(extras: tuple[str, ...] = ("cpu", "gpu", "vllm")) -> dict[str, str]:
    """``{package: version}`` for every ``==`` pin of the base list and the given extras."""
    pins: dict[str, str] = {}
    for req in metadata.requires(DIST) or []:
        m = _REQ.match(req)
        if m and (m.group(3) is None or m.group(3) in extras):
            pins[canonical(m.group(1))] = m.group(2)
    return pins


@dataclass(frozen=True)
class VersionCheck:
    package: str
    pinned: str
    installed: str | None

    @property
    def ok(self) -> bool:
        return self.installed is not None and self.installed.split("+")[0] == self.pinned


def check_versions(extras: tuple[str, ...] = ("cpu",)) -> list[VersionCheck]:
    """Compare the pins of the base list plus ``extras`` with what is installed.

    Example:
        >>> [c.package for c in check_versions() if not c.ok]   # doctest: +SKIP
        []
    """
    return [
        VersionCheck(name, version, installed_versions([name])[name])
        for name, version in sorted(pinned_versions(extras).items())
    ]

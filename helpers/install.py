"""After the install cell: did it upgrade a package the kernel had already imported? Then a restart is needed.

Every notebook's first cell notes the installed distributions' versions, runs ``%pip install``, and then asks
:func:`restart_check` which distributions changed and whether a module of one of them was imported before the
install: that module stays the old version in memory, beside the new files on disk (on Colab a ``pyarrow``
imported before its upgrade broke ``import datasets`` until a restart, huggingface/datasets#6661). Colab's own
warning after ``pip install`` reads pip's "Successfully installed" line, which ``%pip install -q`` does not print
(``google/colab/_pip.py``), so the course checks for itself. Standard library only: the module is imported right
after the install, and nothing it imports may be one of the packages just changed.

Example:
    >>> stale = stale_imports({"pyarrow": "18.1.0", "tqdm": "4.67.1"}, {"pyarrow": "26.0.1", "tqdm": "4.67.1"},
    ...                       imported={"pyarrow", "pyarrow.lib"}, modules_of=lambda dist: {"pyarrow", "pyarrow.lib"})
    >>> stale
    {'pyarrow': ('18.1.0', '26.0.1', ['pyarrow', 'pyarrow.lib'])}
"""

from __future__ import annotations

import importlib
import re
import sys
from importlib import metadata
from pathlib import PurePosixPath
from typing import Callable, Iterable, Mapping

RESTART = ("Runtime > Restart session (on Kaggle: restart the kernel), then run this notebook from the next cell: "
           "the install is kept, so this cell need not run again")


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503): ``Unsloth_Zoo`` -> ``unsloth-zoo``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> dict[str, str]:
    """``{canonical name: version}`` of every installed distribution (the first found on ``sys.path`` wins)."""
    out: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            out.setdefault(canonical(name), dist.version)
    return out


def changed(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, tuple[str, str | None]]:
    """The distributions installed before whose version differs now (``None``: removed): ``{name: (old, new)}``."""
    before, after = _canonical(before), _canonical(after)
    return {name: (old, after.get(name)) for name, old in sorted(before.items()) if after.get(name) != old}


def _canonical(versions: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, version in versions.items():
        if name:  # a distribution with broken metadata has no name
            out.setdefault(canonical(name), version)
    return out


def module_names(files: Iterable[PurePosixPath | str]) -> set[str]:
    """The importable module names a distribution's files provide: ``pyarrow/lib.cpython-311-x86_64-linux-gnu.so``
    -> ``pyarrow.lib``, ``six.py`` -> ``six``, ``pkg/__init__.py`` -> ``pkg``; scripts and metadata are skipped."""
    names = set()
    for file in files:
        parts = PurePosixPath(str(file)).parts
        if not parts or parts[0] == ".." or any(p.endswith((".dist-info", ".egg-info", ".data")) or p == "__pycache__"
                                                for p in parts):
            continue
        stem, dot, suffix = parts[-1].partition(".")
        if suffix not in ("py", "pyc") and not suffix.endswith(("so", "pyd")):
            continue
        dotted = [*parts[:-1]] + ([] if stem == "__init__" else [stem])
        if dotted and all(p.isidentifier() for p in dotted):
            names.add(".".join(dotted))
    return names


def modules_of(dist: str) -> set[str]:
    """The module names distribution ``dist`` installs: from its file list (RECORD), else the top-level names
    ``importlib.metadata.packages_distributions()`` maps to it."""
    try:
        files = metadata.distribution(dist).files
    except metadata.PackageNotFoundError:
        files = None
    if files:
        return module_names(files)
    return {top for top, dists in metadata.packages_distributions().items() if dist in map(canonical, dists)}


def stale_imports(before: Mapping[str, str], after: Mapping[str, str], imported: Iterable[str] | None = None,
                  modules_of: Callable[[str], set[str]] = modules_of) -> dict[str, tuple[str, str | None, list[str]]]:
    """The changed distributions with a module in ``imported`` (``sys.modules`` by default):
    ``{name: (old version, new version, [the imported modules])}``."""
    imported = set(sys.modules if imported is None else imported)
    out = {}
    for name, (old, new) in changed(before, after).items():
        hit = sorted(modules_of(name) & imported)
        if hit:
            out[name] = (old, new, hit)
    return out


def restart_check(before: Mapping[str, str]) -> bool:
    """Compare ``before`` (the versions noted before ``%pip install``) with what is installed now; print what the
    install changed and whether the session must restart. True when it must."""
    importlib.invalidate_caches()
    after = installed()
    stale = stale_imports(before, after)
    upgraded = changed(before, after)
    added = sorted(set(after) - set(_canonical(before)))
    print(f"The install changed {len(upgraded)} package(s) the image had and added {len(added)}.")
    if not stale:
        print("None of the changed packages was imported before the install: nothing to restart.")
        return False
    for name, (old, new, hit) in stale.items():
        shown = ", ".join(hit[:3]) + (f" and {len(hit) - 3} more" if len(hit) > 3 else "")
        print(f"  {name} {old} -> {new or 'removed'}: imported before the install ({shown})")
    print(f"These modules are still the old versions in this session. Restart it: {RESTART}.")
    return True

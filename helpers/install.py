"""After the install cell: did it upgrade a package the kernel had already imported? Then the session must restart.

Serves cell 1 of every notebook (00-08), the install cell.

Cell 1 of every notebook notes the installed versions before ``%pip install``; :func:`restart_check` then looks for a
changed package whose modules were imported before: they stay the old version in memory beside the new files (a
``pyarrow`` imported before its upgrade broke ``import datasets`` on Colab, huggingface/datasets#6661). Colab's own
warning reads pip's "Successfully installed" line (``google/colab/_pip.py``), which ``pip install -q`` hides. Standard
library only: nothing this module imports may be a package the install just changed.

Example:
    >>> stale_imports({"pyarrow": "18.1.0", "tqdm": "4.67.1"}, {"pyarrow": "26.0.1", "tqdm": "4.67.1"},
    ...               imported={"pyarrow", "os"}, modules_of=lambda dist: {"pyarrow", "pyarrow.lib"})
    {'pyarrow': ('18.1.0', '26.0.1', ['pyarrow'])}
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


def canonical(versions: Mapping[str | None, str]) -> dict[str, str]:
    """Names as pip compares them (PEP 503, ``Unsloth_Zoo`` -> ``unsloth-zoo``); the first of two copies wins."""
    out: dict[str, str] = {}
    for name, version in versions.items():
        if name:  # broken metadata has no name
            out.setdefault(re.sub(r"[-_.]+", "-", name).lower(), version)
    return out


def installed() -> dict[str, str]:
    """Every installed distribution's version, noted as the install cell notes them (the first on sys.path wins)."""
    found: dict[str | None, str] = {}
    for dist in metadata.distributions():
        found.setdefault(dist.metadata["Name"], dist.version)
    return canonical(found)


def changed(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, tuple[str, str | None]]:
    """The distributions installed before whose version differs now (``None``: removed): ``{name: (old, new)}``."""
    before, after = canonical(before), canonical(after)
    return {name: (old, after.get(name)) for name, old in sorted(before.items()) if after.get(name) != old}


def module_names(files: Iterable[PurePosixPath | str]) -> set[str]:
    """The modules a distribution's files provide (``pyarrow/lib.cpython-311-x86_64-linux-gnu.so`` -> ``pyarrow.lib``,
    ``pkg/__init__.py`` -> ``pkg``); scripts, metadata and caches are skipped."""
    names = set()
    for parts in (PurePosixPath(str(f)).parts for f in files):
        if not parts or parts[0] == ".." or any(p == "__pycache__" or p.endswith(("-info", ".data")) for p in parts):
            continue
        stem, _, suffix = parts[-1].partition(".")
        dotted = [*parts[:-1]] + ([] if stem == "__init__" else [stem])
        if (suffix == "py" or suffix.endswith(("so", "pyd"))) and dotted and all(p.isidentifier() for p in dotted):
            names.add(".".join(dotted))
    return names


def modules_of(dist: str) -> set[str]:
    """The modules ``dist`` installs: from its RECORD, else the top-level names ``packages_distributions()`` gives."""
    try:
        files = metadata.distribution(dist).files
    except metadata.PackageNotFoundError:
        files = None
    return module_names(files) if files else {top for top, dists in metadata.packages_distributions().items()
                                              if dist in canonical(dict.fromkeys(dists, ""))}


def stale_imports(before: Mapping[str, str], after: Mapping[str, str], imported: Iterable[str] | None = None,
                  modules_of: Callable[[str], set[str]] = modules_of) -> dict[str, tuple[str, str | None, list[str]]]:
    """The changed distributions with a module in ``imported`` (default ``sys.modules``): ``{name: (old, new,
    [imported modules])}``."""
    imported = set(sys.modules if imported is None else imported)
    found = {name: (old, new, sorted(modules_of(name) & imported)) for name, (old, new) in changed(before, after).items()}
    return {name: hit for name, hit in found.items() if hit[2]}


def restart_check(before: Mapping[str, str]) -> bool:
    """Print what the install changed since ``before`` and whether the session must restart; True when it must."""
    importlib.invalidate_caches()
    after = installed()
    stale = stale_imports(before, after)
    print(f"The install changed {len(changed(before, after))} package(s) the image had and added "
          f"{len(set(after) - set(canonical(before)))}.")
    for name, (old, new, hit) in stale.items():
        shown = ", ".join(hit[:3]) + (f" and {len(hit) - 3} more" if len(hit) > 3 else "")
        print(f"  {name} {old} -> {new or 'removed'}: imported before the install ({shown})")
    print(f"These modules are still the old versions in this session. Restart it: {RESTART}." if stale else
          "None of the changed packages was imported before the install: nothing to restart.")
    return bool(stale)

"""Print the real signatures of GPU-path callables as JSON (run by the contract tests).

Usage: ``python tests/contract_probe.py unsloth:FastLanguageModel.from_pretrained ...``

Run with the contract environment's python (Unsloth installed); Unsloth is
imported first with ``UNSLOTH_ALLOW_CPU=1``, exactly as on a GPU, so TRL's
classes are the ones Unsloth patched.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import os
import sys


def describe(target: str) -> dict:
    module_name, _, attr_path = target.partition(":")
    obj = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    if dataclasses.is_dataclass(obj):
        return {"params": sorted(f.name for f in dataclasses.fields(obj)), "var_kw": False}
    sig = inspect.signature(obj)
    params = [
        name for name, p in sig.parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    return {"params": params, "var_kw": var_kw}


def main() -> None:
    os.environ.setdefault("UNSLOTH_ALLOW_CPU", "1")
    import unsloth  # noqa: F401  (patches TRL/transformers as on a GPU)

    out = {"versions": {}, "targets": {}}
    for name in ("unsloth", "unsloth_zoo", "trl", "transformers", "peft"):
        try:
            out["versions"][name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out["versions"][name] = None
    for target in sys.argv[1:]:
        out["targets"][target] = describe(target)
    print("CONTRACT-JSON " + json.dumps(out))


if __name__ == "__main__":
    import importlib.metadata

    main()

"""bench/measured/INDEX.md: every stored measurement, with the command, commit, date and machine that produced it.

    python dev/archive.py            # print the index
    python dev/archive.py --write    # rewrite bench/measured/INDEX.md

A result says these itself (``command``, ``commit``, ``date`` and ``machine`` or ``cpu``: a bench script prints
``bench.archive.stamped(result)``, which takes them from ``bench/record.py``). For a file stored before results did,
``bench/measured/from_git.json`` keeps what ``git log`` says: the commit that stored the file and that commit's date,
with the file's git blob hash (tests/test_archive.py fails when the file has changed since, since a new result records
its own, and checks that each of those commits holds the file). The command and machine of such a file are not
guessed: ``git show COMMIT`` has the commit's own account.

Example:
    >>> machine({"machine": {"cpu": "Intel(R) Xeon(R) Processor", "cpus": 2, "cpu_capability": "AVX512"}})
    'Intel(R) Xeon(R) Processor, 2 cores, AVX512'
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench.archive import FAMILIES, MEASURED, files  # noqa: E402 - after ROOT is on the path

INDEX = MEASURED / "INDEX.md"
FROM_GIT = MEASURED / "from_git.json"
UNKNOWN = "not recorded"


def blob(path: Path) -> str:
    """The file's git blob hash (what ``git hash-object`` prints), computed without git."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def machine(data: Any) -> str | None:
    """The machine a result names: CPU (or GPU) model, cores, torch's CPU kernels; None when it names none."""
    if not isinstance(data, dict):
        return None
    m = data.get("machine") if isinstance(data.get("machine"), (dict, str)) else data.get("cpu")
    if isinstance(m, str):
        return m
    m = m if isinstance(m, dict) else {}
    runs = data.get("runs") if isinstance(data.get("runs"), list) else []
    kernels = sorted({r["cpu_capability"] for r in runs if isinstance(r, dict) and r.get("cpu_capability")})
    parts = [m.get("cpu") or m.get("model"), m.get("gpu"),
             (cores := m.get("cpus") or m.get("cores") or data.get("cpus") or data.get("cpu_count")) and f"{cores} cores",
             m.get("cpu_capability") or m.get("capability") or (kernels and " / ".join(kernels) + " (runs)"),
             m.get("amx") and "AMX"]
    return ", ".join(str(p) for p in parts if p) or None


def recorded(data: Any) -> dict[str, str | None]:
    """What a result says of itself: command, commit, date, machine (None where it says nothing)."""
    data = data if isinstance(data, dict) else {}
    said = {k: data[k] if isinstance(data.get(k), str) else None for k in ("command", "commit", "date")}
    said["commit"] = said["commit"] or data.get("stored_at_commit")  # dev/gpu_check.py store's
    runs = [r for r in data.get("runs") or [] if isinstance(r, dict) and r.get("command")]
    if said["command"] is None and runs:  # each run keeps its own
        said["command"] = runs[0]["command"] + (f" (and {len(runs) - 1} more, in `runs`)" if len(runs) > 1 else "")
    return {**said, "machine": machine(data)}


def provenance() -> dict[str, dict[str, str]]:
    """``from_git.json``: ``{name: {"commit", "date", "path", "blob"}}`` for files that do not say their commit or date."""
    return json.loads(FROM_GIT.read_text()) if FROM_GIT.is_file() else {}


def cell(text: str | None, code: bool = False) -> str:
    text = UNKNOWN if text is None else text.replace("|", "\\|").replace("\n", " ")
    if not code or text == UNKNOWN:
        return text
    command, more, rest = text.partition(" (and ")  # "(and 4 more, in `runs`)" stays out of the code span
    return f"`{command}`" + (more + rest if more else "")


def rows() -> list[tuple[str, Path, dict[str, str]]]:
    """``(family, file, {command, commit, date, machine})``, git's commit and date marked ``(git)``."""
    git = provenance()
    out = []
    for path in files():
        said = recorded(json.loads(path.read_text()))
        known = git.get(path.name, {})
        for key in ("commit", "date"):
            if said[key] is None and key in known:
                said[key] = f"{known[key][:7] if key == 'commit' else known[key]} (git)"
        out.append((path.parent.name, path, {k: cell(v, code=k == "command") for k, v in said.items()}))
    return out


def render() -> str:
    lines = ["# The measurement archive", "",
             "<!-- index:start (dev/archive.py --write, from the files and from_git.json: do not edit) -->", "",
             "Every stored result, in its experiment's folder, with the command, commit, date and machine that "
             "produced it. A name is unique across the folders, so `bench.archive.path(\"judge.json\")` and the "
             "notebooks' `<!--bench judge.json ...-->` find `judge/judge.json`. *(git)*: the file does not say it; "
             "it is the commit that stored the file and its date (`from_git.json`; `git show` has that commit's "
             f"account of the command and machine). *{UNKNOWN}*: neither the file nor git says it.", ""]
    by_family: dict[str, list] = {}
    for family, path, said in rows():
        by_family.setdefault(family, []).append((path, said))
    for family, entries in sorted(by_family.items(), key=lambda kv: list(FAMILIES).index(kv[0])):
        script, what = FAMILIES[family]
        lines += [f"## {family}/ ({len(entries)})", "", f"{what[0].upper()}{what[1:]}; written by {script}.", "",
                  "| file | command | commit | date | machine |", "|---|---|---|---|---|"]
        lines += [f"| [`{p.name}`]({family}/{p.name}) | {s['command']} | {s['commit']} | {s['date']} | "
                  f"{s['machine']} |" for p, s in entries]
        lines.append("")
    total = sum(map(len, by_family.values()))
    said = sum(all("(git)" not in s[k] and s[k] != UNKNOWN for k in ("command", "commit", "date", "machine"))
               for entries in by_family.values() for _, s in entries)
    lines += [f"{total} files in {len(by_family)} folders; {said} say all four themselves.", "",
              "<!-- index:end -->", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if "--write" in argv:
        INDEX.write_text(render())
        print(f"wrote {INDEX.relative_to(ROOT)}")
    else:
        print(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

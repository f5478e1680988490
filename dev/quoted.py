"""Numbers the notebooks and docs quote from a measurement, checked against the bench JSON they come from.

A quoted number carries an HTML comment right after it (invisible when the markdown is rendered)::

    GRPO takes it to 78%<!--bench learning.json after.accuracy--> (+41<!--bench learning.json grpo_gain--> points)

``FILE`` is a file of ``bench/measured/`` by its short name (``judge.json`` is ``judge/judge.json``: names are unique
across the family folders, bench/measured/INDEX.md); ``PATH`` is dot-separated keys (a key may hold ": ",
as ``field: item``), a list element picked by index (``runs.0``) or by a field's value (``runs.seed=1``). The number just
before the comment is compared with the value, scaled: x100 when the number is followed by ``%`` or the comment by
"point(s)", else x1, or the scale given as a third word (``x100``, ``x1``, ``/60`` for seconds shown as minutes);
it must equal the value rounded to the decimals shown. A comment that starts ``<!--bench`` but does not parse is
reported, never skipped.

    python dev/quoted.py [FILE ...]     # default: every notebook, docs/*.md; exits 1 on a mismatch

Example:
    >>> value_at({"runs": [{"seed": 1, "after": 0.44}]}, "runs.seed=1.after")
    0.44
    >>> value_at({"qwen2.5-3b": {"steps": 250}}, "qwen2.5-3b.steps")
    250
    >>> shown_number("seed 1 reached 44%")
    ('44', '%')
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "bench" / "measured"
ANNOTATION = re.compile(r"<!--\s*bench\s+(?P<file>[\w.\-]+\.json)\s+(?P<path>(?:[^\s:]|:\s?)+?)(?:\s+(?P<scale>x100|x1|/60))?\s*-->")
NUMBER = re.compile(r"(?P<number>[+\-\u2212]?\d[\d,]*(?:\.\d+)?)\s*(?P<unit>%|[a-zA-Z]+)?[*_`)]*\s*$")
#: Any comment that starts like an annotation: one that ``ANNOTATION`` does not parse is reported, not skipped.
ANY_ANNOTATION = re.compile(r"<!--\s*bench\b.*?-->", re.S)
SCALES = {"x100": lambda v: 100 * v, "x1": lambda v: v, "/60": lambda v: v / 60}


class QuoteError(ValueError):
    """An annotation that names no value: the message says which file, path and key."""


@dataclass(frozen=True)
class Quote:
    """One annotated number: where, what it shows, and what the JSON holds."""

    where: str
    shown: str
    file: str
    path: str
    expected: float | None
    ok: bool
    problem: str = ""


def value_at(data: Any, path: str) -> Any:
    """The value at a dot-separated ``path``: keys, list indices, or ``field=value`` to pick a list element."""
    node, parts = data, path.split(".")
    while parts:
        part = parts.pop(0)
        while isinstance(node, dict) and part not in node and parts:  # a key with dots in it: "qwen2.5-3b"
            part += "." + parts.pop(0)
        if isinstance(node, list):
            if "=" in part:
                field, want = part.split("=", 1)
                matches = [x for x in node if isinstance(x, dict) and str(x.get(field)) == want]
                if len(matches) != 1:
                    raise QuoteError(f"{len(matches)} elements have {field}={want} (need exactly 1)")
                node = matches[0]
            elif part.lstrip("-").isdigit() and -len(node) <= int(part) < len(node):
                node = node[int(part)]
            else:
                raise QuoteError(f"{part!r} is not an index of a list of {len(node)}")
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            keys = sorted(node)[:12] if isinstance(node, dict) else type(node).__name__
            raise QuoteError(f"no key {part!r} (there: {keys})")
    return node


def shown_number(before: str) -> tuple[str, str] | None:
    """The last number of ``before`` and the unit right after it (``%``, a word, or ``""``)."""
    found = NUMBER.search(before)
    return (found.group("number"), found.group("unit") or "") if found else None


def stored(file: str, measured: Path = MEASURED) -> Path:
    """The file an annotation names by its short name: in a family folder (``judge/judge.json``) or at the top."""
    found = [measured / file] if (measured / file).is_file() else sorted(measured.glob(f"*/{file}"))
    if len(found) != 1:
        raise QuoteError(f"bench/measured/*/{file} does not exist" if not found else
                         f"{len(found)} files are called {file}: {', '.join(str(p.relative_to(measured)) for p in found)}")
    return found[0]


def check(text: str, where: str, measured: Path = MEASURED) -> Iterator[Quote]:
    """Every annotation in ``text`` with the verdict on its number."""
    cache: dict[str, Any] = {}
    for loose in ANY_ANNOTATION.finditer(text):
        found = ANNOTATION.fullmatch(loose.group(0))
        file, path, scale = (found["file"], found["path"], found["scale"]) if found else ("", loose.group(0), None)
        line = text.count("\n", 0, loose.start()) + 1
        spot = f"{where}:{line}"
        number = shown_number(text[max(0, loose.start() - 80):loose.start()])
        shown = number[0] if number else ""
        try:
            if found is None:
                raise QuoteError("malformed annotation: write <!--bench FILE.json PATH--> with an optional third "
                                 f"word {' or '.join(SCALES)}")
            if not number:
                raise QuoteError("no number right before the annotation")
            if file not in cache:
                cache[file] = json.loads(stored(file, measured).read_text())
            value = value_at(cache[file], path)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise QuoteError(f"the value is {value!r}, not a number")
            after = text[loose.end():loose.end() + 12].lstrip()
            scale = scale or ("x100" if number[1] == "%" or after.startswith("point") else "x1")
            expected = SCALES[scale](value)
            digits = len(shown.split(".")[1]) if "." in shown else 0
            got = float(shown.replace(",", "").replace("\u2212", "-"))
            ok = abs(got - expected) <= 0.5 * 10 ** -digits + 1e-9
            yield Quote(spot, shown, file, path, round(expected, digits + 2), ok,
                        "" if ok else f"shows {shown}, the JSON gives {round(expected, digits + 2)} ({scale})")
        except QuoteError as err:
            yield Quote(spot, shown, file, path, None, False, str(err))


def sources(paths: list[Path]) -> Iterator[tuple[str, str]]:
    """``(where, markdown)`` of each markdown cell of the notebooks and each markdown file in ``paths``."""
    for path in paths:
        name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
        if path.suffix == ".ipynb":
            for i, cell in enumerate(json.loads(path.read_text())["cells"]):
                if cell["cell_type"] == "markdown":
                    yield f"{name} cell {i}", "".join(cell["source"])
        else:
            yield name, path.read_text()


def default_paths() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")) + sorted((ROOT / "docs").glob("*.md"))


def main(argv: list[str]) -> int:
    paths = [Path(a).resolve() for a in argv] or default_paths()
    bad = 0
    for where, text in sources(paths):
        for q in check(text, where):
            bad += not q.ok
            print(f"{'ok ' if q.ok else 'BAD'} {q.where}: {q.shown or '?'} <- {q.file} {q.path}"
                  + (f"  ({q.problem})" if q.problem else ""))
    print(f"{bad} mismatched" if bad else "every quoted number matches its JSON")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""How long a notebook's main path takes to read: the words of its markdown a reader sees with every fold closed.

What counts (``visible_text``): every markdown cell; a ``<details>`` block shows only its ``<summary>`` line (that
is what a closed fold displays; ``<details open>`` shows everything); HTML comments are invisible (the
``<!--bench ...-->`` annotations); a link shows its text, not its address; code fences inside markdown are read
like any other text. A word is a whitespace-separated token with at least one letter or digit in it, so markup
(``-``, ``|---|``, ``**``, ``$$``) is not a word. Code cells are not counted.

    python dev/reading.py [NOTEBOOK ...]    # default: every course notebook; exits 1 when one is over target

Targets (issue 34): notebooks 00-05 <= 1,800 unfolded words each, 06 and later <= 2,500, 00-04 together <= 7,000.

Example:
    >>> count_words(visible_text("Read this. <details><summary>Where TRL does it</summary> line 42 </details>"))
    6
    >>> minutes(1800)
    9.0
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS_A_MINUTE = 200
#: Unfolded words allowed per notebook: 00-05 (the workshop path) and 06 onward (the advanced notebooks).
TARGET_EARLY, TARGET_LATER, LAST_EARLY = 1800, 2500, 5
#: Unfolded words allowed for notebooks 00-04 together (35 minutes at 200 words a minute).
GROUP, GROUP_TARGET = range(0, 5), 7000

_COMMENT = re.compile(r"<!--.*?-->", re.S)
#: The innermost ``<details>`` block (no other ``<details`` inside it), its attributes and its body.
_FOLD = re.compile(r"<details(?P<attrs>[^>]*)>(?P<body>(?:(?!<details[\s>]).)*?)</details>", re.S | re.I)
_SUMMARY = re.compile(r"<summary[^>]*>(?P<text>.*?)</summary>", re.S | re.I)
_IMAGE_OR_LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\([^)]*\)")
_HTML_TAG = re.compile(r"</?(?:details|summary|br|p|div|span|b|i|em|strong|sub|sup|kbd|img|a)\b[^>]*>", re.I)
_FENCE_INFO = re.compile(r"^(\s*)(```|~~~)\S*", re.M)
_WORD = re.compile(r"\S*[^\W_]\S*")
#: Words that say nothing about what a fold holds: a summary made only of these is vague.
_FILLER = {"more", "details", "detail", "click", "show", "expand", "read", "see", "here", "to", "info", "the",
           "information", "this", "open", "hidden", "extra", "notes", "note", "solution", "solutions", "answer",
           "and", "for", "me", "a", "of"}


def _close_fold(found: re.Match) -> str:
    if re.search(r"\bopen\b", found.group("attrs"), re.I):
        return found.group("body")
    summary = _SUMMARY.search(found.group("body"))
    return f"\n{summary.group('text')}\n" if summary else "\n"


def visible_text(markdown: str) -> str:
    """The text of ``markdown`` a reader sees with every ``<details>`` closed (nested folds included)."""
    text = _COMMENT.sub("", markdown)
    while True:
        closed = _FOLD.sub(_close_fold, text)
        if closed == text:
            break
        text = closed
    return _shown(text)


def _shown(text: str) -> str:
    """Links as their text, known HTML tags and code fences' markers dropped."""
    for _ in range(2):   # a badge is an image inside a link: [![alt](image)](link)
        text = _IMAGE_OR_LINK.sub(lambda m: m.group("text"), text)
    text = _FENCE_INFO.sub(r"\1", text)
    return _HTML_TAG.sub(" ", text)


def count_words(text: str) -> int:
    """Whitespace-separated tokens holding a letter or a digit."""
    return len(_WORD.findall(text))


def minutes(words: int) -> float:
    """Reading time at 200 words a minute, to 0.1 min."""
    return round(words / WORDS_A_MINUTE, 1)


def markdown_cells(path: Path) -> list[str]:
    """The source of each markdown cell of a notebook, in order."""
    cells = json.loads(Path(path).read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in cells if c["cell_type"] == "markdown"]


def number(path: Path) -> int:
    """The notebook's number: ``03_grpo_training.ipynb`` -> 3."""
    return int(Path(path).name[:2])


def target(path: Path) -> int:
    """Unfolded words allowed for one notebook."""
    return TARGET_EARLY if number(path) <= LAST_EARLY else TARGET_LATER


@dataclass(frozen=True)
class Reading:
    """One notebook's markdown: words seen with the folds closed, and words in all."""

    name: str
    unfolded: int
    total: int
    target: int

    @property
    def ok(self) -> bool:
        return self.unfolded <= self.target


def reading(path: Path) -> Reading:
    """Count one notebook's markdown words, unfolded and in all."""
    cells = markdown_cells(path)
    unfolded = sum(count_words(visible_text(c)) for c in cells)
    total = sum(count_words(_shown(_COMMENT.sub("", c))) for c in cells)
    return Reading(Path(path).stem, unfolded, total, target(path))


def fold_summaries(markdown: str) -> list[str]:
    """The ``<summary>`` text of every ``<details>`` in ``markdown`` (``""`` for a fold without one), tags stripped."""
    out = []
    for found in re.finditer(r"<details[^>]*>\s*(<summary[^>]*>(?P<text>.*?)</summary>)?", markdown, re.S | re.I):
        out.append(" ".join(re.sub(r"<[^>]+>", " ", found.group("text") or "").split()))
    return out


def vague_summary(summary: str) -> str:
    """Why a fold's summary does not say what is inside (``""`` when it does): three words or more, not filler.

    >>> vague_summary("Where TRL computes this (source lines)")
    ''
    >>> vague_summary("Read more here")
    "'Read more here' does not say what is inside"
    """
    words = _WORD.findall(summary)
    if len(words) < 3:
        return f"{summary!r} has {len(words)} word(s); say what is inside in at least three"
    if all(re.sub(r"\W", "", w).lower() in _FILLER for w in words):
        return f"{summary!r} does not say what is inside"
    return ""


def table(readings: list[Reading]) -> str:
    """A plain-text table: words per notebook unfolded and in all, minutes, target, and 00-04 together."""
    lines = [f"{'notebook':28} {'unfolded':>8} {'min':>5} {'target':>6}  {'all md':>7} {'min':>5}"]
    for r in readings:
        lines.append(f"{r.name:28} {r.unfolded:8,} {minutes(r.unfolded):5.1f} {r.target:6,}  {r.total:7,} "
                     f"{minutes(r.total):5.1f}  {'ok' if r.ok else 'OVER by ' + format(r.unfolded - r.target, ',')}")
    group = [r for r in readings if int(r.name[:2]) in GROUP]
    if len(group) == len(GROUP):
        words = sum(r.unfolded for r in group)
        lines.append(f"{'00-04 together':28} {words:8,} {minutes(words):5.1f} {GROUP_TARGET:6,}  "
                     f"{sum(r.total for r in group):7,} {minutes(sum(r.total for r in group)):5.1f}  "
                     f"{'ok' if words <= GROUP_TARGET else 'OVER by ' + format(words - GROUP_TARGET, ',')}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    from tools.course import course_notebooks

    paths = [Path(a) for a in argv] or course_notebooks()
    readings = [reading(p) for p in paths]
    print(table(readings))
    group = [r for r in readings if int(r.name[:2]) in GROUP]
    over = not all(r.ok for r in readings) or sum(r.unfolded for r in group) > GROUP_TARGET
    return 1 if over else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))

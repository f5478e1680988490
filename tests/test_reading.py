"""dev/reading.py: each notebook's main path (its markdown with every fold closed) reads in a sitting.

Targets (issue 34): <= 1,800 unfolded words for each of notebooks 00-05, <= 2,500 for 06 and later, and notebooks
00-04 together <= 7,000 (35 minutes at 200 words a minute). `python dev/reading.py` prints the table as you write.
"""

from __future__ import annotations

import json

import pytest

from tools.course import course_notebooks
from dev.reading import (GROUP, GROUP_TARGET, count_words, fold_summaries, markdown_cells, minutes, reading,
                           table, target, vague_summary, visible_text)

BOOKS = course_notebooks()


# --------------------------------------------------------------------------- the counting

def test_a_closed_fold_shows_only_its_summary():
    text = "Main text here.\n<details>\n<summary>Where TRL computes it</summary>\n\nfive hidden words in here\n</details>"
    assert visible_text(text).split() == ["Main", "text", "here.", "Where", "TRL", "computes", "it"]
    assert count_words(visible_text(text)) == 7


def test_nested_folds_show_only_the_outer_summary():
    text = ("<details><summary>Outer fold says this</summary> hidden <details><summary>inner summary words"
            "</summary> deeper </details> also hidden </details> tail")
    assert visible_text(text).split() == ["Outer", "fold", "says", "this", "tail"]


def test_an_open_fold_shows_everything():
    assert count_words(visible_text("<details open><summary>Shown open here</summary> body words</details>")) == 5


def test_comments_are_invisible_and_code_fences_are_read():
    text = "GRPO reaches 78%<!--bench learning.json after.accuracy--> here\n```python\nx = f(y)\n```"
    assert visible_text(text).split()[:3] == ["GRPO", "reaches", "78%"]
    assert "bench" not in visible_text(text)
    assert count_words(visible_text(text)) == 6    # GRPO reaches 78% here x f(y); "=" and the fences are markup


def test_markup_is_not_a_word_and_a_link_shows_its_text():
    assert count_words(visible_text("| a | b |\n|---|---|\n- **bold** item\n$$x$$")) == 5
    assert visible_text("[GSM8K](https://huggingface.co/datasets/openai/gsm8k) set").split() == ["GSM8K", "set"]
    assert visible_text("[![Open In Colab](https://x/badge.svg)](https://colab/nb)").split() == ["Open", "In", "Colab"]


def test_reading_counts_a_notebook_unfolded_and_in_all(tmp_path):
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["One two three.\n",
                                                                  "<details><summary>Four five six</summary>\n",
                                                                  "seven eight\n</details>"]},
             {"cell_type": "code", "metadata": {}, "source": "not counted at all", "outputs": [],
              "execution_count": None}]
    path = tmp_path / "03_x.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    got = reading(path)
    assert (got.unfolded, got.total, got.target, got.ok) == (6, 8, 1800, True)
    assert len(markdown_cells(path)) == 1
    assert minutes(got.unfolded) == 0.0 and minutes(1800) == 9.0
    assert target(tmp_path / "06_y.ipynb") == 2500 and target(tmp_path / "07_z.ipynb") == 2500


@pytest.mark.parametrize("summary, vague", [
    ("Solution", True), ("More", True), ("Details", True), ("", True), ("Read more here", True), ("Where the data comes from", False),
    ("Solution: validate and save your CSV", False), ("Where TRL computes this (source lines)", False),
    ("show more details", True)])
def test_a_summary_must_say_what_is_inside(summary, vague):
    assert bool(vague_summary(summary)) is vague


def test_fold_summaries_finds_each_fold_and_a_missing_summary():
    text = "<details>\n<summary><b>Solution</b> to exercise 1</summary>x</details> <details>no summary</details>"
    assert fold_summaries(text) == ["Solution to exercise 1", ""]


# --------------------------------------------------------------------------- the course itself

def test_each_notebook_reads_within_its_target():
    readings = [reading(p) for p in BOOKS]
    assert readings, "no course notebook found"
    over = [r for r in readings if not r.ok]
    assert not over, ("unfolded markdown over target for " + ", ".join(r.name for r in over)
                      + " (fold depth into <details> with a summary line, or move it to 'Going deeper'):\n"
                      + table(readings))


def test_notebooks_00_to_04_read_together_in_35_minutes():
    readings = [reading(p) for p in BOOKS if int(p.name[:2]) in GROUP]
    assert len(readings) == len(GROUP)
    words = sum(r.unfolded for r in readings)
    assert words <= GROUP_TARGET, (f"notebooks 00-04 read {words:,} unfolded words ({minutes(words)} min), "
                                   f"target {GROUP_TARGET:,}:\n" + table(readings))


@pytest.mark.parametrize("path", BOOKS, ids=lambda p: p.stem)
def test_every_fold_has_a_summary_that_says_what_is_inside(path):
    vague = [f"cell {i}: {problem}" for i, cell in enumerate(json.loads(path.read_text())["cells"])
             if cell["cell_type"] == "markdown"
             for summary in fold_summaries("".join(cell["source"])) if (problem := vague_summary(summary))]
    assert not vague, f"{path.name}: a <summary> is the line a reader sees folded:\n" + "\n".join(vague)


README_TARGET = 1500  #: the README is a page (issue 34): what, two commands, the tables, the figure, links


def test_the_readme_is_a_page_and_its_links_to_docs_exist():
    from pathlib import Path
    import re

    root = Path(__file__).resolve().parents[1]
    text = (root / "README.md").read_text()
    words = count_words(visible_text(text))
    assert words <= README_TARGET, (f"README.md shows {words} words ({minutes(words):.1f} min), over its "
                                    f"{README_TARGET}: move detail into docs/ and link it")
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert {"docs/measured.md", "docs/scaling-out.md", "docs/tests.md", "docs/your-own-task.md",
            "docs/colab-and-vllm.md", "docs/instructor.md"} <= set(links)
    assert all((root / link).is_file() for link in links), [link for link in links if not (root / link).is_file()]

"""dev/quoted.py: every number the notebooks and docs quote from a measurement is the one its JSON holds."""

from __future__ import annotations

import json
import re

import pytest

from dev.quoted import MEASURED, ROOT, QuoteError, check, default_paths, shown_number, sources, value_at


@pytest.fixture
def measured(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"after": {"accuracy": 0.785, "field: item": 0.7}, "gain": 0.41,
                                                   "seconds": 283.4,
                                                   "runs": [{"seed": 1, "after": 0.44}, {"seed": 2, "after": 0.66}]}))
    return tmp_path


def verdicts(text, measured):
    return [(q.shown, q.ok, q.problem) for q in check(text, "t", measured)]


def test_a_matching_number_passes_and_a_stale_one_fails(measured):
    assert verdicts("reached 78.5%<!--bench run.json after.accuracy-->", measured) == [("78.5", True, "")]
    assert verdicts("reached 79%<!--bench run.json after.accuracy-->", measured)[0][1] is True  # rounded either way
    stale = verdicts("reached 75%<!--bench run.json after.accuracy-->", measured)[0]
    assert stale[1] is False and "the JSON gives 78.5" in stale[2]


def test_points_and_explicit_scales(measured):
    assert verdicts("a gain of +41<!--bench run.json gain--> points", measured)[0][1]
    assert not verdicts("a gain of +41<!--bench run.json gain--> steps", measured)[0][1]  # no scale: 0.41 vs 41
    assert verdicts("**4.7 min**<!--bench run.json seconds /60-->", measured)[0][1]
    assert verdicts("283 s<!--bench run.json seconds-->", measured)[0][1]


def test_list_elements_by_field_and_index(measured):
    assert verdicts("seed 2: 66%<!--bench run.json runs.seed=2.after-->", measured)[0][1]
    assert verdicts("seed 1: 44%<!--bench run.json runs.0.after-->", measured)[0][1]


def test_a_key_with_a_colon_and_space(measured):
    assert verdicts("item 70%<!--bench run.json after.field: item-->", measured) == [("70", True, "")]
    assert not verdicts("item 60%<!--bench run.json after.field: item-->", measured)[0][1]


@pytest.mark.parametrize("text, problem", [
    ("x 5%<!--bench missing.json a-->", "does not exist"),
    ("x 5%<!--bench run.json after.nothing-->", "no key 'nothing'"),
    ("x 5%<!--bench run.json runs.seed=9.after-->", "0 elements have seed=9"),
    ("x 5%<!--bench run.json after-->", "not a number"),
    ("no number here<!--bench run.json gain-->", "no number right before"),
])
def test_an_annotation_that_names_nothing_is_reported_not_raised(measured, text, problem):
    [(shown, ok, message)] = verdicts(text, measured)
    assert not ok and problem in message


@pytest.mark.parametrize("text", [
    "a gain of +41<!--bench run.json gain points-->",  # an unknown third word
    "reached 78.5%<!--bench run.json-->",  # no path
    "reached 78.5%<!-- bench run after.accuracy -->",  # not a .json file
])
def test_a_malformed_annotation_is_reported_not_skipped(measured, text):
    [(shown, ok, message)] = verdicts(text, measured)
    assert not ok and "malformed annotation" in message and "x100" in message


def test_value_at_and_shown_number_helpers():
    assert value_at({"a": [{"k": "x", "v": 3}]}, "a.k=x.v") == 3
    with pytest.raises(QuoteError):
        value_at({"a": [1, 2]}, "a.5")
    assert shown_number("took **4.7** min") is None or shown_number("took **4.7**")[0] == "4.7"
    assert shown_number("went 37% -> 78%") == ("78", "%")


# --------------------------------------------------------------------------- the course itself

def test_every_quoted_number_in_the_notebooks_and_docs_matches_its_json():
    quotes = [q for where, text in sources(default_paths()) for q in check(text, where)]
    assert quotes, "no annotated number found: the notebooks quote measurements"
    bad = [f"{q.where}: {q.shown} <- {q.file} {q.path}: {q.problem}" for q in quotes if not q.ok]
    assert not bad, "stale quoted numbers (fix the text or re-run the bench):\n" + "\n".join(bad)


#: A markdown paragraph that names a stored measurement (``bench/...``, a ``bench/measured`` file).
CITES = re.compile(r"bench/|\b(" + "|".join(re.escape(p.name) for p in sorted(MEASURED.glob("*/*.json"))) + r")\b")
#: A percentage, "N points", or seconds a step: the kinds of number a measurement gives.
MEASURE = re.compile(r"(?<![\w.])[+\-]?\d[\d,]*(?:\.\d+)?(?:\s?%| points?\b| s a step| s/step)")
GENERATED = re.compile(r"<!-- (\w+):start.*?<!-- \1:end -->", re.S)


def test_a_paragraph_that_cites_a_measurement_annotates_its_numbers():
    """A percentage, a gain in points or a step time in a paragraph citing bench output carries its source."""
    missing = []
    for where, text in sources(default_paths()):
        for paragraph in re.split(r"\n\s*\n", GENERATED.sub("", text)):
            if not CITES.search(paragraph):
                continue
            for found in MEASURE.finditer(paragraph):
                if not re.match(r"(\*\*|\))?\s*<!--\s*bench\s", paragraph[found.end():found.end() + 20]):
                    missing.append(f"{where}: {paragraph[max(0, found.start() - 40):found.end() + 10]!r}")
    assert not missing, (f"{len(missing)} measured numbers carry no <!--bench FILE PATH--> annotation "
                         "(dev/quoted.py says how):\n" + "\n".join(missing[:40]))


def test_the_checker_reads_every_notebook_and_doc():
    names = {p.name for p in default_paths()}
    assert {"03_grpo_training.ipynb", "instructor.md"} <= names
    assert all(p.is_relative_to(ROOT) for p in default_paths())

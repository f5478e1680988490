"""One source for every measured number: the benchmarks' committed JSON (bench/measured/)."""

from __future__ import annotations

import pytest

from helpers.config import PROFILES, project_root
from tools.measured import END, START, load, render

README = project_root() / "README.md"


def test_the_readme_measured_section_is_what_the_benchmarks_printed():
    text = README.read_text()
    assert START in text and END in text, "README.md lost its measured markers"
    section = START + text.split(START, 1)[1].split(END, 1)[0] + END
    assert section == render(), "README's measured section is stale: run `python tools/measured.py --write`"


@pytest.mark.parametrize("profile", ["cpu-smoke", "cpu-demo"])
def test_cpu_profile_minutes_are_the_measured_ones(profile):
    measured = load("course")[f"course-{profile.split('-')[1]}"]["minutes"]
    assert PROFILES[profile].minutes == measured, (
        f"{profile}.minutes {PROFILES[profile].minutes} != bench/measured/course.json {measured}")


def test_the_readme_profile_table_adds_up_the_profiles_minutes():
    import re

    rows = re.findall(r"^\| `(cpu-smoke|cpu-demo|colab-t4|gpu-large)` \|.*\| ~([\d.]+) (min|h) ", README.read_text(), re.M)
    assert len(rows) == 4, "the README's profile table lost a row"
    for name, amount, unit in rows:
        total = sum(PROFILES[name].minutes.values())
        assert float(amount) == round(total if unit == "min" else total / 60), (
            f"README says ~{amount} {unit} for {name}; its notebooks' minutes add up to {total:g}")


def test_the_readme_colab_section_is_what_pip_answered():
    from tools.measured import COLAB_END, COLAB_START, render_colab

    text = README.read_text()
    section = COLAB_START + text.split(COLAB_START, 1)[1].split(COLAB_END, 1)[0] + COLAB_END
    assert section == render_colab(), "README's Colab section is stale: run `python tools/measured.py --write`"

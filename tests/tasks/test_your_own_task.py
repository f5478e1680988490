"""Issue 32's acceptance test: notebook 05's numeric task, written to a folder outside the repository, goes through
the check, data prep, the warm-up, GRPO, the evaluation, the recipe and `trl grpo` exactly as the kit prints it,
with no change to helpers/ (slow: it trains)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def units_source() -> str:
    """The ``units.py`` that notebook 05 writes with ``%%writefile``, as the learner reads it."""
    nb = nbformat.read(ROOT / "notebooks" / "05_your_own_task.ipynb", as_version=4)
    [cell] = [c.source for c in nb.cells if c.cell_type == "code" and c.source.startswith("%%writefile {TASKS}/units")]
    return cell.split("\n", 1)[1]


@pytest.fixture
def outside(tmp_path, monkeypatch):
    folder = tmp_path / "my_tasks"
    folder.mkdir()
    (folder / "units.py").write_text(units_source())
    assert not folder.is_relative_to(ROOT)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "units", raising=False)  # each test imports its own copy
    yield folder
    sys.modules.pop("units", None)


def test_the_notebook_s_numeric_task_is_small_and_passes_every_check(outside):
    from helpers.models import load_tokenizer
    from helpers.profiles import get_profile
    from helpers.tasks import get_task
    from helpers.tasks.check import check_task

    assert len(units_source().splitlines()) <= 45  # "the smallest complete numeric task (a few dozen lines)"
    for name in ("cpu-smoke", "cpu-demo", "colab-t4"):
        profile = get_profile(name, task="units:UnitsTask")
        assert (profile.task_level, profile.warmup_level) == ("tenths", "whole")
        tokenizer = load_tokenizer(get_profile("cpu-smoke")) if profile.backend != "unsloth" else None
        assert check_task(get_task("units:UnitsTask"), profile, tokenizer=tokenizer) == []
    rows = get_task("units:UnitsTask").make_rows("tenths", 1200, seed=3407)  # cpu-demo's 1000 + 200, distinct
    assert len({r["question"] for r in rows}) == 1200
    assert all(re.fullmatch(r"\d+(\.\d)?", r["answer"]) for r in rows)


@pytest.mark.slow
def test_a_task_outside_the_repository_trains_evaluates_and_runs_through_trl_grpo(outside, tmp_path):
    from helpers.data import ensure_prepared
    from helpers.evaluation import eval_settings, evaluate_adapters
    from helpers.profiles import get_profile
    from helpers.recipe import Recipe, write_recipe
    from helpers.tasks import get_task
    from helpers.training import train_grpo

    profile = get_profile("cpu-smoke", task="units:UnitsTask", time_budget_minutes=None)
    run = tmp_path / "run"
    data = ensure_prepared(profile, run, verbose=False)
    assert data["train"][0]["question"].startswith("Convert ")
    out = train_grpo(profile, run)
    assert out["summary"]["global_step"] == profile.max_steps and out["summary"]["warmup"]["examples"] > 0
    result = evaluate_adapters(out["model"], out["tokenizer"], data["eval"].select(range(4)), get_task(profile.task),
                               eval_settings(profile), {"base": None, "after GRPO": "default"}, progress=None)
    assert {"accuracy", "correct", "format"} <= set(result["sides"]["after GRPO"]["summary"])

    # the recipe, without a warm-up: one `trl grpo` line, run as printed, from elsewhere, no PYTHONPATH of ours
    recipe_run = tmp_path / "recipe-run"
    recipe = write_recipe(profile.with_overrides(warmup_examples=0), recipe_run)
    assert Recipe.of(recipe_run).pythonpath == (str(outside),)
    header = recipe.grpo.read_text().split("\nmodel_name_or_path")[0]
    assert f"# PYTHONPATH: {outside}" in header and f"env PYTHONPATH={outside} trl grpo" in header
    [line] = recipe.commands()
    assert line == f"env PYTHONPATH={shlex.quote(str(outside))} trl grpo --config {shlex.quote(str(recipe.grpo))}"
    assert yaml.safe_load(recipe.grpo.read_text())["reward_funcs"][0] == "helpers.tasks.reasoning.correctness_reward"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    done = subprocess.run(["bash", "-c", line], cwd=ROOT.parent, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((recipe.output / "grpo" / f"checkpoint-{profile.max_steps}" / "trainer_state.json").read_text())
    assert state["global_step"] == profile.max_steps

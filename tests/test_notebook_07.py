"""Notebook 07 writes its tool, its configs and its trainer in cells; ``bench/tools.py`` measures the same recipe
through the helpers. These checks keep the two one recipe (the numbers the notebook quotes are the bench's)."""

from __future__ import annotations

import ast

import pytest
from transformers.utils import get_json_schema

from helpers.calculator import calculate, calculator
from helpers.profiles import PROFILES, get_model_spec, get_profile
from helpers.runs import project_root
from helpers.tasks.tool_arithmetic import ToolArithmeticTask
from helpers.training import grpo_kwargs, precision, sft_kwargs

from .notebook_code import notebook_code

NOTEBOOK = project_root() / "notebooks" / "07_grpo_with_tools.ipynb"
TASK_KEY = "tools"  # helpers.tasks.tool_arithmetic:ToolArithmeticTask


@pytest.fixture(scope="module")
def source():
    return notebook_code(NOTEBOOK, solutions=False)


def assigned(source: str, name: str) -> str:
    found = [n for n in ast.parse(source).body if isinstance(n, ast.Assign)
             and any(getattr(t, "id", None) == name for t in n.targets)]
    assert found, f"notebook 07 has no `{name} = ...` statement"
    return ast.get_source_segment(source, found[-1])


def test_the_notebook_writes_the_tool_the_benchmark_measures(source):
    """The model reads the schema TRL builds from the function: the cell's and helpers.calculator's must agree."""
    found = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "calculator"]
    assert len(found) == 1, "notebook 07 no longer writes `def calculator` in a cell"
    namespace: dict = {"calculate": calculate}
    exec(compile(ast.Module([found[0]], []), "notebook-07", "exec"), namespace)  # noqa: S102 - the course's cell
    assert get_json_schema(namespace["calculator"]) == get_json_schema(calculator)
    assert namespace["calculator"]("__import__('os')") == calculator("__import__('os')")


def test_the_trainer_takes_the_tool_and_the_loop_limit_in_the_cells(source):
    assert "tools=[calculator]" in source and "max_tool_calling_iterations=TASK.max_tool_calling_iterations" in source
    assert "GRPOTrainer(" in source and "GRPOConfig(**ASKED)" in source and "assistant_only_loss=True" in source


@pytest.mark.parametrize("name", list(PROFILES), ids=str)
def test_the_grpo_config_cell_is_notebook_03s_recipe_plus_the_loop_limit(source, name, tmp_path):
    profile = get_profile(name, task=TASK_KEY, use_vllm=False)
    capability = (7, 5) if profile.backend == "unsloth" else None
    task = ToolArithmeticTask()
    namespace = {"PROFILE": profile, "SPEC": get_model_spec(profile.model), "RUN": tmp_path, "TASK": task,
                 "REWARDS": task.rewards_for(profile.task_level), "PRECISION": precision(profile, capability)}
    exec("from helpers.tracking import run_name_for, use_trackio\nTRACKING = use_trackio(RUN)\n"  # noqa: S102
         + assigned(source, "ASKED"), namespace)
    expected = {**grpo_kwargs(profile, tmp_path, capability),
                "max_tool_calling_iterations": task.max_tool_calling_iterations}
    assert namespace["ASKED"] == expected


@pytest.mark.parametrize("name", ["cpu-smoke", "cpu-demo"])
def test_the_warm_up_cell_is_notebook_03s_plus_the_masked_replies(source, name, tmp_path):
    profile = get_profile(name, task=TASK_KEY)
    namespace = {"PROFILE": profile, "RUN": tmp_path, "PRECISION": precision(profile, None),
                 "SFTConfig": lambda **kwargs: kwargs}
    cell = ast.parse(source)
    call = next(n for n in ast.walk(cell)
                if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "sft_config")
    exec(compile(ast.Module([call], []), "notebook-07", "exec"), namespace)  # noqa: S102
    assert namespace["sft_config"] == {**sft_kwargs(profile, tmp_path), "assistant_only_loss": True}

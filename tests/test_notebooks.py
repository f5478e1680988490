"""The notebooks: conventions every one follows, the library calls they teach, and numbers that agree.

(The notebooks themselves are executed by nbval in `make test`; the keywords of their library
calls are checked against the installed signatures in tests/test_contract_calls.py.)
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
import os
import subprocess
import sys

import nbformat
import pytest

from helpers.profiles import PROFILES, get_model_spec, get_profile
from helpers.runs import project_root
from helpers.tasks import BUILTIN, get_task
from helpers.training import precision
from tools.course import course_notebooks

from .notebook_code import notebook_code, solution_blocks

BOOKS = course_notebooks()
ROOT = project_root()
INSTALL_LINE = '%pip install -q "grpo-course[gpu] @ git+'


def cells(path: Path) -> list:
    return nbformat.read(path, as_version=4).cells


def code(path: Path) -> str:
    return notebook_code(path)


def markdown(path: Path) -> str:
    return "\n".join(c.source for c in cells(path) if c.cell_type == "markdown")


def calls(source: str) -> set[str]:
    """Dotted names of every call in the source: ``GRPOConfig``, ``FastLanguageModel.from_pretrained``, ``.map``."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f, parts = node.func, []
            while isinstance(f, ast.Attribute):
                parts.append(f.attr)
                f = f.value
            parts.append(f.id if isinstance(f, ast.Name) else "")
            out.add(".".join(reversed(parts)))
    return out


# --------------------------------------------------------------------------- conventions


@pytest.mark.parametrize("path", BOOKS, ids=lambda p: p.stem)
def test_only_checked_cells_keep_outputs(path):
    for i, cell in enumerate(cells(path)):
        if cell.cell_type != "code":
            continue
        if cell.source.lstrip().startswith("# NBVAL_CHECK_OUTPUT"):
            assert cell.outputs, f"checked cell {i} has no reference output: run dev/clean_notebooks.py --execute"
        else:
            assert not cell.outputs, f"cell {i} has stray outputs: run dev/clean_notebooks.py"
            assert cell.execution_count is None, f"cell {i}: run dev/clean_notebooks.py"


#: A raw float in printed text: many decimals, or an exponent. Rounded values (0.25, 1.453) and verdicts pass.
RAW_FLOAT = re.compile(r"(?<![\w.])-?\d+\.\d{5,}|\d(?:\.\d+)?e[-+]\d{2}")


def checked_text(cell) -> str:
    return "".join(o.get("text", "") if "text" in o else str(o.get("data", {}).get("text/plain", ""))
                   for o in cell.outputs)


def test_the_raw_float_finder_finds_them():
    assert RAW_FLOAT.search("largest difference: 1.1920928955078125e-07") and RAW_FLOAT.search("x 0.333333")
    assert not RAW_FLOAT.search("total 3.250, std 0.946, 42 steps, v1.13.0, rank 16, 2025-06-28")


@pytest.mark.parametrize("path", BOOKS, ids=lambda p: p.stem)
def test_checked_cells_print_no_raw_float(path):
    """A checked output must read the same on every CPU: a raw float depends on the kernels and threads."""
    for i, cell in enumerate(cells(path)):
        if cell.cell_type == "code" and cell.source.lstrip().startswith("# NBVAL_CHECK_OUTPUT"):
            found = RAW_FLOAT.search(checked_text(cell))
            assert not found, f"{path.name} cell {i} prints the raw float {found.group(0)!r}: round it or print a verdict"


#: Notebooks whose checked cells print what torch computed (advantages, losses): run again on other kernels.
NUMERIC = ["02_reward_lab"]


def nbval_runs_it_here_already(path: Path, session: pytest.Session) -> bool:
    """True where this session's own nbval run of ``path`` already is the AVX2, one-thread run: torch picks its AVX2
    kernels here (an AVX2-only CPU, or ``ATEN_CPU_CAPABILITY=avx2``, which the kernels inherit), ``OMP_NUM_THREADS``
    is 1, and the notebook's cells are collected in this session (under xdist every worker collects every item)."""
    import torch

    if torch.backends.cpu.get_cpu_capability() != "AVX2" or os.environ.get("OMP_NUM_THREADS") != "1":
        return False
    return any(str(getattr(item, "path", "")) == str(path) for item in session.items)


@pytest.mark.slow
@pytest.mark.parametrize("name", NUMERIC)
def test_checked_outputs_hold_on_other_kernels(name, tmp_path, request):
    """Many laptops have no AVX-512: torch's AVX2 kernels on one thread must print the same checked outputs."""
    path = ROOT / "notebooks" / f"{name}.ipynb"
    if not path.is_file():
        pytest.fail(f"{path.name} is missing")
    if nbval_runs_it_here_already(path, request.session):
        pytest.skip(f"nbval runs {path.name} in this session on this CPU's AVX2 kernels with one thread "
                    "(OMP_NUM_THREADS=1): the very run this test would repeat")
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2", OMP_NUM_THREADS="1", COURSE_PROFILE="cpu-smoke",
               COURSE_RUN_DIR=str(tmp_path), HF_HUB_OFFLINE="1", MPLBACKEND="Agg")
    proc = subprocess.run([sys.executable, "-m", "pytest", str(path), "--nbval-lax", "--current-env", "-q",
                           "-p", "no:cacheprovider", "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml")],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:]


@pytest.mark.parametrize("path", BOOKS, ids=lambda p: p.stem)
def test_opens_with_badge_install_cell_and_profile_importing_unsloth_first(path):
    first = cells(path)[0]
    install, profile = [c for c in cells(path) if c.cell_type == "code"][:2]
    assert first.cell_type == "markdown" and f"notebooks/{path.name}" in first.source
    for word in ("you will learn", "how long it takes", "cpu-demo", "colab-t4"):
        assert word in first.source.lower(), f"intro lacks {word!r}"
    assert INSTALL_LINE in install.source and "{KEEP}" in install.source
    assert 'if "google.colab" in sys.modules or "KAGGLE_KERNEL_RUN_TYPE" in os.environ' in install.source
    assert "PROFILE = get_profile()" in profile.source and "RUN = run_dir(" in profile.source
    # Unsloth patches TRL at import: on a GPU profile it is imported before anything else touches TRL,
    # or (notebook 06, which checks TRL's own loss) a GPU profile is swapped for cpu-demo and Unsloth never imported
    lines = profile.source.splitlines()
    if 'if PROFILE.backend != "transformers":' in lines:
        guard = lines.index('if PROFILE.backend != "transformers":')
        body = "\n".join(line for line in lines[guard + 1:] if line.startswith("    "))
        code = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
        assert 'PROFILE = get_profile("cpu-demo"' in body and "unsloth" not in code.replace("Unsloth", "").lower()
    else:
        guard = lines.index('if PROFILE.backend == "unsloth":')
        assert lines[guard + 1].strip().startswith("import unsloth")
    assert not any("trl" in line or "helpers.training" in line for line in lines[:guard])


@pytest.mark.parametrize("path", BOOKS, ids=lambda p: p.stem)
def test_has_exercises_with_solutions_and_troubleshooting(path):
    text = markdown(path)
    assert "<details>" in text and "Exercise" in text and "Troubleshooting" in text


@pytest.mark.parametrize("path", BOOKS, ids=lambda p: p.stem)
def test_every_solution_is_code_the_tests_run(path):
    """conftest.py runs each solution block after the notebook's cells; a solution fold without one is untested.

    A fold whose <summary> starts with "Solution" holds solutions; other <details> are depth to read, never run."""
    from .notebook_code import _FENCE, solution_folds

    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        for details in solution_folds(cell.source) if cell.cell_type == "markdown" else []:
            assert _FENCE.findall(details), f"{path.name} cell {i}: a <details> solution with no ```python block"
    folds = sum(cell.source.count("<details>") for cell in nb.cells if cell.cell_type == "markdown")
    summaries = sum(len(re.findall(r"<details>\s*<summary>", cell.source)) for cell in nb.cells
                    if cell.cell_type == "markdown")
    assert folds == summaries, f"{path.name}: every <details> opens with a <summary> line saying what is inside"
    blocks = solution_blocks(nb)
    assert blocks, f"{path.name}: no solution code for the tests to run"
    for block in blocks:
        ast.parse(block)  # a solution that does not even parse would fail as a test item anyway


@pytest.mark.parametrize("path", BOOKS, ids=lambda p: p.stem)
def test_the_profile_cell_keeps_runs_where_a_disconnect_cannot_lose_them(path):
    profile = [c for c in cells(path) if c.cell_type == "code"][1].source
    assert "KEEP_RUNS = True" in profile, "the profile cell lacks the KEEP_RUNS switch"
    keep = profile.index("use_persistent_runs(KEEP_RUNS)")
    assert profile.index("KEEP_RUNS = True") < keep < profile.index("RUN = run_dir("), (
        "use_persistent_runs must set COURSE_RUNS before run_dir picks the folder")


@pytest.mark.parametrize("path", BOOKS, ids=lambda p: p.stem)
def test_gpu_only_cells_are_skipped_by_nbval_and_guarded(path):
    for i, cell in enumerate(cells(path)):
        if cell.cell_type == "code" and cell.source.startswith("# NBVAL_SKIP"):
            assert any(guard in cell.source for guard in ("PROFILE.backend", "PROFILE.use_vllm", "COURSE_HEADLESS")), (
                f"cell {i} is skipped by nbval but not guarded for `make course` on a CPU")


@pytest.mark.parametrize("path", BOOKS, ids=lambda p: p.stem)
def test_notebooks_are_small_and_parse(path):
    assert path.stat().st_size < 200_000
    ast.parse(code(path))


# --------------------------------------------------------------------------- the calls a learner came to learn

TAUGHT = {
    "01_dataset_prep": {"load_dataset", "gsm8k.map", "rows.map", "gsm_train.filter", "AutoTokenizer.from_pretrained",
                        "broken.rename_columns"},
    "02_reward_lab": {"accuracy_reward", "get_repetition_penalty_reward", "rewards.std"},
    "03_grpo_training": {"FastLanguageModel.from_pretrained", "FastLanguageModel.get_peft_model",
                         "AutoModelForCausalLM.from_pretrained", "BitsAndBytesConfig", "LoraConfig", "get_peft_model",
                         "SFTConfig", "SFTTrainer", "sft.train", "GRPOConfig", "GRPOTrainer", "trainer.train",
                         "trainer.save_model"},
    "04_merge_and_inference": {"PeftModel.from_pretrained", "model.load_adapter", "merge_and_unload",
                               "model.save_pretrained_merged", "AutoModelForCausalLM.from_pretrained",
                               "model.save_pretrained_gguf", "get_token", "model.push_to_hub_merged"},
    "05_your_own_task": {"load_dataset", "rename_columns", "Draft202012Validator", "train_grpo", "evaluate_adapters"},
    "07_grpo_with_tools": {"GRPOConfig", "GRPOTrainer", "SFTConfig", "SFTTrainer", "sft.train", "trainer.train",
                           "get_json_schema", "supports_tool_calling", "evaluate_with_tools"},
}


@pytest.mark.parametrize("name", list(TAUGHT))
def test_the_library_calls_stand_in_the_cells(name):
    found = calls(code(ROOT / "notebooks" / f"{name}.ipynb"))
    dotted = found | {c.split(".", 1)[-1] for c in found}  # `x.merge_and_unload` counts as merge_and_unload
    missing = sorted(c for c in TAUGHT[name] if c not in dotted and not any(f.endswith("." + c) for f in found))
    assert not missing, f"{name} no longer writes {missing} in its cells"


def test_notebooks_do_not_hide_the_trainer_behind_helpers():
    source = notebook_code(ROOT / "notebooks" / "03_grpo_training.ipynb", solutions=False)
    for hidden in ("train_grpo(", "ensure_adapter(", "grpo_config(", "run_warmup("):
        assert hidden not in source, f"notebook 03 calls {hidden} outside its exercise solutions"


def test_rewards_written_out_in_the_reward_lab():
    tree = ast.parse(code(ROOT / "notebooks" / "02_reward_lab.ipynb"))
    defined = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    for name in ("simple_format_reward", "simple_correctness_reward"):
        args = defined[name].args
        assert args.args[0].arg == "completions" and args.kwarg is not None, f"{name} is not in TRL's convention"


# --------------------------------------------------------------------------- one recipe: notebook 03's cell = the save point


def assigned(source: str, name: str) -> str:
    """The source of the top-level statement ``name = ...`` (the last one)."""
    found = [n for n in ast.parse(source).body if isinstance(n, ast.Assign)
             and any(getattr(t, "id", None) == name for t in n.targets)]
    assert found, f"no `{name} = ...` statement"
    return ast.get_source_segment(source, found[-1])


@pytest.mark.parametrize("profile", list(PROFILES.values()), ids=lambda p: p.name)
def test_notebook_03_grpo_config_is_the_save_point(profile, tmp_path):
    """Notebook 03's GRPOConfig cell passes exactly the save point's keywords (helpers.training.grpo_kwargs)."""
    from helpers.tracking import use_trackio
    from helpers.training import grpo_kwargs

    source = code(ROOT / "notebooks" / "03_grpo_training.ipynb")
    assert "config = GRPOConfig(**ASKED)" in source
    capability = (7, 5) if profile.backend == "unsloth" else None
    namespace = {"PROFILE": profile, "SPEC": get_model_spec(profile.model), "RUN": tmp_path,
                 "REWARDS": get_task(profile.task).rewards_for(profile.task_level),
                 "PRECISION": precision(profile, capability), "TRACKING": use_trackio(tmp_path)}
    exec(assigned(source, "ASKED"), namespace)  # noqa: S102 - the notebook's own cell
    assert namespace["ASKED"] == grpo_kwargs(profile, tmp_path, capability)


def shared_blocks(a: str, b: str, size: int = 6) -> list[str]:
    """Runs of ``size`` consecutive non-blank, non-comment lines (whitespace-normalised) that both sources hold."""
    def lines(source: str) -> list[str]:
        out = [" ".join(line.split("#")[0].split()) for line in source.splitlines()]
        return [line for line in out if line]

    windows = lambda ls: {tuple(ls[i:i + size]) for i in range(len(ls) - size + 1)}  # noqa: E731
    return ["\n".join(w) for w in windows(lines(a)) & windows(lines(b))]


def test_the_shared_block_finder_finds_a_copy():
    block = "\n".join(f"x{i} = {i}" for i in range(6))
    assert shared_blocks("a = 1\n" + block, block + "\n# comment\nb = 2") and not shared_blocks(block, "y = 1")


def test_notebook_05_teaches_the_task_and_trains_through_notebook_03s_path():
    """No third copy of the trainer: notebooks 03 and 05 share no block of six lines (issue 17)."""
    three = notebook_code(ROOT / "notebooks" / "03_grpo_training.ipynb", solutions=False)
    five = notebook_code(ROOT / "notebooks" / "05_your_own_task.ipynb", solutions=False)
    install = [c for c in cells(ROOT / "notebooks" / "03_grpo_training.ipynb") if c.cell_type == "code"][:2]
    common = [b for b in shared_blocks(three, five) if not any(b.split("\n")[0] in c.source for c in install)]
    assert not common, "notebooks 03 and 05 repeat code:\n" + common[0]
    assert "GRPOConfig(" not in five and "GRPOTrainer(" not in five and "SFTConfig(" not in five


# --------------------------------------------------------------------------- numbers come from the profile

#: Profile fields a text may quote as "<field> <number>"; every quote must be some profile's value.
QUOTABLE = ("max_completion_length", "num_generations", "per_device_train_batch_size", "max_steps", "learning_rate",
            "lora_rank", "lora_alpha", "train_rows", "eval_rows", "max_prompt_tokens", "time_budget_minutes",
            "warmup_examples", "save_steps", "eval_prompts", "max_seq_length", "beta")
QUOTE = re.compile(r"`?\b(" + "|".join(QUOTABLE) + r")\b`?\s*(?:=|:|of|is)?\s*(-?\d[\d.]*(?:e-?\d+)?)")


def prose(text: str) -> str:
    """Markdown without code blocks and without inline code that calls something (an override example)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"`[^`\n]*\([^`\n]*`", "", text)


def quoted_values(text: str) -> list[tuple[str, float]]:
    return [(m.group(1), float(m.group(2).rstrip("."))) for m in QUOTE.finditer(prose(text))]


def test_the_quote_finder_finds_what_it_should():
    assert quoted_values("`max_completion_length` 48 here, num_generations=8") == [
        ("max_completion_length", 48.0), ("num_generations", 8.0)]
    assert quoted_values('try `get_profile("cpu-demo", max_steps=20)`\n```python\nx(max_steps=3)\n```') == []


@pytest.mark.parametrize("path", [*BOOKS, ROOT / "README.md"], ids=lambda p: p.stem)
def test_quoted_profile_values_exist_in_a_profile(path):
    text = markdown(path) if path.suffix == ".ipynb" else path.read_text()
    # a profile's value, or one a built-in task's settings give it (notebook 05 quotes the JSON task's group)
    profiles = [get_profile(name, task=task, use_vllm=False) for name in PROFILES for task in BUILTIN]
    for field, value in quoted_values(text):
        allowed = {float(getattr(p, field)) for p in profiles if getattr(p, field) is not None}
        assert value in allowed, f"{path.name} quotes {field} {value:g}, which no profile has ({sorted(allowed)})"


TIME_ROW = re.compile(r"^\|\s*`(cpu-smoke|cpu-demo|colab-t4|gpu-large)`[^|]*\|(?:[^|]*\|)*?\s*~?([\d.]+)\s*min", re.M)


@pytest.mark.parametrize("path", BOOKS, ids=lambda p: p.stem)
def test_time_headers_agree_with_the_profiles(path):
    intro = cells(path)[0].source
    rows = TIME_ROW.findall(intro)
    assert rows, f"{path.name}: no `| profile | ... | ~N min |` rows in the intro"
    for profile, minutes in rows:
        decimals = len(minutes.split(".")[1]) if "." in minutes else 0
        assert float(minutes) == round(PROFILES[profile].minutes[path.stem], decimals), (
            f"{path.name} says ~{minutes} min on {profile}; the profile says {PROFILES[profile].minutes[path.stem]}")


# --------------------------------------------------------------------------- the GPU path, as far as a CPU can tell


def test_install_cell_is_the_same_everywhere_and_keeps_the_images_torch_trio():
    sources = {[c for c in cells(p) if c.cell_type == "code"][0].source for p in BOOKS}
    assert len(sources) == 1, "the notebooks' install cells differ"
    cell = sources.pop()
    cell = cell.replace('if "google.colab" in sys.modules or "KAGGLE_KERNEL_RUN_TYPE" in os.environ:', "if True:")
    cell = re.sub(r'"(grpo-course\[gpu\] @ [^"]+)"', r"'\1'", cell)
    cell = re.sub(r"%pip install (.*)$", r'PIP = f"pip install \1"', cell, flags=re.M)
    namespace: dict = {}
    exec(cell, namespace)  # noqa: S102 - the course's own cell, with pip replaced by a string
    import torch

    assert f"torch=={torch.__version__}" in namespace["PIP"].split()


def test_no_second_vllm_engine_in_the_notebooks_process():
    """A new vllm.LLM beside Unsloth's engine fails vLLM's free-memory check: serve from its own process."""
    for path in BOOKS:
        assert not {c for c in calls(code(path)) if c.split(".")[-1] == "LLM"}, f"{path.name} builds a vllm.LLM"


def test_after_training_every_sample_names_the_adapter():
    """With vLLM, Unsloth's engine holds the base weights: a sample without a LoRA request is the base model."""
    sampled = ("evaluate", "generate", "transcript", "chat_box", "evaluate_adapters")
    for name, after in (("03_grpo_training", "trainer.train"), ("04_merge_and_inference", None)):
        tree = ast.parse(code(ROOT / "notebooks" / f"{name}.ipynb"))
        start = 0 if after is None else min(n.lineno for n in ast.walk(tree)
                                            if isinstance(n, ast.Call) and ast.unparse(n.func) == after)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and node.lineno > start and \
                    ast.unparse(node.func).split(".")[-1] in sampled:
                assert {k.arg for k in node.keywords} & {"adapter", "folders"}, (
                    f"{name}:{node.lineno} samples after training without naming the adapter")


def test_the_merge_check_compares_like_with_like():
    """On the GPU the merge and the reference (the adapter on the full-precision base the merge used, not the 4-bit
    training model) both load through FastLanguageModel: once FastLanguageModel has loaded an architecture, a plain
    transformers load of it runs Unsloth's forward and fails (the GPU check of 2026-11-27). On a CPU both sides are
    float32."""
    import ast
    source = code(ROOT / "notebooks" / "04_merge_and_inference.ipynb")
    cell = source[source.index("from helpers.merge import verify_merged"):source.index("report.table()")]
    tree = ast.parse(cell)
    branch = next(n for n in ast.walk(tree)
                  if isinstance(n, ast.If) and ast.unparse(n.test) == "PROFILE.backend == 'unsloth'")
    gpu, cpu = ast.unparse(ast.Module(branch.body, [])), ast.unparse(ast.Module(branch.orelse, []))
    loads = {c.keywords[0].value.args[0].id: {k.arg: ast.unparse(k.value) for k in c.keywords}
             for c in ast.walk(ast.Module(branch.body, [])) if isinstance(c, ast.Call)
             and ast.unparse(c.func) == "FastLanguageModel.from_pretrained"}
    assert set(loads) == {"MERGED", "ADAPTER"} and all(v["load_in_4bit"] == "False" for v in loads.values())
    assert "AutoModelForCausalLM" not in gpu and "float16" not in cell
    assert "AutoModelForCausalLM.from_pretrained(str(MERGED), dtype=torch.float32)" in cpu


def _root_conftest():
    import importlib.util
    spec = importlib.util.spec_from_file_location("course_root_conftest", Path(__file__).parents[1] / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _item(path, name="Cell 0", items=(), factory=None):
    from types import SimpleNamespace
    return SimpleNamespace(path=str(path), fspath=None, name=name, parent=SimpleNamespace(course_items=list(items)),
                           config=SimpleNamespace(_tmp_path_factory=factory))


def _teardown(hooks, item, nextitem):  # drives conftest's teardown wrapper as pytest does
    gen = hooks.pytest_runtest_teardown(item, nextitem)
    next(gen)
    with pytest.raises(StopIteration):
        gen.send(None)


def test_each_notebook_gets_a_fresh_drive_and_working_folder_and_nothing_leaks_after_it(monkeypatch):
    from types import SimpleNamespace
    hooks = _root_conftest()
    monkeypatch.delenv("COURSE_KEEP_NBVAL_RUNS", raising=False)
    monkeypatch.delenv("COURSE_RUNS", raising=False)
    monkeypatch.setenv("COURSE_RUN_DIR", "mine")  # monkeypatch restores these afterwards
    monkeypatch.setenv("PYTHONPATH", "elsewhere")
    a, b = _item("nb/a.ipynb"), _item("nb/b.ipynb")
    hooks.pytest_runtest_setup(a)
    drive = Path(os.environ["COURSE_RUNS"])
    assert "COURSE_RUN_DIR" not in os.environ and drive.is_dir() and not any(drive.iterdir())
    assert (drive.parent / "content").is_dir() and hooks._current["content"] == drive.parent / "content"
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(Path(hooks.__file__).parent), "elsewhere"]
    (drive / "lab-cpu-smoke" / "merged").mkdir(parents=True)
    _teardown(hooks, a, a)  # the same notebook's next cell: the same folders
    hooks.pytest_runtest_setup(a)
    assert os.environ["COURSE_RUNS"] == str(drive)
    _teardown(hooks, a, SimpleNamespace(path="tests/test_x.py"))  # a test file next: restored, deleted
    assert (os.environ["COURSE_RUN_DIR"], os.environ["PYTHONPATH"]) == ("mine", "elsewhere")
    assert "COURSE_RUNS" not in os.environ and not drive.parent.exists()
    hooks.pytest_runtest_setup(b)
    second = Path(os.environ["COURSE_RUNS"])
    assert second != drive and not any(second.iterdir())
    hooks.pytest_unconfigure(SimpleNamespace(workerinput={}))  # the worker's end
    assert not second.parent.exists() and os.environ["COURSE_RUN_DIR"] == "mine" and "COURSE_RUNS" not in os.environ


def test_course_keep_nbval_runs_keeps_the_run_folders(monkeypatch):
    from types import SimpleNamespace
    hooks = _root_conftest()
    monkeypatch.setenv("COURSE_KEEP_NBVAL_RUNS", "1")
    monkeypatch.delenv("COURSE_RUNS", raising=False)
    hooks.pytest_runtest_setup(_item("nb/a.ipynb"))
    kept = Path(os.environ["COURSE_RUNS"]).parent
    hooks.pytest_unconfigure(SimpleNamespace(workerinput={}))
    assert kept.is_dir() and "COURSE_RUNS" not in os.environ
    import shutil
    shutil.rmtree(kept)


def test_nbval_runs_of_03_and_04_are_kept_with_a_record_for_the_colab_layout_checks(monkeypatch, tmp_path):
    from types import SimpleNamespace
    from nbformat import NotebookNode
    from .shared import nbval_run
    hooks = _root_conftest()
    monkeypatch.delenv("COURSE_KEEP_NBVAL_RUNS", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # the session root: tmp_path, not this session's
    factory = SimpleNamespace(getbasetemp=lambda: tmp_path, _basetemp=tmp_path)
    path = Path(hooks.__file__).parent / "notebooks" / "04_merge_and_inference.ipynb"
    cell, probe = (_item(path, name, ["Cell 0", hooks.PROBE_ITEM], factory) for name in ("Cell 0", hooks.PROBE_ITEM))
    hooks.pytest_runtest_setup(cell)
    drive = Path(os.environ["COURSE_RUNS"])
    for item, text in ((cell, "run folder: x\n"), (probe, 'PROBE {"cwd": "c"}\n')):
        item.test_outputs = [NotebookNode(output_type="stream", name="stdout", text=text)]
        gen = hooks.pytest_runtest_makereport(item, SimpleNamespace(when="call"))
        next(gen)
        with pytest.raises(StopIteration):
            gen.send(SimpleNamespace(failed=item is cell, when="call"))
    _teardown(hooks, probe, None)
    record = nbval_run("notebooks/04_merge_and_inference.ipynb", factory, timeout=0)
    assert record["drive"] == str(drive) and record["content"] == str(drive.parent / "content") and drive.is_dir()
    assert record["text"].startswith("run folder: x\n") and record["probe"] == {"cwd": "c"}
    assert record["ran"] == record["items"] == ["Cell 0", hooks.PROBE_ITEM] and record["failed"] == ["Cell 0 (call)"]
    assert "COURSE_RUNS" not in os.environ
    hooks.pytest_unconfigure(SimpleNamespace(_tmp_path_factory=factory))  # the controller, at the end: deleted
    assert not drive.parent.exists()

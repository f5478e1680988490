"""helpers.sources: cited library lines are read from the installed package, printed, and checked."""

from __future__ import annotations

import pytest

from helpers.sources import SourceMismatch, library_lines, package_version, show_lines, source_file


def test_a_file_is_found_in_the_installed_package_without_importing_it():
    import trl

    path = source_file("trl/trainer/grpo_config.py")
    assert path.is_file() and path.is_relative_to(__import__("pathlib").Path(trl.__file__).parent)


def test_the_lines_are_the_ones_numbered():
    text = source_file("trl/trainer/grpo_trainer.py").read_text().splitlines()
    assert library_lines("trl/trainer/grpo_trainer.py", 10, 12) == text[9:12]


def test_show_lines_prints_numbers_and_version_and_checks_what_is_cited(capsys):
    show_lines("trl/trainer/grpo_trainer.py", 3239, 3240, expect="inputs[\"importance_sampling_ratio\"]")
    out = capsys.readouterr().out
    assert out.startswith(f"trl/trainer/grpo_trainer.py:3239-3240 (trl {package_version('trl/x')})")
    assert " 3240  " in out


def test_a_stale_citation_is_an_error_that_says_so():
    with pytest.raises(SourceMismatch, match="stale"):
        show_lines("trl/trainer/grpo_trainer.py", 1, 3, expect="per_token_loss * inputs")
    with pytest.raises(SourceMismatch, match="lines"):
        library_lines("trl/trainer/grpo_trainer.py", 10, 10**7)


def test_whitespace_does_not_matter_but_words_do():
    show_lines("trl/trainer/grpo_trainer.py", 3239, 3240, expect=("self.use_vllm   and", "per_token_loss *"))
    with pytest.raises(SourceMismatch):
        show_lines("trl/trainer/grpo_trainer.py", 3239, 3240, expect="self.use_vllm or")


def test_a_package_that_is_not_installed_is_named():
    with pytest.raises(ModuleNotFoundError, match="not_a_package_here is not installed"):
        source_file("not_a_package_here/x.py")
    assert package_version("not_a_package_here/x.py") == "not installed"
    with pytest.raises(FileNotFoundError, match="no such file"):
        source_file("trl/no_such_file.py")


def cited_lines(source: str) -> list[tuple]:
    """The literal arguments of every ``show_lines(...)`` call in a piece of Python source."""
    import ast

    calls = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "show_lines":
            calls.append((tuple(ast.literal_eval(a) for a in node.args),
                          {k.arg: ast.literal_eval(k.value) for k in node.keywords}))
    return calls


def test_every_source_line_a_notebook_cites_holds(capsys):
    """Every show_lines(...) in the notebooks (code cells and the folds' code, which nbval does not run) names
    installed lines that still hold what it expects."""
    import re

    import nbformat

    from helpers.runs import project_root

    found = 0
    for path in sorted((project_root() / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            blocks = ([cell.source] if cell.cell_type == "code" else
                      re.findall(r"```python\n(.*?)```", cell.source, re.S))
            for block in blocks:
                if "show_lines" not in block:
                    continue
                for args, kwargs in cited_lines(re.sub(r"^(\s*)%", r"\1#", block, flags=re.M)):
                    show_lines(*args, **kwargs)
                    found += 1
    capsys.readouterr()
    assert found >= 20, f"only {found} citations found: notebook 06 cites TRL's lines in its folds"

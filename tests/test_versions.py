"""One place for versions: pyproject.toml pins, environment.yml agrees, the venv matches."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SHARED = ["transformers", "trl", "peft", "datasets", "accelerate", "bitsandbytes"]
EXACT = re.compile(r"^([A-Za-z0-9_.\-]+)==([^;\s]+)$")


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def exact_pins(requirements: list[str]) -> dict[str, str]:
    """``{"trl": "1.13.0", ...}`` for the ``name==version`` lines of a requirement list."""
    pins = {}
    for req in requirements:
        m = EXACT.match(req.strip())
        if m:
            pins[_canon(m.group(1))] = m.group(2)
    return pins


def pinned(name: str, extra: str | None = None) -> str:
    """The version pyproject.toml pins for ``name`` (in the base list or an extra)."""
    reqs = PYPROJECT["project"]["optional-dependencies"][extra] if extra else PYPROJECT["project"]["dependencies"]
    return exact_pins(reqs)[_canon(name)]


def environment_pins() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return exact_pins([r for r in pip_section if not r.startswith("-")])


def test_shared_libraries_are_pinned_exactly():
    base = exact_pins(PYPROJECT["project"]["dependencies"])
    for name in SHARED:
        assert name in base, f"{name} must be pinned with == in [project.dependencies]"


def test_environment_yml_agrees_with_pyproject():
    env = environment_pins()
    ours = exact_pins(PYPROJECT["project"]["dependencies"]) | exact_pins(
        PYPROJECT["project"]["optional-dependencies"]["gpu"]
    )
    disagree = {k: (v, ours.get(k)) for k, v in env.items() if ours.get(k) != v}
    assert not disagree, f"environment.yml vs pyproject.toml (yml, pyproject): {disagree}"
    missing = sorted((set(SHARED) | {"unsloth"}) - set(env))
    assert not missing, f"environment.yml's pip section lacks {missing}"


def test_detects_a_disagreement(tmp_path, monkeypatch):
    assert exact_pins(["trl==1.14.0", "torch>=2"]) == {"trl": "1.14.0"}
    assert exact_pins(["trl==1.14.0"])["trl"] != pinned("trl")


def test_shared_pins_sit_inside_unsloths_ranges():
    """Unsloth 2026.10.x accepts transformers <= 5.17.0, trl <= 1.13.0, datasets < 5."""
    from packaging.version import Version

    assert Version(pinned("transformers")) <= Version("5.17.0")
    assert Version(pinned("trl")) <= Version("1.13.0")
    assert Version(pinned("datasets")) < Version("5")
    assert Version(pinned("peft")) >= Version("0.18.0")


def test_contract_set_pins_the_same_unsloth_as_the_gpu_extra():
    contract = exact_pins(PYPROJECT["tool"]["grpo-course"]["contract-no-deps"])
    assert contract["unsloth"] == pinned("unsloth", extra="gpu")
    assert contract["unsloth-zoo"] == pinned("unsloth_zoo", extra="gpu")


@pytest.mark.parametrize("name", SHARED + ["math-verify"])
def test_installed_cpu_stack_matches_the_pins(name):
    assert metadata.version(name) == pinned(name)


def test_installed_torch_matches_the_cpu_pin():
    assert metadata.version("torch").split("+")[0] == pinned("torch", extra="cpu")

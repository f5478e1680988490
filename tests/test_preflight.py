"""helpers.preflight: the known traps, versions against the pins (and the pins agree across files), the room line.

The machine facts are tested in test_machine.py, the precision in test_training.py."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from helpers import preflight as P
from helpers.machine import Hardware
from helpers.preflight import (
    Trap,
    VersionCheck,
    check_versions,
    installed_versions,
    preflight_warnings,
    room_line,
)
from helpers.profiles import get_model_spec, get_profile
from helpers.timing import StepTiming

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
T4, A100, H100 = (7, 5), (8, 0), (9, 0)


def machine(**kw) -> Hardware:
    """A free Colab T4 unless told otherwise."""
    base = dict(cuda=True, gpu_name="Tesla T4", capability=T4, vram_gb=14.7, cpus=2, ram_gb=12.7,
                free_disk_gb=60.0, on_colab=True, on_kaggle=False)
    return Hardware(**(base | kw))


LAPTOP = dict(cuda=False, gpu_name=None, capability=None, vram_gb=None, on_colab=False)
A100_40 = dict(gpu_name="NVIDIA A100-SXM4-40GB", capability=A100, vram_gb=39.4, on_colab=False)


@pytest.fixture()
def vllm_installed(monkeypatch):
    """Pretend vLLM is (True) or is not (False) installed, for the one lookup preflight makes."""
    real = importlib.util.find_spec

    def set_installed(installed: bool) -> None:
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: (object() if installed else None) if name == "vllm" else real(name, *a))

    return set_installed


def topics(hw, profile="colab-t4", model=None, **over):
    p = get_profile(profile, **over)
    return [t.topic for t in preflight_warnings(hw, p, get_model_spec(model or p.model))]


# --------------------------------------------------------------------------- traps


def test_a_t4_warns_about_bf16_only_for_qwen():
    [trap] = preflight_warnings(machine(), get_profile("colab-t4"), get_model_spec("qwen2.5-1.5b"))
    assert trap.topic == "bf16" and "Tesla T4 (compute capability 7.5)" in trap.message
    assert "bf16=True" in trap.fix


def test_gemma_on_a_t4_warns_about_fp16_overflow():
    assert topics(machine(), model="gemma3-1b") == ["bf16", "gemma-fp16"]
    assert topics(machine(**A100_40), model="gemma3-1b") == []


def test_vllm_on_a_t4_is_flagged(vllm_installed):
    vllm_installed(True)
    assert topics(machine(), use_vllm=True) == ["bf16", "vllm-t4"]
    assert topics(machine(), use_vllm=False) == ["bf16"]


def test_a_profile_that_wants_vllm_without_it(vllm_installed):
    vllm_installed(False)
    [trap] = preflight_warnings(machine(**A100_40), get_profile("gpu-large", use_vllm=True), get_model_spec("qwen3-4b"))
    assert trap.topic == "vllm-missing" and "grpo-course[vllm]" in trap.fix
    vllm_installed(True)
    assert topics(machine(**A100_40), "gpu-large") == []
    assert topics(machine(**LAPTOP), "cpu-demo", use_vllm=True) == []  # no GPU: vLLM is not looked for


def test_no_gpu_says_how_to_get_one():
    no_gpu = machine(**(LAPTOP | {"on_colab": True}))
    [trap] = preflight_warnings(no_gpu, get_profile("cpu-demo"), get_model_spec("smollm2-135m"))
    assert trap.topic == "no-gpu" and "T4 GPU" in trap.fix
    traps = preflight_warnings(no_gpu, get_profile("colab-t4"), get_model_spec("qwen2.5-1.5b"))
    assert [t.topic for t in traps] == ["no-gpu", "no-gpu"]
    assert "'colab-t4' needs a CUDA GPU" in traps[1].message and "COURSE_PROFILE=cpu-demo" in traps[1].fix
    assert topics(machine(**LAPTOP), "gpu-large", use_vllm=False) == ["no-gpu"]


def test_a_small_gpu_is_warned_about_a_big_model():
    [trap] = [t for t in preflight_warnings(machine(vram_gb=8.0), get_profile("colab-t4"), get_model_spec("qwen3-4b"))
              if t.topic == "vram"]
    assert "qwen3-4b needs ~14.0 GB for GRPO (an estimate, not measured)" in trap.message and "8.0 GB" in trap.message
    assert "vram" not in topics(machine(vram_gb=14.7), model="qwen2.5-3b")  # 11 GB + 1 fits


def test_low_disk_names_the_need():
    [trap] = [t for t in preflight_warnings(machine(free_disk_gb=5.0), get_profile("colab-t4"),
                                            get_model_spec("qwen2.5-3b")) if t.topic == "disk"]
    assert trap.message.startswith("5.0 GB free; a full run with qwen2.5-3b needs ~20.0 GB")
    assert "disk" not in topics(machine(free_disk_gb=20.0), model="qwen2.5-3b")
    assert topics(machine(**(LAPTOP | {"free_disk_gb": 1.9})), "cpu-smoke") == ["disk"]  # the bundled model: 2 GB
    assert topics(machine(**(LAPTOP | {"free_disk_gb": 2.0})), "cpu-smoke") == []


def test_a_laptop_gets_no_warnings():
    assert topics(machine(**LAPTOP), "cpu-demo") == []
    assert topics(machine(**LAPTOP), "cpu-smoke") == []


# --------------------------------------------------------------------------- versions


def _pins(requirements: list[str]) -> dict[str, str]:
    """``{normalised name: version}`` of every ``==`` pin, read with ``packaging`` as pip reads them."""
    out = {}
    for line in requirements:
        req = Requirement(line)
        pinned = [s.version for s in req.specifier if s.operator == "=="]
        if pinned:
            out[re.sub(r"[-_.]+", "-", req.name).lower()] = pinned[0]
    return out


def _pyproject_pins(extras: tuple[str, ...]) -> dict[str, str]:
    return _pins(PYPROJECT["project"]["dependencies"] + [
        r for e in extras for r in PYPROJECT["project"]["optional-dependencies"][e]])


def test_installed_versions():
    got = installed_versions(["trl", "no-such-package-xyz"])
    assert got == {"trl": "1.13.0", "no-such-package-xyz": None}
    assert set(installed_versions()) == set(P.TRACKED_PACKAGES)


def pinned_versions(extras: tuple[str, ...] = ("cpu", "gpu", "vllm")) -> dict[str, str]:
    return {c.package: c.pinned for c in check_versions(extras)}


def test_the_checked_pins_are_the_pyproject_pins():
    """The pins come from the installed package's metadata (so Colab can check them): the same as pyproject.toml."""
    assert pinned_versions() == _pyproject_pins(("cpu", "gpu", "vllm"))
    assert pinned_versions(("cpu",)) == _pyproject_pins(("cpu",))
    assert "unsloth" not in pinned_versions(("cpu",)) and pinned_versions(("gpu",))["unsloth-zoo"]
    assert "pytest" not in pinned_versions()  # the dev extra is not checked


def test_this_environment_matches_its_pins():
    checks = check_versions()
    assert {c.package for c in checks} == set(_pyproject_pins(("cpu",)))
    assert [c for c in checks if not c.ok] == []
    assert [c.package for c in checks] == sorted(c.package for c in checks)


def test_version_check_reports_mismatches_and_missing_packages(monkeypatch):
    assert VersionCheck("torch", "2.13.0", "2.13.0+cpu").ok  # a local build tag is the same version
    assert not VersionCheck("trl", "1.13.0", "1.14.0").ok and not VersionCheck("trl", "1.13.0", None).ok
    monkeypatch.setattr(P, "installed_versions", lambda names: {n: {"trl": "1.12.0", "peft": None}.get(n, "x")
                                                                for n in names})
    bad = {c.package: c for c in check_versions() if not c.ok}
    assert bad["trl"] == VersionCheck("trl", "1.13.0", "1.12.0") and bad["peft"].installed is None


# --------------------------------------------------------------------------- the pins agree across files


def _environment_pins() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return _pins([r for r in pip if not r.startswith(("-", "."))])  # options and local paths are not pins


def test_environment_yml_agrees_with_pyproject():
    env, ours = _environment_pins(), _pyproject_pins(("gpu",))
    disagree = {k: (v, ours.get(k)) for k, v in env.items() if ours.get(k) != v}
    assert not disagree, f"environment.yml vs pyproject.toml (yml, pyproject): {disagree}"
    shared = {"transformers", "trl", "peft", "datasets", "accelerate", "bitsandbytes", "unsloth", "unsloth-zoo"}
    assert shared <= set(env), f"environment.yml's pip section lacks {sorted(shared - set(env))}"


def test_contract_set_pins_the_same_unsloth_as_the_gpu_extra():
    contract = _pins(PYPROJECT["tool"]["grpo-course"]["contract-no-deps"])
    gpu = _pyproject_pins(("gpu",))
    assert (contract["unsloth"], contract["unsloth-zoo"]) == (gpu["unsloth"], gpu["unsloth-zoo"])


def test_shared_pins_sit_inside_unsloths_ranges():
    """Unsloth 2026.10.x accepts transformers <= 5.17.0, trl <= 1.13.0, datasets < 5, peft >= 0.18."""
    from packaging.version import Version

    pins = _pyproject_pins(())
    assert Version(pins["transformers"]) <= Version("5.17.0") and Version(pins["trl"]) <= Version("1.13.0")
    assert Version(pins["datasets"]) < Version("5") and Version(pins["peft"]) >= Version("0.18.0")


def test_room_line_says_who_has_what_in_one_line():
    laptop = Hardware(False, None, None, None, 2, 24.0, 50.0, False, False)
    checks = [VersionCheck("trl", "1.13.0", "1.13.0"), VersionCheck("peft", "0.19.1", "0.18.0")]
    timing = StepTiming("cpu-demo", seconds=(10.0, 9.0), max_steps=60, budget_minutes=10, warmup=True)
    line = room_line(laptop, get_profile("cpu-demo"), checks, [], timing)
    assert "\n" not in line
    assert line.split(" | ")[1:] == ["cpu-demo", "CPU 2 cores 24.0 GB", "smollm2-135m", "versions differ: peft",
                                     "no traps", "9.0 s/step -> 60/60 steps in 10 min"]
    a100 = Hardware(True, "NVIDIA A100", (8, 0), 40.0, 8, 80.0, 100.0, False, True)
    slow = StepTiming("gpu-large", seconds=(80.0, 70.0), max_steps=500, budget_minutes=60, warmup=False)
    line = room_line(a100, get_profile("gpu-large", use_vllm=False), checks[:1], [Trap("vllm-missing", "", "")], slow)
    assert " | gpu-large (Kaggle) | NVIDIA A100 40.0 GB cc8.0 bf16 | " in line
    assert line.endswith("| versions ok | traps: vllm-missing | 70.0 s/step -> 51/500 steps in 60 min")


def test_a_colab_cpu_runtime_keeps_the_images_torch_without_a_false_alarm(monkeypatch):
    """Colab's CPU fallback: profile cpu-demo, so the cpu extra's torch pin is checked, against the image's torch
    that the install cell keeps on purpose. On a laptop the same mismatch is a real one."""
    image = {**pinned_versions(("cpu",)), "torch": "2.11.0+cpu"}  # the rest as pinned
    monkeypatch.setattr(P, "installed_versions", lambda names: {n: image[n] for n in names})
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-stand-in")
    colab_cpu = machine(cuda=False, gpu_name=None, capability=None, vram_gb=None)
    checks = check_versions(("cpu",))
    [torch] = [c for c in checks if c.package == "torch"]
    assert torch == VersionCheck("torch", "2.13.0", "2.11.0+cpu", kept=True) and torch.ok
    assert all(c.ok for c in checks) and not any(c.kept for c in checks if c.package != "torch")
    assert " | versions ok | " in room_line(colab_cpu, get_profile("cpu-demo"), checks, [])
    monkeypatch.delenv("COLAB_RELEASE_TAG")
    laptop = check_versions(("cpu",), hosted=False)
    assert [c.package for c in laptop if not c.ok] == ["torch"]
    assert " | versions differ: torch | " in room_line(machine(**LAPTOP), get_profile("cpu-demo"), laptop, [])
    assert not VersionCheck("torch", "2.13.0", None, kept=True).ok  # kept, but missing: still an alarm


def test_low_space_on_the_drive_mount_says_it_is_the_drive_quota(tmp_path, monkeypatch):
    from helpers import runs

    monkeypatch.setattr(runs, "DRIVE_MOUNT", tmp_path)
    [trap] = [t for t in preflight_warnings(machine(free_disk_gb=5.0), get_profile("colab-t4"),
                                            get_model_spec("qwen2.5-3b"), run=tmp_path / "runs") if t.topic == "disk"]
    assert trap.message.startswith("5.0 GB left in your Google Drive quota, shared with Gmail and Google Photos")
    assert "empty Drive's bin" in trap.fix and "EXPORT_GGUF" in trap.fix

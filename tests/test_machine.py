"""helpers.machine: GPU capability and bf16, the CPU's bf16, installed packages, Colab/Kaggle, the hardware."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
from types import SimpleNamespace

import pytest

from helpers import machine as M
from helpers.machine import (
    Hardware,
    cpu_bf16,
    gpu_capability,
    inspect_hardware,
    installed,
    native_bf16,
    on_colab,
    on_kaggle,
)

T4, A100, H100 = (7, 5), (8, 0), (9, 0)


def test_bf16_comes_from_the_compute_capability():
    assert [native_bf16(c) for c in (None, (6, 1), T4, A100, (8, 6), H100)] == [False, False, False, True, True, True]
    assert native_bf16([8, 0]) is True  # a list (as JSON gives it back) is read the same way


def test_this_machine():
    import torch

    assert (gpu_capability() is None) == (not torch.cuda.is_available())
    hw = inspect_hardware()
    assert hw.cpus >= 1 and hw.free_disk_gb > 0 and hw.ram_gb > 0
    assert hw.cuda == (hw.capability is not None) == (hw.gpu_name is not None) == (hw.vram_gb is not None)
    assert (hw.on_colab, hw.on_kaggle) == (on_colab(), on_kaggle())


def test_inspect_hardware_reads_the_gpu_torch_reports(monkeypatch):
    import torch

    props = SimpleNamespace(name="Tesla T4", major=7, minor=5, total_memory=15_828_320_256)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (7, 5))
    hw = inspect_hardware()
    assert (hw.cuda, hw.gpu_name, hw.capability, hw.vram_gb) == (True, "Tesla T4", T4, 14.7)
    assert gpu_capability() == T4


def test_hardware_is_a_frozen_record():
    hw = Hardware(False, None, None, None, 2, 24.0, 50.0, False, False)
    with pytest.raises(AttributeError):
        hw.cpus = 4  # type: ignore[misc]


@pytest.mark.parametrize("capability, chip, speedup, expected", [
    ("AVX2", {"avx512_bf16": True, "amx_bf16": True}, 4.0, False),  # torch runs no bf16 kernels here
    ("DEFAULT", {"avx512_bf16": True}, 4.0, False),
    ("SVE256", {}, 4.0, False),                                     # ARM: float32
    ("AVX512", {"avx512_bf16": False, "amx_bf16": False}, 4.0, False),  # AVX-512 without its BF16 extension or AMX
    ("AVX512", {"avx512_bf16": True}, 2.3, True),                   # bf16 measured 2.3x faster (seen on one machine)
    ("AVX512", {"avx512_bf16": True}, 0.6, False),                  # AVX512-BF16, yet bf16 slower (seen on another)
    ("AVX512", {"amx_bf16": True}, 1.5, True),                      # AMX tiles (Intel Sapphire Rapids), at the bar
])
def test_cpu_bf16_needs_the_kernels_the_instructions_and_the_speed(monkeypatch, capability, chip, speedup, expected):
    import torch

    from helpers import machine

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: chip)
    monkeypatch.setattr(machine, "bf16_speedup", lambda: speedup)
    cpu_bf16.cache_clear()
    try:
        assert cpu_bf16() is expected
    finally:
        cpu_bf16.cache_clear()


def test_bf16_speedup_times_both_dtypes_on_a_small_matmul():
    from helpers.machine import bf16_speedup

    ratio = bf16_speedup(8, 16, 8)
    assert 0 < ratio < 1000


def test_cpu_bf16_on_this_machine_is_a_bool_measured_once(monkeypatch):
    from helpers import machine

    calls = []
    monkeypatch.setattr(machine, "bf16_speedup", lambda: calls.append(1) or 1.0)
    cpu_bf16.cache_clear()
    try:
        assert isinstance(cpu_bf16(), bool) and cpu_bf16() == cpu_bf16()
        assert len(calls) <= 1  # none where the chip has no bf16 instructions, else one measurement per process
    finally:
        cpu_bf16.cache_clear()


def test_cpu_bf16_is_false_under_avx2_kernels():
    """ATEN_CPU_CAPABILITY=avx2 (a laptop's kernels) must give float32, even on a chip with AVX512-BF16."""
    code = "from helpers.machine import cpu_bf16; print(cpu_bf16())"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_installed_looks_without_importing():
    assert installed("json") and installed("trl")
    assert not installed("no_such_package_xyz")
    assert "no_such_package_xyz" not in sys.modules


def test_installed_follows_find_spec(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    assert installed("vllm")


def test_colab_and_kaggle_detection(monkeypatch):
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    assert (on_colab(), on_kaggle()) == (False, False)
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20260101")
    assert on_colab()
    monkeypatch.delenv("COLAB_RELEASE_TAG")
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    assert on_colab()
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    assert on_kaggle() and inspect_hardware().on_kaggle


def test_free_disk_is_read_where_asked(tmp_path, monkeypatch):
    seen = []

    def usage(path):
        seen.append(path)
        return SimpleNamespace(total=0, used=0, free=3 * 1024**3)

    monkeypatch.setattr(M.shutil, "disk_usage", usage)
    assert inspect_hardware(tmp_path).free_disk_gb == 3.0 and seen == [tmp_path.resolve()]

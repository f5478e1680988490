"""What this machine is: GPU and its compute capability, native bf16, CPU, memory, disk, Colab or Kaggle.

Serves notebooks 00, 03, 05, 07 and 08 (and every profile's defaults).

Example:
    >>> native_bf16((7, 5)), native_bf16((8, 0))
    (False, True)
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path


def gpu_capability() -> tuple[int, int] | None:
    """Compute capability of GPU 0, or None without CUDA."""
    import torch
    return tuple(torch.cuda.get_device_capability(0)) if torch.cuda.is_available() else None  # type: ignore


def native_bf16(capability: tuple[int, int] | None) -> bool:
    """True from compute capability 8.0 (Ampere) on (``torch.cuda.is_bf16_supported()`` can say True on a T4)."""
    return capability is not None and tuple(capability) >= (8, 0)


BF16_MIN_SPEEDUP = 1.5  #: how much faster a bf16 matmul must be than a float32 one for CPU profiles to use bf16


def bf16_speedup(m: int = 1360, k: int = 576, n: int = 1536) -> float:
    """float32 time over bfloat16 time of an ``(m x k) @ (k x n)`` matmul (one ``cpu-demo`` step's MLP), best of 5."""
    import torch
    best = {}
    for dtype in [torch.float32, torch.bfloat16] * 6:  # interleaved: load from other work falls on both alike
        a, b = torch.ones(m, k, dtype=dtype), torch.ones(k, n, dtype=dtype)
        start = time.perf_counter()
        a @ b
        best[dtype] = min(best.get(dtype, float("inf")), time.perf_counter() - start)
    return best[torch.float32] / best[torch.bfloat16]


@functools.cache
def cpu_bf16() -> bool:
    """True where the chip has AVX512-BF16 or AMX *and* bf16 multiplies measurably faster (once per process, ~0.2 s)."""
    import torch
    # torch reports DEFAULT, VSX, Z VECTOR, NO AVX, AVX2, AVX512 or SVE256 (torch/backends/cpu/__init__.py)
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        return False
    chip = torch.cpu.get_capabilities()  # what the CPU has (cpuinfo), whatever kernels torch dispatches to
    return bool(chip.get("avx512_bf16") or chip.get("amx_bf16")) and bf16_speedup() >= BF16_MIN_SPEEDUP


def installed(package: str) -> bool:
    """Whether ``package`` can be imported here (without importing it)."""
    return importlib.util.find_spec(package) is not None


def on_colab() -> bool:
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def on_kaggle() -> bool:
    return "KAGGLE_KERNEL_RUN_TYPE" in os.environ


@dataclass(frozen=True)
class Hardware:
    """Facts about the machine that decide the profile and the precision."""

    cuda: bool
    gpu_name: str | None
    capability: tuple[int, int] | None
    vram_gb: float | None
    cpus: int
    ram_gb: float
    free_disk_gb: float
    on_colab: bool
    on_kaggle: bool


def inspect_hardware(path: str | Path = ".") -> Hardware:
    """Read GPU, CPU, RAM and free disk (at ``path``) without loading any model."""
    import psutil
    import torch
    cuda, name, cap, vram = False, None, None, None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        cuda, name, cap = True, props.name, (props.major, props.minor)
        vram = round(props.total_memory / 1024**3, 1)
    return Hardware(cuda=cuda, gpu_name=name, capability=cap, vram_gb=vram, cpus=os.cpu_count() or 1,
                    ram_gb=round(psutil.virtual_memory().total / 1024**3, 1),
                    free_disk_gb=round(shutil.disk_usage(Path(path).resolve()).free / 1024**3, 1),
                    on_colab=on_colab(), on_kaggle=on_kaggle())

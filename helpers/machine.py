"""What this machine is: GPU and its compute capability, native bf16, CPU, memory, disk, Colab or Kaggle.

Example:
    >>> native_bf16((7, 5)), native_bf16((8, 0))
    (False, True)
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path


def gpu_capability() -> tuple[int, int] | None:
    """Compute capability of GPU 0, or None without CUDA."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return None
    if not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(0))  # type: ignore[return-value]


def native_bf16(capability: tuple[int, int] | None) -> bool:
    """True from compute capability 8.0 (Ampere) on (``torch.cuda.is_bf16_supported()`` can say True on a T4)."""
    return capability is not None and tuple(capability) >= (8, 0)


def cpu_bf16() -> bool:
    """True when torch runs bfloat16 natively on this CPU (AVX-512 kernels, AVX512-BF16 or AMX-BF16 on the chip)."""
    import torch
    # torch reports DEFAULT, VSX, Z VECTOR, NO AVX, AVX2, AVX512 or SVE256 (torch/backends/cpu/__init__.py)
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        return False
    chip = torch.cpu.get_capabilities()  # what the CPU has (cpuinfo), whatever kernels torch dispatches to
    return bool(chip.get("avx512_bf16") or chip.get("amx_bf16"))


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
    cuda, name, cap, vram = False, None, None, None
    try:
        import torch
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            cuda, name, cap = True, props.name, (props.major, props.minor)
            vram = round(props.total_memory / 1024**3, 1)
    except ImportError:  # pragma: no cover
        pass
    return Hardware(cuda=cuda, gpu_name=name, capability=cap, vram_gb=vram, cpus=os.cpu_count() or 1,
                    ram_gb=round(psutil.virtual_memory().total / 1024**3, 1),
                    free_disk_gb=round(shutil.disk_usage(Path(path).resolve()).free / 1024**3, 1),
                    on_colab=on_colab(), on_kaggle=on_kaggle())

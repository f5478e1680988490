"""What this machine is, and the known traps for the chosen profile and model.

Example:
    >>> from helpers.hardware import inspect_hardware, native_bf16
    >>> native_bf16((7, 5)), native_bf16((8, 0))
    (False, True)
    >>> hw = inspect_hardware()          # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .config import ModelSpec, Profile


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

    @property
    def bf16(self) -> bool:
        return self.capability is not None and native_bf16(self.capability)


@dataclass(frozen=True)
class Warning_:
    """One preflight finding: what is wrong and what to do."""

    topic: str
    message: str
    fix: str


@dataclass(frozen=True)
class DiskNeed:
    gb: float
    why: list[str] = field(default_factory=list)


def native_bf16(capability: tuple[int, int]) -> bool:
    """True from Ampere (compute capability 8.0) on; a T4 is 7.5.

    Decide from the capability, not ``torch.cuda.is_bf16_supported()``, which
    can answer True on a T4 (bf16 is emulated there, slowly).
    """
    return tuple(capability) >= (8, 0)


def inspect_hardware(path: str | Path = ".") -> Hardware:
    """Read GPU, CPU, RAM and free disk (at ``path``) without loading any model."""
    import psutil

    cuda, name, cap, vram = False, None, None, None
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            cuda, name = True, props.name
            cap = (props.major, props.minor)
            vram = round(props.total_memory / 1024**3, 1)
    except ImportError:
        pass
    return Hardware(
        cuda=cuda,
        gpu_name=name,
        capability=cap,
        vram_gb=vram,
        cpus=os.cpu_count() or 1,
        ram_gb=round(psutil.virtual_memory().total / 1024**3, 1),
        free_disk_gb=round(shutil.disk_usage(Path(path).resolve()).free / 1024**3, 1),
        on_colab="google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ,
        on_kaggle="KAGGLE_KERNEL_RUN_TYPE" in os.environ,
    )


def disk_needed(spec: ModelSpec) -> DiskNeed:
    """Rough free disk a full course run needs with this model (adapter, merge, export)."""
    weights16 = 2.0 * spec.params_b  # GB of 16-bit weights
    if spec.bundled:
        return DiskNeed(2.0, ["bundled model and a merged copy (~0.6 GB each)", "run outputs"])
    return DiskNeed(
        round(3 * weights16 + 2, 1),
        [f"base weights download (~{weights16:.1f} GB in 16-bit, less in 4-bit)",
         f"merged 16-bit copy (~{weights16:.1f} GB)", f"GGUF export (~{weights16:.1f} GB)",
         "checkpoints and adapters (~1 GB)"],
    )


def preflight_warnings(hw: Hardware, profile: Profile, spec: ModelSpec) -> list[Warning_]:
    """The known traps that apply to this machine, profile and model, each with a fix.

    Example:
        >>> from helpers.config import get_profile, get_model_spec
        >>> t4 = Hardware(True, "Tesla T4", (7, 5), 15.0, 2, 12.0, 50.0, True, False)
        >>> [w.topic for w in preflight_warnings(t4, get_profile("colab-t4"), get_model_spec("gemma3-1b"))]
        ['bf16', 'gemma-fp16']
    """
    out: list[Warning_] = []
    gpu_profile = profile.backend == "unsloth"
    if hw.on_colab and not hw.cuda:
        out.append(Warning_(
            "no-gpu", "This Colab runtime has no GPU, so the course falls back to the CPU profile.",
            "Runtime > Change runtime type > T4 GPU, then Runtime > Restart session and run again.",
        ))
    if gpu_profile and not hw.cuda:
        out.append(Warning_(
            "no-gpu", f"Profile {profile.name!r} needs a CUDA GPU and none is visible.",
            "Use a GPU runtime, or set COURSE_PROFILE=cpu-demo to run the bundled model on the CPU.",
        ))
    if hw.cuda and hw.capability is not None and not hw.bf16:
        out.append(Warning_(
            "bf16", f"{hw.gpu_name} (compute capability {hw.capability[0]}.{hw.capability[1]}) has "
            "no native bf16; training runs in fp16.",
            "Never set bf16=True here, even if torch.cuda.is_bf16_supported() says True; "
            "helpers.training picks fp16 from the compute capability.",
        ))
    if hw.cuda and spec.fp32_on_t4 and not hw.bf16:
        out.append(Warning_(
            "gemma-fp16", f"{spec.key} overflows in fp16, so Unsloth runs it in float32 on this GPU "
            "(~57 s per step on a T4).",
            "Expect slow steps, or pick COURSE_MODEL=qwen2.5-1.5b for fp16-safe speed.",
        ))
    if profile.use_vllm and hw.cuda and hw.capability is not None and not hw.bf16:
        out.append(Warning_(
            "vllm-t4", "vLLM releases differ on a T4 (sm_75); some fail to start or fall back to slow kernels.",
            "Keep use_vllm=False on a T4 (the colab-t4 default); if you turn it on and it fails, turn it off "
            "and restart the session.",
        ))
    if profile.use_vllm and hw.cuda:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            out.append(Warning_(
                "vllm-missing", f"Profile {profile.name!r} wants vLLM but it is not installed.",
                'pip install "grpo-course[vllm]" (vllm==0.19.1), or set use_vllm=False.',
            ))
    if hw.cuda and hw.vram_gb is not None and spec.t4_vram_gb and hw.vram_gb < spec.t4_vram_gb + 1:
        out.append(Warning_(
            "vram", f"{spec.key} needs ~{spec.t4_vram_gb} GB for GRPO; this GPU has {hw.vram_gb} GB.",
            "Choose a smaller model (COURSE_MODEL=qwen2.5-1.5b) or lower num_generations and "
            "max_completion_length.",
        ))
    need = disk_needed(spec)
    if hw.free_disk_gb < need.gb:
        out.append(Warning_(
            "disk", f"{hw.free_disk_gb} GB free; a full run with {spec.key} needs ~{need.gb} GB "
            f"({'; '.join(need.why)}).",
            "Free space (delete old runs/ and checkpoints), save the adapter before merging, "
            "and skip the GGUF export if space is short.",
        ))
    return out

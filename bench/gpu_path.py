"""The GPU path as Unsloth really runs it, on a tiny random-weight Qwen2 (issue 16). Needs a CUDA GPU.

    python bench/gpu_path.py [--out DIR] [--tokenizer DIR] [--steps 4]

What it does, each stage recorded (an error is recorded with its stage and the run goes on):

1. builds a tiny random Qwen2 (2 layers, hidden 256) with the bundled SmolLM2 tokenizer and saves it
   (``dev.gpu_check.tiny_model``): ``<|im_end|>`` is sampled with p ~ 0.08 a token, so some completions end and
   some are truncated (a fully random head never ends one);
2. loads it as notebook 03 does (``helpers.models.load_model``: Unsloth's ``FastLanguageModel``, 4-bit when
   bitsandbytes is there, the profile's LoRA) with the ``colab-t4`` profile, its model entry's id replaced;
3. builds Unsloth's patched ``GRPOConfig`` and TRL's own (the class Unsloth's subclasses) from the same keyword
   arguments, for the course's ``colab-t4`` and ``gpu-large`` values and for configs a learner writes, and
   records every field where they differ;
4. trains a few steps through the course's ``helpers.training.train_grpo`` (the arithmetic task's rewards and
   rows) and records TRL's logged metrics, the tokenizer's padding side and what the trainer changed in its args;
5. merges a LoRA adapter with Unsloth's ``save_pretrained_merged(..., "merged_16bit")`` and with PEFT's
   ``merge_and_unload``, reloads the merges with transformers and compares logits and greedy text.

Prints one JSON object (also written to ``OUT/gpu_path.json``). Without a CUDA GPU it prints
``{"skipped": ...}`` and exits 0, measuring nothing (``make bench`` runs every benchmark on a CPU too).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
for _key, _value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "UNSLOTH_DISABLE_STATISTICS": "1",
                     "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(_key, _value)

from dev.gpu_check import jsonable  # noqa: E402 - after ROOT is on the path

RESULT: dict[str, Any] = {"errors": {}, "seconds": {}}
EOS_PROBABILITY = 0.08


def stage(name: str):
    """Decorator: time a stage, record its exception (with the traceback's tail) instead of stopping."""
    def wrap(func):
        def run(*args, **kwargs):
            start = time.time()
            print(f"=== stage {name}", flush=True)
            try:
                return func(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - recorded in the JSON, the next stage still runs
                RESULT["errors"][name] = f"{type(exc).__name__}: {exc}"[:2000]
                RESULT["errors"][name + ".traceback"] = traceback.format_exc()[-4000:]
                traceback.print_exc()
                return None
            finally:
                RESULT["seconds"][name] = round(time.time() - start, 1)
        return run
    return wrap


@stage("build_tiny_model")
def build_tiny_model(tokenizer_dir: Path, out: Path) -> Path:
    """A random Qwen2 saved in bfloat16 with a tokenizer shaped like Qwen's (pad <|endoftext|>, eos <|im_end|>):
    ``dev.gpu_check.tiny_model``, which the GPU check (dev/gpu_check.py) builds its models with too."""
    from dev.gpu_check import tiny_model

    RESULT["tiny_model"] = tiny_model("qwen2", tokenizer_dir, out, eos_probability=EOS_PROBABILITY)
    return out


@stage("import_unsloth")
def import_unsloth() -> None:
    import importlib.metadata as md

    import torch

    start = time.time()
    import unsloth  # noqa: F401  (before TRL: it rewrites TRL's trainers and configs)

    RESULT["import_unsloth_seconds"] = round(time.time() - start, 1)
    names = ("unsloth", "unsloth_zoo", "trl", "transformers", "peft", "accelerate", "datasets", "bitsandbytes",
             "torch", "triton", "xformers", "torchao", "tokenizers")
    versions = {}
    for name in names:
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    props = torch.cuda.get_device_properties(0)
    RESULT["versions"] = versions
    RESULT["gpu"] = {"name": props.name, "capability": list(torch.cuda.get_device_capability(0)),
                     "memory_gb": round(props.total_memory / 1024**3, 1), "cuda": torch.version.cuda}


def colab_t4_profile(steps: int) -> Any:
    """``colab-t4`` with its recipe kept and only the sizes cut for a tiny model and a few steps."""
    from helpers.profiles import get_profile

    return get_profile("colab-t4", max_steps=steps, max_completion_length=32, train_rows=24, eval_rows=4,
                       eval_prompts=4, save_steps=1000, time_budget_minutes=None)


@stage("load_model")
def load_model(profile: Any, base: Path, bnb: bool) -> tuple[Any, Any]:
    """``helpers.models.load_model`` on a GPU profile, the registry's Unsloth id replaced by ``base``."""
    from helpers.models import load_model, resolve

    profile = profile.with_overrides(load_in_4bit=profile.load_in_4bit and bnb)
    run = resolve(profile, probe=False)  # the profile's task and model entry, the entry's id replaced below
    model, tok = load_model(dataclasses.replace(run, spec=dataclasses.replace(run.spec, unsloth_id=str(base))))
    linear4 = sum(type(m).__name__ == "Linear4bit" for m in model.modules())
    peft_config = model.peft_config["default"]
    RESULT["loaded"] = {"model_class": type(model).__name__, "base_class": type(model.base_model.model).__name__,
                        "dtype": str(model.dtype), "load_in_4bit": profile.load_in_4bit, "linear4bit_modules": linear4,
                        "lora": {"r": peft_config.r, "lora_alpha": peft_config.lora_alpha,
                                 "lora_dropout": peft_config.lora_dropout,
                                 "target_modules": sorted(peft_config.target_modules)},
                        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
                        "padding_side_after_load": tok.padding_side, "eos_token": tok.eos_token,
                        "pad_token": tok.pad_token, "max_seq_length": getattr(model, "max_seq_length", None)}
    return model, tok


def build_both(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Unsloth's ``GRPOConfig(**kwargs)`` and TRL's own (its parent class): asked, built, and every difference."""
    from trl import GRPOConfig

    out: dict[str, Any] = {"asked": jsonable(kwargs)}
    try:
        unsloth_cfg = GRPOConfig(**kwargs)
    except Exception as exc:  # noqa: BLE001
        out["unsloth_error"] = f"{type(exc).__name__}: {exc}"[:600]
        return out
    pristine = type(unsloth_cfg).__mro__[1]
    trl_fields = {f.name for f in dataclasses.fields(pristine)}
    out["unsloth_class"] = f"{type(unsloth_cfg).__module__}.{type(unsloth_cfg).__qualname__}"
    out["pristine_class"] = f"{pristine.__module__}.{pristine.__qualname__}"
    out["unsloth_only_fields"] = {f.name: jsonable(getattr(unsloth_cfg, f.name))
                                  for f in dataclasses.fields(unsloth_cfg) if f.name not in trl_fields}
    try:
        trl_cfg = pristine(**kwargs)
    except Exception as exc:  # noqa: BLE001
        out["trl_error"] = f"{type(exc).__name__}: {exc}"[:600]
        trl_cfg = None
    skip = {"logging_dir"}  # a timestamp
    diff = {}
    for name in sorted(trl_fields - skip):
        built = jsonable(getattr(unsloth_cfg, name, None))
        trl_value = jsonable(getattr(trl_cfg, name, None)) if trl_cfg is not None else None
        if trl_cfg is None or built != trl_value:
            diff[name] = {"trl": trl_value, "unsloth": built}
    out["differs_from_trl"] = diff if trl_cfg is not None else None
    out["asked_vs_built"] = {k: {"asked": jsonable(v), "unsloth": jsonable(getattr(unsloth_cfg, k, None)),
                                 "trl": jsonable(getattr(trl_cfg, k, None)) if trl_cfg is not None else None}
                             for k, v in kwargs.items()}
    out["changed_from_asked"] = sorted(k for k, v in out["asked_vs_built"].items() if v["asked"] != v["unsloth"])
    # what Unsloth alone changed: TRL's own class keeps the asked value (or refuses it)
    table = out["asked_vs_built"]
    out["changed_by_unsloth"] = sorted(k for k in out["changed_from_asked"]
                                       if trl_cfg is None or table[k]["trl"] != table[k]["unsloth"])
    watch = ("per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate", "optim", "weight_decay",
             "warmup_steps", "warmup_ratio", "bf16", "fp16", "seed", "num_generations", "loss_type", "beta",
             "scale_rewards", "epsilon", "epsilon_high", "mask_truncated_completions",
             "vllm_importance_sampling_correction", "generation_batch_size", "steps_per_generation",
             "max_completion_length", "temperature", "router_aux_loss_coef", "lr_scheduler_type", "max_grad_norm")
    out["watched"] = {k: {"unsloth": jsonable(getattr(unsloth_cfg, k, None)),
                          "trl": jsonable(getattr(trl_cfg, k, None)) if trl_cfg is not None else None} for k in watch}
    return out


@stage("configs")
def configs(work: Path) -> None:
    """The course's configs and a learner's own, through Unsloth's GRPOConfig and TRL's."""
    from helpers.machine import gpu_capability
    from helpers.profiles import get_profile
    from helpers.training import grpo_kwargs

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        large = get_profile("gpu-large")
    t4 = get_profile("colab-t4")
    run = work / "cfg"
    course_t4 = grpo_kwargs(t4, run, (7, 5))
    no_dapo_extras = {k: v for k, v in course_t4.items() if k not in ("epsilon_high", "mask_truncated_completions")}
    own = {"output_dir": str(run)}
    scenarios = {
        "colab-t4 (a T4: capability 7.5)": course_t4,
        "colab-t4 (this GPU's capability)": grpo_kwargs(t4, run, gpu_capability()),
        "gpu-large (this GPU's capability)": grpo_kwargs(large, run, gpu_capability()),
        "colab-t4, loss_type=dr_grpo": dict(course_t4, loss_type="dr_grpo"),
        "colab-t4, dapo without epsilon_high/mask_truncated_completions": no_dapo_extras,
        "colab-t4, batch 4 with num_generations 6": dict(course_t4, per_device_train_batch_size=4),
        "own: output_dir only": own,
        "own: loss_type=dapo": dict(own, loss_type="dapo"),
        "own: loss_type=dr_grpo": dict(own, loss_type="dr_grpo"),
        "own: loss_type=dr_grpo, scale_rewards=group": dict(own, loss_type="dr_grpo", scale_rewards="group"),
        "own: loss_type=grpo": dict(own, loss_type="grpo"),
        "own: num_generations=6, per_device_train_batch_size=4": dict(own, num_generations=6,
                                                                       per_device_train_batch_size=4),
    }
    RESULT["configs"] = {name: build_both(kwargs) for name, kwargs in scenarios.items()}


def args_diff(before: dict, after: dict) -> dict:
    """``{field: {config, trainer.args}}`` for every value the trainer's ``__init__`` changed in its args."""
    return {k: {"config": jsonable(before.get(k)), "trainer.args": jsonable(after.get(k))}
            for k in sorted(set(before) | set(after))
            if k != "logging_dir" and jsonable(before.get(k)) != jsonable(after.get(k))}


@stage("train")
def train(profile: Any, model: Any, tok: Any, work: Path) -> Any:
    """``helpers.training.train_grpo``: the course's rewards, rows, callbacks and config, a few steps."""
    from helpers.training import grpo_config, train_grpo

    run = work / "run"
    before = grpo_config(profile, run).to_dict()
    padding_before = tok.padding_side
    out = train_grpo(profile, run, model=model, tokenizer=tok, resume=False, warmup=False)
    trainer = out["trainer"]
    RESULT["train"] = {"trainer_class": type(trainer).__name__, "summary": out["summary"],
                       "padding_side": {"before_trainer": padding_before, "after_train": tok.padding_side},
                       "trainer_changed_args": args_diff(before, trainer.args.to_dict()),
                       "log_history": jsonable(trainer.state.log_history),
                       "metric_keys": sorted({k for h in trainer.state.log_history for k in h}),
                       "run_files": sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())[:60]}
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    RESULT["train"]["lora_B_max_abs_after_training"] = float(max(p.detach().abs().max() for p in lora_b))
    return trainer


def length_reward(completions: list, **kwargs: Any) -> list[float]:
    """Shorter is better: a reward that varies within a group on a random model, so advantages are non-zero."""
    from helpers.rewards import completion_text

    return [-len(completion_text(c)) / 100.0 for c in completions]


@stage("train_with_signal")
def train_with_signal(profile: Any, model: Any, tok: Any, work: Path, steps: int) -> None:
    """The same config plus a length reward, so the loss and the gradient are not zero on random weights."""
    from transformers import PrinterCallback
    from trl import GRPOTrainer

    from helpers.data import ensure_prepared
    from helpers.tasks import get_task
    from helpers.training import grpo_config

    rewards = get_task(profile.task).rewards_for(profile.task_level)
    run = work / "run-signal"
    config = grpo_config(profile, run, max_steps=steps, reward_weights=[w for _, w in rewards] + [1.0])
    dataset = ensure_prepared(profile, run, tokenizer=tok, verbose=False)
    tok.padding_side = "left"  # as helpers.models.prepare_tokenizer leaves it
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=[f for f, _ in rewards] + [length_reward],
                          args=config, train_dataset=dataset["train"])
    padding_after_init = tok.padding_side
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    RESULT["train_with_signal"] = {"log_history": jsonable(trainer.state.log_history), "padding_side": {
        "before_trainer": "left", "after_trainer_init": padding_after_init, "after_train": tok.padding_side},
        "accelerate_mixed_precision": os.environ.get("ACCELERATE_MIXED_PRECISION"),
        "args_precision": {"bf16": trainer.args.bf16, "fp16": trainer.args.fp16}}


@stage("t4_precision")
def t4_precision(profile: Any, base: Path, work: Path, bnb: bool) -> None:
    """A float16 model with the T4 precision the course asks (fp16=True): what Unsloth's trainer keeps, 2 steps."""
    import torch
    from transformers import PrinterCallback
    from trl import GRPOTrainer
    from unsloth import FastLanguageModel

    import helpers.models as hm
    from helpers.data import ensure_prepared
    from helpers.models import LORA_TARGETS
    from helpers.tasks import get_task
    from helpers.training import grpo_config

    model, tok = FastLanguageModel.from_pretrained(model_name=str(base), max_seq_length=profile.max_seq_length,
                                                   load_in_4bit=bnb, dtype=torch.float16, fast_inference=False)
    model = FastLanguageModel.get_peft_model(model, r=profile.lora_rank, target_modules=LORA_TARGETS,
                                             lora_alpha=profile.lora_alpha, lora_dropout=0.0,
                                             use_gradient_checkpointing="unsloth", random_state=profile.seed)
    hm.prepare_tokenizer(tok, model)
    hm.install_prefill(tok, get_task(profile.task).prefill)
    rewards = get_task(profile.task).rewards_for(profile.task_level)
    run = work / "run-fp16"
    config = grpo_config(profile, run, capability=(7, 5), max_steps=2)
    before = config.to_dict()
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=[f for f, _ in rewards], args=config,
                          train_dataset=ensure_prepared(profile, run, tokenizer=tok, verbose=False)["train"])
    trainer.remove_callback(PrinterCallback)
    changed = args_diff(before, trainer.args.to_dict())
    trainer.train()
    RESULT["t4_precision"] = {"model_dtype": str(model.dtype),
                              "asked": {"fp16": before["fp16"], "bf16": before["bf16"]},
                              "trainer_changed_args": changed, "accelerate_mixed_precision":
                              os.environ.get("ACCELERATE_MIXED_PRECISION"),
                              "log_history": jsonable(trainer.state.log_history)}
    del trainer, model
    torch.cuda.empty_cache()


def logits(model: Any, ids: Any) -> Any:
    import torch

    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def max_diff(a: Any, b: Any) -> float:
    return float((a - b).abs().max())


@stage("merge")
def merge(model: Any, tok: Any, base: Path, work: Path) -> None:
    """Unsloth's and PEFT's 16-bit merges of one adapter, reloaded with transformers, against the adapter model."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from unsloth import FastLanguageModel

    from helpers.merge import saved_dtype, verify_merged
    from helpers.prompts import build_prompt, encode
    from helpers.tasks import get_task

    os.environ["UNSLOTH_RETURN_LOGITS"] = "1"  # Unsloth's forward otherwise skips the logits while training
    # LoRA B starts at 0 and a few steps at lr 5e-6 barely move it: random B makes the merge check non-trivial
    generator = torch.Generator(device="cpu").manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_((torch.randn(p.shape, generator=generator) * 0.05).to(p.dtype))
    adapter = work / "adapter-random-B"
    model.save_pretrained(str(adapter))
    tok.save_pretrained(str(adapter))
    FastLanguageModel.for_inference(model)
    task = get_task("arithmetic")
    questions = ["What is 12 + 30?", "Tom has 5 apples and buys 7 more. How many apples does he have?"]
    prompts = [build_prompt(q, task.system_prompt) for q in questions]
    ids = encode(tok, prompts[:1])
    input_ids = torch.tensor(ids, device="cuda")
    adapter_logits = logits(model, input_ids)
    record: dict[str, Any] = {"adapter_files": sorted(p.name for p in adapter.iterdir()),
                              "adapter_model_dtype": str(model.dtype), "prompt_tokens": input_ids.shape[1],
                              "logit_scale": float(adapter_logits.abs().max())}
    RESULT["merge"] = record
    merged_dir = work / "merged-unsloth"
    start = time.time()
    model.save_pretrained_merged(str(merged_dir), tok, save_method="merged_16bit")
    record["unsloth_merge_seconds"] = round(time.time() - start, 1)
    record["unsloth_merged_files"] = sorted(p.name for p in merged_dir.iterdir())
    record["unsloth_merged_saved_dtype"] = saved_dtype(merged_dir)
    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16}
    comparisons: dict[str, Any] = {}
    for name, dtype in dtypes.items():
        merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype=dtype).cuda().eval()
        base16 = AutoModelForCausalLM.from_pretrained(str(base), dtype=dtype).cuda().eval()
        peft_model = PeftModel.from_pretrained(base16, str(adapter)).eval()
        peft_logits = logits(peft_model, input_ids)
        peft_merged = peft_model.merge_and_unload()
        merged_logits, peft_merged_logits = logits(merged, input_ids), logits(peft_merged, input_ids)
        comparisons[name] = {
            "unsloth_merged_vs_unsloth_adapter_model": max_diff(merged_logits, adapter_logits),
            "unsloth_merged_vs_peft_unmerged_16bit_base": max_diff(merged_logits, peft_logits),
            "peft_merged_vs_peft_unmerged": max_diff(peft_merged_logits, peft_logits),
            "unsloth_merged_vs_peft_merged": max_diff(merged_logits, peft_merged_logits),
            "peft_unmerged_16bit_base_vs_unsloth_adapter_model": max_diff(peft_logits, adapter_logits),
            "argmax_agreement_unsloth_merged_vs_adapter_model": float(
                (merged_logits.argmax(-1) == adapter_logits.argmax(-1)).float().mean()),
        }
        if name == "bfloat16":
            report = verify_merged(PeftModel.from_pretrained(
                AutoModelForCausalLM.from_pretrained(str(base), dtype=dtype).cuda().eval(), str(adapter)),
                merged, tok, prompts, max_new_tokens=12)
            record["greedy_peft_adapter_vs_unsloth_merged"] = {"matches": report.matches,
                                                               "adapter": report.adapter_outputs,
                                                               "merged": report.merged_outputs}
            unsloth_side = verify_merged(model, merged, tok, prompts, max_new_tokens=12)
            record["greedy_unsloth_4bit_adapter_vs_unsloth_merged"] = {"matches": unsloth_side.matches,
                                                                       "adapter": unsloth_side.adapter_outputs}
        del merged, base16, peft_model, peft_merged
        torch.cuda.empty_cache()
    record["max_abs_logit_diff"] = comparisons


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-path-out"), help="folder for the JSON and files")
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the bundled SmolLM2's)")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps of the course's training run")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():  # `make bench` runs every benchmark: say so and succeed, measuring nothing
        reason = ("bench/gpu_path.py needs a CUDA GPU (it runs Unsloth's GPU path); none is visible, so nothing was "
                  "measured. Run it on a GPU machine with the GPU stack installed (`pip install -e .[gpu]`).")
        print(reason, file=sys.stderr)
        print(json.dumps({"skipped": reason}))
        return 0
    out = Path(args.out).resolve()
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)  # Unsloth writes unsloth_compiled_cache/ into the working directory
    if args.tokenizer is None:
        from helpers.models import bundled_model_path

        args.tokenizer = str(bundled_model_path(build=False))
    os.environ.setdefault("COURSE_GSM8K_DIR", str(ROOT / "data" / "gsm8k_sample"))
    from helpers.machine import installed

    bnb = installed("bitsandbytes")
    RESULT["bitsandbytes_installed"] = bnb
    base = build_tiny_model(Path(args.tokenizer), work / "tiny-qwen2")
    import_unsloth()
    profile = colab_t4_profile(args.steps)
    RESULT["profile"] = profile.to_dict()
    configs(work)
    loaded = load_model(profile, base, bnb) if base is not None else None
    if loaded is not None:
        model, tok = loaded
        train(profile, model, tok, work)
        train_with_signal(profile, model, tok, work, min(args.steps, 3))
        merge(model, tok, base, work)
        t4_precision(profile, base, work, bnb)
    RESULT["peak_gpu_memory_gb"] = round(torch.cuda.max_memory_allocated() / 1024**3, 2)
    text = json.dumps(RESULT, indent=1, default=str)
    (out / "gpu_path.json").write_text(text)
    print("GPU-PATH-JSON " + json.dumps(RESULT, default=str))
    return 1 if RESULT["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The run's recipe as files TRL's own command line reads: ``trl grpo`` and ``trl sft`` YAML.

To run notebook 03's recipe longer, on a bigger model or on several GPUs, nothing home-made is needed:
``trl grpo`` / ``trl sft`` read every config field, the model, LoRA, quantisation, the dataset and the
reward functions (by dotted import path) from a YAML file, and ``accelerate launch`` runs them with the
DDP, DeepSpeed ZeRO and FSDP configs TRL ships. :func:`write_recipe` writes into ``RUN/recipe/``:

* ``model/``: the base model's files (linked) and the tokenizer as the course prepares it (the task's
  prefill in the chat template, the end-of-turn EOS): TRL's commands read the tokenizer from the model folder;
* ``grpo.yaml``: every value of notebook 03's ``GRPOConfig`` (:func:`helpers.training.grpo_kwargs`), the task's
  rewards by import path, notebook 01's prepared dataset;
* ``sft.yaml`` and ``warmup.jsonl``: the format warm-up, where the profile has one.

``trl grpo`` loads a saved adapter frozen, so it cannot continue the warm-up's adapter as notebook 03 does:
``python -m helpers.recipe merge`` folds the warm-up into the weights GRPO starts from (``merge_and_unload``)
and ``python -m helpers.recipe combine`` stacks the two LoRAs into one adapter on the base model
(``add_weighted_adapter(combination_type="cat")``: exactly their sum). Outputs go to ``RUN/cli/``.
"""

from __future__ import annotations

import importlib
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from .data import ensure_prepared
from .machine import gpu_capability
from .models import LORA_TARGETS, model_source, prepare_tokenizer
from .profiles import Profile, get_model_spec, get_profile
from .prompts import install_prefill, text_tokenizer
from .tasks import Task, get_task
from .training import check_config, grpo_kwargs, sft_kwargs, torch_dtype, warmup_dataset

RECIPE_DIR, CLI_DIR = "recipe", "cli"
GRPO_YAML, SFT_YAML, WARMUP_ROWS, MODEL_DIR = "grpo.yaml", "sft.yaml", "warmup.jsonl", "model"
#: Files of a transformers model folder that :func:`recipe_model` links (weights and architecture).
_MODEL_FILES = ("config.json", "*.safetensors", "*.safetensors.index.json", "*.bin", "pytorch_model*.json")


class RecipeError(ValueError):
    """A piece of the recipe TRL's command line cannot express as it stands; the message says what to do."""


def reward_path(func: Callable, task: Task | None = None) -> str:
    """The dotted path ``trl grpo`` imports back to this very reward: a module-level name in the reward's
    module or in the task's.

    Example:
        >>> [reward_path(f) for f, _ in get_task("arithmetic").rewards][1:3]
        ['helpers.tasks.reasoning.partial_correctness_reward', 'helpers.tasks.reasoning.prefilled_strict_format_reward']
    """
    wrapped = getattr(func, "reward", None)  # a Prefilled reward usually lives beside the one it wraps
    modules = [getattr(func, "__module__", None), getattr(wrapped, "__module__", None),
               type(task).__module__ if task is not None else None]
    for module in dict.fromkeys(m for m in modules if m and m != "__main__"):
        try:
            for name, value in vars(importlib.import_module(module)).items():
                if value is func and not name.startswith("_"):
                    return f"{module}.{name}"
        except ImportError:
            continue
    raise RecipeError(f"Reward {getattr(func, '__name__', func)!r} is not importable by name, and `trl grpo` loads "
                      "rewards by dotted import path. Assign it to a module-level name in an importable file (your "
                      "task's module, e.g. my_task.py beside where you run the command).")


def _dump(sections: list[tuple[str, dict[str, Any]]], header: str) -> str:
    """YAML with a comment above each section (``yaml.safe_dump`` per section, key order kept)."""
    import yaml

    out = [header.rstrip() + "\n"]
    for comment, values in sections:
        out.append("\n" + "".join(f"# {line}\n" for line in comment.splitlines()))
        out.append(yaml.safe_dump(values, sort_keys=False, allow_unicode=True, width=110))
    return "".join(out)


def _model_args(profile: Profile, model: str | Path, dtype: str) -> dict[str, Any]:
    """``trl.ModelConfig`` fields: the model folder, LoRA as notebook 03 builds it, 4-bit or not."""
    args: dict[str, Any] = dict(model_name_or_path=str(model), dtype=dtype, use_peft=True, lora_r=profile.lora_rank,
                                lora_alpha=profile.lora_alpha, lora_dropout=0.0, lora_target_modules=list(LORA_TARGETS),
                                lora_task_type="CAUSAL_LM")
    return {**args, "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"} if profile.load_in_4bit else args


def recipe_model(profile: Profile, folder: str | Path, tokenizer: Any = None, fetch: bool = False) -> Path:
    """A model folder TRL's commands load as the course does: the base's weights and config (symlinks into
    the bundled model or the Hugging Face cache, never copies), the prepared tokenizer, a generation config
    with its EOS. ``fetch`` downloads a hub model into the cache first; without it a model not yet cached
    gets the tokenizer only, and a warning says how to fetch the rest."""
    from transformers import AutoTokenizer, GenerationConfig

    spec = get_model_spec(profile.model)
    source = Path(model_source(spec)) if spec.bundled else None
    if source is None:
        from huggingface_hub import snapshot_download

        try:
            source = Path(snapshot_download(spec.hf_id, local_files_only=not fetch, allow_patterns=[
                "*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]))
        except Exception as exc:  # noqa: BLE001 - not in the cache (offline), or no network
            import warnings

            warnings.warn(f"{spec.hf_id} is not in the Hugging Face cache ({type(exc).__name__}), so {folder} holds "
                          "the tokenizer but not the weights yet. Fetch them once (several GB): `python -m "
                          f"helpers.recipe write RUN --profile {profile.name} --fetch`.", stacklevel=2)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for file in [f for p in _MODEL_FILES for f in source.glob(p)] if source is not None else []:
        link = folder / file.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(file.resolve())
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(source) if source is not None else spec.hf_id)
    install_prefill(prepare_tokenizer(tokenizer), get_task(profile.task).prefill).save_pretrained(str(folder))
    try:
        generation = GenerationConfig.from_pretrained(str(source) if source is not None else spec.hf_id)
    except OSError:  # no generation_config.json, or not in the cache
        generation = GenerationConfig()
    tok = text_tokenizer(tokenizer)
    generation.eos_token_id, generation.pad_token_id = tok.convert_tokens_to_ids(tok.eos_token), tok.pad_token_id
    generation.save_pretrained(str(folder))
    return folder


@dataclass(frozen=True)
class Recipe:
    """The files :func:`write_recipe` wrote, and the commands that run them."""

    folder: Path
    grpo: Path
    sft: Path | None
    model: Path
    output: Path

    def commands(self, processes: int = 1) -> list[str]:
        """The commands, in order: warm-up (``trl sft``) and its merge, ``trl grpo``, and the two adapters
        combined. ``processes > 1`` runs GRPO as that many CPU processes with ``torchrun``, the per-process
        batch divided so the global batch, and every step's groups, stay the recipe's."""
        import yaml

        out = [f"trl sft --config {_q(self.sft)}", f"python -m helpers.recipe merge {_q(self.folder)}"] if self.sft else []
        if processes <= 1:
            out.append(f"trl grpo --config {_q(self.grpo)}")
        else:
            batch = yaml.safe_load(self.grpo.read_text())["per_device_train_batch_size"]
            if batch % processes:
                raise RecipeError(f"per_device_train_batch_size={batch} does not split over {processes} processes: "
                                  "choose a number of processes that divides it, or raise the batch in the profile.")
            out.append(f"torchrun --nproc_per_node {processes} -m trl.scripts.grpo --config {_q(self.grpo)} "
                       f"--per_device_train_batch_size {batch // processes}")
        return out + ([f"python -m helpers.recipe combine {_q(self.folder)}"] if self.sft else [])

    @classmethod
    def of(cls, run: str | Path) -> "Recipe":
        """The recipe written into ``RUN/recipe/`` (an error when there is none)."""
        run = Path(run).absolute()
        folder = run / RECIPE_DIR
        if not (folder / GRPO_YAML).is_file():
            raise RecipeError(f"No recipe in {folder}: write it with helpers.recipe.write_recipe(PROFILE, RUN) or "
                              f"`python -m helpers.recipe write {run}`.")
        return cls(folder, folder / GRPO_YAML, folder / SFT_YAML if (folder / SFT_YAML).is_file() else None,
                   folder / MODEL_DIR, run / CLI_DIR)

    @property
    def adapter(self) -> Path:
        """Where the commands leave the trained adapter on the base model (what notebook 04 loads)."""
        return self.output / ("adapter" if self.sft is not None else "grpo")


def _q(path: Path | None) -> str:
    return shlex.quote(str(path))


def recipe_texts(profile: Profile, run: str | Path, capability: tuple[int, int] | None = None,
                 vllm_installed: bool | None = None) -> dict[str, str]:
    """The recipe's YAML files as text (``sft.yaml`` only where the profile warms up), checked by
    :func:`helpers.training.check_config`; writes nothing, loads no model.

    Example:
        >>> texts = recipe_texts(get_profile("cpu-smoke"), "/tmp/run")
        >>> sorted(texts), texts["grpo.yaml"].count("- helpers.tasks.")
        (['grpo.yaml', 'sft.yaml'], 4)
    """
    run = Path(run).absolute()
    folder, output, model = run / RECIPE_DIR, run / CLI_DIR, run / RECIPE_DIR / MODEL_DIR
    task = get_task(profile.task)
    paths = [reward_path(f, task) for f, _ in task.rewards_for(profile.task_level)]
    grpo = grpo_kwargs(profile, output, capability)  # output_dir: RUN/cli/grpo
    check_config(SimpleNamespace(**grpo), profile, capability=capability, vllm_installed=vllm_installed)
    dtype, warmup = torch_dtype(profile, capability), profile.warmup_examples > 0
    texts: dict[str, str] = {}
    if warmup:
        texts[SFT_YAML] = _dump([
            ("Model (trl.ModelConfig): the recipe's model folder, LoRA as in notebook 03.",
             _model_args(profile, model, dtype)),
            (f"Data: {profile.warmup_examples} rows of level {profile.warmup_level!r}, prompt + completion\n"
             "conversations; SFTTrainer trains on the completion only.",
             {"datasets": [{"path": "json", "data_files": str(folder / WARMUP_ROWS), "split": "train"}]}),
            ("SFTConfig: every value notebook 03's warm-up cell sets.", sft_kwargs(profile, output, capability)),
        ], header=(f"# The format warm-up of profile {profile.name!r} ({task.name}), written by helpers.recipe.\n"
                   f"# Run it with TRL's own command:  trl sft --config {folder / SFT_YAML}\n"
                   f"# then fold it into the weights GRPO starts from:  python -m helpers.recipe merge {folder}"))
    texts[GRPO_YAML] = _dump([
        ("Model (trl.ModelConfig)" + (": the base with the warm-up merged in (python -m helpers.recipe merge);\n"
                                      f"the base and its tokenizer are in {model}." if warmup else
                                      ": the recipe's model folder (the base + the course's tokenizer)."),
         _model_args(profile, output / "warmup-merged" if warmup else model, dtype)),
        ("Data: notebook 01's prepared dataset (saved with save_to_disk: arrow files), its train split.",
         {"datasets": [{"path": "arrow", "data_files": str(run / "dataset" / "train" / "data-*.arrow"),
                        "split": "train"}]}),
        ("Rewards, by import path (TRL imports module.name); their weights are reward_weights below.",
         {"reward_funcs": paths}),
        ("GRPOConfig: every value notebook 03's GRPOConfig cell sets (helpers.training.grpo_kwargs).", grpo),
    ], header=(f"# The GRPO recipe of profile {profile.name!r} ({task.name}), written by helpers.recipe.\n"
               f"# Run it with TRL's own command:  trl grpo --config {folder / GRPO_YAML}\n"
               "# Any field can be overridden on the command line (--max_steps 500)."
               + (" On a GPU, notebook 03 trains with Unsloth; TRL's command trains the same LoRA with PEFT."
                  if profile.backend == "unsloth" else "")
               + f"\n# Prefill {task.prefill!r}: in the chat template saved with the model folder's tokenizer."))
    return texts


def write_recipe(profile: Profile, run: str | Path, tokenizer: Any = None, capability: tuple[int, int] | None = None,
                 fetch: bool = False) -> Recipe:
    """Write the run's recipe into ``RUN/recipe/``, for the profile's task; return it. ``tokenizer``: notebook
    03's (loaded from the profile when None). The prepared dataset is used where it lies (built when missing)."""
    from transformers import AutoTokenizer

    run = Path(run).absolute()
    folder = run / RECIPE_DIR
    capability = gpu_capability() if capability is None and profile.backend == "unsloth" else capability
    texts = recipe_texts(profile, run, capability)  # checks first: nothing is written on an error
    model = recipe_model(profile, folder / MODEL_DIR, tokenizer, fetch=fetch)
    tok = AutoTokenizer.from_pretrained(str(model))
    ensure_prepared(profile, run, tokenizer=tok, verbose=False)
    if SFT_YAML in texts:
        warmup_dataset(profile, tok).to_json(str(folder / WARMUP_ROWS), lines=True, force_ascii=False)
    for name, text in texts.items():
        (folder / name).write_text(text)
    return Recipe.of(run)


def load_recipe(path: str | Path) -> dict[str, Any]:
    """A recipe YAML as a dict."""
    import yaml

    return yaml.safe_load(Path(path).read_text())


def _adapter_model(sft: dict[str, Any], adapter: Path, name: str = "default") -> Any:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(sft["model_name_or_path"], dtype=getattr(torch, sft.get("dtype") or "float32"))
    return PeftModel.from_pretrained(base, str(adapter), adapter_name=name)


def merge_warmup(folder: str | Path) -> Path:
    """Fold the warm-up adapter (``trl sft``'s output) into the weights the GRPO step starts from; every
    path comes from the recipe's YAML."""
    from transformers import AutoTokenizer

    folder = Path(folder)
    if not (folder / SFT_YAML).is_file():
        raise RecipeError(f"No {SFT_YAML} in {folder}: this recipe has no warm-up, run `trl grpo` directly.")
    sft, grpo = load_recipe(folder / SFT_YAML), load_recipe(folder / GRPO_YAML)
    if not (Path(sft["output_dir"]) / "adapter_config.json").is_file():
        raise RecipeError(f"No warm-up adapter in {sft['output_dir']}: run `trl sft --config {folder / SFT_YAML}` first.")
    target = Path(grpo["model_name_or_path"])
    _adapter_model(sft, Path(sft["output_dir"])).merge_and_unload().save_pretrained(str(target))
    AutoTokenizer.from_pretrained(sft["model_name_or_path"]).save_pretrained(str(target))
    return target


def combine_adapters(folder: str | Path) -> Path:
    """One LoRA adapter on the *base* model equal to warm-up + GRPO (rank r1 + r2, ``combination_type="cat"``),
    saved to ``RUN/cli/adapter``: it loads on the base model, as notebook 04 loads ``RUN/adapter``."""
    from transformers import AutoTokenizer

    folder = Path(folder)
    if not (folder / SFT_YAML).is_file():
        raise RecipeError(f"No {SFT_YAML} in {folder}: without a warm-up, `trl grpo`'s output_dir already holds "
                          "the adapter on the base model.")
    sft, grpo = load_recipe(folder / SFT_YAML), load_recipe(folder / GRPO_YAML)
    trained = Path(grpo["output_dir"])
    if not (trained / "adapter_config.json").is_file():
        raise RecipeError(f"No GRPO adapter in {trained}: run `trl grpo --config {folder / GRPO_YAML}` first.")
    model = _adapter_model(sft, Path(sft["output_dir"]), "warmup")
    model.load_adapter(str(trained), adapter_name="grpo")
    model.add_weighted_adapter(["warmup", "grpo"], [1.0, 1.0], adapter_name="default", combination_type="cat")
    model.delete_adapter("warmup")
    model.delete_adapter("grpo")
    target = trained.parent / "adapter"
    model.save_pretrained(str(target))  # the adapter named "default" is saved at the folder's top level
    AutoTokenizer.from_pretrained(str(trained)).save_pretrained(str(target))
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m helpers.recipe write RUN [--profile NAME] [--task KEY]``, ``... merge RUN/recipe``,
    ``... combine RUN/recipe``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m helpers.recipe", description=main.__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    write = sub.add_parser("write", help="write RUN/recipe/ from a profile")
    write.add_argument("run", help="the run folder (its dataset/ is used, or built)")
    write.add_argument("--profile", default=None, help="profile name (default: COURSE_PROFILE or detected)")
    write.add_argument("--task", default=None, help="task (default: the profile's)")
    write.add_argument("--fetch", action="store_true", help="download a hub model into the HF cache if missing")
    for action in ("merge", "combine"):
        sub.add_parser(action, help=f"{action} the adapters of RUN/recipe").add_argument("recipe", help="RUN/recipe")
    args = parser.parse_args(argv)
    try:
        if args.action == "write":
            profile = get_profile(args.profile, **({"task": args.task} if args.task else {}))
            print("\n".join(write_recipe(profile, args.run, fetch=args.fetch).commands()))
        elif args.action == "merge":
            print(f"merged warm-up saved to {merge_warmup(args.recipe)}")
        else:
            print(f"adapter on the base model saved to {combine_adapters(args.recipe)}")
    except RecipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())

"""The run's recipe for TRL's command line: ``RUN/recipe/`` holds ``model/``, ``grpo.yaml``, a warm-up's ``sft.yaml``.

Serves notebooks 03, 04 and 05 (the recipe a run leaves for ``trl grpo``).

``trl grpo`` loads a saved adapter frozen, so ``merge`` folds the warm-up in first and ``combine`` stacks both LoRAs.
"""

from __future__ import annotations

import importlib
import os
import shlex
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import yaml

from .data import ensure_prepared
from .models import LORA_TARGETS, Resolved, model_source, prepare_tokenizer, resolve
from .profiles import Profile, ProfileError, get_profile
from .prompts import install_prefill
from .tasks import Task, import_root
from .tasks.check import TaskCheckError
from .training import check_config, grpo_kwargs, sft_kwargs, torch_dtype, warmup_dataset

RECIPE_DIR, CLI_DIR = "recipe", "cli"
PYTHONPATH_LINE = "# PYTHONPATH: "  #: the header line naming the folders TRL must import the rewards from
GRPO_YAML, SFT_YAML, WARMUP_ROWS, MODEL_DIR = "grpo.yaml", "sft.yaml", "warmup.jsonl", "model"
_MODEL_FILES = ("config.json", "*.safetensors", "*.safetensors.index.json", "*.bin", "pytorch_model*.json")


class RecipeError(ValueError):
    """A piece of the recipe TRL's command line cannot express; the message says what to do."""


def reward_path(func: Callable, task: Task | None = None) -> str:
    """The dotted path ``trl grpo`` imports back to this very reward (a module-level name)."""
    wrapped = getattr(func, "reward", None)  # a Prefilled reward usually lives beside the one it wraps
    modules = [getattr(func, "__module__", None), getattr(wrapped, "__module__", None),
               type(task).__module__ if task is not None else None]
    for module in dict.fromkeys(m for m in modules if m and m != "__main__"):  # each is imported already
        for name, value in vars(importlib.import_module(module)).items():
            if value is func and not name.startswith("_"):
                return f"{module}.{name}"
    where = ("is defined in this notebook (__main__), which no other process can import" if "__main__" in modules
             else "has no module-level name in its module")
    raise RecipeError(f"Reward {getattr(func, '__name__', func)!r} {where}: `trl grpo` runs in a process of "
                      "its own and imports every reward by its dotted name. Put the task and its rewards in a file "
                      "(e.g. my_task.py beside the notebook), give each reward a module-level name there (also a "
                      "wrapped one: `prefilled_my_reward = Prefilled(my_reward, PREFILL)`), and use "
                      "task='my_task:MyTask'.")


def _dump(sections: list[tuple[str, dict[str, Any]]], header: str) -> str:
    parts = [f"\n# {comment}\n" + yaml.safe_dump(values, sort_keys=False, allow_unicode=True, width=110)
             for comment, values in sections]
    return header.rstrip() + "\n" + "".join(parts)


def _model_args(profile: Profile, model: str | Path, dtype: str) -> dict[str, Any]:
    quantized = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"} if profile.load_in_4bit else {}
    return dict(model_name_or_path=str(model), dtype=dtype, use_peft=True, lora_r=profile.lora_rank,
                lora_alpha=profile.lora_alpha, lora_dropout=0.0, lora_target_modules=list(LORA_TARGETS),
                lora_task_type="CAUSAL_LM", **quantized)


def recipe_model(profile: Profile | Resolved, folder: str | Path, tokenizer: Any = None, fetch: bool = False) -> Path:
    """A model folder for TRL: the weights linked, the course's tokenizer (``fetch``: download a hub model first)."""
    from transformers import AutoTokenizer, GenerationConfig
    r = resolve(profile, probe=False)
    spec = r.spec
    source = Path(model_source(spec)) if spec.bundled else None
    if source is None:
        from huggingface_hub import snapshot_download
        try:
            source = Path(snapshot_download(spec.hf_id, local_files_only=not fetch, allow_patterns=[
                "*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]))
        except Exception as exc:  # noqa: BLE001 - not in the cache (offline), or no network
            warnings.warn(f"{spec.hf_id} is not in the Hugging Face cache ({type(exc).__name__}): {folder} holds only "
                          f"the tokenizer. Fetch the weights: python -m helpers.recipe write RUN --profile "
                          f"{r.profile.name} --fetch", stacklevel=2)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for file in [f for p in _MODEL_FILES for f in source.glob(p)] if source is not None else []:
        (folder / file.name).unlink(missing_ok=True)
        (folder / file.name).symlink_to(file.resolve())
    name = str(source) if source is not None else spec.hf_id
    try:
        generation = GenerationConfig.from_pretrained(name)
    except OSError:  # no generation_config.json, or not in the cache
        generation = GenerationConfig()
    tokenizer = prepare_tokenizer(tokenizer or AutoTokenizer.from_pretrained(name),
                                  SimpleNamespace(generation_config=generation))  # the EOS and pad ids
    install_prefill(tokenizer, r.task.prefill).save_pretrained(str(folder))
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
    pythonpath: tuple[str, ...] = ()  #: folders TRL must import the rewards from (a task of yours, not installed)

    def commands(self) -> list[str]:
        """The commands in order: the warm-up and its merge (when there is one), GRPO, the adapters combined.

        When the rewards live in a folder of yours, ``trl grpo`` starts with ``env PYTHONPATH=...`` (a shell line
        and an argument list alike)."""
        sft, config, folder = (shlex.quote(str(path)) for path in (self.sft, self.grpo, self.folder))
        env = f"env PYTHONPATH={shlex.quote(os.pathsep.join(self.pythonpath))} " if self.pythonpath else ""
        grpo = f"{env}trl grpo --config {config}"
        if self.sft is None:
            return [grpo]
        return [f"trl sft --config {sft}", f"python -m helpers.recipe merge {folder}", grpo,
                f"python -m helpers.recipe combine {folder}"]

    @classmethod
    def of(cls, run: str | Path) -> "Recipe":
        """The recipe written into ``RUN/recipe/`` (an error when there is none)."""
        run = Path(run).absolute()
        folder = run / RECIPE_DIR
        if not (folder / GRPO_YAML).is_file():
            raise RecipeError(f"No recipe in {folder}: write it with helpers.recipe.write_recipe(PROFILE, RUN) or "
                              f"`python -m helpers.recipe write {run}`.")
        header = [line for line in (folder / GRPO_YAML).read_text().splitlines() if line.startswith(PYTHONPATH_LINE)]
        paths = tuple(header[0][len(PYTHONPATH_LINE):].split(os.pathsep)) if header else ()
        return cls(folder, folder / GRPO_YAML, folder / SFT_YAML if (folder / SFT_YAML).is_file() else None,
                   folder / MODEL_DIR, run / CLI_DIR, paths)

    @property
    def adapter(self) -> Path:
        """Where the commands leave the adapter on the base model (what notebook 04 loads)."""
        return self.output / ("adapter" if self.sft is not None else "grpo")


def recipe_texts(profile: Profile | Resolved, run: str | Path, capability: tuple[int, int] | None = None,
                 vllm_installed: bool | None = None) -> dict[str, str]:
    """The recipe's YAML files as text, checked by ``check_config``; writes nothing."""
    run, r = Path(run).absolute(), resolve(profile, capability=capability, probe=False)
    folder, output, model = run / RECIPE_DIR, run / CLI_DIR, run / RECIPE_DIR / MODEL_DIR
    profile, task = r.profile, r.task
    paths = [reward_path(f, task) for f, _ in task.rewards_for(profile.task_level)]
    roots = list(dict.fromkeys(str(root) for p in paths if (root := import_root(p.rsplit(".", 1)[0])) is not None))
    grpo = grpo_kwargs(r, output)  # output_dir: RUN/cli/grpo
    check_config(SimpleNamespace(**grpo), r, vllm_installed=vllm_installed)
    dtype, warmup = torch_dtype(r, None), profile.warmup_examples > 0
    texts: dict[str, str] = {}
    if warmup:
        texts[SFT_YAML] = _dump([
            ("Model (trl.ModelConfig): the recipe's model folder, LoRA as in notebook 03.",
             _model_args(profile, model, dtype)),
            (f"Data: {profile.warmup_examples} prompt + completion rows of level {profile.warmup_level!r}.",
             {"datasets": [{"path": "json", "data_files": str(folder / WARMUP_ROWS), "split": "train"}]}),
            ("SFTConfig: every value notebook 03's warm-up cell sets.", sft_kwargs(r, output)),
        ], header=(f"# The format warm-up of profile {profile.name!r} ({task.name}): trl sft --config "
                   f"{folder / SFT_YAML}\n# then: python -m helpers.recipe merge {folder}"))
    start = "the base with the warm-up merged in (python -m helpers.recipe merge)" if warmup else "the base"
    texts[GRPO_YAML] = _dump([
        (f"Model (trl.ModelConfig): {start}, the course's tokenizer in {model}.",
         _model_args(profile, output / "warmup-merged" if warmup else model, dtype)),
        ("Data: notebook 01's prepared dataset (save_to_disk's arrow files), its train split.",
         {"datasets": [{"path": "arrow", "data_files": str(run / "dataset" / "train" / "data-*.arrow"),
                        "split": "train"}]}),
        ("Rewards by import path; their weights are reward_weights below.", {"reward_funcs": paths}),
        ("GRPOConfig: every value notebook 03's GRPOConfig cell sets (helpers.training.grpo_kwargs).", grpo),
    ], header=(f"# The GRPO recipe of profile {profile.name!r} ({task.name}): trl grpo --config {folder / GRPO_YAML}\n"
               f"# Override any field on the command line (--max_steps 500). Prefill {task.prefill!r}: in the chat "
               "template of the model folder's tokenizer."
               + (f"\n# The rewards are imported from a folder of yours: run it as `env PYTHONPATH="
                  f"{os.pathsep.join(roots)} trl grpo ...` (the printed commands do).\n{PYTHONPATH_LINE}"
                  f"{os.pathsep.join(roots)}" if roots else "")))
    return texts


def write_recipe(profile: Profile | Resolved, run: str | Path, tokenizer: Any = None,
                 capability: tuple[int, int] | None = None, fetch: bool = False) -> Recipe:
    """Write the run's recipe into ``RUN/recipe/`` for the profile's task (dataset built when missing)."""
    from transformers import AutoTokenizer
    run, r = Path(run).absolute(), resolve(profile, capability=capability)
    folder = run / RECIPE_DIR
    texts = recipe_texts(r, run)  # checks first: nothing is written on an error
    model = recipe_model(r, folder / MODEL_DIR, tokenizer, fetch=fetch)
    tok = AutoTokenizer.from_pretrained(str(model))
    ensure_prepared(r.profile, run, tokenizer=tok, verbose=False)
    if SFT_YAML in texts:
        warmup_dataset(r, tok).to_json(str(folder / WARMUP_ROWS), lines=True, force_ascii=False)
    for name, text in texts.items():
        (folder / name).write_text(text)
    return Recipe.of(run)


def _with_warmup(folder: Path, needs: tuple[str, ...]) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    if not (folder / SFT_YAML).is_file():
        raise RecipeError(f"No {SFT_YAML} in {folder}: this recipe has no warm-up, so `trl grpo` alone trains it.")
    recipes = {name: yaml.safe_load((folder / name).read_text()) for name in (SFT_YAML, GRPO_YAML)}
    for name in needs:
        trained = Path(recipes[name]["output_dir"])
        if not (trained / "adapter_config.json").is_file():
            command = f"trl {name.removesuffix('.yaml')} --config {folder / name}"
            raise RecipeError(f"No adapter in {trained}: run `{command}` first.")
    sft = recipes[SFT_YAML]
    base = AutoModelForCausalLM.from_pretrained(sft["model_name_or_path"],
                                                dtype=getattr(torch, sft.get("dtype") or "float32"))
    return PeftModel.from_pretrained(base, sft["output_dir"], adapter_name="warmup"), sft, recipes[GRPO_YAML]


def merge_warmup(folder: str | Path) -> Path:
    """Fold the warm-up adapter (``trl sft``'s output) into the weights ``trl grpo`` starts from."""
    from transformers import AutoTokenizer
    model, sft, grpo = _with_warmup(Path(folder), (SFT_YAML,))
    target = Path(grpo["model_name_or_path"])
    model.merge_and_unload().save_pretrained(str(target))
    AutoTokenizer.from_pretrained(sft["model_name_or_path"]).save_pretrained(str(target))
    return target


def combine_adapters(folder: str | Path) -> Path:
    """One LoRA adapter on the base equal to warm-up + GRPO (``combination_type="cat"``), in ``RUN/cli/adapter``."""
    from transformers import AutoTokenizer
    model, _, grpo = _with_warmup(Path(folder), (SFT_YAML, GRPO_YAML))
    trained = Path(grpo["output_dir"])
    model.load_adapter(str(trained), adapter_name="grpo")
    model.add_weighted_adapter(["warmup", "grpo"], [1.0, 1.0], adapter_name="default", combination_type="cat")
    for name in ("warmup", "grpo"):
        model.delete_adapter(name)
    target = trained.parent / "adapter"
    model.save_pretrained(str(target))  # the adapter named "default" is saved at the folder's top level
    AutoTokenizer.from_pretrained(str(trained)).save_pretrained(str(target))
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m helpers.recipe write RUN [--profile NAME] [--task KEY] [--fetch]`` | ``merge|combine RUN/recipe``."""
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
    except (RecipeError, TaskCheckError, ProfileError) as exc:  # each message says what to change
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())

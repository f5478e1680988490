"""The course's recipe as files TRL's own command line reads: ``trl grpo`` and ``trl sft`` YAML.

Notebook 03 trains inside a notebook. To run the same recipe longer, on a bigger model or on
several GPUs, nothing home-made is needed: TRL ships ``trl grpo`` / ``trl sft`` (every
``GRPOConfig`` / ``SFTConfig`` field, the model, LoRA, quantisation and the dataset, read from a
YAML file; reward functions by dotted import path) and accelerate configs for DDP, DeepSpeed ZeRO
and FSDP. :func:`write_recipe` writes, into ``RUN/recipe/``:

``model/``
    the base model's files (linked, not copied) and the tokenizer as the course prepares it: the
    prefill in the chat template's generation prompt (:func:`helpers.prompts.install_prefill`) and
    the end-of-turn EOS (:func:`helpers.models.prepare_tokenizer`). TRL's commands have no
    tokenizer option: they load it from the model folder, so this folder is the recipe's model.
``grpo.yaml``
    the GRPO step: model, LoRA, 4-bit or not, notebook 01's prepared dataset (``RUN/dataset``),
    the reward functions by import path with their weights, every ``GRPOConfig`` value notebook 03
    sets (:func:`helpers.training.grpo_kwargs`).
``sft.yaml``, ``warmup.jsonl``
    the format warm-up, where the profile has one (:func:`helpers.training.sft_kwargs`).

What TRL's command cannot express, and what the recipe does about it: the prefill lives in the
saved chat template; the ``prefilled_*`` rewards are module-level functions of
:mod:`helpers.rewards`; the dashboard and time-budget callbacks are notebook conveniences
(``max_steps`` bounds the run, TRL logs to the console and ``report_to``); and ``trl grpo`` loads
a saved LoRA adapter frozen (transformers' ``load_adapter`` defaults to ``is_trainable=False`` and
``ModelConfig`` has no adapter field), so it cannot continue the warm-up's adapter as notebook 03
does: ``python -m helpers.recipe merge`` folds the warm-up into the weights the GRPO step starts
from (PEFT's ``merge_and_unload``, notebook 04's call), GRPO trains a fresh LoRA on top, and
``python -m helpers.recipe combine`` stacks the two LoRAs into one adapter on the base model
(PEFT's ``add_weighted_adapter(combination_type="cat")``: exactly their sum), which notebook 04
loads like its own. Profiles without a warm-up (the GPU ones) need only ``trl grpo``.

The outputs of the commands go to ``RUN/cli/`` (``warmup-adapter``, ``warmup-merged``, ``grpo``,
``adapter``), beside, never over, the notebooks' ``RUN/adapter``.

Example::

    recipe = write_recipe(get_profile("cpu-smoke"), RUN)
    for line in recipe.commands(): print(line)
    # trl sft --config RUN/recipe/sft.yaml
    # python -m helpers.recipe merge RUN/recipe
    # trl grpo --config RUN/recipe/grpo.yaml
    # python -m helpers.recipe combine RUN/recipe
"""

from __future__ import annotations

import importlib
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .config import Profile, get_model_spec

RECIPE_DIR, CLI_DIR = "recipe", "cli"
GRPO_YAML, SFT_YAML, WARMUP_ROWS, MODEL_DIR = "grpo.yaml", "sft.yaml", "warmup.jsonl", "model"

#: Files of a transformers model folder that :func:`recipe_model` links (weights and architecture).
_MODEL_FILES = ("config.json", "*.safetensors", "*.safetensors.index.json", "*.bin", "pytorch_model*.json")


class RecipeError(ValueError):
    """A piece of the recipe TRL's command line cannot express as it stands; the message says what to do."""


def reward_path(func: Callable) -> str:
    """The dotted import path ``trl grpo`` resolves back to this very function.

    TRL's ``grpo`` script imports ``module.name`` for every ``reward_funcs`` entry with a dot, so a
    reward must be a module-level function. The ``prefilled_*`` rewards of the default prefill are.

    Example:
        >>> from helpers.rewards import get_preset
        >>> [reward_path(f) for f, _ in get_preset("format-only")][0]
        'helpers.rewards.prefilled_strict_format_reward'
    """
    module, name = getattr(func, "__module__", None), getattr(func, "__name__", "")
    try:  # a function of a notebook or a script (__main__) is not importable from another process
        found = getattr(importlib.import_module(module), name) if module and module != "__main__" else None
    except (ImportError, AttributeError):
        found = None
    if found is not func:
        raise RecipeError(
            f"Reward {name or func!r} is not importable by name ({module}.{name}), and `trl grpo` loads reward "
            "functions by dotted import path. Define it at module level in an importable file (e.g. "
            "my_rewards.py beside where you run the command) and list it as 'my_rewards.<name>'. A prefilled "
            "reward for a prefill other than the course's '<reasoning>\\n' is made by get_prefilled_reward(...) "
            "at run time: assign it to a module-level name the same way.")
    return f"{module}.{name}"


def _dump(sections: list[tuple[str, dict[str, Any]]], header: str) -> str:
    """YAML with a comment above each section (yaml.safe_dump per section, key order kept)."""
    import yaml

    out = [header.rstrip() + "\n"]
    for comment, values in sections:
        out.append("\n" + "".join(f"# {line}\n" if line else "#\n" for line in comment.splitlines()))
        out.append(yaml.safe_dump(values, sort_keys=False, allow_unicode=True, width=110))
    return "".join(out)


def _model_args(profile: Profile, model: str | Path, dtype: str) -> dict[str, Any]:
    """``trl.ModelConfig`` fields: the model folder, LoRA as notebook 03 builds it, 4-bit or not."""
    from .models import LORA_TARGETS

    args: dict[str, Any] = dict(model_name_or_path=str(model), dtype=dtype, use_peft=True,
                                lora_r=profile.lora_rank, lora_alpha=profile.lora_alpha, lora_dropout=0.0,
                                lora_target_modules=list(LORA_TARGETS), lora_task_type="CAUSAL_LM")
    if profile.load_in_4bit:
        args.update(load_in_4bit=True, bnb_4bit_quant_type="nf4")
    return args


def _dtype(bits: dict[str, bool]) -> str:
    return "bfloat16" if bits.get("bf16") else "float16" if bits.get("fp16") else "float32"


def recipe_model(profile: Profile, folder: str | Path, tokenizer: Any = None, fetch: bool = False) -> Path:
    """A model folder TRL's commands can load as the course does: the base's weights and config
    (symlinks into the bundled model or the Hugging Face cache, never copies) plus the prepared
    tokenizer (prefill, end-of-turn EOS) and a generation config with that EOS.

    A hub model's files are linked from the Hugging Face cache; with ``fetch`` they are downloaded
    there first (``snapshot_download``: the download ``trl grpo`` would make); without, a model not
    yet in the cache gets the tokenizer only, and a warning says how to fetch the rest. Returns the folder.

    Example::

        recipe_model(get_profile("cpu-smoke"), RUN / "recipe" / "model")
    """
    from transformers import AutoTokenizer, GenerationConfig

    from .models import model_source, prepare_tokenizer
    from .prompts import install_prefill

    spec = get_model_spec(profile.model)
    source = Path(model_source(spec)) if spec.bundled else None
    if source is None:
        from huggingface_hub import snapshot_download

        patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
        try:
            source = Path(snapshot_download(spec.hf_id, allow_patterns=patterns, local_files_only=not fetch))
        except Exception as exc:  # noqa: BLE001 - not in the cache (offline), or no network
            import warnings

            warnings.warn(
                f"{spec.hf_id} is not in the Hugging Face cache ({type(exc).__name__}), so {folder} holds the "
                "tokenizer but not the weights yet. Before running the recipe, fetch them once (several GB): "
                f"`python -m helpers.recipe write RUN --profile {profile.name} --fetch`.", stacklevel=2)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for pattern in _MODEL_FILES if source is not None else ():
        for file in source.glob(pattern):
            link = folder / file.name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(file.resolve())
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(str(source) if source is not None else spec.hf_id)
    tokenizer = install_prefill(prepare_tokenizer(tokenizer), profile.prefill)
    tokenizer.save_pretrained(str(folder))
    text_tok = getattr(tokenizer, "tokenizer", tokenizer)
    try:
        generation = GenerationConfig.from_pretrained(str(source) if source is not None else spec.hf_id)
    except OSError:  # a model without a generation_config.json, or not in the cache
        generation = GenerationConfig()
    generation.eos_token_id = text_tok.convert_tokens_to_ids(text_tok.eos_token)
    generation.pad_token_id = text_tok.pad_token_id
    generation.save_pretrained(str(folder))
    return folder


@dataclass(frozen=True)
class Recipe:
    """The files :func:`write_recipe` wrote, and the commands that run them.

    Example::

        recipe.grpo            # RUN/recipe/grpo.yaml
        recipe.commands()      # the one-machine commands, in order
    """

    folder: Path
    grpo: Path
    sft: Path | None
    model: Path
    output: Path

    def commands(self, processes: int = 1) -> list[str]:
        """The commands that run the recipe, in order: warm-up (``trl sft``), its merge, ``trl grpo``, and
        (after a warm-up) the two adapters combined into one on the base model.

        ``processes > 1`` runs the GRPO step as that many CPU processes with ``torchrun`` (Accelerate
        reads torchrun's environment and trains with gloo); the per-process batch is divided so the
        global batch, and with it every step's groups, stays the recipe's.
        """
        import yaml

        out = []
        if self.sft is not None:
            out += [f"trl sft --config {_q(self.sft)}", f"python -m helpers.recipe merge {_q(self.folder)}"]
        if processes <= 1:
            out.append(f"trl grpo --config {_q(self.grpo)}")
        else:
            batch = yaml.safe_load(self.grpo.read_text())["per_device_train_batch_size"]
            if batch % processes:
                raise RecipeError(f"per_device_train_batch_size={batch} does not split over {processes} processes: "
                                  "choose a number of processes that divides it, or raise the batch in the profile.")
            out.append(f"torchrun --nproc_per_node {processes} -m trl.scripts.grpo --config {_q(self.grpo)} "
                       f"--per_device_train_batch_size {batch // processes}")
        if self.sft is not None:
            out.append(f"python -m helpers.recipe combine {_q(self.folder)}")
        return out

    @classmethod
    def of(cls, run: str | Path) -> "Recipe":
        """The recipe :func:`write_recipe` wrote into ``RUN/recipe/`` (an error when there is none).

        Example::

            Recipe.of(RUN).commands()
        """
        run = Path(run).absolute()
        folder = run / RECIPE_DIR
        if not (folder / GRPO_YAML).is_file():
            raise RecipeError(f"No recipe in {folder}: write it with helpers.recipe.write_recipe(PROFILE, RUN) or "
                              f"`python -m helpers.recipe write {run}`.")
        return cls(folder=folder, grpo=folder / GRPO_YAML,
                   sft=folder / SFT_YAML if (folder / SFT_YAML).is_file() else None,
                   model=folder / MODEL_DIR, output=run / CLI_DIR)

    @property
    def adapter(self) -> Path:
        """Where the commands leave the trained adapter on the base model (what notebook 04 loads)."""
        return self.output / ("adapter" if self.sft is not None else "grpo")


def _q(path: Path) -> str:
    return shlex.quote(str(path))


def recipe_texts(profile: Profile, run: str | Path, rewards: list | None = None,
                 capability: tuple[int, int] | None = None, vllm_installed: bool | None = None) -> dict[str, str]:
    """The recipe's YAML files as text, ``{"grpo.yaml": ..., "sft.yaml": ...}`` (``sft.yaml`` only where the
    profile warms up), checked by :func:`helpers.training.check_config` (``capability`` and
    ``vllm_installed`` as there: give them to write a GPU recipe elsewhere); writes nothing, loads no model.

    Example:
        >>> from helpers.config import get_profile
        >>> texts = recipe_texts(get_profile("cpu-smoke"), "/tmp/run")
        >>> sorted(texts), texts["grpo.yaml"].count("- helpers.rewards.")
        (['grpo.yaml', 'sft.yaml'], 4)
    """
    from .preflight import precision
    from .rewards import get_preset
    from .training import grpo_kwargs, sft_kwargs

    run = Path(run).absolute()
    folder, output, model = run / RECIPE_DIR, run / CLI_DIR, run / RECIPE_DIR / MODEL_DIR
    rewards = rewards or get_preset(profile.reward_preset, prefill=profile.prefill)
    paths = [reward_path(f) for f, _ in rewards]
    grpo = grpo_kwargs(profile, output, [w for _, w in rewards], capability)  # output_dir: RUN/cli/grpo
    check_recipe(grpo, profile, capability, vllm_installed=vllm_installed)
    dtype = _dtype(precision(profile, capability))
    warmup = profile.warmup_examples > 0
    texts: dict[str, str] = {}
    if warmup:
        texts[SFT_YAML] = _dump([
            ("Model (trl.ModelConfig): the recipe's model folder, LoRA as in notebook 03.",
             _model_args(profile, model, dtype)),
            (f"Data: {profile.warmup_examples} worked problems ({profile.warmup_level}), prompt + completion\n"
             "conversations; SFTTrainer trains on the completion only.",
             {"datasets": [{"path": "json", "data_files": str(folder / WARMUP_ROWS), "split": "train"}]}),
            ("SFTConfig: every value notebook 03's warm-up cell sets (helpers.training.sft_kwargs).",
             sft_kwargs(profile, output, capability)),  # output_dir: RUN/cli/warmup-adapter
        ], header=(f"# The format warm-up of profile {profile.name!r}, written by helpers.recipe.\n"
                   f"# Run it with TRL's own command:  trl sft --config {folder / SFT_YAML}\n"
                   f"# then fold it into the weights GRPO starts from:  python -m helpers.recipe merge {folder}"))
    backend = ("notebook 03 trains with Unsloth on this profile; TRL's command trains the same LoRA with PEFT "
               "(and bitsandbytes 4-bit where set)" if profile.backend == "unsloth" else
               "the same model, LoRA and precision as notebook 03")
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
    ], header=(f"# The GRPO recipe of profile {profile.name!r}, written by helpers.recipe.\n"
               f"# Run it with TRL's own command:  trl grpo --config {folder / GRPO_YAML}\n"
               f"# Any field can be overridden on the command line (--max_steps 500). Model: {backend}.\n"
               f"# Prefill {profile.prefill!r}: in the chat template saved with the model folder's tokenizer."))
    return texts


def write_recipe(profile: Profile, run: str | Path, tokenizer: Any = None, rewards: list | None = None,
                 capability: tuple[int, int] | None = None, fetch: bool = False) -> Recipe:
    """Write the run's recipe into ``RUN/recipe/`` as ``trl grpo`` (and ``trl sft``) YAML; return it.

    ``tokenizer`` is the prepared one of notebook 03 (loaded from the profile when None);
    ``rewards`` the ``[(function, weight)]`` of the run (the profile's preset when None). The
    prepared dataset of notebook 01 is used where it lies (``RUN/dataset``, built when missing).
    ``fetch`` downloads a hub model into the Hugging Face cache when it is not there yet
    (:func:`recipe_model`); the bundled model needs nothing.

    Example::

        recipe = write_recipe(get_profile("cpu-smoke"), RUN)
        print(recipe.grpo.read_text())
    """
    from transformers import AutoTokenizer

    from .data import ensure_prepared
    from .preflight import gpu_capability
    from .training import warmup_dataset

    run = Path(run).absolute()
    folder = run / RECIPE_DIR
    if capability is None and profile.backend == "unsloth":
        capability = gpu_capability()
    texts = recipe_texts(profile, run, rewards, capability)  # checks first: nothing is written on an error
    model = recipe_model(profile, folder / MODEL_DIR, tokenizer, fetch=fetch)
    tok = AutoTokenizer.from_pretrained(str(model))
    ensure_prepared(profile, run, tokenizer=tok, verbose=False)
    if SFT_YAML in texts:
        warmup_dataset(profile, tok).to_json(str(folder / WARMUP_ROWS), lines=True, force_ascii=False)
    for name, text in texts.items():
        (folder / name).write_text(text)
    return Recipe(folder=folder, grpo=folder / GRPO_YAML, sft=folder / SFT_YAML if SFT_YAML in texts else None,
                  model=model, output=run / CLI_DIR)


def check_recipe(values: dict[str, Any], profile: Profile, capability: tuple[int, int] | None = None,
                 vllm_installed: bool | None = None) -> None:
    """:func:`helpers.training.check_config` on ``GRPOConfig`` values given as a dict (a recipe's)."""
    from types import SimpleNamespace

    from .training import check_config

    check_config(SimpleNamespace(**values), profile, capability=capability, vllm_installed=vllm_installed)


def load_recipe(path: str | Path) -> dict[str, Any]:
    """A recipe YAML as a dict.

    Example::

        load_recipe(RUN / "recipe" / "grpo.yaml")["reward_funcs"][0]
        # -> 'helpers.rewards.correctness_reward'
    """
    import yaml

    return yaml.safe_load(Path(path).read_text())


def merge_warmup(folder: str | Path) -> Path:
    """Fold the warm-up adapter (``trl sft``'s output) into the weights the GRPO step starts from.

    Reads the paths from the recipe itself: the base and the adapter from ``sft.yaml``
    (``model_name_or_path``, ``output_dir``), the target from ``grpo.yaml``'s
    ``model_name_or_path``. Saves the merged model and the base folder's tokenizer there.

    Example::

        merge_warmup(RUN / "recipe")   # after `trl sft --config RUN/recipe/sft.yaml`
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(folder)
    if not (folder / SFT_YAML).is_file():
        raise RecipeError(f"No {SFT_YAML} in {folder}: this recipe has no warm-up, run `trl grpo` directly.")
    sft, grpo = load_recipe(folder / SFT_YAML), load_recipe(folder / GRPO_YAML)
    adapter = Path(sft["output_dir"])
    if not (adapter / "adapter_config.json").is_file():
        raise RecipeError(f"No warm-up adapter in {adapter}: run `trl sft --config {folder / SFT_YAML}` first.")
    dtype = getattr(torch, sft.get("dtype") or "float32")
    base = AutoModelForCausalLM.from_pretrained(sft["model_name_or_path"], dtype=dtype)
    merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    target = Path(grpo["model_name_or_path"])
    merged.save_pretrained(str(target))
    AutoTokenizer.from_pretrained(sft["model_name_or_path"]).save_pretrained(str(target))
    return target


def combine_adapters(folder: str | Path) -> Path:
    """One LoRA adapter on the *base* model that equals warm-up + GRPO, saved to ``RUN/cli/adapter``.

    After a warm-up, ``trl grpo`` trains on the warm-up-merged weights, so its adapter belongs to them.
    PEFT's ``add_weighted_adapter(..., combination_type="cat")`` stacks the two LoRAs into one of rank
    r1 + r2 whose update is exactly the sum of theirs: the result loads on the base model, as notebook
    04 loads ``RUN/adapter``. Reads every path from the recipe's YAML files.

    Example::

        combine_adapters(RUN / "recipe")   # after `trl grpo --config RUN/recipe/grpo.yaml`
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(folder)
    if not (folder / SFT_YAML).is_file():
        raise RecipeError(f"No {SFT_YAML} in {folder}: without a warm-up, `trl grpo`'s output_dir already holds "
                          "the adapter on the base model.")
    sft, grpo = load_recipe(folder / SFT_YAML), load_recipe(folder / GRPO_YAML)
    warm, trained = Path(sft["output_dir"]), Path(grpo["output_dir"])
    if not (trained / "adapter_config.json").is_file():
        raise RecipeError(f"No GRPO adapter in {trained}: run `trl grpo --config {folder / GRPO_YAML}` first.")
    base = AutoModelForCausalLM.from_pretrained(sft["model_name_or_path"],
                                                dtype=getattr(torch, sft.get("dtype") or "float32"))
    model = PeftModel.from_pretrained(base, str(warm), adapter_name="warmup")
    model.load_adapter(str(trained), adapter_name="grpo")
    model.add_weighted_adapter(["warmup", "grpo"], [1.0, 1.0], adapter_name="default", combination_type="cat")
    model.delete_adapter("warmup")
    model.delete_adapter("grpo")
    target = trained.parent / "adapter"
    model.save_pretrained(str(target))  # the adapter named "default" is saved at the folder's top level
    AutoTokenizer.from_pretrained(str(trained)).save_pretrained(str(target))
    return target


def vllm_serve_command(recipe: Recipe, **server: Any) -> str:
    """The ``vllm serve`` command TRL 1.13 prints for the recipe's model (``trl vllm-serve`` is deprecated
    in favour of it): built by TRL's own ``trl.scripts.vllm_serve.build_command``, with the environment
    variables TRL sets. ``server`` takes ``trl vllm-serve``'s fields (``port``, ``tensor_parallel_size``...).

    Example::

        vllm_serve_command(recipe, max_model_len=1024)
        # -> 'VLLM_SERVER_DEV_MODE=1 VLLM_WORKER_MULTIPROC_METHOD=spawn vllm serve .../model --host 0.0.0.0 ...'
    """
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    command = build_command(ScriptArguments(model=str(recipe.model), **server))
    return ("VLLM_SERVER_DEV_MODE=1 VLLM_WORKER_MULTIPROC_METHOD=spawn "
            + shlex.join(["vllm", *command[command.index("serve"):]]))


def main(argv: list[str] | None = None) -> int:
    """``python -m helpers.recipe write RUN [--profile NAME]``, ``... merge RUN/recipe``, ``... combine RUN/recipe``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m helpers.recipe", description=main.__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    write = sub.add_parser("write", help="write RUN/recipe/ from a profile")
    write.add_argument("run", help="the run folder (its dataset/ is used, or built)")
    write.add_argument("--profile", default=None, help="profile name (default: COURSE_PROFILE or detected)")
    write.add_argument("--fetch", action="store_true", help="download a hub model into the HF cache if missing")
    merge = sub.add_parser("merge", help="fold the warm-up adapter into the model the GRPO step starts from")
    merge.add_argument("recipe", help="the recipe folder (RUN/recipe)")
    combine = sub.add_parser("combine", help="warm-up + GRPO as one adapter on the base model (RUN/cli/adapter)")
    combine.add_argument("recipe", help="the recipe folder (RUN/recipe)")
    args = parser.parse_args(argv)
    try:
        if args.action == "write":
            from .config import get_profile

            recipe = write_recipe(get_profile(args.profile), args.run, fetch=args.fetch)
            print("\n".join(recipe.commands()))
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

"""CPU stand-ins for a rehearsal of the GPU check: ``dev/gpu_check.py --native --rehearse tests/gpu_check_cpu.py``.

Run by ``tests/test_gpu_check.py`` in the contract environment. It checks the check (every cell of notebooks 03 and
04 runs through it, the readers, the resume, the merge and reload cells), not the GPU path: what needs a GPU is
replaced, the way ``tests/unsloth_cpu.py`` replaces it.

* TRL is patched as ``import unsloth`` patches it on a T4 (``UNSLOTH_ALLOW_CPU=1`` returns before that step), with
  Unsloth's own entry ``unsloth.models.rl._patch_trl_rl_trainers_impl``: the trainer is ``UnslothGRPOTrainer``.
* ``unsloth.FastLanguageModel`` becomes a stand-in with the same calls the notebooks make: ``from_pretrained`` (a
  model folder, or an adapter folder naming its base) loads with transformers in float32 and ``get_peft_model`` adds
  PEFT's LoRA; the models get Unsloth's ``for_training``/``for_inference`` and ``save_pretrained_merged`` (PEFT's
  ``merge_and_unload`` on the full-precision base, saved in bfloat16).
"""

from __future__ import annotations

import json
import tempfile
import types
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer


def _save_pretrained_merged(self: Any, folder: str, tokenizer: Any, save_method: str = "merged_16bit", **_: Any) -> None:
    if save_method != "merged_16bit":
        raise ValueError(f"the rehearsal merges to 16 bits only, not {save_method!r}")
    with tempfile.TemporaryDirectory() as tmp:
        self.save_pretrained(tmp, selected_adapters=[self.active_adapter])
        full = AutoModelForCausalLM.from_pretrained(self._course_base, dtype=torch.float32)
        merged = PeftModel.from_pretrained(full, str(Path(tmp) / ("" if self.active_adapter == "default"
                                                                 else self.active_adapter))).merge_and_unload()
    merged.to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _as_unsloth(model: Any, base: str) -> Any:
    model._course_base = base
    model.for_training = types.MethodType(lambda self, *a, **k: self.train(), model)
    model.for_inference = types.MethodType(lambda self, *a, **k: self.eval(), model)
    model.save_pretrained_merged = types.MethodType(_save_pretrained_merged, model)
    return model


class FastLanguageModel:
    """The calls notebooks 03 and 04 make, on a CPU."""

    @staticmethod
    def from_pretrained(model_name: str, max_seq_length: int | None = None, load_in_4bit: bool = False,
                        fast_inference: bool = False, max_lora_rank: int | None = None,
                        gpu_memory_utilization: float | None = None, **_: Any) -> tuple[Any, Any]:
        folder = Path(model_name)
        adapter = folder / "adapter_config.json"
        base = json.loads(adapter.read_text())["base_model_name_or_path"] if adapter.is_file() else str(folder)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        if adapter.is_file():
            model = _as_unsloth(PeftModel.from_pretrained(model, str(folder), is_trainable=True), base)
        else:
            model._course_base = base
        return model, tokenizer

    @staticmethod
    def get_peft_model(model: Any, r: int, target_modules: list[str], lora_alpha: int, lora_dropout: float = 0.0,
                       use_gradient_checkpointing: Any = None, random_state: int = 0, **_: Any) -> Any:
        torch.manual_seed(random_state)
        lora = LoraConfig(r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, target_modules=target_modules,
                          task_type="CAUSAL_LM")
        return _as_unsloth(get_peft_model(model, lora), model._course_base)

    @staticmethod
    def for_training(model: Any, *args: Any, **kwargs: Any) -> Any:
        return model.train()

    @staticmethod
    def for_inference(model: Any, *args: Any, **kwargs: Any) -> Any:
        return model.eval()


def install() -> None:
    """Patch TRL as ``import unsloth`` does on a T4, and put the stand-in in ``unsloth.FastLanguageModel``."""
    import unsloth
    from unsloth.models import rl

    real = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda *args, **kwargs: (7, 5)
    for trainer in ("grpo_trainer", "sft_trainer"):
        rl._patch_trl_rl_trainers_impl(trainer)
    torch.cuda.get_device_capability = real
    unsloth.FastLanguageModel = FastLanguageModel


if __name__ == "__gpu_check_rehearsal__":  # run by dev/gpu_check.py --rehearse; importing it does nothing
    install()

"""Contract: every keyword the notebooks and helpers pass to TRL, PEFT, transformers, Unsloth and vLLM
exists in the pinned versions, GPU-only cells included (no machine here runs those).

The calls are found by parsing the code (``ast``): every notebook's code cells and every module of
``helpers``, its ``tasks`` package included. Signatures come from the installed packages, read in the contract environment where
Unsloth imports on a CPU (``tests/contract_probe.py``); vLLM, which cannot be installed without a
GPU, from the record of its pinned wheel (``tests/fixtures/vllm_*_signatures.json``). A keyword must
be a named parameter, not one swallowed by ``**kwargs``.
"""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

import pytest

from helpers.profiles import MODELS, PROFILES, get_model_spec, get_profile
from helpers.runs import project_root
from tools.course import course_notebooks

from .contract import signatures
from .notebook_code import notebook_code

pytestmark = pytest.mark.contract
ROOT = project_root()
VLLM_RECORD = Path(__file__).parent / "fixtures" / "vllm_0.19.1_signatures.json"

# patch_saving_functions binds these to model.save_pretrained_merged / push_to_hub_merged /
# save_pretrained_gguf (the generic ones on text models, the older names on others): both must accept.
MERGED = ["unsloth.save:unsloth_generic_save_pretrained_merged", "unsloth.save:unsloth_save_pretrained_merged"]
PUSH = ["unsloth.save:unsloth_generic_push_to_hub_merged", "unsloth.save:unsloth_push_to_hub_merged"]

#: How a call is written (the last dotted parts) -> the real callables it reaches.
TARGETS: dict[str, list[str]] = {
    "GRPOConfig": ["trl:GRPOConfig"],
    "SFTConfig": ["trl:SFTConfig"],
    "GRPOTrainer": ["trl:GRPOTrainer.__init__"],
    "SFTTrainer": ["trl:SFTTrainer.__init__"],
    "FastLanguageModel.from_pretrained": ["unsloth:FastLanguageModel.from_pretrained"],
    "FastLanguageModel.get_peft_model": ["unsloth:FastLanguageModel.get_peft_model"],
    "LoraConfig": ["peft:LoraConfig"],
    "get_peft_model": ["peft:get_peft_model"],
    "PeftModel.from_pretrained": ["peft:PeftModel.from_pretrained"],
    "load_adapter": ["peft:PeftModel.load_adapter"],
    "BitsAndBytesConfig": ["transformers:BitsAndBytesConfig.__init__"],
    "save_pretrained_merged": MERGED,
    "push_to_hub_merged": PUSH,
    "save_pretrained_gguf": ["unsloth.save:unsloth_save_pretrained_gguf"],
    "load_lora": ["unsloth_zoo.vllm_utils:load_lora"],
}
#: vLLM callables, from the record of the pinned wheel.
VLLM_TARGETS = {"SamplingParams": "vllm:SamplingParams", "LoRARequest": "vllm.lora.request:LoRARequest",
                "fast_generate": "vllm:LLM.generate"}


def sources() -> dict[str, str]:
    out = {f"notebooks/{p.name}": notebook_code(p) for p in course_notebooks()}
    out.update({str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "helpers").rglob("*.py"))})
    return out


def dotted(func: ast.AST) -> str:
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return ".".join(reversed(parts))


def spelled_dicts(tree: ast.AST) -> dict[str, list[str]]:
    """``NAME = dict(a=..., b=...)`` or ``NAME = {"a": ..., **OTHER}`` (:func:`readable_dict`): keys a reader sees
    written out."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            if isinstance(value, ast.Call) and dotted(value.func) == "dict" and not value.args and all(
                    k.arg for k in value.keywords):
                out[node.targets[0].id] = [k.arg for k in value.keywords]
            elif isinstance(value, ast.Dict) and (keys := readable_dict(value, out)) is not None:
                out[node.targets[0].id] = keys
    return out


#: Save points whose keywords are checked where they are built: ``grpo_kwargs`` by tests/unsloth_config_probe.py,
#: which passes its whole output to Unsloth's and TRL's GRPOConfig.
SAVE_POINTS = {"grpo_kwargs"}


def readable_dict(node: ast.Dict, spelled: dict[str, list[str]]) -> list[str] | None:
    """The keys of ``{"a": 1, **ASKED, **grpo_kwargs(...)}`` when every one can be read: written-out string keys,
    spelled dicts and save points (their own keys are checked elsewhere); None when one cannot."""
    keys = []
    for key, value in zip(node.keys, node.values):
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            keys.append(key.value)
        elif key is None and isinstance(value, ast.Name) and value.id in spelled:
            keys += spelled[value.id]
        elif key is None and isinstance(value, ast.Call) and dotted(value.func) in SAVE_POINTS:
            continue
        else:
            return None
    return keys


def target_of(name: str) -> str | None:
    for key in sorted(set(TARGETS) | set(VLLM_TARGETS), key=len, reverse=True):
        if name == key or name.endswith("." + key):
            return key
    return None


@functools.lru_cache(maxsize=None)
def found_calls() -> list[tuple[str, int, str, list[str], bool]]:
    """``(file, line, call, keywords, has_**)`` for every call of a checked target."""
    out = []
    for where, source in sources().items():
        tree = ast.parse(source)
        spelled = spelled_dicts(tree)
        demos = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) and any(
            "TypeError" in ast.unparse(h.type or ast.Name("")) for h in t.handlers)
            for stmt in t.body for n in ast.walk(stmt)}  # calls made to show TRL's own TypeError
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and id(node) not in demos and (key := target_of(dotted(node.func))):
                kws = [k.arg for k in node.keywords if k.arg is not None]
                stars = [k.value for k in node.keywords if k.arg is None]
                for star in [s for s in stars if isinstance(s, ast.Name) and s.id in spelled]:
                    kws += spelled[star.id]  # GRPOConfig(**ASKED), ASKED = dict(...) written out above
                    stars.remove(star)
                for star in [s for s in stars if isinstance(s, ast.Dict)]:
                    if (keys := readable_dict(star, spelled)) is not None:
                        kws += keys  # GRPOConfig(**{**grpo_kwargs(...), "bf16": True})
                        stars.remove(star)
                out.append((where, node.lineno, key, kws, bool(stars)))
    return out


@functools.lru_cache(maxsize=None)
def recorded_vllm() -> dict:
    return json.loads(VLLM_RECORD.read_text())


@pytest.fixture(scope="module")
def info():
    return signatures(*sorted({t for targets in TARGETS.values() for t in targets}))


def test_the_calls_a_learner_must_learn_are_found():
    seen = {(where.split("/")[0], key) for where, _, key, _, _ in found_calls()}
    for key in ("GRPOConfig", "SFTConfig", "GRPOTrainer", "SFTTrainer", "FastLanguageModel.from_pretrained",
                "FastLanguageModel.get_peft_model", "LoraConfig", "save_pretrained_merged", "PeftModel.from_pretrained"):
        assert ("notebooks", key) in seen, f"no notebook calls {key}: the contract would check nothing"


def test_every_helpers_module_is_read():
    read = {where for where in sources() if where.startswith("helpers/")}
    assert {"helpers/training.py", "helpers/models.py", "helpers/generation.py", "helpers/tasks/orders.py"} <= read
    seen = {(where, key) for where, _, key, _, _ in found_calls()}
    for where, key in [("helpers/models.py", "FastLanguageModel.from_pretrained"), ("helpers/models.py", "LoraConfig"),
                       ("helpers/training.py", "GRPOTrainer"), ("helpers/training.py", "SFTTrainer"),
                       ("helpers/generation.py", "SamplingParams"), ("helpers/generation.py", "LoRARequest")]:
        assert (where, key) in seen, f"{where} no longer calls {key}? The contract would check nothing there"


def test_notebook_calls_spell_out_their_keywords():
    hidden = [f"{w}:{line} {key}" for w, line, key, _, star in found_calls() if star and w.startswith("notebooks")]
    assert not hidden, f"these calls pass **kwargs, so nobody can check them: {hidden}"


@pytest.mark.parametrize("key", sorted(TARGETS))
def test_keywords_exist_in_the_installed_signatures(info, key):
    for where, line, _, kws, _ in [c for c in found_calls() if c[2] == key]:
        for target in TARGETS[key]:
            params = set(info["targets"][target]["params"])
            unknown = sorted(set(kws) - params)
            assert not unknown, (f"{where}:{line} passes {unknown} to {key}, which {target} "
                                 f"(versions {info['versions']}) does not name: ignored or an error on a GPU")


@pytest.mark.parametrize("key", sorted(VLLM_TARGETS))
def test_keywords_exist_in_the_recorded_vllm(key):
    params = set(recorded_vllm()["targets"][VLLM_TARGETS[key]]["params"])
    for where, line, _, kws, _ in [c for c in found_calls() if c[2] == key]:
        unknown = sorted(set(kws) - params)
        assert not unknown, f"{where}:{line} passes {unknown} to {key}: vllm {recorded_vllm()['versions']} lacks them"


def test_the_vllm_record_is_for_the_pinned_vllm():
    from helpers.preflight import check_versions

    assert recorded_vllm()["versions"]["vllm"] == {c.package: c.pinned for c in check_versions(("vllm",))}["vllm"], (
        "the vllm pin changed: re-record tests/fixtures/vllm_*_signatures.json from the new wheel")


def test_a_wrong_keyword_is_caught(info):
    assert "max_prompt_length" not in info["targets"]["trl:GRPOConfig"]["params"]
    assert "warmup_ratio" not in info["targets"]["trl:SFTConfig"]["params"]


class Recorder:
    """Stands in for a config class: records the keywords it is built with."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.__dict__.update(kwargs)

    def __getattr__(self, name):  # anything a check reads and nobody set
        return None


@pytest.mark.parametrize("task", ["arithmetic", "json"])
@pytest.mark.parametrize("name", list(PROFILES), ids=str)
@pytest.mark.parametrize("capability", [(7, 5), (8, 0)], ids=["t4", "a100"])
def test_the_save_points_build_configs_the_installed_trl_accepts(info, name, task, capability, monkeypatch,
                                                                 tmp_path):
    """helpers.training builds GRPOConfig and SFTConfig from dicts (overrides on top): check what it really
    passes, for every profile, task and model (Unsloth's GRPOConfig and SFTConfig, as on a GPU)."""
    import trl

    from helpers.training import grpo_config, sft_kwargs

    monkeypatch.setattr(trl, "GRPOConfig", Recorder)
    monkeypatch.setattr("helpers.training.check_config", lambda *a, **k: None)
    profile = get_profile(name, task=task, use_vllm=PROFILES[name].use_vllm)
    models = [profile.model] if profile.backend != "unsloth" else [k for k, s in MODELS.items() if s.unsloth_id]
    for model in models:
        p = profile.with_overrides(model=model)
        cap = capability if p.backend == "unsloth" else None
        kwargs = grpo_config(p, tmp_path, capability=cap).kwargs
        unknown = sorted(set(kwargs) - set(info["targets"]["trl:GRPOConfig"]["params"]))
        assert not unknown, f"{p.name}/{model}: GRPOConfig has no {unknown}"
        assert kwargs["chat_template_kwargs"] == (get_model_spec(model).chat_template_kwargs or None)
        unknown = sorted(set(sft_kwargs(p, tmp_path, cap)) - set(info["targets"]["trl:SFTConfig"]["params"]))
        assert not unknown, f"{p.name}/{model}: SFTConfig has no {unknown}"


def test_unsloth_writes_gguf_files_where_collect_gguf_looks(tmp_path):
    """``save_pretrained_gguf(folder)`` puts the .gguf in ``folder + "_gguf"`` (a sibling), read from Unsloth."""
    import os
    import subprocess

    from helpers.merge import collect_gguf

    from .contract import contract_python

    code = ("import os; os.environ['UNSLOTH_ALLOW_CPU'] = '1'; import unsloth.save as s; "
            f"print('GGUF-DIR', s._gguf_output_directory({str(tmp_path / 'gguf-export')!r}))")
    proc = subprocess.run([contract_python(), "-c", code], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, UNSLOTH_ALLOW_CPU="1"), cwd=tmp_path)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("GGUF-DIR ")), None)
    assert line is not None, f"Unsloth no longer has save._gguf_output_directory: {proc.stderr[-2000:]}"
    where = Path(line.split(" ", 1)[1])
    (tmp_path / "gguf-export").mkdir()
    where.mkdir()
    (where / "model-Q4_K_M.gguf").write_bytes(b"GGUF")
    assert [p.name for p in collect_gguf(tmp_path / "gguf-export", tmp_path / "gguf")] == ["model-Q4_K_M.gguf"]

"""dev/gpu_check.py without a GPU: the notebook cells it runs, its tiny models, and the check itself up to the
first CUDA call (in the contract environment, where Unsloth imports on a CPU), so a broken check is caught here."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from dev import gpu_check as gc

from .contract import contract_python

ROOT = Path(__file__).resolve().parents[1]


def test_the_check_finds_its_cells_in_both_notebooks():
    cells = {nb: gc.read_cells(nb) for nb in gc.NOTEBOOKS}
    for nb, markers in gc.PATH_MARKERS.items():
        assert sorted(c.marker for c in cells[nb] if c.role == "path") == sorted(markers)
    run03 = "\n".join(c.source for c in cells["03"] if c.role != "skip")
    for call in ("FastLanguageModel.from_pretrained(", "load_in_4bit=PROFILE.load_in_4bit",
                 "FastLanguageModel.get_peft_model(", "config = GRPOConfig(**ASKED)", "trainer = GRPOTrainer(",
                 "trainer.train(resume_from_checkpoint=checkpoint)"):
        assert call in run03, f"notebook 03 no longer has {call!r}: the GPU check would not run it"
    run04 = "\n".join(c.source for c in cells["04"] if c.role != "skip")
    for call in ('save_method="merged_16bit"', "model_name=str(MERGED)", "verify_merged(",
                 "transcript("):
        assert call in run04, f"notebook 04 no longer has {call!r}: the GPU check would not run it"
    assert [c.name for c in cells["04"] if c.role == "skip"] == [
        next(c.name for c in cells["04"] if "save_pretrained_gguf(" in c.source)]
    assert [c.name for c in cells["03"] if c.role == "skip"] == [  # a web server that never returns in a script
        next(c.name for c in cells["03"] if "trackio.show(" in c.source)]
    assert cells["03"][0].source.count("pass  # %pip") == 1  # the install cell's magic, as nbval's reader sees it
    for cell in cells["03"] + cells["04"]:
        compile(cell.source, cell.name, "exec")
    assert gc.FIRST_CUDA_CELL in {(c.notebook, c.marker) for c in cells["03"]}


def test_a_changed_notebook_is_caught(tmp_path):
    nb = json.loads(gc.NOTEBOOKS["03"].read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            cell["source"] = text.replace("trainer = GRPOTrainer(", "trainer = Trainer(")
    path = tmp_path / "03.ipynb"
    path.write_text(json.dumps(nb))
    with pytest.raises(ValueError, match="0 code cells contain 'trainer = GRPOTrainer\\('"):
        gc.read_cells("03", path)


def test_report_to_trackio_becomes_none_only_without_trackio():
    cells = [gc.Cell("03", 20, 'ASKED = dict(report_to="trackio", seed=1)', "path")]
    assert gc.apply_substitutions(cells, gc.substitutions(trackio=True)) == []
    applied = gc.apply_substitutions(cells, gc.substitutions(trackio=False))
    assert cells[0].source == 'ASKED = dict(report_to="none", seed=1)'
    assert applied == [{"cell": "03[20]", "old": 'report_to="trackio"', "new": 'report_to="none"',
                        "why": gc.substitutions(False)[0][2]}]


@pytest.mark.slow
@pytest.mark.parametrize("arch", gc.ARCHITECTURES)
def test_the_tiny_models_end_some_completions_and_write_greedy_text(tmp_path, arch):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from helpers.models import bundled_model_path

    info = gc.tiny_model(arch, bundled_model_path(build=False), tmp_path)
    assert info["config"]["num_hidden_layers"] == 2 and info["config"]["tie_word_embeddings"] is (arch == "gemma3")
    assert info["model_type"] == {"qwen2": "qwen2", "gemma3": "gemma3_text"}[arch]
    low, mean, high = info["p_eos_per_token"]
    assert 0.05 <= mean <= 0.12 and high < 0.5, info  # some sampled completions end, most are not cut at once
    assert info["p_top_other_token_mean"] > mean      # so greedy decoding writes a token rather than ending
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    assert str(next(model.parameters()).dtype) == "torch.float32" and tok.eos_token == "<|im_end|>"
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 12 + 30?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    greedy = model.generate(**ids, max_new_tokens=8, do_sample=False)[0, ids["input_ids"].shape[1]:]
    assert len(greedy) == 8 and tok.eos_token_id not in greedy.tolist()


def make_carry(folder: Path) -> Path:
    """A carried folder holding one small pure-Python wheel and a manifest."""
    (folder / "wheels").mkdir(parents=True)
    dist = "gpucheckdemo-1.0.dist-info"
    files = {"gpucheckdemo/__init__.py": "VALUE = 7\n",
             f"{dist}/METADATA": "Metadata-Version: 2.1\nName: gpucheckdemo\nVersion: 1.0\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    from dev.wheelhouse import record_hash
    files[f"{dist}/RECORD"] = "".join(f"{n},{record_hash(t.encode())},{len(t)}\n" for n, t in files.items()) \
        + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(folder / "wheels" / "gpucheckdemo-1.0-py3-none-any.whl", "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)
    (folder / "manifest.json").write_text(json.dumps({"image_requirements": {
        "packaging": ["packaging>=20 (gpucheckdemo)"], "numpy": ["numpy>=99 (gpucheckdemo)"]}}))
    return folder


def test_install_and_the_image_requirements(tmp_path):
    carry = make_carry(tmp_path / "carry")
    out = gc.install(carry, tmp_path / "site")
    assert out["wheels"] == 1 and (tmp_path / "site" / "gpucheckdemo" / "__init__.py").is_file()
    checked = gc.image_requirements(carry)
    assert checked["checked"] == 2
    assert len(checked["unmet"]) == 1 and checked["unmet"][0].startswith("numpy>=99 (gpucheckdemo): numpy ")
    with pytest.raises(FileNotFoundError, match="dev/wheelhouse.py build"):
        gc.install(tmp_path / "nothing", tmp_path / "site2")


def test_t4_emulation_shows_a_t4_to_unsloth_and_the_real_gpu_to_the_kernel_compilers(monkeypatch):
    """Told 7.5 on an H100, Triton built sm_75 kernels the GPU could not load (the first GPU run, 2026-11-27,
    bench/measured/gpu/gpu_check_first_t4like.json): Triton and torch's compilers must read the real capability."""
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "_course_real_capability", None, raising=False)  # removed again afterwards
    assert gc.emulate_t4() == {"capability": [7, 5], "bf16_supported": False}
    asked = {}
    for module in ("unsloth.models._utils", "bitsandbytes.cextension", "helpers.machine", "trl.trainer.utils",
                   "triton.backends.nvidia.driver", "torch._inductor.utils", "tritonclient"):
        exec("capability = torch.cuda.get_device_capability(0)", scope := {"__name__": module, "torch": torch})
        asked[module] = scope["capability"]
    assert asked == {"unsloth.models._utils": (7, 5), "bitsandbytes.cextension": (7, 5), "helpers.machine": (7, 5),
                     "trl.trainer.utils": (7, 5), "triton.backends.nvidia.driver": (9, 0),
                     "torch._inductor.utils": (9, 0), "tritonclient": (7, 5)}
    assert torch.cuda.is_bf16_supported() is False


def test_store_keeps_only_a_gpu_result(tmp_path):
    result = {k: {} for k in gc.REQUIRED}
    result.update(date="2026-11-26T22:00:00", ran=["qwen2: tiny_model"], failed={},
                  machine={"gpu": None, "python": "3.12.3"})
    src, dest = tmp_path / "gpu_check.json", tmp_path / "measured" / "gpu_check.json"
    src.write_text(json.dumps(result))
    assert gc.main(["store", str(src), "--dest", str(dest)]) == 1 and not dest.exists()
    result["machine"]["gpu"] = "NVIDIA H100 80GB HBM3"
    src.write_text(json.dumps(result))
    assert gc.main(["store", str(src), "--dest", str(dest)]) == 0
    assert json.loads(dest.read_text())["machine"]["gpu"] == "NVIDIA H100 80GB HBM3"
    src.write_text(json.dumps({"date": "x"}))
    assert gc.main(["store", str(src), "--dest", str(dest)]) == 1


@pytest.mark.contract
def test_the_check_runs_on_a_cpu_up_to_the_first_cuda_call(tmp_path):
    """Everything before the GPU runs here: the tiny models, the cells, Unsloth's import, the course's setup cell on
    the T4 profile with the tiny model registered; it stops at the memory cap, the first CUDA call."""
    carry = make_carry(tmp_path / "carry")
    env = dict(os.environ, UNSLOTH_ALLOW_CPU="1", HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    env.pop("COURSE_PROFILE", None)
    from helpers.models import bundled_model_path
    cmd = [contract_python(), str(ROOT / "dev" / "gpu_check.py"), "--out", str(tmp_path / "out"), "--work",
           str(tmp_path / "work"), "--install", "--carry", str(carry), "--tokenizer", str(bundled_model_path(build=False))]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert data["machine"]["gpu"] is None and data["failed"] == {}
    assert data["install"]["wheels"] == 1 and data["image_requirements"]["checked"] == 2
    assert data["versions"]["unsloth"] == "2026.10.3" and data["versions"]["trl"] == "1.13.0"
    assert set(data["models"]) == set(gc.ARCHITECTURES)
    for arch, model in data["models"].items():
        names = [s["name"] for s in model["steps"]]
        assert names == ["tiny_model", "notebook_cells", "t4_like", "import_unsloth", "course_setup", "03 03[1]",
                         "03 03[2]", "gpu_memory_cap"], names
        assert all(s["ok"] for s in model["steps"][:-1])
        assert model["stopped_at"].startswith("gpu_memory_cap: no CUDA GPU")
        assert model["exit_code"] == 2
        assert model["t4_emulation"] == {"capability": [7, 5], "bf16_supported": False}
        profile = model["course"]["profile"]
        assert (profile["name"], profile["model"], profile["backend"]) == ("colab-t4", f"tiny-{arch}", "unsloth")
        assert (profile["load_in_4bit"], profile["optim"], profile["loss_type"], profile["num_generations"],
                profile["max_steps"], profile["save_steps"]) == (True, "adamw_8bit", "dapo", 6, gc.STEPS, 1)
        # the notebook's own setup cell ran with the tiny model as the profile's model
        setup = next(s for s in model["steps"] if s["name"] == "03 03[2]")
        assert f"model: tiny-{arch}" in setup["output_tail"] and "backend: unsloth" in setup["output_tail"]
        assert model["tiny_model"]["model_type"] == {"qwen2": "qwen2", "gemma3": "gemma3_text"}[arch]
        cells = {nb: gc.read_cells(nb) for nb in gc.NOTEBOOKS}
        assert model["cells"]["04"]["skipped"] == {c.name: c.why for c in cells["04"] if c.role == "skip"}
        assert model["cells"]["03"]["path"] == [c.name for c in cells["03"] if c.role == "path"]


class FakeConfig:
    def __init__(self, **values):
        vars(self).update(values)


class FakeTrainer:
    """What the readers use of a trainer: args, callbacks, state."""

    def __init__(self, model):
        self.model, self.callbacks = model, []
        self.args = FakeConfig(fp16=True, bf16=False)
        self.state = FakeConfig(global_step=0, log_history=[])

    def add_callback(self, callback):
        self.callbacks.append(callback)

    def train(self, resume_from_checkpoint=None):
        for step in (1, 2):
            for cb in self.callbacks:
                cb.on_step_begin(self.args, self.state, None)
                cb.on_step_end(self.args, self.state, None)
            self.state.global_step = step
            self.state.log_history.append({"step": step, "loss": 0.5, "reward": 0.25, "ignored": "x"})


def test_run_cells_records_reads_and_stops_where_a_learner_would(tmp_path):
    import torch

    cells = [
        gc.Cell("03", 1, "X = 1", "aside"),
        gc.Cell("03", 2, "ASKED = dict(learning_rate=5e-6, report_to='none', fp16=True)\n"
                         "config = FakeConfig(learning_rate=5e-6, report_to=[], fp16=False, unsloth_num_chunks=-1)",
                "path", marker="config = GRPOConfig(**ASKED)"),
        gc.Cell("03", 3, "raise RuntimeError('a table broke')", "aside"),
        gc.Cell("03", 4, "model = torch.nn.Linear(2, 2)\ntokenizer = FakeConfig(padding_side='left')\n"
                         "trainer = FakeTrainer(model)", "path", marker="trainer = GRPOTrainer("),
        gc.Cell("03", 5, "checkpoint = '/run/grpo/checkpoint-2'\ntrainer.train(resume_from_checkpoint=checkpoint)",
                "path", marker="trainer.train(resume_from_checkpoint="),
        gc.Cell("03", 6, "raise ValueError('no data')", "path", marker="data = ensure_prepared("),
        gc.Cell("03", 7, "NEVER = True", "aside"),
    ]
    rec = gc.Recorder(tmp_path / "child.json", deadline=gc.time.time() + 600, model="qwen2")
    ns = {"FakeConfig": FakeConfig, "FakeTrainer": FakeTrainer, "torch": torch}
    record: dict = {}
    assert gc.run_cells(rec, "03", cells, ns, record) is False
    assert record["config"]["changed_from_asked"] == {"fp16": [True, False]}  # report_to "none" -> [] is no change
    assert record["config"]["unsloth_config"] is True
    assert record["trainer"]["args_fp16"] is True and record["trainer"]["trainable_parameters"] == 6
    train = record["train"]
    assert train["global_step"] == 2 and train["resumed_from"] == "/run/grpo/checkpoint-2"
    assert len(train["step_seconds"]) == 2 and train["seconds_per_step"] == train["step_seconds"][1]
    assert train["log_history"] == [{"step": 1, "loss": 0.5, "reward": 0.25}, {"step": 2, "loss": 0.5, "reward": 0.25}]
    assert record["stopped_after"] == "03[6]" and "NEVER" not in ns  # a failed path cell stops the notebook
    steps = {s["name"]: s for s in json.loads((tmp_path / "child.json").read_text())["steps"]}
    assert steps["03 03[3]"]["error"] == "RuntimeError: a table broke" and steps["03 03[4]"]["ok"]  # an aside did not
    assert steps["03 03[6]"]["error"] == "ValueError: no data"


def test_run_cells_stops_at_the_hook_and_at_the_deadline(tmp_path):
    cells = [gc.Cell("03", 6, "RAN = True", "path", marker=gc.FIRST_CUDA_CELL[1])]

    def gpu_memory_cap():
        raise gc.NoGPU("no CUDA GPU is visible")

    rec = gc.Recorder(tmp_path / "a.json", deadline=gc.time.time() + 600, model="gemma3")
    ns: dict = {}
    assert gc.run_cells(rec, "03", cells, ns, {}, before={gc.FIRST_CUDA_CELL: gpu_memory_cap}) is False
    assert "RAN" not in ns and rec.data["stopped_at"] == "gpu_memory_cap: no CUDA GPU is visible"
    late = gc.Recorder(tmp_path / "b.json", deadline=gc.time.time() + 5, model="gemma3")
    assert gc.run_cells(late, "04", cells, ns, {}) is False
    assert "RAN" not in ns and late.data["stopped_at"] == "04 03[6]: out of time"


def test_summarize_reads_every_architecture():
    result = {"models": {
        "qwen2": {"steps": [{"name": "tiny_model", "ok": True}, {"name": "04 04[26]", "ok": False, "error": "E: x"}],
                  "notebook_03": {"train": {"seconds_per_step": 0.8}, "config": {"changed_from_asked": {}},
                                  "peak_gpu_memory": {"allocated_gib": 1.5}},
                  "notebook_04": {"peak_gpu_memory": {"allocated_gib": 2.5}},
                  "substitutions": [{"cell": "03[20]", "old": "a", "new": "b", "why": "c"}]},
        "gemma3": {"steps": [{"name": "gpu_memory_cap", "ok": False, "stopped": "no GPU"}],
                   "stopped_at": "gpu_memory_cap: no GPU"}}}
    gc.summarize(result)
    assert result["ran"] == ["qwen2: tiny_model"] and result["failed"] == {"qwen2: 04 04[26]": "E: x"}
    assert result["stopped"] == {"gemma3": "gpu_memory_cap: no GPU"}
    assert result["seconds_per_step"] == {"qwen2": 0.8, "gemma3": None}
    assert result["peak_gpu_memory_gib"] == {"qwen2": 2.5, "gemma3": None}
    assert result["rewritten_config"] == {"qwen2": {"changed_from_asked": {}}, "gemma3": None}
    assert result["substitutions"] == ["03[20]: a -> b (c)"]


#: A rehearsal's sizes: the colab-t4 recipe on groups of 2 and short completions, so every cell runs in ~2 minutes.
REHEARSAL_SIZES = {"num_generations": 2, "per_device_train_batch_size": 2, "max_completion_length": 24,
                   "train_rows": 8, "eval_rows": 4, "eval_prompts": 4}


@pytest.mark.contract
def test_a_cpu_rehearsal_runs_every_cell_of_03_and_04_through_the_check(tmp_path):
    """Past the first CUDA call on a CPU: Unsloth's patched trainer, with tests/gpu_check_cpu.py standing in for
    FastLanguageModel, runs every cell the check runs on a GPU (the notebooks' Unsloth branch, which nbval never
    executes): training with checkpoints, the resume, the merge, the reload, and what the check reads of them."""
    from helpers.models import bundled_model_path

    env = dict(os.environ, UNSLOTH_ALLOW_CPU="1", UNSLOTH_COMPILE_DISABLE="1", HF_HUB_OFFLINE="1",
               PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    env.pop("COURSE_PROFILE", None)
    cmd = [contract_python(), str(ROOT / "dev" / "gpu_check.py"), "--native", "--rehearse",
           str(ROOT / "tests" / "gpu_check_cpu.py"), "--models", "qwen2", "--minutes", "6", "--sizes",
           json.dumps(REHEARSAL_SIZES), "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"),
           "--tokenizer", str(bundled_model_path(build=False))]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    data = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert proc.returncode == 0 and data["failed"] == {} and data["stopped"] == {}, (
        json.dumps(data["failed"], indent=1) + proc.stdout[-2000:])
    model = data["models"]["qwen2"]
    assert model["rehearsal"].endswith("gpu_check_cpu.py") and model["gpu"]["gpu"] is None
    nb03, resume, nb04 = model["notebook_03"], model["notebook_03_resume"], model["notebook_04"]
    assert nb03["config"]["unsloth_config"] and nb03["trainer"]["class"] == "UnslothGRPOTrainer"
    assert nb03["config"]["built"]["optim"] == "adamw_8bit" and nb03["config"]["built"]["loss_type"] == "dapo"
    assert nb03["train"]["global_step"] == 2 and nb03["train"]["resumed_from"] is None
    assert len(nb03["train"]["step_seconds"]) == 2
    assert resume["train"]["resumed_from"].endswith("grpo/checkpoint-2") and resume["train"]["global_step"] == 3
    assert model["adapter_signal"]["lora_B_tensors"] == 14   # 7 projections x 2 layers
    assert nb04["merge"]["saved_dtype"] == "bfloat16" and "model.safetensors" in nb04["merge"]["files"]
    logits = nb04["reload_and_generate"]["logits_merged_vs_adapter"]
    assert logits["argmax_agreement"] >= 0.9 and logits["max_abs_diff"] < 0.05 * logits["scale"]
    assert set(nb04["skipped"]) == set(model["cells"]["04"]["skipped"]) and len(nb04["skipped"]) == 1
    assert set(nb03["skipped"]) == set(model["cells"]["03"]["skipped"])
    ran = set(data["ran"])
    cells = model["cells"]
    assert {f"qwen2: 03 {c}" for c in cells["03"]["run"]} <= ran and {f"qwen2: 04 {c}" for c in cells["04"]["run"]} <= ran


def test_a_failed_training_still_leaves_04_an_adapter_and_the_adapter_gets_signal(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    class LoraModel:  # what untrained_adapter uses of notebook 03's model and tokenizer
        def save_pretrained(self, folder):
            Path(folder).mkdir(parents=True, exist_ok=True)
            save_file({"base.q_proj.lora_A.weight": torch.ones(4, 8), "base.q_proj.lora_B.weight": torch.zeros(8, 4)},
                      str(Path(folder) / "adapter_model.safetensors"))
            (Path(folder) / "adapter_config.json").write_text("{}")

    class Tokenizer:
        def save_pretrained(self, folder):
            (Path(folder) / "tokenizer.json").write_text("{}")

    out = gc.untrained_adapter({"model": LoraModel(), "tokenizer": Tokenizer()}, tmp_path)
    assert "training failed" in out["why"] and (tmp_path / "adapter" / "tokenizer.json").is_file()
    signal = gc.adapter_signal(tmp_path)
    assert signal["lora_B_tensors"] == 1
    tensors = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert torch.equal(tensors["base.q_proj.lora_A.weight"], torch.ones(4, 8))  # A untouched
    assert 0.02 < float(tensors["base.q_proj.lora_B.weight"].std()) < 0.1        # B no longer zero


# ------------------------------------------------------------------------ --real: the T4's models at their real size
@pytest.fixture(scope="module")
def qwen_tokenizer(tmp_path_factory):
    from helpers.models import bundled_model_path

    out = tmp_path_factory.mktemp("standin") / "tokenizer"
    return gc.standin_tokenizer(bundled_model_path(build=False), 151936, out), out


def test_the_standin_tokenizer_has_the_real_vocabulary_and_the_bundled_ones_behaviour(qwen_tokenizer, tmp_path):
    from transformers import AutoTokenizer

    from helpers.models import bundled_model_path

    info, folder = qwen_tokenizer
    tok, bundled = AutoTokenizer.from_pretrained(str(folder)), AutoTokenizer.from_pretrained(str(bundled_model_path()))
    assert len(tok) == info["vocab_size"] == 151936 and info["fillers"] == 151936 - len(bundled)
    text = "Natalia sold clips to 48 of her friends. <|im_end|>"
    assert tok(text)["input_ids"] == bundled(text)["input_ids"]          # encoding never produces a filler
    chat = [{"role": "user", "content": "What is 12 + 30?"}]
    assert tok.apply_chat_template(chat, tokenize=False) == bundled.apply_chat_template(chat, tokenize=False)
    assert tok.decode([151935]) == "<f151935>" and tok.convert_tokens_to_ids("<|im_end|>") == 2
    with pytest.raises(ValueError, match="smaller than the bundled tokenizer"):
        gc.standin_tokenizer(bundled_model_path(), 1000, tmp_path / "small")


@pytest.mark.parametrize("key", gc.REAL_MODELS)
def test_the_real_configs_take_the_standin_tokenizers_ids_and_keep_their_shapes(key, tmp_path):
    from transformers import AutoTokenizer

    from helpers.models import bundled_model_path
    from dev.model_configs import config_values

    published = config_values(key)
    gc.standin_tokenizer(bundled_model_path(), published["vocab_size"], tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    config = gc.real_config(key, tok)
    assert (config.eos_token_id, config.pad_token_id) == (2, 0)        # <|im_end|>, <|endoftext|> of the stand-in
    for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "vocab_size", "tie_word_embeddings"):
        assert name not in published or getattr(config, name) == published[name], name
    assert config.tie_word_embeddings                                  # all four tie the head (Gemma 3 by default)
    meta = gc.meta_shapes(key)
    assert meta["vocab"] == published["vocab_size"] and meta["layers"] == published["num_hidden_layers"]


@pytest.mark.slow
def test_a_real_model_is_built_saved_and_loads_as_its_architecture(qwen_tokenizer, tmp_path):
    """Built on the CPU with one layer (the GPU check builds all 28 on the GPU): the real widths, saved in bfloat16."""
    import torch
    from transformers import AutoModelForCausalLM

    _, folder = qwen_tokenizer
    info = gc.real_model("qwen2.5-1.5b", folder, tmp_path / "model", device="cpu", overrides={"num_hidden_layers": 1})
    assert info["class"] == "Qwen2ForCausalLM" and info["tied"] and info["config"]["hidden_size"] == 1536
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"))
    assert model.dtype == torch.bfloat16 and model.config.vocab_size == 151936
    assert model.generation_config.eos_token_id == 2 and (tmp_path / "model" / "tokenizer.json").is_file()
    assert sum(p.numel() for p in model.parameters()) == info["parameters"]


def test_the_preflight_report_a_cell_leaves_is_recorded():
    from helpers.readiness import Figures, Plan, Report, Verdict

    figures = Figures(groups=8, group_size=6, limit=256, masked=True, temperature=1.0, spread=0.25, learnable=0.0,
                      truncated=1.0, format=0.0, headline=0.0, pass_at_g=0.0, solved_all=0.0, distinct=1.0,
                      length_p95=512, probe_limit=512, seconds=40.0)
    report = Report(figures, Verdict("fix first", "every completion is cut", "raise max_completion_length"),
                    Plan(steps=250, warmup_examples=0))
    found = gc.preflight_record({"readiness": report, "check": print, "X": 1})
    assert found["figures"]["truncated"] == 1.0 and found["verdict"]["verdict"] == "fix first"
    assert found["printed"] == str(report) and gc.preflight_record({"readiness": None}) is None


def test_each_stage_is_its_cells_peak_and_the_step_time_names_the_gpu():
    cells = {"03": [gc.Cell("03", 6, "model = FastLanguageModel.from_pretrained(x)", "path"),
                    gc.Cell("03", 26, "readiness = check(model)", "aside"),
                    gc.Cell("03", 30, "trainer.train(resume_from_checkpoint=checkpoint)", "path")],
             "04": [gc.Cell("04", 28, "report = verify_merged(a, b)", "path")]}
    names = gc.stage_cells(cells)
    assert names == {"03[6]": "load", "03[26]": "preflight", "03[30]": "train (held-out evaluations inside)",
                     "04[28]": "verify_04"}
    steps = [{"name": "gpu_memory_cap", "ok": True}, {"name": "random_model", "ok": True, "peak_gpu": {"allocated_gib": 3.1}},
             {"name": "03 03[6]", "ok": True, "peak_gpu": {"allocated_gib": 1.2}},
             {"name": "03 03[26]", "ok": True, "peak_gpu": {"allocated_gib": 2.0}},
             {"name": "03 03[30]", "ok": True, "peak_gpu": {"allocated_gib": 4.5}},
             {"name": "03 03[30] (read)", "ok": True, "peak_gpu": {"allocated_gib": 9.9}},   # a reader, not a stage
             {"name": "04 04[28]", "ok": True, "peak_gpu": {"allocated_gib": 7.0}}]
    result = {"machine": {"gpu": "NVIDIA H200"}, "t4_like": {"capability": [7, 5]}, "models": {"qwen2.5-1.5b": {
        "steps": steps, "stage_cells": names, "notebook_03": {"train": {"seconds_per_step": 12.5},
                                                              "preflight": {"verdict": {"verdict": "go"}}}}}}
    gc.summarize(result)
    assert result["peak_gpu_gib_by_stage"]["qwen2.5-1.5b"] == {
        "build (the random model, bfloat16)": 3.1, "load": 1.2, "preflight": 2.0,
        "train (held-out evaluations inside)": 4.5, "verify_04": 7.0}
    label = result["step_time"]["qwen2.5-1.5b"]["label"]
    assert label.startswith("12.5 s a step on NVIDIA H200 told it is a T4") and "not a T4's speed" in label
    assert result["preflight"]["qwen2.5-1.5b"] == {"verdict": {"verdict": "go"}}


def test_a_cpu_recorder_reads_no_gpu_peak(tmp_path):
    rec = gc.Recorder(tmp_path / "r.json", deadline=gc.time.time() + 60, model="qwen2.5-1.5b")
    assert rec.run("add", lambda: 1 + 1) == (True, 2)
    assert "peak_gpu" not in rec.data["steps"][0] and rec.take_window() is None


def test_real_sizes_keep_colab_t4s_recipe_and_the_models_are_checked(tmp_path, monkeypatch):
    import helpers.profiles as hp

    monkeypatch.setattr(hp, "MODELS", dict(hp.MODELS))
    monkeypatch.setattr(hp, "PROFILES", dict(hp.PROFILES))
    for name in ("COURSE_PROFILE", "COURSE_MODEL", "COURSE_RUN_DIR", "COURSE_GSM8K_DIR", "COURSE_TIME_BUDGET"):
        monkeypatch.setenv(name, "")   # recorded, so what course_setup sets is undone after the test
        monkeypatch.delenv(name)
    setup = gc.course_setup("gemma3-1b", tmp_path / "random-gemma3-1b", tmp_path / "run", None)
    profile, t4 = setup["profile"], hp.COLAB_T4
    assert (profile["model"], profile["max_steps"], profile["time_budget_minutes"]) == ("random-gemma3-1b", 250, 1.5)
    for name in ("max_completion_length", "num_generations", "per_device_train_batch_size", "lora_rank", "optim",
                 "max_seq_length", "load_in_4bit", "gradient_checkpointing", "mask_truncated_completions"):
        assert profile[name] == getattr(t4, name), name
    spec = hp.MODELS["random-gemma3-1b"]
    assert spec.fp32_on_t4 and spec.params_b == hp.MODELS["gemma3-1b"].params_b and spec.unsloth_id.endswith("gemma3-1b")
    with pytest.raises(SystemExit):
        gc.main(["--models", "qwen2.5-1.5b", "--out", str(tmp_path / "out")])   # a registry key needs --real
    with pytest.raises(SystemExit):
        gc.main(["--real", "--models", "qwen2", "--out", str(tmp_path / "out")])


@pytest.mark.contract
def test_the_real_size_check_runs_on_a_cpu_up_to_the_first_cuda_call(tmp_path):
    """--real before the GPU: the real config on the meta device, the stand-in tokenizer of its vocabulary, the
    notebooks' setup with colab-t4's real sizes; it stops at the memory cap, before building the weights."""
    carry = make_carry(tmp_path / "carry")
    env = dict(os.environ, UNSLOTH_ALLOW_CPU="1", HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    env.pop("COURSE_PROFILE", None)
    from helpers.models import bundled_model_path
    cmd = [contract_python(), str(ROOT / "dev" / "gpu_check.py"), "--real", "--models", "gemma3-1b", "--out",
           str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--install", "--carry", str(carry),
           "--tokenizer", str(bundled_model_path(build=False))]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert data["real_size"] is True and data["failed"] == {} and data["children"] == "one after the other"
    model = data["models"]["gemma3-1b"]
    names = [s["name"] for s in model["steps"]]
    assert names == ["model_config", "standin_tokenizer", "notebook_cells", "t4_like", "import_unsloth",
                     "course_setup", "03 03[1]", "03 03[2]", "gpu_memory_cap"], names
    assert model["stopped_at"].startswith("gpu_memory_cap: no CUDA GPU") and "real_model" not in model
    assert model["model_config"]["parameters"] == pytest.approx(1.0e9, rel=0.01)
    assert model["standin_tokenizer"]["vocab_size"] == 262144
    profile = model["course"]["profile"]
    assert (profile["model"], profile["max_completion_length"], profile["num_generations"]) == (
        "random-gemma3-1b", 256, 6)
    assert set(model["stage_cells"].values()) >= {"load", "preflight", "train (held-out evaluations inside)",
                                                  "merge_04", "verify_04"}

"""Where one ``cpu-demo`` GRPO step spends its time, against the machine's matmul roofline, and what the course's
settings change: today's settings and the course's, side by side in one run.

    python bench/step_profile.py [--runs native/today,native/course,avx2/today,avx2/course] [--rounds 2]
                                 [--steps 3] [--threads N] [--torch-profile]

Each run (a machine and a variant) is a worker process, and the workers alternate round by round (today,
course, today, course, ...), so load from other work on a shared machine falls on all of them alike. A worker builds
notebook 03's trainer for the profile's recipe (the model with the format warm-up adapter, the prepared data,
the task's rewards, ``helpers.training.grpo_kwargs``, the course's callbacks; no checkpoint saving), wraps the
trainer's methods so that each phase's exclusive time is recorded per optimizer step, and runs ``--steps``
steps: the first (FLOPs counted with ``torch.utils.flop_counter``, slower) is not timed. Phases:

- generation: ``model.generate`` (prefill and decoding), TRL's prompt tokenizing and decoding;
- reward_scoring: TRL's ``_calculate_rewards`` (the task's reward functions);
- logprob_loss_forward: the policy forward for the log-probs and the loss math (``compute_loss``);
- backward: ``accelerator.backward``;
- optimizer: gradient clipping, ``optimizer.step``, ``zero_grad``;
- trl_bookkeeping: what is left of TRL's and transformers' step (advantages, metrics, the completion log, the
  dataloader, callbacks, logging).

The step's wall time runs from the dataloader fetch to the end of the step's logging
(transformers/trainer.py:1808-1884). FLOPs are analytic from the step's padded shapes (checked against the flop
counter on the first step's forward and backward; with gradient checkpointing the counter also sees the recomputed forward, which
the analytic backward leaves out, so a checkpointed backward shows a lower rate). The roofline is a plain
``(1360 x 576) @ (576 x 1536)`` matmul (one step's training tokens through an MLP projection) and the decoding
shape ``16 x 576 @ 576 x 1536``, float32 and bfloat16, measured in each worker at its threads.

Machines: ``native`` (torch's default kernels and threads); ``avx2``: one thread with ``ATEN_CPU_CAPABILITY=avx2``,
``ONEDNN_MAX_CPU_ISA=AVX2`` and ``MKL_ENABLE_INSTRUCTIONS=AVX2`` (a laptop without AVX-512 or bf16 kernels).
Prints ONE JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]

#: GRPOConfig values on top of ``grpo_kwargs`` (``{}``: the course's settings as they are now), and two loading
#: choices: ``base_bf16`` (the frozen base in bf16; None: what the course picks, ``config.bf16``) and ``head_fix``
#: (``helpers.models.contiguous_head_input``, on in the course).
VARIANTS: dict[str, dict[str, Any]] = {
    "today": {"bf16": False, "fp16": False, "gradient_checkpointing": True, "base_bf16": False,
              "head_fix": False},  # the settings before issue 19
    "course": {},  # what helpers.training.precision picks on this machine (bf16 only where measured faster)
    "bf16": {"bf16": True, "fp16": False, "base_bf16": True},  # bf16 base + autocast, wherever the chip has the ISA
    "autocast_only": {"base_bf16": False, "head_fix": False},  # bf16 autocast on a float32 base (the course until now)
    "no_head_fix": {"head_fix": False},
    "gc_off_fp32": {"bf16": False, "fp16": False, "gradient_checkpointing": False, "base_bf16": False},
    "bf16_gc_on": {"bf16": True, "fp16": False, "gradient_checkpointing": True},
    "static_cache": {"cache_implementation": "static"},  # generation into a preallocated KV cache (no torch.cat)
}
MACHINES: dict[str, dict[str, str]] = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "COURSE_BENCH_THREADS": "1"},
}
PHASES: dict[str, list[str]] = {
    "generation": ["generate", "gen_tokenize", "gen_decode"],
    "reward_scoring": ["rewards"],
    "logprob_loss_forward": ["forward", "loss_math"],
    "backward": ["backward"],
    "optimizer": ["optimizer"],
    "trl_bookkeeping": ["scoring_bookkeeping", "prepare_inputs", "training_step", "log_save", "dataloader",
                        "callbacks"],
}


def say(msg: str) -> None:
    print(f"[step_profile] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------- the worker


class PhaseTimer:
    """Wraps methods so that each call adds its *exclusive* wall and CPU time (minus wrapped callees) to a label;
    one dict per optimizer step in ``steps``."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.current: dict[str, Any] = {}
        self.stack: list[list[float]] = []
        self.count_flops = True

    def wrap(self, owner: Any, name: str, label: str, before: Callable | None = None,
             after: Callable | None = None) -> None:
        inner, timer = getattr(owner, name), self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if before is not None:
                before(args, kwargs)
            timer.stack.append([0.0, 0.0])
            counter = None
            if timer.count_flops and label in ("forward", "backward"):  # (generate: too slow to count)
                from torch.utils.flop_counter import FlopCounterMode

                counter = FlopCounterMode(display=False)
                counter.__enter__()
            t, c = time.perf_counter(), time.process_time()
            try:
                out = inner(*args, **kwargs)
            finally:
                took, cpu = time.perf_counter() - t, time.process_time() - c
                if counter is not None:
                    counter.__exit__(None, None, None)
                    flops = timer.current.setdefault("flops_counted", {})
                    flops[label] = flops.get(label, 0) + counter.get_total_flops()
                child, child_cpu = timer.stack.pop()
                if timer.stack:
                    timer.stack[-1][0] += took
                    timer.stack[-1][1] += cpu
                for key, value in (("wall", took - child), ("cpu", cpu - child_cpu)):
                    timer.current.setdefault(key, {})
                    timer.current[key][label] = timer.current[key].get(label, 0.0) + value
            if after is not None:
                after(args, kwargs, out)
            return out

        setattr(owner, name, timed)


def instrument(trainer: Any, timer: PhaseTimer) -> None:
    """Time the trainer's phases (instance attributes shadow the methods of TRL's and transformers' classes)."""
    from transformers import TrainerCallback

    def begin(args: Any, kwargs: Any) -> None:
        timer.current = {"start": time.perf_counter(), "cpu_start": time.process_time()}
        timer.steps.append(timer.current)

    def end(args: Any, kwargs: Any, out: Any) -> None:
        if "start" not in timer.current:  # the epoch's end logs again (transformers/trainer.py:1915): no step
            return
        timer.current["step_wall"] = time.perf_counter() - timer.current.pop("start")
        timer.current["step_cpu"] = time.process_time() - timer.current.pop("cpu_start")
        timer.current, timer.count_flops = {}, False

    def gen_shapes(args: Any, kwargs: Any, out: Any) -> None:
        ids = kwargs["input_ids"]
        timer.current["gen"] = [int(ids.shape[0]), int(ids.shape[1]), int(out.shape[1] - ids.shape[1])]

    def loss_shapes(args: Any, kwargs: Any) -> None:
        inputs = args[1] if len(args) > 1 else kwargs["inputs"]
        timer.current["fwd"] = [int(inputs["prompt_ids"].shape[0]), int(inputs["prompt_ids"].shape[1]),
                                int(inputs["completion_ids"].shape[1])]
        timer.current["completion_tokens"] = int(inputs["completion_mask"].sum())

    timer.wrap(trainer, "get_batch_samples", "dataloader", before=begin)  # transformers/trainer.py:1808
    timer.wrap(trainer, "training_step", "training_step")
    timer.wrap(trainer, "_prepare_inputs", "prepare_inputs")
    timer.wrap(trainer, "_generate_and_score_completions", "scoring_bookkeeping")
    timer.wrap(trainer, "_generate", "gen_decode")
    timer.wrap(trainer, "_tokenize_prompts", "gen_tokenize")
    timer.wrap(trainer, "_calculate_rewards", "rewards")
    timer.wrap(trainer, "compute_loss", "loss_math", before=loss_shapes)
    timer.wrap(trainer, "_get_per_token_logps_and_entropies", "forward")
    timer.wrap(trainer.accelerator, "backward", "backward")
    timer.wrap(trainer, "_clip_grad_norm", "optimizer")
    timer.wrap(trainer, "_maybe_log_save_evaluate", "log_save", after=end)  # transformers/trainer.py:1884
    for event in ("on_step_begin", "on_step_end", "on_log", "on_pre_optimizer_step", "on_optimizer_step"):
        timer.wrap(trainer.callback_handler, event, "callbacks")
    timer.wrap(trainer.model, "generate", "generate", after=gen_shapes)

    class OptimizerTimer(TrainerCallback):
        """The optimizer exists only once ``train()`` has begun."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            timer.wrap(trainer.optimizer, "step", "optimizer")
            timer.wrap(trainer.model, "zero_grad", "optimizer")

    trainer.add_callback(OptimizerTimer())


def roofline() -> dict[str, dict[str, float]]:
    """GFLOP/s of plain matmuls at the model's shapes, float32 and bfloat16, at this process's threads."""
    import torch

    def rate(m: int, k: int, n: int, dtype: Any, seconds: float = 0.5) -> float:
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        for _ in range(3):
            a @ b
        rates, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end or len(rates) < 5:
            t = time.perf_counter()
            a @ b
            rates.append(2 * m * k * n / (time.perf_counter() - t) / 1e9)
        return round(max(rates), 1)  # the machine's capability: the best burst, not the shared average

    shapes = {"train_1360x576x1536": (1360, 576, 1536), "decode_16x576x1536": (16, 576, 1536)}
    return {name: {"float32": rate(*s, torch.float32), "bfloat16": rate(*s, torch.bfloat16)}
            for name, s in shapes.items()}


def model_dims(model: Any) -> dict[str, int]:
    cfg = model.config
    h, i = cfg.hidden_size, cfg.intermediate_size
    hd = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    r = model.peft_config["default"].r
    return {"hidden": h, "layers": cfg.num_hidden_layers, "q": q, "vocab": cfg.vocab_size,
            "linear": h * q + 2 * h * kv + q * h + 3 * h * i,
            "lora": r * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h))}


def forward_flops(d: dict[str, int], batch: int, new: int, ctx: int, logits: int) -> dict[str, float]:
    """Matmul FLOPs of one forward: ``new`` tokens per row over ``ctx`` positions, ``logits`` positions per row."""
    tokens = batch * new
    return {"base": 2.0 * tokens * d["linear"] * d["layers"], "lora": 2.0 * tokens * d["lora"] * d["layers"],
            "attn": 4.0 * batch * new * ctx * d["q"] * d["layers"], "head": 2.0 * batch * logits * d["hidden"] * d["vocab"]}


def step_flops(d: dict[str, int], s: dict[str, Any]) -> dict[str, float]:
    """Analytic FLOPs per phase of one recorded step (its padded shapes: the work the machine does)."""
    out: dict[str, float] = {}
    if "gen" in s:
        b, p, t = s["gen"]
        total = sum(forward_flops(d, b, p, p, 1).values())
        total += sum(sum(forward_flops(d, b, 1, p + k, 1).values()) for k in range(1, t))
        out["generation"] = total
    if "fwd" in s:
        b, p, c = s["fwd"]
        f = forward_flops(d, b, p + c, p + c, c + 1)
        out["logprob_loss_forward"] = sum(f.values())
        # frozen base weights and tied head: input gradients only; LoRA: input and weight gradients; attention: 2x
        out["backward"] = f["base"] + 2 * f["lora"] + 2 * f["attn"] + f["head"]
    out["optimizer"] = 12.0 * d["lora"] * d["layers"]
    return out


def worker(args: argparse.Namespace) -> int:
    threads = int(os.environ.get("COURSE_BENCH_THREADS", "0")) or args.threads
    import torch

    if threads:
        torch.set_num_threads(threads)
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from helpers.callbacks import DashboardCallback, RunLogCallback
    from helpers.data import ensure_prepared
    from helpers.machine import bf16_speedup, cpu_bf16
    from helpers.models import load_model
    from helpers.profiles import get_profile
    from helpers.tasks import get_task
    from helpers.training import check_config, grpo_kwargs

    profile = get_profile(args.profile, task=args.task, time_budget_minutes=None)
    run = Path(tempfile.mkdtemp(prefix="step-profile-", dir=args.workdir))
    roof = roofline()
    variant = dict(VARIANTS[args.worker])
    base_bf16, head_fix = variant.pop("base_bf16", None), variant.pop("head_fix", True)
    steps = args.steps + (1 if args.torch_profile else 0)  # the profiled step is extra, and not timed
    kwargs = {**grpo_kwargs(profile, run), **variant, "max_steps": steps, "save_strategy": "no"}
    config = GRPOConfig(**kwargs)
    model, tok = load_model(profile, adapter=args.adapter, bf16=config.bf16 if base_bf16 is None else base_bf16)
    if not head_fix:  # undo helpers.models.contiguous_head_input, and only its hook
        model.get_output_embeddings()._course_contiguous.remove()
    data = ensure_prepared(profile, Path(args.workdir) / "data", tokenizer=tok, verbose=False)
    rewards = get_task(profile.task).rewards_for(profile.task_level)
    if args.worker == "course":
        check_config(config, profile)
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=[f for f, _ in rewards], args=config,
                          train_dataset=data["train"], callbacks=[DashboardCallback(run, live=False), RunLogCallback(run)])
    trainer.remove_callback(PrinterCallback)
    timer = PhaseTimer()
    instrument(trainer, timer)
    ops: dict[str, Any] = {}
    if args.torch_profile:
        trainer.add_callback(OpProfile(ops, steps))
    torch.manual_seed(profile.seed + args.round)
    trainer.train()
    trl_times = [float(r["step_time"]) for r in trainer.state.log_history if "step_time" in r]
    print(json.dumps({
        "steps": [s | {"trl_step_time": t} for s, t in zip(timer.steps[:args.steps], trl_times)],
        "dims": model_dims(model), "roofline": roof, "ops": ops,
        "settings": {"bf16": config.bf16, "fp16": config.fp16, "gradient_checkpointing": config.gradient_checkpointing,
                     "autocast": bool(trainer.accelerator.native_amp), "threads": torch.get_num_threads(),
                     "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_bf16": cpu_bf16(),
                     "chip_bf16": bool(torch.cpu.get_capabilities().get("avx512_bf16")
                                       or torch.cpu.get_capabilities().get("amx_bf16")),
                     "bf16_speedup": round(bf16_speedup(), 2),
                     "weights": str(next(model.parameters()).dtype), "head_fix": head_fix}}))
    return 0


def OpProfile(out: dict, last_step: int) -> Any:  # noqa: N802 - a callback factory (TRL imported lazily)
    """A callback that runs torch.profiler over the last step and sums self CPU time by kind of op."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import TrainerCallback

    class Cb(TrainerCallback):
        prof = None

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == last_step - 1:
                self.t = time.perf_counter()
                self.prof = profile(activities=[ProfilerActivity.CPU])
                self.prof.__enter__()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if self.prof is None:
                return
            self.prof.__exit__(None, None, None)
            wall = time.perf_counter() - self.t
            events = [e for e in self.prof.key_averages() if e.key.startswith("aten::")]
            kinds = {"matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"),
                     "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu",
                                   "aten::_scaled_dot_product_flash_attention_for_cpu_backward")}
            sums = {k: 0.0 for k in (*kinds, "other_aten")}
            for e in events:
                kind = next((k for k, names in kinds.items() if e.key in names), "other_aten")
                sums[kind] += e.self_cpu_time_total / 1e6
            top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:10]
            out.update({"wall_s": round(wall, 3), "aten_calls": sum(e.count for e in events),
                        "self_s": {k: round(v, 3) for k, v in sums.items()},
                        "outside_aten_s": round(wall - sum(sums.values()), 3),
                        "top": [[e.key, e.count, round(e.self_cpu_time_total / 1e6, 3)] for e in top]})
            self.prof = None

    return Cb()


# ----------------------------------------------------------------------------------------------- the driver


def prepare(args: argparse.Namespace) -> int:
    """The format warm-up adapter (notebook 03's) and the prepared data, once, shared by every worker."""
    from helpers.data import ensure_prepared
    from helpers.models import load_model
    from helpers.profiles import get_profile
    from helpers.training import run_warmup

    profile = get_profile(args.profile, task=args.task)
    model, tok = load_model(profile)
    ensure_prepared(profile, Path(args.workdir) / "data", tokenizer=tok, verbose=False)
    if profile.warmup_examples and not (Path(args.workdir) / "warm" / "warmup-adapter").is_dir():
        run_warmup(model, tok, profile, Path(args.workdir) / "warm")
    return 0


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(results: list[dict], skip: int) -> dict[str, Any]:
    """Medians over the timed steps of every worker of one (machine, variant)."""
    steps = [s for r in results for s in r["steps"][skip:] if "step_wall" in s]
    dims, roofs = results[0]["dims"], [r["roofline"] for r in results]
    roof = {shape: {dt: round(median([r[shape][dt] for r in roofs]), 1) for dt in ("float32", "bfloat16")}
            for shape in roofs[0]}
    wall = median([s["step_wall"] for s in steps])
    fp32, bf16 = roof["train_1360x576x1536"]["float32"], roof["train_1360x576x1536"]["bfloat16"]
    phases: dict[str, Any] = {}
    for name, labels in PHASES.items():
        sec = median([sum(s["wall"].get(label, 0.0) for label in labels) for s in steps])
        cpu = median([sum(s["cpu"].get(label, 0.0) for label in labels) for s in steps])
        gflop = median([step_flops(dims, s).get(name, 0.0) for s in steps]) / 1e9
        rate = gflop / sec if gflop and sec else None
        phases[name] = {"seconds": round(sec, 3), "cpu_seconds": round(cpu, 3), "share": round(sec / wall, 3),
                        "gflop": round(gflop, 1), "gflop_per_s": rate and round(rate, 1),
                        "of_fp32_roofline": rate and round(rate / fp32, 3),
                        "of_bf16_roofline": rate and round(rate / bf16, 3)}
    total = sum(p["seconds"] for p in phases.values())
    gflop = sum(p["gflop"] for p in phases.values())
    first = results[0]["steps"][0]
    counted = first.get("flops_counted", {})
    check = {}
    if counted and "gen" in first:
        analytic = step_flops(dims, first)
        check = {"forward": [round(analytic["logprob_loss_forward"] / 1e9, 1), round(counted.get("forward", 0) / 1e9, 1)],
                 "backward": [round(analytic["backward"] / 1e9, 1), round(counted.get("backward", 0) / 1e9, 1)],
                 "note": "[analytic, torch.utils.flop_counter] GFLOP of the first (untimed) step"}
    walls = sorted(s["step_wall"] for s in steps)
    return {
        "settings": results[0]["settings"], "roofline_gflop_per_s": roof, "timed_steps": len(steps),
        "step": {"wall_s": round(wall, 3), "wall_min_max_s": [round(walls[0], 3), round(walls[-1], 3)],
                 "cpu_s": round(median([s["step_cpu"] for s in steps]), 3),
                 "trl_step_time_s": round(median([s["trl_step_time"] for s in steps]), 3),
                 "sum_of_phases_s": round(total, 3), "sum_over_wall": round(total / wall, 3),
                 "gflop": round(gflop, 1), "gflop_per_s": round(gflop / wall, 1),
                 "of_fp32_roofline": round(gflop / wall / fp32, 3), "of_bf16_roofline": round(gflop / wall / bf16, 3)},
        "phases": phases,
        "shapes": {k: first.get(k) for k in ("gen", "fwd", "completion_tokens")},
        "flop_check": check,
        "ops_last_step": next((r["ops"] for r in reversed(results) if r.get("ops")), None),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="native/today,native/course,avx2/today,avx2/course",
                    help=f"comma-separated MACHINE/VARIANT: machines {sorted(MACHINES)}, variants {sorted(VARIANTS)}")
    ap.add_argument("--rounds", type=int, default=2, help="worker processes per (machine, variant), interleaved")
    ap.add_argument("--steps", type=int, default=3, help="steps per worker; the first (FLOPs counted) is not timed")
    ap.add_argument("--threads", type=int, default=None, help="torch threads on 'native' (default: torch's own)")
    ap.add_argument("--profile", default="cpu-demo")
    ap.add_argument("--task", default="arithmetic")
    ap.add_argument("--torch-profile", action="store_true", help="torch.profiler op summary of one more step per worker (not timed)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--adapter", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.prepare:
        return prepare(args)
    if args.worker:
        return worker(args)

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="step-profile-"))
    base = [sys.executable, str(Path(__file__).resolve()), "--profile", args.profile, "--task", args.task,
            "--workdir", str(workdir)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    load_start, started = os.getloadavg(), time.time()
    say(f"preparing the warm-up adapter and data in {workdir}")
    subprocess.run(base + ["--prepare"], env=env, check=True, stdout=sys.stderr)
    adapter = workdir / "warm" / "warmup-adapter"
    runs = [tuple(r.split("/")) for r in args.runs.split(",")]
    unknown = [r for r in runs if len(r) != 2 or r[0] not in MACHINES or r[1] not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown runs {unknown}: give MACHINE/VARIANT, machines {sorted(MACHINES)}, "
                         f"variants {sorted(VARIANTS)}")
    raw: dict[str, list[dict]] = {f"{m}/{v}": [] for m, v in runs}
    for rnd in range(args.rounds):
        for machine, variant in runs:
            cmd = base + ["--worker", variant, "--steps", str(args.steps), "--round", str(rnd)]
            cmd += ["--adapter", str(adapter)] if adapter.is_dir() else []
            cmd += ["--threads", str(args.threads)] if args.threads and machine == "native" else []
            cmd += ["--torch-profile"] if args.torch_profile else []
            t = time.time()
            out = subprocess.run(cmd, env={**env, **MACHINES[machine]}, capture_output=True, text=True)
            if out.returncode:
                sys.stderr.write(out.stderr[-4000:])
                raise SystemExit(f"worker {machine}/{variant} failed ({out.returncode})")
            result = json.loads(out.stdout.strip().splitlines()[-1])
            raw[f"{machine}/{variant}"].append(result)
            walls = [round(s.get("step_wall", 0), 1) for s in result["steps"]]
            say(f"round {rnd + 1}/{args.rounds} {machine}/{variant}: steps {walls} s ({time.time() - t:.0f} s), "
                f"load {os.getloadavg()[0]:.1f}")
    summary = {key: summarize(results, skip=1) for key, results in raw.items()}
    compare = {}
    for machine in MACHINES:
        if f"{machine}/today" in raw and f"{machine}/course" in raw:
            today, course = summary[f"{machine}/today"]["step"], summary[f"{machine}/course"]["step"]
            per_round = [median([s["step_wall"] for s in a["steps"][1:]]) / median([s["step_wall"] for s in b["steps"][1:]])
                         for a, b in zip(raw[f"{machine}/today"], raw[f"{machine}/course"])]
            compare[machine] = {"today_s_per_step": today["wall_s"], "course_s_per_step": course["wall_s"],
                                "course_over_today": round(course["wall_s"] / today["wall_s"], 3),
                                "speedup": round(today["wall_s"] / course["wall_s"], 2),
                                "speedup_cpu_time": round(today["cpu_s"] / course["cpu_s"], 2),
                                "speedup_per_round": [round(x, 2) for x in per_round]}
    from archive import stamped  # bench/archive.py: the command, commit, date and machine
    print(json.dumps(stamped({
        "command": "python bench/step_profile.py " + " ".join(sys.argv[1:]),
        "profile": args.profile, "task": args.task, "rounds": args.rounds, "steps_per_worker": args.steps,
        "variants": {v: VARIANTS[v] for _, v in runs}, "machines": {m: MACHINES[m] for m, _ in runs},
        "compare": compare, "results": summary,
        "machine": {"cpus": os.cpu_count(), "loadavg_start": [round(x, 2) for x in load_start],
                    "loadavg_end": [round(x, 2) for x in os.getloadavg()], "seconds": round(time.time() - started),
                    "note": "a machine shared with other work: the load average says how busy; variants alternate"},
    })))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

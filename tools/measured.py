"""The README's "Measured" section, written from the benchmarks' own JSON (one source for every number).

    python tools/measured.py            # print the section
    python tools/measured.py --write    # rewrite it in README.md, between the measured markers, and the
                                        # time rows of the notebooks' intros and the README's profile table

Each ``bench/measured/<name>.json`` is the stdout of ``python bench/<name>.py`` on the project's 2-core
machine, committed as it was printed. ``tests/test_measured.py`` fails when the README's section is not
what this script writes from them, or when a profile's ``minutes`` disagree with ``course.json``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "bench" / "measured"
START, END = "<!-- measured:start (tools/measured.py --write) -->", "<!-- measured:end -->"
COLAB_START, COLAB_END = "<!-- colab:start (tools/measured.py --write) -->", "<!-- colab:end -->"
PLAN_START, PLAN_END = "<!-- plan:start (tools/measured.py --write) -->", "<!-- plan:end -->"
ROOM_START, ROOM_END = "<!-- roomline:start (tools/measured.py --write) -->", "<!-- roomline:end -->"
INSTRUCTOR = ROOT / "docs" / "instructor.md"

#: The instructor guide's three-hour plan: (part, minutes in the room, what it teaches). A notebook's
#: slot must hold its run time on `cpu-demo` (measured) and `colab-t4` (estimated): tests/test_measured.py.
PLAN: list[tuple[str, int, str]] = [
    ("00_setup", 15, "profiles, what a T4 can do, versions against the pins, the room line"),
    ("01_dataset_prep", 15, "`load_dataset`, `.map`, prompts as TRL renders them, the prefill, a clean split"),
    ("02_reward_lab", 30, "rewards in TRL's convention, tested on hand-written completions; advantages; reward hacking"),
    ("break", 10, "(start notebook 03's model loading before the break on Colab)"),
    ("03_grpo_training", 70, "`SFTTrainer` warm-up, `GRPOConfig` knob by knob, `GRPOTrainer` and its live dashboard"),
    ("04_merge_and_inference", 30, "base vs warm-up vs GRPO on held-out prompts, the completion log, `merge_and_unload`"),
    ("wrap-up", 10, "questions, next steps (the recipe as `trl grpo` config), homework: 03 and 04's exercises"),
]
#: Notebooks for after the workshop (too long for its slots): the guide lists them with their times.
AFTER = ["05_your_own_task", "06_inside_grpo"]
SIDE = {"before": "base", "after_warmup": "after warm-up", "after": "after GRPO"}


def load(name: str) -> dict:
    return json.loads((MEASURED / f"{name}.json").read_text())


def pct(x: float) -> str:
    return f"{100 * x:.1f}%".replace(".0%", "%")


def rate(side: dict, name: str) -> float:
    """A rate from a benchmark's side, under its name or the ``<name>_rate`` of the JSON the bench printed before."""
    return side[name] if name in side else side[f"{name}_rate"]


def loss_type_finals(lt: dict) -> dict[str, list[float]]:
    """bench/loss_types.py's final held-out headline metric, per variant, one value per seed."""
    finals: dict[str, list[float]] = {}
    for r in lt["runs"]:
        finals.setdefault(r["variant"], []).append(r["eval"][-1][lt["headline"]])
    return finals


def render() -> str:
    course, learning, overhead = load("course"), load("learning"), load("overhead")
    rewards, data, evals = load("rewards"), load("data_prep"), load("eval_throughput")
    smoke, demo, test = course["course-smoke"], course["course-demo"], course.get("test")
    warm, after, before = learning["after_warmup"], learning["after"], learning["before"]
    passk = learning.get("pass_at_k")
    k = max(int(x) for x in passk["after"]) if passk else 0
    fast = sorted(v["completions_per_s"] for k, v in rewards["throughput"].items() if k != "trl_accuracy_reward")
    lines = [
        START,
        f"On the project's {course['cpus']}-core CPU machine (`bench/measured/*.json`, each the output of "
        "`python bench/<name>.py`):",
        "",
        "| what | wall time | notes |",
        "|---|---|---|",
        f"| the course, `cpu-smoke` | {smoke['seconds']:.0f} s | every notebook, Hub offline |",
        f"| the course, `cpu-demo` | {demo['seconds']:.0f} s ({demo['seconds'] / 60:.1f} min) | notebook 03 trains "
        f"{learning['recipe']['max_steps']} steps, notebook 05 {load('learning_json')['recipe']['max_steps']}, or "
        f"{learning['recipe']['time_budget_minutes']} minutes, whichever comes first"
        + (f"; its median GRPO step took {demo['median_step_seconds']} s" if "median_step_seconds" in demo else "")
        + " |",
    ]
    if test:
        lines.append(f"| `make test` | {test['seconds']:.0f} s ({test['seconds'] / 60:.1f} min) | with the bundled "
                     "model already built |")
    lines += [
        "",
        f"What the `cpu-demo` recipe learns ({after['n_prompts']} held-out two-number sums, greedy): the base "
        f"model answers {pct(before['accuracy'])} in the format; after the format-only warm-up "
        f"({learning['recipe']['warmup_examples']} single-digit sums) it has the format ({pct(rate(warm, 'format'))}) "
        f"and {pct(warm['accuracy'])} accuracy; GRPO then takes it to {pct(after['accuracy'])} "
        f"(`bench/learning.py`, {learning['steps']} GRPO steps, {learning['train_seconds']:.0f} s of training, "
        f"{learning['seconds_per_step']:.1f} s a step): GRPO's own gain is {100 * learning['grpo_gain']:+.1f} points."
        + (f" pass@1 → pass@{k} ({learning['pass_at_k_setup']['n']} samples at temperature 1 for each of "
           f"{learning['pass_at_k_setup']['prompts']} of those sums): "
           + ", ".join(f"{SIDE.get(side, side)} {pct(c['1'])} → {pct(c[str(k)])}" for side, c in passk.items())
           + "." if passk else ""),
    ]
    def by_seed(sweep: dict) -> tuple[dict, dict]:
        """A ``bench/learning_seeds.py`` sweep of one precision: its runs by seed, and their means."""
        (precision, means), = sweep["by_precision"].items()
        return {r["seed"]: r for r in sweep["runs"] if r["precision"] == precision}, means

    if (MEASURED / "learning_seeds20.json").is_file():  # the same recipe, other seeds: how lucky is the one above
        s20 = load("learning_seeds20")
        by, mean = by_seed(s20)
        best = by[learning["recipe"]["seed"]]["after"] == max(r["after"] for r in by.values())
        lines[-1] += (f" That is seed {learning['recipe']['seed']}, {'the best' if best else 'one'} of {len(by)} seeds "
                      "of the same recipe "
                      f"(`bench/learning_seeds.py --steps {s20['steps']}`, `learning_seeds20.json`): "
                      + "; ".join(f"seed {s} {pct(r['after_warmup'])} → {pct(r['after'])} ({100 * r['grpo_gain']:+.0f})"
                                  for s, r in by.items())
                      + f", a mean of {pct(mean['after']['mean'])} after GRPO and a gain of "
                        f"{100 * mean['grpo_gain']['mean']:+.1f} points. The seed draws the sums (for training and "
                        "held out), the warm-up's examples, the fresh adapter and every sample, and a run this short "
                        "depends on them: read one run's number with that spread in mind.")
        if (MEASURED / "learning_seeds20_wu48.json").is_file():  # a steadier start, tried on the same seeds
            wu = load("learning_seeds20_wu48")
            (wby, wm), changed = by_seed(wu), dict(kv.split("=", 1) for kv in wu["set"])
            lines[-1] += (f" With a warm-up of {changed['warmup_examples']} single-digit sums instead of "
                          f"{learning['recipe']['warmup_examples']} (`learning_seeds20_wu48.json`) the same seeds "
                          "went: "
                          + "; ".join(f"seed {sd} {pct(r['after_warmup'])} → {pct(r['after'])}"
                                      for sd, r in wby.items())
                          + f". The three ended within {100 * (wm['after']['max'] - wm['after']['min']):.1f} points "
                            f"of each other, {pct(wm['after']['mean'])} on average, but GRPO's own gain fell to a mean "
                            f"of {100 * wm['grpo_gain']['mean']:+.1f} points, and the course's seed ended at "
                            f"{pct(wby[learning['recipe']['seed']]['after'])} instead of {pct(after['accuracy'])}. "
                            f"The course keeps {learning['recipe']['warmup_examples']}: the two means are close "
                            f"({pct(mean['after']['mean'])} and {pct(wm['after']['mean'])}), and with more warm-up "
                            "GRPO's own share of the learning shrinks. A recipe that is both steady and leaves the "
                            "learning to GRPO is open work.")
    if (MEASURED / "learning_curve.json").is_file():
        def points(c: dict) -> str:
            return ", ".join(f"{pct(h)} at step {step}" for step, h, _ in c["curve"])

        from helpers.profiles import get_profile
        from helpers.tasks.orders import CPU_MAX_STEPS

        cur = load("learning_curve")
        lines += ["", f"Step by step (`bench/learning_curve.py`, {cur['eval']['rows']} held-out sums, greedy, seed "
                      f"{cur['recipe']['seed']}): accuracy {points(cur)} (0: after the warm-up). That plateau is why "
                      f"`cpu-demo` trains {learning['recipe']['max_steps']} steps."]
        runs_beside = {  # more runs, each reported in one sentence when its file is there
            "learning_curve_json": lambda c: f" The JSON task's exact match, on its CPU recipe (groups of "
                                             f"{c['recipe']['num_generations']}, learning rate "
                                             f"{c['recipe']['learning_rate']:g}): {points(c)}; on a CPU it trains at "
                                             f"most {CPU_MAX_STEPS} steps (`helpers.tasks.orders.CPU_MAX_STEPS`).",
            "learning_curve_json_g8": lambda c: f" On notebook 03's recipe (groups of {c['recipe']['num_generations']}, "
                                                f"{c['recipe']['learning_rate']:g}), its recipe before: {points(c)}, "
                                                "every order ending up `\"standard\"`.",
            "learning_curve_json_t13": lambda c: f" Sampled at temperature {c['recipe']['temperature']:g} instead of "
                                                 f"1 on that recipe, to break the tie on `shipping`: {points(c)}: "
                                                 "no better.",
            "learning_curve_json_t07": lambda c: f" At temperature {c['recipe']['temperature']:g}: {points(c)}: no "
                                                 "better either.",
            "learning_curve_json_warm_orders": lambda c: " With its warm-up on the paraphrased `orders` level instead "
                                                         f"of `orders-easy`: {points(c)} (one run: a higher start "
                                                         "that GRPO did not hold).",
            "learning_curve_json_ng4": lambda c: f" In groups of {c['recipe']['num_generations']} at "
                                                 f"{c['recipe']['learning_rate']:g}: {points(c)}.",
            "learning_curve_lr1e3": lambda c: f" With learning rate {c['recipe']['learning_rate']:g} instead of "
                                              f"{cur['recipe']['learning_rate']:g} the arithmetic run collapsed: "
                                              f"{points(c)}.",
            "learning_curve_ng4": lambda c: f" So did arithmetic in groups of {c['recipe']['num_generations']} at "
                                            f"{c['recipe']['learning_rate']:g}: {points(c)}, the format kept, every "
                                            "answer wrong: a recipe holds for one task.",
            "learning_curve_r64": lambda c: f" Arithmetic with LoRA rank {c['recipe']['lora_rank']} (alpha "
                                            f"{c['recipe']['lora_alpha']}) instead of {get_profile('cpu-demo').lora_rank}"
                                            f" collapsed as well, from a weaker warm-up: {points(c)}.",
            "learning_ng16": lambda c: f" One prompt a step in a group of {c['recipe']['num_generations']} "
                                       f"(the same {c['recipe']['per_device_train_batch_size']} completions a step, "
                                       f"`bench/learning.py`) barely moved it: {pct(c['after_warmup']['accuracy'])} → "
                                       f"{pct(c['after']['accuracy'])} ({100 * c['grpo_gain']:+.1f}) in {c['steps']} "
                                       f"steps, on {c['after']['n_prompts']} sums.",
        }
        for name, sentence in runs_beside.items():
            if (MEASURED / f"{name}.json").is_file():
                lines[-1] += sentence(load(name))
    if (MEASURED / "learning_seeds.json").is_file():
        ls = load("learning_seeds")
        bp, paired, n = ls["by_precision"], ls["paired"], len(ls["seeds"])
        bf16_runs = [r for r in ls["runs"] if r["precision"] == "bf16"]
        low_format = min(bp[p]["format"]["min"] for p in bp)

        def span(p: str, m: str, points: bool = False) -> str:
            f = (lambda x: f"{100 * x:+.1f}") if points else pct
            return f"{f(bp[p][m]['mean'])} ({f(bp[p][m]['min'])} to {f(bp[p][m]['max'])})"

        lines += ["", f"bf16 against float32 on the earlier machine where bf16 was faster (`bench/learning_seeds.py`, "
                      f"the recipe before `cpu-demo` was cut to {learning['recipe']['max_steps']} steps: seeds "
                      f"{', '.join(map(str, ls['seeds']))}, {ls['steps']} GRPO steps each, the mean and the range of "
                      f"{n} runs): after GRPO {span('bf16', 'after')} with bf16 (what that CPU picked), "
                      f"{span('fp32', 'after')} in float32; after the warm-up {span('bf16', 'after_warmup')} and "
                      f"{span('fp32', 'after_warmup')}; GRPO's own gain {span('bf16', 'grpo_gain', True)} and "
                      f"{span('fp32', 'grpo_gain', True)} points; format after GRPO "
                      f"{'' if low_format == 1 else 'at least '}{pct(low_format)} in every run; bf16 took "
                      f"{min(r['seconds_per_step'] for r in bf16_runs):.1f} s a step at best. Seed by seed, bf16 minus "
                      f"float32 after GRPO: {', '.join(f'{100 * d:+.1f}' for d in paired['after'])} points. "
                      f"So bf16 is not shown to learn as well: its mean is "
                      f"{100 * (bp['fp32']['after']['mean'] - bp['bf16']['after']['mean']):.1f} points lower and its "
                      f"runs spread over {100 * (bp['bf16']['after']['max'] - bp['bf16']['after']['min']):.1f} points "
                      f"against {100 * (bp['fp32']['after']['max'] - bp['fp32']['after']['min']):.1f} in float32, "
                      f"and its best run, {pct(bp['bf16']['after']['max'])}, is one of {n}. With {n} seeds it cannot "
                      "be called worse either. The course uses bf16 only where it measures it faster; notebook 03 "
                      "says how to train in float32 anyway."]
    elif (MEASURED / "learning_fp32.json").is_file():
        fp = load("learning_fp32")
        spread = round(100 * max(max(v) - min(v) for v in loss_type_finals(load("loss_types")).values()))
        mine = "bf16" if learning.get("precision", {}).get("bf16") else "float32"
        same = "the same " if fp["steps"] == learning["steps"] else ""
        lines += ["", f"Precision on the same recipe (`bench/learning.py --precision fp32`, seed "
                      f"{fp['recipe']['seed']}, one run each): with {mine} (what this CPU picks) GRPO reached "
                      f"{pct(after['accuracy'])} in {learning['steps']} steps at "
                      f"{learning['seconds_per_step']:.1f} s a step; in float32 {pct(fp['after']['accuracy'])} "
                      f"in {same}{fp['steps']} steps at {fp['seconds_per_step']:.1f} s a step, "
                      f"format {pct(rate(fp['after'], 'format'))}. The 16-example warm-up differed more: "
                      f"{pct(warm['accuracy'])} accuracy and {pct(rate(warm, 'format'))} format with {mine}, "
                      f"{pct(fp['after_warmup']['accuracy'])} and {pct(rate(fp['after_warmup'], 'format'))} in "
                      "float32, so GRPO's own gains differ partly because their starts do. "
                      "One seed each: `bench/loss_types.py` shows the two seeds of one recipe differing by up to "
                      f"{spread} points, so a gap below that is noise."]
    if (MEASURED / "step_profile.json").is_file():
        sp = load("step_profile")
        native, avx2, res = sp["compare"]["native"], sp["compare"]["avx2"], sp["results"]
        course = res["native/course"]
        phases, picked = course["phases"], course["settings"]
        share = {name: round(100 * phase["share"]) for name, phase in phases.items()}
        roof = course["roofline_gflop_per_s"]["train_1360x576x1536"]
        setting = ("the frozen base in bf16, LoRA in float32, bf16 autocast" if picked["bf16"] else "float32")
        lines += ["", f"One `cpu-demo` GRPO step, phase by phase (`bench/step_profile.py`, {sp['rounds']} rounds "
                      f"interleaved on one 2-core machine): the course's settings (here {setting}, "
                      f"`contiguous_head_input`, no gradient checkpointing) take {native['course_s_per_step']:.1f} s "
                      f"against {native['today_s_per_step']:.1f} s in float32 with checkpointing, the settings before "
                      f"issue 19 ({native['speedup']:.2f}x); with `ATEN_CPU_CAPABILITY=avx2` and one thread "
                      f"{avx2['course_s_per_step']:.1f} s against {avx2['today_s_per_step']:.1f} s "
                      f"({avx2['speedup']:.2f}x)."
                  + (f" This CPU has AVX512-BF16 or AMX, and its plain matmul at the training shape ran at "
                     f"{roof['bfloat16']:.0f} GFLOP/s in bf16 against {roof['float32']:.0f} in float32, so "
                     "`helpers.machine.cpu_bf16` measured bf16 as not faster and the course picked float32; forcing "
                     "the bf16 base anyway took "
                     f"{res['native/bf16']['step']['wall_s']:.1f} s a step."
                     if picked.get("chip_bf16") and not picked["bf16"] and "native/bf16" in res else "")
                  + f" Generation is {share['generation']}% of the step, the loss's forward "
                    f"{share['logprob_loss_forward']}% and the backward {share['backward']}%; generation runs at "
                    f"{pct(phases['generation']['of_fp32_roofline'])} of the float32 matmul rate measured in the "
                    "same run: at 16 sequences a decoding step is small matrices and per-op overhead."]
        if (MEASURED / "step_profile_bf16cpu.json").is_file():
            old = load("step_profile_bf16cpu")
            oroof, onat = old["results"]["native/course"]["roofline_gflop_per_s"]["train_1360x576x1536"], \
                old["compare"]["native"]
            lines[-1] += (f" An earlier machine of the project (`step_profile_bf16cpu.json`) multiplied bf16 at "
                          f"{oroof['bfloat16']:.0f} GFLOP/s against {oroof['float32']:.0f} in float32; there the "
                          f"course trained on a bf16 base and its step took {onat['course_s_per_step']:.1f} s against "
                          f"{onat['today_s_per_step']:.1f} s ({onat['speedup']:.2f}x). Which precision is faster "
                          "depends on the CPU, so the course measures it.")
        if (MEASURED / "step_profile_cache.json").is_file():  # a generation setting tried and not taken
            runs = load("step_profile_cache")["results"]
            gen = {k.split("/")[1]: r["phases"]["generation"]["seconds"] for k, r in runs.items()}
            lines[-1] += (f" Generating into a preallocated KV cache (`cache_implementation=\"static\"`, "
                          f"`step_profile_cache.json`) instead of growing it token by token took "
                          f"{gen['static_cache']:.2f} s of generation a step against {gen['course']:.2f} s, so the "
                          "course keeps TRL's default.")
    if (MEASURED / "learning_json.json").is_file():
        js = load("learning_json")
        w, a, b = js["after_warmup"], js["after"], js["before"]
        lines += ["", f"Notebook 05's JSON task on `cpu-demo` ({a['n_prompts']} held-out orders, greedy; "
                      f"`bench/learning.py --task json`, {js['steps']} GRPO steps in {js['train_seconds']:.0f} s of "
                      f"training): schema-valid {pct(rate(b, 'schema_valid'))} (base) → {pct(rate(w, 'schema_valid'))} "
                      f"(warm-up) → {pct(rate(a, 'schema_valid'))} (GRPO); exact match {pct(rate(b, 'exact_match'))} → "
                      f"{pct(rate(w, 'exact_match'))} → {pct(rate(a, 'exact_match'))}: GRPO's own gain is "
                      f"{100 * js.get('grpo_gain', js.get('grpo_gain_exact_match', 0)):+.1f} points, in groups of "
                      f"{js['recipe']['num_generations']} at learning rate {js['recipe']['learning_rate']:g} "
                      f"(`shipping` right on {pct(rate(a, 'field: shipping'))})."]
        for name in ("learning_json_10steps", "learning_json_20steps", "learning_json_g8", "learning_json_ng4"):
            if (MEASURED / f"{name}.json").is_file():
                o = load(name)
                lines[-1] += (f" {o['steps']} steps in groups of {o['recipe']['num_generations']} at "
                              f"{o['recipe']['learning_rate']:g}: "
                              f"exact match {pct(rate(o['after_warmup'], 'exact_match'))} → "
                              f"{pct(rate(o['after'], 'exact_match'))} ({100 * o['grpo_gain']:+.1f}), schema-valid "
                              f"{pct(rate(o['after'], 'schema_valid'))}, `shipping` right on "
                              f"{pct(rate(o['after'], 'field: shipping'))}.")
    if (MEASURED / "loss_types.json").is_file():
        lt = load("loss_types")
        start = [pct(next(r["eval"][0][lt["headline"]] for r in lt["runs"] if r["seed"] == seed))
                 for seed in lt["seeds_complete"]]
        lines += ["", f"`loss_type` at equal budget (`bench/loss_types.py`, notebook 06; seeds "
                      f"{', '.join(map(str, lt['seeds_complete']))}, {lt['steps']} optimizer steps each from the same "
                      f"warm-up adapter, {lt['recipe']['eval']['rows']} held-out sums, greedy): held-out accuracy "
                      f"from {' / '.join(start)} to "
                      + "; ".join(f"{v} {' / '.join(map(pct, f))}" for v, f in loss_type_finals(lt).items())
                      + " (one number per seed). The spread between seeds is as large as between variants: these "
                        "runs cannot rank the loss types."]
    if demo.get("eval"):
        sides = ", ".join(f"{side} {pct(s['accuracy'])}" for side, s in demo["eval"].items())
        lines += ["", f"In the `cpu-demo` course run above, notebook 04 measured accuracy {sides} "
                      f"({demo['eval'][next(iter(demo['eval']))]['n_prompts']} held-out prompts)."]
    lines += [
        "",
        f"Other benchmarks: the course's callbacks and TRL's completion log cost {100 * (overhead['ratio'] - 1):+.1f}% "
        f"per step over a bare `GRPOTrainer` (`overhead.py`); the course's rewards score {fast[0] / 1000:.0f}k to "
        f"{fast[-1] / 1000:.0f}k completions/s, TRL's math-verify `accuracy_reward` "
        f"{rewards['throughput']['trl_accuracy_reward']['completions_per_s']:.0f}/s (`rewards.py`); the "
        f"{data['train_rows_in']:,} GSM8K train rows are prepared in {data['total_seconds']:.1f} s "
        f"(`data_prep.py`); the evaluation samples {evals['completions_per_second']:.1f} completions/s on "
        f"`cpu-demo` (`eval_throughput.py`), and an adapter side takes {evals['seconds']['adapter']:.1f} s live and "
        f"{evals['seconds']['adapter_merged']:.1f} s merged while it samples ({evals['prompts']} prompts).",
        END,
    ]
    return "\n".join(lines)


def render_colab() -> str:
    """What the install cell changes on Colab's image, from ``bench/measured/gpu_pins.json``."""
    pins = load("gpu_pins")
    changed = ", ".join(f"{k} {a} → {b}" for k, (a, b) in pins["changed"].items())
    added = ", ".join(f"{k} {v}" for k, v in pins["added"].items())
    trio = ", ".join(f"{k} {v}" for k, v in pins["torch_trio"].items())
    return "\n".join([
        COLAB_START,
        f"Asked of pip against Colab's published GPU image (Python {pins['python']}; `make gpu-pins`, "
        f"`bench/measured/gpu_pins.json`): the install keeps {trio} "
        f"{'and ipywidgets' if pins['ipywidgets_kept'] else 'but not ipywidgets'}; it upgrades {changed}; "
        f"it adds {added}.",
        COLAB_END,
    ])


def render_plan() -> str:
    """The instructor guide's plan table: slots, and each notebook's time from the benchmarks' JSON."""
    from helpers.profiles import PROFILES

    demo = load("course")["course-demo"]["minutes"]
    t4 = PROFILES["colab-t4"].minutes
    lines = [PLAN_START, "| when | part | what it teaches | `cpu-demo` (measured) | `colab-t4` (estimated) |",
             "|---|---|---|---|---|"]
    start = 0
    for part, slot, teaches in PLAN:
        when = f"{start // 60}:{start % 60:02d}-{(start + slot) // 60}:{(start + slot) % 60:02d}"
        cpu = f"{demo[part]:.1f} min" if part in demo else ""
        gpu = f"~{t4[part]:g} min" if part in t4 else ""
        lines.append(f"| {when} | {part} | {teaches} | {cpu} | {gpu} |")
        start += slot
    workshop = [part for part, _, _ in PLAN]
    lines += ["", f"In all: {start // 60} h {start % 60:02d} min in the room; those notebooks run in "
                  f"{sum(demo[p] for p in workshop if p in demo):.1f} min on `cpu-demo` and "
                  f"~{sum(t4[p] for p in workshop if p in t4):g} min on `colab-t4`."]
    for part in AFTER:
        if part in demo and part in t4:
            lines.append(f"After the workshop, as homework: {part} ({demo[part]:.1f} min on `cpu-demo`, "
                         f"~{t4[part]:g} min on `colab-t4`).")
    lines.append(PLAN_END)
    return "\n".join(lines)


def render_room_line() -> str:
    """Notebook 00's room line for the project's own 2-core machine, at the step time bench/learning.py measured."""
    from helpers.machine import Hardware
    from helpers.preflight import preflight_warnings, room_line
    from helpers.profiles import get_model_spec, get_profile
    from helpers.timing import StepTiming

    learning = load("learning")
    profile = get_profile("cpu-demo", time_budget_minutes=learning["recipe"]["time_budget_minutes"])
    #: the project's machines: 2 cores and 24 GB (the disk figure only has to clear the model's need)
    hw = Hardware(False, None, None, None, learning["machine"]["cpus"], 24.0, 50.0, False, False)
    step = learning["seconds_per_step"]
    timing = StepTiming("cpu-demo", seconds=(step, step), max_steps=learning["recipe"]["max_steps"],
                        budget_minutes=learning["recipe"]["time_budget_minutes"], warmup=True)
    line = room_line(hw, profile, [], preflight_warnings(hw, profile, get_model_spec(profile.model)), timing)
    return "\n".join([ROOM_START, "```", line, "```", ROOM_END])


def replace_between(text: str, start: str, end: str, new: str) -> str:
    head, rest = text.split(start, 1)
    return head + new + rest.split(end, 1)[1]


#: A time row of a notebook's intro table: `| `profile` | ... ~N min ...`.
TIME_ROW = re.compile(r"^(\|\s*`(cpu-smoke|cpu-demo|colab-t4|gpu-large)`[^|]*\|(?:[^|]*\|)*?\s*~?)([\d.]+)(\s*min)", re.M)
#: A row of the README's profile table: `| `profile` | ... | ~N min (...) |`.
README_ROW = re.compile(r"^(\| `(cpu-smoke|cpu-demo|colab-t4|gpu-large)` \|.*\| ~)([\d.]+)( (?:min|h) )", re.M)


def minutes_text(minutes: float, like: str) -> str:
    """``minutes`` written with as many decimals as the text it replaces (``0.3`` -> one, ``50`` -> none)."""
    decimals = len(like.split(".")[1]) if "." in like else 0
    return f"{minutes:.{decimals}f}"


def sync_times(text: str, minutes_of: Callable[[str], float | None], pattern: re.Pattern = TIME_ROW) -> str:
    """Rewrite every time row in ``text`` to ``minutes_of(profile)`` (rows it returns None for stay)."""
    def sub(m: re.Match) -> str:
        minutes = minutes_of(m.group(2))
        if minutes is None:
            return m.group(0)
        unit = m.group(4).strip()
        value = minutes / 60 if unit == "h" else minutes
        like = m.group(3) if unit != "h" else "0"
        return m.group(1) + minutes_text(value, like) + m.group(4)
    return pattern.sub(sub, text)


def write_times() -> list[Path]:
    """Notebook intros and the README's profile table, from the profiles' ``minutes`` (the measured ones on CPU)."""
    import nbformat

    from helpers.profiles import PROFILES

    changed = []
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        intro = nb.cells[0]
        new = sync_times(intro.source, lambda p: PROFILES[p].minutes.get(path.stem))
        if new != intro.source:
            intro.source = new
            nbformat.write(nb, path)
            changed.append(path)
    readme = ROOT / "README.md"
    text = readme.read_text()
    new = sync_times(text, lambda p: sum(PROFILES[p].minutes.values()), README_ROW)
    if new != text:
        readme.write_text(new)
        changed.append(readme)
    return changed


def main() -> int:
    if "--write" in sys.argv:
        readme = ROOT / "README.md"
        text = replace_between(readme.read_text(), START, END, render())
        readme.write_text(replace_between(text, COLAB_START, COLAB_END, render_colab()))
        guide = replace_between(INSTRUCTOR.read_text(), PLAN_START, PLAN_END, render_plan())
        INSTRUCTOR.write_text(replace_between(guide, ROOM_START, ROOM_END, render_room_line()))
        for path in write_times():
            print(f"updated {path.relative_to(ROOT)}")
    else:
        print("\n\n".join([render(), render_colab(), render_plan(), render_room_line()]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

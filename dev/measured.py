"""The measured results, written from the benchmarks' own JSON (one source for every number).

    python dev/measured.py            # print the README's block and docs/measured.md
    python dev/measured.py --write    # rewrite the README's measured block (a figure and a table of headline
                                        # numbers), docs/measured.md (the whole story) and its figure
                                        # (docs/figures/learning.png), the time rows of the notebooks' intros, the
                                        # README's profile table and the instructor guide's plan

Each ``bench/measured/<family>/<name>.json`` is what a ``bench/`` script printed on the project's 2-core machine,
committed as it was printed (bench/measured/INDEX.md: which command, commit, date and machine); this script names
them by their short names (``bench.archive``). docs/measured.md, the README's block and docs/colab-and-vllm.md's are
``dev/templates/<that file>`` with each ``{{ expr }}`` filled from them: their prose is edited there. ``tests/test_measured.py`` fails when the README's block,
docs/measured.md or the figure's data is not what this script writes from them, or when a profile's ``minutes``
disagree with ``course.json``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench import archive  # noqa: E402 - after ROOT is on the path

MEASURED = archive.MEASURED
START, END = "<!-- measured:start (dev/measured.py --write) -->", "<!-- measured:end -->"
COLAB_START, COLAB_END = "<!-- colab:start (dev/measured.py --write) -->", "<!-- colab:end -->"
COLAB = ROOT / "docs" / "colab-and-vllm.md"  #: where the Colab block lives
PLAN_START, PLAN_END = "<!-- plan:start (dev/measured.py --write) -->", "<!-- plan:end -->"
ROOM_START, ROOM_END = "<!-- roomline:start (dev/measured.py --write) -->", "<!-- roomline:end -->"
INSTRUCTOR = ROOT / "docs" / "instructor.md"
DOC = ROOT / "docs" / "measured.md"
FIGURE = ROOT / "docs" / "figures" / "learning.png"
#: The cpu-demo recipe over five seeds (bench/learning_seeds.py), the README's headline and its figure.
SEEDS = "learning_seeds_lr1e4_30_split3407"
#: The same recipe before ``split_seed``, each seed drawing its own sums, and its five adapters scored on two seeds'
#: held-out sums (bench/checkpoints.py --held-out-of): how much of the spread was the sums a seed was scored on.
OWN_SUMS = "learning_seeds_lr1e4_30"
HELDOUT = ["heldout_of3407_lr1e4_30", "heldout_of4_lr1e4_30"]
#: The recipe before it (learning rate 3e-4, 20 steps), over the same five seeds: what every variant changed.
BEFORE = "learning_seeds_cpu_demo"
BEFORE_KNOBS, BEFORE_STEPS = "learning rate 3e-4, 20 steps", 20
BEFORE_WHAT = f"the earlier recipe: {BEFORE_KNOBS}"
#: Every recipe variant measured beside the earlier recipe, also those that did not help: (file, what it changed
#: in that recipe), in the order measured. Each file is a ``bench/learning_seeds.py`` sweep (its ``set`` says the
#: change).
SCREENS: list[tuple[str, str]] = [
    ("learning_seeds_b32", "4 prompts a step (batch 32), not 2"),
    ("learning_seeds_t07", "temperature 0.7, not 1.0"),
    ("learning_seeds_filt", "data: 64 prompts sampled 4 times by the warmed-up model, those it always or never "
                            "solves dropped"),
    ("learning_seeds_order", "data: the same 64 prompts ordered by that pass rate, most often solved first"),
    ("learning_seeds_lin", "learning rate decaying linearly to 0, not constant"),
    ("learning_seeds_none", "`scale_rewards=\"none\"`: advantages not divided by the group's spread"),
    ("learning_seeds_lr1e3", "learning rate 1e-3, not 3e-4"),
    ("learning_seeds_ng4", "groups of 4, not 8"),
    ("learning_seeds_lr1e4", "learning rate 1e-4, not 3e-4"),
    ("learning_seeds_t13", "temperature 1.3, not 1.0"),
    ("learning_seeds_lr2e4", "learning rate 2e-4, not 3e-4"),
    ("learning_seeds_filt_lr1e4", "the pass-rate filter and learning rate 1e-4 together"),
    ("learning_seeds_ng4_lr1e4", "groups of 4 and learning rate 1e-4 together"),
    ("learning_seeds_ng4_lr2e4", "groups of 4 and learning rate 2e-4 together"),
    ("learning_seeds_b32_200", "4 prompts a step (batch 32), not 2"),
    ("learning_seeds_lr1e4_40", "learning rate 1e-4, not 3e-4"),
    ("learning_seeds_lr15e5_30", "learning rate 1.5e-4, not 3e-4"),
    ("learning_seeds_wu48_lr1e4_30", "a warm-up of 48 sums, not 16, and learning rate 1e-4"),
    (OWN_SUMS, "learning rate 1e-4, not 3e-4, each seed drawing its own sums (the course's recipe before "
               "`split_seed`)"),
    ("learning_seeds_mu2_lr1e4_40", "two optimizer steps on each batch of samples (`num_iterations=2`, PPO's "
                                    "clipped reuse) and learning rate 1e-4, on the course's sums (`split_seed`)"),
    ("learning_seeds_t12_lr1e4_30", "temperature 1.2, not 1.0, and learning rate 1e-4, on the course's sums "
                                    "(`split_seed`)"),
    ("learning_seeds_b32_lr1e4_30", "4 prompts a step (batch 32), not 2, and learning rate 1e-4, on the course's "
                                    "sums (`split_seed`)"),
    ("learning_seeds_b32_lr1e4_20", "4 prompts a step (batch 32), not 2, and learning rate 1e-4, on the course's "
                                    "sums (`split_seed`)"),
    ("learning_seeds_cos2e4_30", "learning rate 2e-4 falling to 0 on a cosine, not 3e-4 constant, on the course's "
                                 "sums (`split_seed`)"),
    ("learning_seeds_te02_30", "only the fifth of tokens with the highest entropy in the loss "
                               "(`top_entropy_quantile=0.2`, a `GRPOConfig` value) and learning rate 1e-4, on the "
                               "course's sums (`split_seed`)"),
    ("learning_seeds_sbatch_30", "advantages divided by the spread of the whole batch, not of each group "
                                 "(`scale_rewards=\"batch\"`) and learning rate 1e-4, on the course's sums "
                                 "(`split_seed`)"),
    ("learning_seeds_conly_30", "GRPO rewarded on the right answer alone (`correctness_reward`), the format rewards "
                                "dropped, and learning rate 1e-4, on the course's sums (`split_seed`)"),
    ("learning_seeds_beta04_30", "a KL penalty toward the warm-up model (`beta=0.04`, not 0) and learning rate 1e-4, "
                                 "on the course's sums (`split_seed`)"),
    ("learning_seeds_beta04_lr15e5_30", "a KL penalty toward the warm-up model (`beta=0.04`) and learning rate 1.5e-4, "
                                        "on the course's sums (`split_seed`)"),
    ("learning_seeds_wuadd2_30", "a warm-up on 16 of the task's own sums (`warmup_level=\"add2\"`), not "
                                 "single-digit ones, and learning rate 1e-4, on the course's sums (`split_seed`)"),
]
#: Issue 37's targets for the cpu-demo recipe over 5 seeds: (what, metric, over the seeds: "min" or "mean", bound).
TARGETS: list[tuple[str, str, str, float]] = [
    ("after GRPO on every seed", "after", "min", 0.70),
    ("after GRPO on average", "after", "mean", 0.75),
    ("GRPO's own gain on every seed", "grpo_gain", "min", 0.25),
    ("format on every seed", "format", "min", 0.99),
]
TRAIN_MINUTES = 6  #: issue 37's bound on one seed's training (warm-up and GRPO) on the 2-core machine

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
AFTER = ["05_your_own_task", "06_inside_grpo", "07_grpo_with_tools", "08_rewards_from_a_model"]
SIDE = {"before": "base", "after_warmup": "after warm-up", "after": "after GRPO"}


def load(name: str) -> dict:
    """A stored result by its short name (``"learning"``), from whichever family folder holds it."""
    return archive.load(name)


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


#: The generated text's prose, each named for the file it fills, numbers as ``{{ expr }}`` (``doc_namespace``).
TEMPLATES = Path(__file__).resolve().parent / "templates"
PLACEHOLDER = re.compile(r"\{\{ (.+?) \}\}")


def require(ok: object, why: str) -> str:
    """For the template: stop the rendering where a sentence's claim no longer holds for the stored numbers."""
    if not ok:
        raise ValueError(f"docs/measured.md would be wrong: {why}; rewrite the sentence in dev/templates/")
    return ""


def doc_namespace() -> dict:
    """The names the templates read: the stored results, and what is computed from them."""
    from helpers.profiles import get_profile
    from helpers.tasks.orders import CPU_MAX_STEPS

    ns = dict(globals(), CPU_MAX_STEPS=CPU_MAX_STEPS, demo_rank=get_profile("cpu-demo").lora_rank,
              n=lambda x, d=0: format(x, d if isinstance(d, str) else f".{d}f"),
              pts=lambda x, d=1: f"{100 * x:+.{d}f}", g=lambda x: f"{x:g}",
              points=lambda c: ", ".join(f"{pct(h)} at step {step}" for step, h, _ in c["curve"]))
    names = dict(course="course", learning="learning", overhead="overhead", rewards="rewards", data="data_prep",
                 evals="eval_throughput", slow="learning_avx2", s20="learning_seeds20", wu="learning_seeds20_wu48",
                 cur="learning_curve", ck40="checkpoints_lr1e4_40", c_json="learning_curve_json",
                 c_g8="learning_curve_json_g8", c_t13="learning_curve_json_t13", c_t07="learning_curve_json_t07",
                 c_warm="learning_curve_json_warm_orders", c_jng4="learning_curve_json_ng4",
                 c_lr1e3="learning_curve_lr1e3", c_ng4="learning_curve_ng4", c_r64="learning_curve_r64",
                 ng16="learning_ng16", ls="learning_seeds", sp="step_profile", js="learning_json", lt="loss_types",
                 gspo="loss_types_gspo", tools="tools", tools1="tools_seed1", rd="readiness")
    ns.update({key: load(file) for key, file in names.items()}, pins=load("gpu_pins"))
    learning, sweep = ns["learning"], load(SEEDS)
    by = sweep_runs(sweep)
    passk = learning["pass_at_k"]
    k = max(int(x) for x in passk["after"])
    (s20_by, s20_mean), (wu_by, wu_mean) = by_seed(ns["s20"]), by_seed(ns["wu"])
    sp, bp = ns["sp"], ns["ls"]["by_precision"]
    course_run, phases = sp["results"]["native/course"], sp["results"]["native/course"]["phases"]
    old = load("step_profile_bf16cpu")
    rd = ns["rd"]
    runs = rd["runs"]
    part = [r for r in runs if "fewer_groups_first_rule" in r["readiness"]]
    recipe_runs = [r for r in runs if r["family"].startswith("the recipe")]
    ns.update(
        recipe=learning["recipe"], warm=learning["after_warmup"], after=learning["after"], before=learning["before"],
        smoke=ns["course"]["course-smoke"], demo=ns["course"]["course-demo"], k=k, seed=learning["recipe"]["seed"],
        passk=", ".join(f"{SIDE.get(side, side)} {pct(c['1'])} → {pct(c[str(k)])}" for side, c in passk.items()),
        sweep=sweep, by=by, st=stats(by), mean=next(iter(sweep["by_precision"].values())),
        train=[r["train_seconds"] for r in by.values() if r.get("train_seconds")], rows=sweep.get("eval_rows", 200), split=shared_split(by), earlier=load(BEFORE), s20_by=s20_by, s20_mean=s20_mean, wu_by=wu_by, wu_mean=wu_mean,
        wu_set=dict(kv.split("=", 1) for kv in ns["wu"]["set"]), wu_first=next(iter(wu_by)), bp=bp,
        low_format=min(bp[p]["format"]["min"] for p in bp),
        span_of=lambda p, m, points=False: "{} ({} to {})".format(
            *((f"{100 * x:+.1f}" if points else pct(x)) for x in (bp[p][m]["mean"], bp[p][m]["min"], bp[p][m]["max"]))),
        native=sp["compare"]["native"], avx2=sp["compare"]["avx2"], picked=course_run["settings"], phases=phases,
        roof=course_run["roofline_gflop_per_s"]["train_1360x576x1536"],
        share={name: round(100 * phase["share"]) for name, phase in phases.items()},
        old_roof=old["results"]["native/course"]["roofline_gflop_per_s"]["train_1360x576x1536"],
        old_native=old["compare"]["native"],
        cache_gen={key.split("/")[1]: r["phases"]["generation"]["seconds"]
                   for key, r in load("step_profile_cache")["results"].items()},
        json_runs=[load(f"learning_json_{x}") for x in ("10steps", "20steps", "g8", "ng4")],
        fast=sorted(v["completions_per_s"] for key, v in ns["rewards"]["throughput"].items()
                    if key != "trl_accuracy_reward"),
        changed=[f"{r['name']} (GRPO's gain {100 * r['outcome']['grpo_gain']:+.1f})" for r in runs
                 if r["readiness"]["first_rule"] != r["readiness"]["verdict"]["verdict"]],
        rd_seconds=sorted(r["readiness"]["seconds"] for r in runs),
        own_steps=[(r["name"], r["readiness"]["seconds"] / r["outcome"]["seconds_per_step"]) for r in runs
                   if r["outcome"].get("seconds_per_step")],
        part=part, same={g: sum(r["readiness"]["fewer_groups_first_rule"][g] == r["readiness"]["first_rule"]
                                for r in part) for g in ("2", "4")},
        verified=[r for r in runs if r.get("verified")],
        gains=[r["outcome"]["grpo_gain"] for r in recipe_runs],
        passes=[r["readiness"]["figures"]["pass_at_g"] for r in recipe_runs],
        least=min(r["readiness"]["figures"]["pass_at_g"] for r in runs if r["readiness"]["verdict"]["verdict"] == "go"))
    return ns


def by_seed(sweep: dict) -> tuple[dict, dict]:
    """A ``bench/learning_seeds.py`` sweep of one precision: its runs by seed, and their means."""
    (precision, means), = sweep["by_precision"].items()
    return {r["seed"]: r for r in sweep["runs"] if r["precision"] == precision}, means


def readiness_rows() -> str:
    """docs/measured.md's pre-flight table: the verdict at the start of each run whose outcome is known."""
    lines = []
    for r in load("readiness")["runs"]:
        f, v = r["readiness"]["figures"], r["readiness"]["verdict"]
        said = "go" if v["verdict"] == "go" else f"fix first: {v['change'].split(':')[0].split(' (9')[0]}"
        lines.append(f"| {r['name']} | {'`' + Path(r['stored']).name + '`' if r['stored'] else 'trained here'} | "
                     f"{pct(f['learnable'])} | {pct(f['truncated'])} | {pct(f['format'])} | {pct(f['pass_at_g'])} "
                     f"(G={f['group_size']}) | {said} | {100 * r['outcome']['grpo_gain']:+.1f} | "
                     f"{'yes' if r['hit'] else '**no**'} |")
    return "\n".join(lines)


def fill(template: Path) -> str:
    """``template`` with each ``{{ expr }}`` evaluated on the stored results (``doc_namespace``)."""
    ns = doc_namespace()
    return PLACEHOLDER.sub(lambda m: str(eval(m[1], ns)), template.read_text())  # noqa: S307 - our own template


def render_doc() -> str:
    """docs/measured.md: ``templates/measured.md`` filled from the stored results."""
    return fill(TEMPLATES / "measured.md")


def sweep_name() -> str:
    """The seed sweep the README shows: the cpu-demo recipe over five seeds."""
    return SEEDS


def sweep_runs(sweep: dict) -> dict[int, dict]:
    """A ``bench/learning_seeds.py`` sweep's runs of its (one) precision, by seed."""
    precision = next(iter(sweep["by_precision"]))
    return {r["seed"]: r for r in sweep["runs"] if r["precision"] == precision}


def json_curve() -> tuple[str, list[list[float]]]:
    """The JSON task's held-out exact match by step: ``learning_curve_json.json`` (scored every few steps)."""
    c = load("learning_curve_json")
    return (f"JSON task: exact match\n(seed {c['recipe']['seed']}, {c['eval']['rows']} orders)",
            [[step, value] for step, value, *_ in c["curve"]])


def figure_data() -> dict:
    """What the README's figure plots, from the bench JSON alone (its hash is stored in the PNG)."""
    sweep = load(sweep_name())
    by = sweep_runs(sweep)
    runs = {f"seed {seed}": {"start": r["after_warmup"], "end": r["after"], "steps": r["steps"],
                             "curve": r.get("heldout_curve") and [[x[0], x[1]] for x in r["heldout_curve"]]}
            for seed, r in by.items()}
    label, curve = json_curve()
    slice_rows = next((r["heldout_rows"] for r in by.values() if r.get("heldout_rows")), None)
    note = (f"diamonds: all {sweep.get('eval_rows', 200)} held-out sums, after the warm-up and after GRPO"
            + (f"; dots: the {slice_rows}-sum slice scored while training" if slice_rows else ""))
    return {"runs": runs, "extra": {label: curve}, "note": note,
            "title": f"cpu-demo, arithmetic: held-out accuracy while GRPO trains ({len(runs)} seeds)"}


def figure_hash(data: dict) -> str:
    import hashlib
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def write_figure(path: Path = FIGURE) -> Path:
    """The README's figure as a PNG, its data's hash in the PNG's ``Description`` (tests/test_measured.py reads it)."""
    sys.path.insert(0, str(ROOT))
    from helpers.plots import learning_curves_figure

    data = figure_data()
    fig = learning_curves_figure(data["runs"], data["extra"], title=data["title"], note=data["note"])
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=110, bbox_inches="tight", metadata={"Description": figure_hash(data)})
    return path


def png_description(path: Path = FIGURE) -> str | None:
    """The ``Description`` text chunk of a PNG written by :func:`write_figure` (None if absent)."""
    from PIL import Image
    with Image.open(path) as im:
        return im.text.get("Description") if hasattr(im, "text") else None


def render() -> str:
    """The README's measured block: ``templates/README.md`` filled from the stored results."""
    return fill(TEMPLATES / "README.md").rstrip("\n")


def variants_row(by: dict[int, dict]) -> str | None:
    """The README's row on the recipe's variants: how many were measured, and whether any run on the recipe's own sums
    beat it by more than two standard errors (paired, seed by seed); ``None`` when none is stored."""
    screens = [(file, what, sweep_runs(load(file))) for file, what in SCREENS]
    if not screens:
        return None
    paired = paired_variants(by, screens)
    better = [p for p in paired if p[0] > 2 * p[1]]
    full = sorted(p[0] for p in paired if p[2] == len(by))
    verdict = (f"{', '.join(p[3] for p in better)} beat{'s' if len(better) == 1 else ''} the recipe by more than "
               "two standard errors" if better else "none beats the recipe by more than two standard errors")
    return (f"| ... the recipe's variants (learning rate, steps, batch, KL penalty, warm-up, ...) | {len(screens)} "
            f"measured; of the {len(paired)} scored on the same sums, seed by seed, {verdict}"
            + (f" (the {len(full)} run on all {len(by)} seeds: {100 * full[0]:+.1f} to {100 * full[-1]:+.1f} points "
               "on average)" if len(full) > 1 else "") + " | [docs/measured.md](docs/measured.md) |")


def show_target(metric: str, x: float) -> str:
    return f"{100 * x:+.0f} points" if metric == "grpo_gain" else pct(x)


def correlation(xs: list[float], ys: list[float]) -> float:
    """Pearson's r of two equally long lists (0 when either is constant)."""
    import statistics
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        return 0.0


def stats(runs: dict[int, dict]) -> dict[str, dict[str, float]]:
    """The mean, lowest and highest of each metric over ``runs`` (as ``bench/learning_seeds.py`` prints them)."""
    return {m: {"mean": sum(v) / len(v), "min": min(v), "max": max(v)}
            for m in ("after_warmup", "after", "grpo_gain", "format")
            if (v := [r[m] for r in runs.values() if r.get(m) is not None])}


def differs(screen: dict, sweep: dict) -> str:
    """What a variant's sweep ran otherwise than the recipe's, beside the knob it names: ``"; 40 steps"``, or ``""``."""
    mine, theirs = (dict(s, eval_rows=s.get("eval_rows", 200)) for s in (screen, sweep))  # older sweeps: 200
    return "".join(f"; {mine[key]} {what}" for key, what in (("steps", "steps"), ("eval_rows", "held-out sums"))
                   if mine[key] != theirs[key])


def paired_variants(by: dict[int, dict], screens: list[tuple[str, str, dict]]) -> list[tuple]:
    """Each variant run on the recipe's sums and on at least 2 of its seeds, against the recipe seed by seed (paired):
    ``(mean difference, its standard error, seeds, what, file, differences)``, after GRPO."""
    import statistics
    split, paired = shared_split(by), []
    for file, what, runs in screens:
        same = [seed for seed in runs if seed in by]
        if split is not None and shared_split(runs) == split and len(same) >= 2:
            diffs = [runs[x]["after"] - by[x]["after"] for x in same]
            short = what.split("; ")[0].replace(", on the course's sums (`split_seed`)", "")
            paired.append((statistics.fmean(diffs), statistics.stdev(diffs) / len(diffs) ** 0.5, len(diffs), short,
                           file, diffs))
    return paired


def noise_note(by: dict[int, dict], screens: list[tuple[str, str, dict]], rows: int) -> str:
    """How big a difference the sweeps can see: the spread of the recipe's seeds, the held-out sums' own sampling
    error, and each variant on the course's sums against the recipe seed by seed (paired), with standard errors."""
    import statistics
    ends = [r["after"] for r in by.values()]
    if len(ends) < 3:
        return ""
    sd, mean = statistics.stdev(ends), statistics.fmean(ends)
    se = sd / len(ends) ** 0.5
    text = (f"How big a difference these sweeps can see: the {len(ends)} seeds' accuracies after GRPO have a "
            f"standard deviation of {100 * sd:.1f} points, so the recipe's mean is known to about "
            f"±{100 * se:.1f} points (one standard error), and {rows} held-out sums measure one "
            f"run to about ±{100 * (mean * (1 - mean) / rows) ** 0.5:.1f} points (binomial, at {pct(mean)}). ")
    paired = paired_variants(by, screens)
    full = sorted((p for p in paired if p[2] == len(by)), key=lambda p: -p[0])
    if full:
        d, d_se, n, what, file, diffs = full[0]
        others = "; ".join(f"{w} (`{f}.json`), {100 * x:+.1f}" for x, _, _, w, f, _ in full[1:])
        text += (f"The best variant measured on all {n} seeds on the same sums, {what} (`{file}.json`), differs from "
                 f"the recipe by {100 * d:+.1f} points on average (seed by seed {100 * min(diffs):+.1f} to "
                 f"{100 * max(diffs):+.1f}; standard error {100 * d_se:.1f})"
                 + (": within the noise" if abs(d) < 2 * d_se else "")
                 + (f" (the other{'s' if len(full) > 2 else ''} on all {n} seeds: {others})" if others else "")
                 + f". The best one's seed-by-seed differences spread by {100 * d_se * n ** 0.5:.1f} points, so a "
                   f"variant tried on two seeds has to move them by about {100 * 2 * d_se * (n / 2) ** 0.5:.0f} "
                   "points (two standard errors) before it shows. ")
    best = max(paired, key=lambda p: p[0]) if paired else None
    if best is not None and (not full or best is not full[0]):
        d, d_se, n, what, file, _ = best
        text += (f"The largest average gain over the recipe on the same seeds and sums: {100 * d:+.1f} points "
                 f"(standard error {100 * d_se:.1f}), {what} (`{file}.json`, {n} seeds). ")
    target = next(bound for _, metric, over, bound in TARGETS if metric == "after" and over == "mean")
    gap = target - mean
    if gap <= 0:
        return text + "The mean target is met."
    return text + (f"The mean target, {pct(target)}, is {100 * gap:.1f} points above the recipe's mean, "
                   f"{gap / se:.1f} of its standard errors: a change to the recipe has to lift the {len(ends)} seeds "
                   "by that much on average; lifting one is not enough.")


WARMUP_PROBE = "warmup_probe"  #: ``bench/warmup_probe.py``: the held-out sums after the warm-up alone, no GRPO


def warmup_note(by: dict[int, dict]) -> str:
    """What the warm-up alone gives (``bench/warmup_probe.py``): the task's own sums in one line, or worked in tens
    and ones (``bench/worked_sums.py``), against the course's format warm-up on the same seed."""
    runs = load(WARMUP_PROBE)["runs"]

    def side(r: dict) -> str:
        s, w = r["summary"], r["warmup"]
        given = re.search(r"warmup_epochs=(\d+)", r["command"])  # the command's, not guessed from the steps
        epochs = "1 epoch" if given is None or given[1] == "1" else f"{given[1]} epochs"
        return (f"{pct(s['accuracy'])} ({epochs}"
                + (f", format {pct(s['format'])}" if s["format"] < 1 else "")
                + (f", training loss {w['final_loss']:.4f}" if w["final_loss"] < 0.01 else "") + ")")

    seeds = sorted({r["seed"] for r in runs}, key=lambda sd: sd != 3407)
    parts = []
    for sd in seeds:
        one = [side(r) for r in runs if r["seed"] == sd and r["task"].endswith("OneLineAdd2Warmup")]
        work = [side(r) for r in runs if r["seed"] == sd and r["task"].endswith("WorkedSums")]
        parts.append(f"seed {sd}: the course's warm-up (16 single-digit sums) "
                     + (f"{pct(by[sd]['after_warmup'])}; " if sd in by else "; ")
                     + (f"16 of the task's own sums in one line, {' and '.join(one)}; " if one else "")
                     + (f"the same sums worked in tens and ones, {' and '.join(work)}" if work else ""))
    copied = next((r for r in runs if r["task"].endswith("WorkedSums") and r.get("wrong")), None)
    example = ""
    if copied:
        answer, text = copied["wrong"][1]
        lines = text.split("\n")[:3]
        example = (f" Worked, the model writes the lines but copies the digits wrong: for a sum of {answer} it wrote "
                   + ", ".join(f"`{line}`" for line in lines) + ".")
    return ("What the warm-up alone gives, before any GRPO (`bench/warmup_probe.py`, held-out sums, greedy; "
            f"`{WARMUP_PROBE}.json`): " + "; ".join(parts) + "." + example
            + " A warm-up on the task's own sums starts GRPO higher, so GRPO's own share shrinks; four epochs "
              "learn the 16 answers by heart and generalise worse than one; the worked format is worse still "
              "for a 135M model.")


def shortfall(runs: dict[int, dict]) -> float:
    """How far ``runs`` are from issue 37's accuracy targets: the points missing on each, added up (0: all met)."""
    st = stats(runs)
    return sum(max(0.0, bound - st[metric][over]) for _, metric, over, bound in TARGETS if metric != "format")


def minutes(r: dict) -> str:
    return f"{r['train_seconds'] / 60:.1f}" if r.get("train_seconds") else "?"


def named(r: dict) -> list[str]:
    """The warnings ``helpers.watch.diagnose`` names today in a run's stored history, with their step."""
    from helpers.watch import diagnose
    return [f"{w.name} (step {w.step})" for w in diagnose(r.get("history") or [])]


def threads_note(sweep: dict, by: dict[int, dict]) -> list[str]:
    """The same recipe and seed on another thread count, where a stored run has one: does the run end alike?"""
    pairs = []  # (sentence, ended alike: within 5 points)
    if one := load("learning"):
        seed, threads = one["recipe"]["seed"], one["machine"]["threads"]
        if seed in by and threads != sweep.get("threads") and alone_minutes(sweep) is not None:
            r = by[seed]
            pairs.append((f"the course's recipe on seed {seed}, {pct(one['after_warmup']['accuracy'])} → "
                          f"{pct(one['after']['accuracy'])} with {threads} threads (`learning.json`) and "
                          f"{pct(r['after_warmup'])} → {pct(r['after'])} with {sweep.get('threads')} (above)",
                          abs(one["after"]["accuracy"] - r["after"]) <= 0.05))
    two, one = load("learning_curve_ng4"), load("history_ng4")
    if two["machine"].get("threads") != one["machine"]["threads"]:
        pairs.append((f"groups of {one['recipe']['num_generations']} at 3e-4 on seed {one['recipe']['seed']}, "
                      f"{two['curve'][0][1]:.0%} → {two['curve'][-1][1]:.0%} with {two['machine']['threads']} "
                      f"threads (`learning_curve_ng4.json`, an older harness: no held-out slice while training, no "
                      f"trackio, another held-out sample) and {pct(one['after_warmup']['accuracy'])} → "
                      f"{pct(one['after']['accuracy'])} with {one['machine']['threads']} (`history_ng4.json`)",
                      abs(two["curve"][-1][1] - one["after"]["accuracy"]) <= 0.05))
    if not pairs:
        return []
    text = "The same recipe and seed on two thread counts: " + "; ".join(p for p, _ in pairs) + "."
    if any(not alike for _, alike in pairs):
        text += (" Where the two ended far apart, the seed alone did not decide whether the run learned or collapsed; "
                 "the thread count (which changes how the CPU rounds its sums) is one candidate, not shown. Either "
                 "way, one run's number is a draw from a spread, not the recipe's value.")
    return [text]


def alone_minutes(sweep: dict) -> float | None:
    """``learning.json``'s training minutes (warm-up and GRPO, alone on the machine) where it ran ``sweep``'s recipe:
    the same steps and the same changed fields; else None."""
    one = load("learning")
    same = one["steps"] == sweep["steps"] and all(one["recipe"].get(k) is not None
                                                  and float(one["recipe"][k]) == float(v)
                                                  for k, v in (kv.split("=", 1) for kv in sweep.get("set", [])))
    return one["train_seconds"] / 60 if same else None  # train_seconds holds the warm-up


def shared_split(by: dict[int, dict]) -> int | None:
    """The ``split_seed`` every run of a sweep shared (the same rows and held-out sums), or None."""
    splits = {r.get("split_seed") for r in by.values()}
    return splits.pop() if len(splits) == 1 and None not in splits else None


def heldout_note(by: dict[int, dict]) -> list[str]:
    """How far a seed's own held-out sums moved its score: the recipe's adapters before ``split_seed``, scored on
    other seeds' sums (``HELDOUT``), and how far apart ``by`` (the recipe on the same sums) still ended."""
    files = HELDOUT
    own, crosses = sweep_runs(load(OWN_SUMS)), [load(f) for f in files]
    on = [{r["seed"]: r["accuracy"] for r in c["runs"]} for c in crosses]
    # each seed's score on the other sums farthest from its own, and the seed it moved most
    farthest = {sd: max((acc[sd] for acc in on if sd in acc), key=lambda a: abs(a - r["after"]))
                for sd, r in own.items()}
    far = max(own, key=lambda sd: abs(farthest[sd] - own[sd]["after"]))
    other, moved = farthest[far], abs(farthest[far] - own[far]["after"])
    left_out = max(r.get("seen_left_out", 0) for c in crosses for r in c["runs"])
    return ["How much of the spread was the held-out sums: before `split_seed`, each seed drew its own "
            f"(`{OWN_SUMS}.json`: "
            + ", ".join(f"seed {sd} {pct(r['after'])}" for sd, r in own.items()) + f"): its {len(own)} adapters scored "
            + "; ".join(f"on seed {c['held_out_of']}'s held-out sums "
                        + ", ".join(pct(acc[sd]) for sd in own if sd in acc)
                        + f" (`{f}.json`, {pct(next(iter(c['by_step'].values()))['mean'])} on average)"
                        for f, c, acc in zip(files, crosses, on))
            + f". One adapter moved by up to {100 * moved:.1f} points with the sums it was scored on "
              f"(seed {far}: {pct(own[far]['after'])} on its own, {pct(other)} on another seed's). (Sums a run "
              f"trained on are left out of its score on another seed's: at most {left_out} of "
              f"{own[far].get('eval_rows') or 200}.) So the course now draws the rows and the held-out split from "
              "`split_seed`, the same for every seed, and a seed changes only the training's randomness. On the same "
              f"sums the {len(by)} seeds still ended {100 * span(by):.1f} points apart (the table above), "
              f"against {100 * span(own):.1f} before: "
              + ("the exam moved single numbers; the training makes the spread." if span(by) >= span(own) - 0.03 else
                 "the exam made part of the spread.")]


def span(runs: dict[int, dict]) -> float:
    """How far apart a sweep's runs ended after GRPO: the best minus the worst."""
    return max(r["after"] for r in runs.values()) - min(r["after"] for r in runs.values())


def cpu_note(sweeps: list[tuple[str, dict]]) -> str | None:
    """One sentence naming the runs that recorded the CPU kernels torch picked (``cpu_capability``), None if none did.

    Runs from before that record ran on the project's machine of their day; another CPU changes a run's minutes
    several times over, so the sentence says which minutes not to compare.
    """
    found = []
    for file, runs in sweeps:
        by_kernels: dict[str, list[int]] = {}
        for seed, r in runs.items():
            if r.get("cpu_capability"):
                by_kernels.setdefault(r["cpu_capability"], []).append(seed)
        found += [f"`{file}.json` seed{'s' if len(sds) > 1 else ''} {', '.join(map(str, sds))} on {cap}"
                  for cap, sds in by_kernels.items()]
    if not found:
        return None
    return ("Runs that record the CPU kernels torch used (`cpu_capability`): " + "; ".join(found) + ". The others "
            "ran on the project's machine of their day. Another CPU changes a run's minutes, often several times "
            "over, so compare their minutes only with runs on the same kernels; their accuracies are the same recipe "
            "under another CPU's rounding, as a different thread count is.")


def seeds_rows() -> str:
    """docs/measured.md's table of the recipe's seeds, a row a seed and their mean."""
    sweep = load(SEEDS)
    by, mean = sweep_runs(sweep), next(iter(sweep["by_precision"].values()))
    lines = []
    for seed, r in by.items():
        load_avg = " → ".join(f"{x:.1f}" for x in r.get("loadavg_1min") or [] if x is not None)
        lines.append(f"| {seed} | {pct(r['after_warmup'])} | {pct(r['after'])} | {100 * r['grpo_gain']:+.1f} | "
                     f"{pct(r['format'])} | {minutes(r)} | {load_avg} |")
    lines.append(f"| mean | {pct(mean['after_warmup']['mean'])} | {pct(mean['after']['mean'])} | "
                 f"{100 * mean['grpo_gain']['mean']:+.1f} | {pct(mean['format']['mean'])} | | |")
    return "\n".join(lines)


def seeds_notes() -> str:
    """The paragraphs after the seeds' table: the shared machine, the targets, the spread, the held-out sums."""
    sweep = load(SEEDS)
    by, mean = sweep_runs(sweep), next(iter(sweep["by_precision"].values()))
    lines = []
    train = [r["train_seconds"] / 60 for r in by.values() if r.get("train_seconds")]
    shared = [seed for seed, r in by.items() if max(x or 0 for x in r.get("loadavg_1min") or [0]) >= 2.5]
    if shared:
        lines += [(f"Seeds {', '.join(map(str, shared))} ran" if len(shared) > 1 else f"Seed {shared[0]} ran")
                  + " while another run shared the 2 cores (a load average of 2.5 or more): "
                  + ("their" if len(shared) > 1 else "its") + " minutes are not the recipe's on a quiet machine."]
    show = lambda metric, x: f"{100 * x:+.1f} points" if metric == "grpo_gain" else pct(x)  # noqa: E731
    verdicts = [f"{label} ≥ {show_target(metric, bound)}: {show(metric, mean[metric][over])}, "
                f"{'met' if mean[metric][over] >= bound else 'NOT met'}" for label, metric, over, bound in TARGETS]
    alone, one = alone_minutes(sweep), load("learning")
    require(alone is not None, "learning.json no longer runs the sweep's recipe")
    verdicts.append(f"training ≤ {TRAIN_MINUTES} min a seed: {alone:.1f} min for seed {one['recipe']['seed']} "
                    f"alone on the machine (`learning.json`, {one['machine']['threads']} threads), "
                    f"{'met' if alone <= TRAIN_MINUTES else 'NOT met'}")
    met = all(v.endswith(", met") for v in verdicts)
    lines += [f"The targets set for this recipe ({len(by)} seeds): " + "; ".join(verdicts) + ". "
              + ("Every target is met." if met else "**The recipe does not meet them**; the runs below are what "
                 "was tried.")
              + f" (The sweep's runs took {min(train):.1f} to {max(train):.1f} min: one thread each, most of them "
                "beside another run on the 2 cores.)"]
    spread = sorted(by.items(), key=lambda kv: kv[1]["after"])
    (low_seed, low), (high_seed, high) = spread[0], spread[-1]
    r_start_end = correlation([r["after_warmup"] for r in by.values()], [r["after"] for r in by.values()])
    lines += [f"The spread: seed {high_seed} ended at {pct(high['after'])} and seed {low_seed} at "
              f"{pct(low['after'])}, {100 * (high['after'] - low['after']):.1f} points apart, from warm-ups of "
              f"{pct(high['after_warmup'])} and {pct(low['after_warmup'])}; over the {len(by)} seeds the "
              f"warm-up's accuracy and the end's correlate at r = {r_start_end:+.2f}"
              + (": the start does not decide the end." if abs(r_start_end) < 0.5 else
                 f": a better start tends to end {'higher' if r_start_end > 0 else 'lower'} (on "
                 f"{len(by)} seeds, a hint only).")
              + " The held-out slice scored while training (the figure's dots) shows where each run stood on "
                "the way."]
    for seed, r in by.items():
        if named(r):
            curve = r.get("heldout_curve") or []
            lines[-1] += (f" Seed {seed}: the watch named {', '.join(named(r))}"
                          + (", printed live too" if r.get("warnings") else "")
                          + ("; its slice read " + ", ".join(pct(c[1]) for c in curve) + " at steps "
                             + ", ".join(str(c[0]) for c in curve) if curve else "") + ".")
    if not any(named(r) or r.get("warnings") for r in by.values()):
        lines[-1] += " The watch (`helpers.watch.diagnose`) names no failure in any of these runs."
    extra = [r["heldout_seconds"] / (r["train_seconds"] - r["heldout_seconds"]) for r in by.values()
             if r.get("heldout_seconds") and r.get("train_seconds")]
    if extra:
        first = next(iter(by.values()))
        lines[-1] += (f" Scoring that slice ({first.get('heldout_rows') or 'a few'} sums, "
                      f"{len(first.get('heldout_curve') or [])} times) made training {100 * min(extra):.0f}% to "
                      f"{100 * max(extra):.0f}% longer than without it (the course allows 15%).")
    return "\n\n".join(lines + heldout_note(by) + threads_note(sweep, by))


def screens() -> list[tuple[str, str, dict]]:
    """The earlier recipe and every variant of it: ``(file, what it changed, its runs by seed)``."""
    before = load(BEFORE)
    return [(BEFORE, f"{BEFORE_WHAT}; {before.get('eval_rows', 200)} held-out sums", sweep_runs(before))] + [
        (file, what + differs(screen, before), sweep_runs(screen)) for file, what in SCREENS for screen in [load(file)]]


def except_same() -> str:
    """``, except those that say "on the course's sums"`` where a variant ran on the recipe's own sums."""
    split = shared_split(sweep_runs(load(SEEDS)))
    return ", except those that say \"on the course's sums\"" if any(
        shared_split(runs) == split for *_, runs in screens()) else ""


def variants_table() -> str:
    """docs/measured.md's table of every variant measured, the course's recipe first."""
    sweep = load(SEEDS)
    by, rows, split = sweep_runs(sweep), sweep.get("eval_rows", 200), shared_split(sweep_runs(sweep))
    found = screens()
    seeds = list(dict.fromkeys([*by, *(sd for _, _, runs in found for sd in runs)]))
    lines = ["| variant | file | " + " | ".join(f"seed {sd}" for sd in seeds) + " | format (lowest) | training (min) "
             "| named |", "|---|---|" + "---|" * len(seeds) + "---|---|---|"]
    recipe_what = "the course's recipe: " + "; ".join(
        [*(f"`{kv}`" for kv in sweep.get("set", [])), f"{sweep['steps']} steps", f"{rows} held-out sums",
         f"the same sums for every seed (`split_seed={split}`)"])
    for what, file, runs in [(recipe_what, SEEDS, by)] + [(w, f, r) for f, w, r in found]:
        cells = [f"{pct(runs[sd]['after_warmup'])} → {pct(runs[sd]['after'])} "
                 f"({100 * runs[sd]['grpo_gain']:+.0f})" if sd in runs else "" for sd in seeds]
        warn = "; ".join(f"seed {sd}: {', '.join(named(r))}" for sd, r in runs.items() if named(r))
        train = [r["train_seconds"] / 60 for r in runs.values() if r.get("train_seconds")]
        lines.append(f"| {what} | `{file}.json` | " + " | ".join(cells)
                     + f" | {pct(stats(runs)['format']['min'])} | "
                     + (f"{min(train):.1f} to {max(train):.1f}" if len({round(t, 1) for t in train}) > 1 else
                        f"{train[0]:.1f}" if train else "") + f" | {warn or 'none'} |")
    return "\n".join(lines)


def variants_notes() -> str:
    """The paragraphs after the variants' table: CPU kernels, noise, the warm-up alone, and which came closest."""
    sweep = load(SEEDS)
    by, found = sweep_runs(sweep), screens()
    notes = [cpu_note([(SEEDS, by), *((f, r) for f, _, r in found)]),
             noise_note(by, [(f, w, r) for f, w, r in found if f != BEFORE], sweep.get("eval_rows", 200)),
             warmup_note(by)]
    closest = [(shortfall(runs), what, file, runs, {sd: by[sd] for sd in runs if sd in by}) for file, what, runs in found]

    def said(runs: dict) -> str:
        st = stats(runs)
        return (f"{pct(st['after']['mean'])} on average after GRPO, {pct(st['after']['min'])} at worst, a gain "
                f"of {100 * st['grpo_gain']['min']:+.0f} points at worst")

    beats = [what for g, what, *_ in closest if g <= 0]
    text = ("No variant met the targets either, even on the few seeds it was run on." if not beats
            else f"Met on the seeds run (too few to call it): {', '.join(beats)}.")
    for label, group in (("on three seeds or more", [c for c in closest if len(c[3]) >= 3]),
                         ("on fewer seeds", [c for c in closest if len(c[3]) < 3])):
        if group:
            gap, what, file, runs, own = min(group, key=lambda c: c[0])
            text += (f" Closest {label} (the fewest points short of the three accuracy targets, "
                     f"added up): {what} (`{file}.json`, seed{'s' if len(runs) > 1 else ''} "
                     f"{', '.join(map(str, runs))}): {said(runs)}, {100 * gap:.1f} points short; "
                     f"the course's recipe on the same seeds: {said(own)}, "
                     f"{100 * shortfall(own):.1f} points short.")
    many = [c for c in closest if len(c[3]) >= 3]
    full = [c for c in closest if len(c[3]) >= len(by)]
    if full and not beats:
        best = min(full, key=lambda c: c[0])
        text += (f" Of the {len(full) + 1} recipes measured on all {len(by)} seeds (the course's among them), none "
                 "meets the targets; "
                 + (f"the course's is the closest, {100 * shortfall(by):.1f} points short, against "
                    f"{100 * best[0]:.1f} for the next ({best[1]})." if shortfall(by) <= best[0] else
                    f"the closest is {best[1]}, {100 * best[0]:.1f} points short, against "
                    f"{100 * shortfall(by):.1f} for the course's.")
                 + (" The others were run on too few seeds to compare." if len(full) < len(closest) else ""))
    elif not full:
        text += (" None was measured on enough seeds to replace the course's recipe, whose own seeds spread as far "
                 "as the table shows" + (f"; the one to measure on five seeds next is the closest on three: "
                                         f"{min(many, key=lambda c: c[0])[1]}." if many else "."))
    return "\n\n".join([n for n in notes if n] + [text])


def render_colab() -> str:
    """What the install cell changes on Colab's image (``gpu_pins.json``): ``templates/colab-and-vllm.md`` filled."""
    return fill(TEMPLATES / "colab-and-vllm.md").rstrip("\n")


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
    estimated = load("course")["course-demo"].get("estimated_minutes", {})
    for part in AFTER:
        if part in demo and part in t4:
            lines.append(f"After the workshop, as homework: {part} ({demo[part]:.1f} min on `cpu-demo`, "
                         f"~{t4[part]:g} min on `colab-t4`).")
        elif part in estimated and part in t4:
            lines.append(f"After the workshop, as homework: {part} (~{estimated[part]:g} min on `cpu-demo`, not "
                         f"measured yet, and ~{t4[part]:g} min on `colab-t4`).")
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
        DOC.write_text(render_doc())
        write_figure()
        readme.write_text(text)
        COLAB.write_text(replace_between(COLAB.read_text(), COLAB_START, COLAB_END, render_colab()))
        guide = replace_between(INSTRUCTOR.read_text(), PLAN_START, PLAN_END, render_plan())
        INSTRUCTOR.write_text(replace_between(guide, ROOM_START, ROOM_END, render_room_line()))
        for path in write_times():
            print(f"updated {path.relative_to(ROOT)}")
    else:
        print("\n\n".join([render(), render_doc(), render_colab(), render_plan(), render_room_line()]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

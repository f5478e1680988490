"""helpers.watch: the named warnings on logged histories (real stored runs and hand-made ones), and the group
diversity measured on real completions. The callbacks that raise them while training are tested in
test_callbacks.py."""

import json
from pathlib import Path

import pytest
from helpers.watch import DISTINCT, FIXES, OVERLAP, RunWarning, diagnose, group_diversity, watch_every

from bench import archive

#: Two stored runs only this file reads (bench/learning.py's JSON, kept as fixtures); the others are in the archive.
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def history(n=12, **series):
    """``n`` per-step log entries; each keyword is a list (one value a step) or a constant."""
    base = {"reward": 1.0, "frac_reward_zero_std": 0.25, "entropy": 0.5, "completions/clipped_ratio": 0.0}
    rows = []
    for i in range(n):
        row = {"step": i + 1}
        for key, value in {**base, **series}.items():
            v = value[i] if isinstance(value, list) else value
            if v is not None:
                row[key] = v
        rows.append(row)
    return rows


def names(rows, **kw):
    return [w.name for w in diagnose(rows, **kw)]


# --------------------------------------------------------------------------- hand-made histories: each rule


def test_a_steady_run_raises_nothing():
    assert names(history(20, reward=[0.5 + 0.1 * i for i in range(20)])) == []


def test_entropy_collapse_is_named_when_entropy_falls_and_the_groups_stop_differing():
    entropy = [0.6, 0.6, 0.6, 0.5, 0.3, 0.1, 0.05, 0.04, 0.03, 0.03]
    alike = [0.0, 0.0, 0.5, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
    found = diagnose(history(10, entropy=entropy, frac_reward_zero_std=alike))
    # step 7: the median entropy of steps 5-7 is 0.1 (17% of 0.6), and steps 4-7 had 75% of completions alike
    assert [(w.name, w.step) for w in found] == [("entropy-collapse", 7), ("no-reward-spread", 9)]
    assert "0.100" in found[0].seen and "17%" in found[0].seen and "75% of the completions" in found[0].seen


def test_a_collapse_onto_answers_the_held_out_slice_scores_at_its_best_is_convergence_not_a_collapse():
    entropy = [0.6, 0.6, 0.6, 0.5, 0.3, 0.1, 0.05, 0.04, 0.03, 0.03]
    alike = [0.0, 0.0, 0.5, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
    rising = [None, None, 0.3, None, None, 0.5, None, None, 0.7, None]  # the slice every third step
    assert names(history(10, entropy=entropy, frac_reward_zero_std=alike, eval_accuracy=rising)) == [
        "no-reward-spread"]
    falling = [None, None, 0.5, None, None, 0.3, None, None, 0.2, None]
    assert [(w.name, w.step) for w in diagnose(history(10, entropy=entropy, frac_reward_zero_std=alike,
                                                       eval_accuracy=falling))][0] == ("entropy-collapse", 7)
    one = [None, None, None, None, None, 0.5, None, None, None, None]  # one reading says nothing about a trend
    assert "entropy-collapse" in names(history(10, entropy=entropy, frac_reward_zero_std=alike, eval_accuracy=one))


def test_entropy_falling_while_the_groups_still_differ_is_learning_not_a_collapse():
    """A healthy run grows sure of its answers: entropy 0.68 -> 0.02 in 20 steps of the course's recipe."""
    assert names(history(20, entropy=[0.6 / (1 + i) for i in range(20)], frac_reward_zero_std=0.5)) == []
    assert names(history(10, entropy=[0.6] * 3 + [0.3] * 7, frac_reward_zero_std=1.0)) == ["no-reward-spread"]


def test_zero_spread_needs_every_group_equal_several_steps_in_a_row():
    assert names(history(8, frac_reward_zero_std=[1.0, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 0.5])) == []
    found = diagnose(history(8, frac_reward_zero_std=[0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5], reward=0.25))
    assert [(w.name, w.step) for w in found] == [("no-reward-spread", 5)]
    assert "4 steps in a row (reward 0.25)" in found[0].seen


def test_all_truncated_only_matters_with_the_mask():
    rows = history(4, **{"completions/clipped_ratio": [0.5, 1.0, 1.0, 0.9]})
    assert names(rows) == []
    assert [(w.name, w.step) for w in diagnose(rows, mask_truncated_completions=True)] == [("all-truncated", 2)]
    assert names(history(4, **{"completions/clipped_ratio": 0.97}), mask_truncated_completions=True) == []


def test_heldout_falling_while_reward_rises():
    acc = [None, None, None, 0.6, None, None, None, 0.5, None, None, None, 0.35]
    rising = [1.0 + 0.1 * i for i in range(12)]
    found = diagnose(history(12, eval_accuracy=acc, reward=rising))
    assert [(w.name, w.step) for w in found] == [("heldout-falling", 12)]
    assert "60% -> 50% -> 35%" in found[0].seen and "steps 4, 8, 12" in found[0].seen
    # the same fall with the reward falling too is a dying run, not reward hacking: other warnings name it
    assert names(history(12, eval_accuracy=acc, reward=rising[::-1])) == []
    # a fall of 5 points is noise on a small slice
    assert names(history(12, eval_accuracy=[None] * 3 + [0.6] + [None] * 3 + [0.58] + [None] * 3 + [0.55],
                         reward=rising)) == []


def test_missing_and_odd_values_are_skipped():
    rows = history(6, entropy=[None, float("nan"), 0.5, 0.5, 0.5, 0.5], reward=None)
    rows.append({"train_runtime": 3.0})  # the trainer's summary entry has no "step"
    assert names(rows) == []


def test_every_warning_has_a_fix_and_prints_both():
    warning = RunWarning("no-reward-spread", 3, "seen", FIXES["no-reward-spread"])
    assert str(warning).startswith("[no-reward-spread] step 3: seen -> every completion")
    assert set(FIXES) == {"entropy-collapse", "diversity-collapse", "no-reward-spread", "all-truncated",
                          "heldout-falling"}


def test_watch_every_spreads_the_evaluations_over_the_run():
    assert [watch_every(s, 5) for s in (20, 250, 2, 7)] == [4, 50, 1, 1]
    assert watch_every(2, 2) == 1


# --------------------------------------------------------------------------- real runs, stored


def stored(name):
    """A stored run's JSON (bench/learning.py's): a fixture of this file's, else the archive's (a missing one fails)."""
    return json.loads((FIXTURES / name if (FIXTURES / name).is_file() else archive.path(name)).read_text())


@pytest.mark.parametrize("name, expected", [
    # learning rate 1e-3, seed 3407: 34% after the warm-up, 0% after GRPO; entropy 0.57 -> 0.10 by step 6
    ("history_lr1e3.json", ["entropy-collapse"]),
    # temperature 0.7, seed 1: the slice 56% -> 50% -> 38% at the end while the reward rose
    ("history_t07.json", ["entropy-collapse", "heldout-falling"]),
    # groups of 4, seed 3407, one thread: 34% -> 73%, nothing to name. The same recipe and seed on two threads
    # collapsed to 0% (bench/measured/learning_curve/learning_curve_ng4.json, no per-step history stored): which run dies is
    # decided by more than the seed.
    ("history_ng4.json", []),
    # the same groups of 4 on seed 1, one thread: 17% after the warm-up, 0% after GRPO; entropy 0.69 -> 0.16 by step
    # 11, then every group alike for 4 steps in a row from step 15: the real run that shows no-reward-spread
    ("history_ng4_seed1.json", ["entropy-collapse", "no-reward-spread"]),
    # the mask on, no warm-up, 32 tokens: the base model's completions were cut off on 19% to 75% of a step, never
    # all, so all-truncated stays silent
    ("history_trunc.json", []),
    # the mask on, no warm-up, 20 tokens: the base model's rambling was cut off on 88% to 100% of a step, every one
    # at steps 3 and 5 (loss 0 there: nothing left to learn from), named from step 3; 0% after 6 steps
    ("history_trunc20.json", ["all-truncated"]),
])
def test_the_stored_runs_read_as_they_went(name, expected):
    run = stored(name)
    assert names(run["history"], mask_truncated_completions=run["recipe"]["mask_truncated_completions"]) == expected
    start = (run["after_warmup"] or {"accuracy": 0.0})["accuracy"]  # no warm-up: the base model scores 0%
    lost = name in ("history_lr1e3.json", "history_ng4_seed1.json")  # the runs that ended below the warm-up
    assert (run["after"]["accuracy"] < start) == lost
    assert printed(run) == expected  # what the run printed while training


def printed(run):
    """The warning names a run printed while training (``WatchCallback``), in order."""
    return [w.split("]", 1)[0].lstrip("[") for w in run["warnings"]]


def test_the_stored_truncation_run_had_the_mask_on_and_never_every_completion_cut_off():
    run = stored("history_trunc.json")
    clipped = [h["completions/clipped_ratio"] for h in run["history"]]
    assert run["recipe"]["mask_truncated_completions"] and run["recipe"]["warmup_examples"] == 0
    assert 0.5 <= max(clipped) < 1.0  # many cut off, never all: the rule needs every one


def test_the_stored_all_truncated_run_learned_nothing_on_the_steps_where_every_completion_was_cut_off():
    run = stored("history_trunc20.json")
    assert run["recipe"]["mask_truncated_completions"] and run["recipe"]["max_completion_length"] == 20
    every = [h for h in run["history"] if h.get("completions/clipped_ratio") == 1.0]
    assert [h["step"] for h in every] == [3, 5]
    assert all(h["loss"] == 0.0 for h in every)  # the mask left no token to learn from


def test_every_stored_run_replayed_step_by_step_warns_live_as_its_whole_history_reads():
    """WatchCallback, fed each stored run's log one step at a time as the trainer feeds it, prints exactly what
    diagnose names in the whole history afterwards, at the same steps: a warning never depends on a later step.
    (What the runs printed while training came from the rules of their day: the collapse rule has read the held-out
    slice since, so the stored ``warnings`` of some runs name more than diagnose does now.)"""
    from types import SimpleNamespace
    from helpers.callbacks import WatchCallback
    runs = stored_runs()
    assert len(runs) >= 40
    for label, run in runs:
        lines = []
        watch = WatchCallback(print_fn=lines.append, alert=False)
        state, args = SimpleNamespace(log_history=[]), SimpleNamespace(report_to=[])
        for entry in run["history"]:
            state.log_history.append(entry)
            watch.on_log(args, state, None, logs=entry)
        assert [(w.name, w.step) for w in watch.raised] == [(w.name, w.step) for w in diagnose(run["history"])], label
        assert len(lines) == len(watch.raised)


def stored_runs():
    """Every stored run of the recipe and its variants (the sweeps docs/measured.md tabulates): (label, run)."""
    from dev.measured import BEFORE, SCREENS, SEEDS
    return [(f"{file} seed {run['seed']}", run) for file in [SEEDS, BEFORE, *(f for f, _ in SCREENS)]
            for run in stored(f"{file}.json")["runs"]]


def steady(run, fall=0.10):
    """A run GRPO helped whose held-out accuracy (the warm-up's, then the slice scored while training) never fell more
    than ``fall`` below its best so far: a definition the warnings do not use (they read entropy, the groups'
    spread, truncation, and the slice only together with a rising reward)."""
    curve = [run["after_warmup"], *(v for _, v, *_ in run["heldout_curve"])]
    return run["grpo_gain"] > 0 and all(max(curve[:i + 1]) - v <= fall + 1e-9 for i, v in enumerate(curve))


def test_a_run_grpo_made_worse_is_named_and_a_steady_run_raises_nothing():
    """On the stored real runs (the recipe's seeds and every variant's): at least one warning wherever GRPO ended
    below the warm-up's accuracy, and none on a steady run. Five steady runs were named ``entropy-collapse`` before the
    rule read the held-out slice, each once its groups had gone all-alike on answers the slice scored at its best:
    the pass-rate ordering's seed 1 (slice 34%, 66%, 69%), groups of 4 seed 4 (50%, 62.5%), the pass-rate filter's
    seed 5 (19%, 31%, 38%, then 75%), learning rate 1e-4 for 40 steps seed 1 (41%, 59%, 78%, 78%) and 1.5e-4 for 30
    steps seed 1 (38%, 50%, 81%): sure of right answers, not collapsed. A rule that names any of them again, or
    misses a run that ended below its warm-up, fails here.

    One run steady by this definition is named, and rightly: the 48-sum warm-up at 1e-4, seed 1. Its policy was
    near-deterministic from its first step (entropy 0.03: the longer warm-up), every group alike by step 28, and its
    slice back at its first reading when the watch spoke (72%, after 78% twice), then lower (69%): GRPO had stopped
    teaching it. It fell 9.4 points, under the 10 of ``steady``; the test holds it to that reading.

    And one steady run is named with the slice read only once: two optimizer steps per batch of samples
    (``num_iterations=2``), seed 4, named at step 19 with one reading behind it (31% at step 10), which cannot tell
    converged from collapsed. Its slice crept up afterwards (37.5%, 47%, 50%), and it ended 10.5 points under the
    course's recipe on the same seed and sums: a run that slowed, named early. The test holds both facts.

    One run GRPO made worse goes unnamed, and the test says why rather than bending a rule to it: the loss on only
    the fifth of tokens with the highest entropy (``top_entropy_quantile=0.2``), seed 2, 34% after the warm-up, 14.5%
    after GRPO. Nothing it logged looks like a dying run: its entropy rose (0.31 at the first step, 0.28 to 0.77
    after), its groups kept differing, and its slice fell once (28% to 16%) and then stayed at 22%, with a reward
    that went up and down. It learned badly, it did not collapse; only a slice read before the first step would
    show it, and the course reads none there (one more evaluation's time)."""
    from dev.measured import SEEDS

    runs = stored_runs()
    worse = [(label, names(run["history"])) for label, run in runs if run["after"] < run["after_warmup"]]
    calm = [(label, names(run["history"])) for label, run in runs if steady(run)]
    assert worse and len(calm) >= 3, "the stored runs no longer hold both runs GRPO made worse and steady ones"
    unseen = "learning_seeds_te02_30 seed 2"
    assert [label for label, found in worse if not found] == [unseen]
    run = dict(runs)[unseen]
    entropy, curve = [h["entropy"] for h in run["history"]], [v for _, v, *_ in run["heldout_curve"]]
    assert min(entropy[1:]) >= entropy[0] - 0.05 and max(entropy) > 2 * entropy[0]  # rose, never collapsed
    assert max(h["frac_reward_zero_std"] for h in run["history"]) < 0.75  # its groups kept differing
    assert sum(b < a for a, b in zip(curve, curve[1:])) == 1 and run["after"] < run["after_warmup"] - 0.15
    stalled, early = "learning_seeds_wu48_lr1e4_30 seed 1", "learning_seeds_mu2_lr1e4_40 seed 4"
    assert [(label, found) for label, found in calm if found and label not in (stalled, early)] == []
    run, recipe = dict(runs)[early], dict(runs)[f"{SEEDS} seed 4"]
    step = next(w.step for w in diagnose(run["history"]) if w.name == "entropy-collapse")
    assert len([s for s, *_ in run["heldout_curve"] if s <= step]) == 1 and run["after"] < recipe["after"] - 0.1
    run = dict(runs)[stalled]
    curve = [v for _, v, *_ in run["heldout_curve"]]
    assert dict(calm)[stalled] == ["entropy-collapse"] and curve[-2] <= curve[0] < max(curve) and curve[-1] < curve[0]
    assert max(h["entropy"] for h in run["history"][:3]) < 0.1  # near-deterministic from the start
    spared = ["learning_seeds_filt seed 5", "learning_seeds_lr15e5_30 seed 1", "learning_seeds_lr1e4_40 seed 1",
              "learning_seeds_ng4 seed 4", "learning_seeds_order seed 1"]
    by_label = dict(runs)
    for label in spared:  # their slice is what spares them: without it the rule names them
        run = by_label[label]
        assert steady(run) and names([{k: v for k, v in h.items() if not k.startswith("eval_")}
                                      for h in run["history"]]) == ["entropy-collapse"], label


# --------------------------------------------------------------------------- the group diversity


def test_group_diversity_of_hand_made_groups():
    assert group_diversity(["a b", "a b", "a b"], group_size=3) == {DISTINCT: 0.3333, OVERLAP: 1.0}  # rounded
    assert group_diversity(["x", "y z"], 2) == {DISTINCT: 1.0, OVERLAP: 0.0}
    # groups by position, as TRL orders them; a last group of one says nothing and is left out
    assert group_diversity(["a", "a", "b", "c", "d"], 2) == {DISTINCT: 0.75, OVERLAP: 0.5}
    assert group_diversity(["a"], 2) == {} and group_diversity([], 8) == {}
    # whitespace around a completion is not a difference; two empty ones are alike
    assert group_diversity([" 4\n", "4", "", " "], group_size=2) == {DISTINCT: 0.5, OVERLAP: 1.0}


def test_diversity_collapse_is_named_when_the_groups_completions_become_copies():
    overlap = [0.3, 0.35, 0.3, 0.5, 0.7, 0.9, 0.97, 0.98, 0.99, 1.0]
    alike = [0.0, 0.0, 0.5, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
    rows = [{k: v for k, v in r.items() if k != "entropy"}  # Unsloth's trainer: no entropy logged
            for r in history(10, frac_reward_zero_std=alike, **{OVERLAP: overlap})]
    found = diagnose(rows)
    # step 7: the median difference (1 - overlap) of steps 5-7 is 0.1, below 0.3 x the first steps' 0.7
    assert [(w.name, w.step) for w in found] == [("diversity-collapse", 7), ("no-reward-spread", 9)]
    assert "share 90% of their words, up from 30%" in found[0].seen
    # the same with the groups still scoring differently is not a collapse; nor is it with the slice at its best
    assert names(history(10, frac_reward_zero_std=0.25, **{OVERLAP: overlap})) == []
    rising = [None, None, 0.3, None, None, 0.5, None, None, 0.7, None]
    assert names(history(10, frac_reward_zero_std=alike, eval_accuracy=rising, **{OVERLAP: overlap})) == [
        "no-reward-spread"]


FIXTURES = Path(__file__).resolve().parent / "fixtures"


def diversity_run(label):
    """A real cpu-demo run with its completions (tests/fixtures/group_diversity_run.py wrote it: the command, commit,
    date and CPU are in the file)."""
    path = FIXTURES / f"group_diversity_{label}.json"
    if not path.is_file():
        pytest.fail(f"{path} is missing: run the command its docstring gives (tests/fixtures/group_diversity_run.py)")
    return json.loads(path.read_text())


@pytest.mark.parametrize("label", ["collapse", "lr2e3", "recipe"])
def test_the_logged_diversity_is_the_one_of_the_completions_trl_logged(label):
    """What GroupDiversityCallback logged at each step, from the completions the trainer held, is what the completion
    log TRL wrote from the same completions gives."""
    run = diversity_run(label)
    logged = {h["step"]: (h[DISTINCT], h[OVERLAP]) for h in run["history"]}
    assert sorted(logged) == [c["step"] for c in run["completions"]] == list(range(1, run["recipe"]["max_steps"] + 1))
    size = run["recipe"]["num_generations"]
    for step in run["completions"]:
        texts = [text for group in step["groups"] for text in group]
        assert all(len(group) == size for group in step["groups"])
        measured = group_diversity(texts, group_size=size)
        assert (measured[DISTINCT], measured[OVERLAP]) == pytest.approx(logged[step["step"]], abs=1e-4)


def without_entropy(history):
    """A history as Unsloth's trainer logs it: no entropy."""
    return [{k: v for k, v in h.items() if k != "entropy"} for h in history]


def test_a_real_collapse_is_named_from_its_completions_alone_at_the_step_the_entropy_names_it():
    """Learning rate 1e-3 on cpu-demo (10 times the recipe's), seed 3407: by step 9 every completion of a group was
    the same text (``10 ... <answer> 10``), the reward sat at the format rewards alone (0.75) and the held-out slice
    read 0%. Without the entropy (Unsloth's trainer) the watch names it at the same step as with it (TRL's)."""
    run = diversity_run("collapse")
    assert run["recipe"]["learning_rate"] == 1e-3
    steps = {w.name: w.step for w in diagnose(run["history"])}
    assert steps == {"entropy-collapse": 7, "diversity-collapse": 7, "no-reward-spread": 10}
    assert printed(run) == ["entropy-collapse", "diversity-collapse", "no-reward-spread"]  # what it printed, live
    alone = {w.name: w.step for w in diagnose(without_entropy(run["history"]))}
    assert alone == {"diversity-collapse": 7, "no-reward-spread": 10}
    overlap = [h[OVERLAP] for h in run["history"]]
    assert max(overlap[:2]) < 0.5 and min(overlap[-4:]) > 0.85  # 0.39 at the first step, 0.86 to 1 at the last four
    assert [m["accuracy"] for _, m in run["heldout_curve"]] == [0.0] * 5
    assert all(h["reward"] == 0.75 for h in run["history"][-4:])  # the format rewards alone: 0.25 + 0.5


def test_a_run_destroyed_with_varied_completions_is_no_collapse_and_the_watch_cannot_name_it():
    """Learning rate 2e-3: the model kept the format and lost the sums (held-out slice 0% from its first reading, at
    step 2), its completions all different and its entropy rising (0.59 to 1.48): not a collapse, so neither collapse
    rule fires, and with no fall of the slice to see, nothing is named. What the watch cannot see, said plainly."""
    run = diversity_run("lr2e3")
    history = run["history"]
    assert max(h["entropy"] for h in history) > 2 * history[0]["entropy"]
    assert min(h[DISTINCT] for h in history[3:]) == 1.0
    assert names(history) == [] == names(without_entropy(history))
    assert [m["accuracy"] for _, m in run["heldout_curve"]] == [0.0] * 4


def test_the_recipe_raises_no_diversity_warning():
    """The course's recipe (learning rate 1e-4), seed 3407, its first 12 steps (of 30; the held-out slice of 16 read
    50%, 56%, 62%, 50%): nothing named, with the entropy or without it."""
    run = diversity_run("recipe")
    assert run["recipe"]["learning_rate"] == 1e-4
    assert names(run["history"]) == [] == names(without_entropy(run["history"]))
    assert printed(run) == []


def test_watch_and_callbacks_do_not_import_each_other_and_the_watch_loads_no_torch():
    """helpers.callbacks imports helpers.watch, never the other way (issue 52): no import of the callbacks in
    helpers/watch.py, no re-export, and no user left importing a callback from helpers.watch."""
    import ast
    import re
    import subprocess
    import sys
    import helpers.watch as watch

    root = FIXTURES.parents[1]
    tree = ast.parse((root / "helpers" / "watch.py").read_text())
    imported = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)} | {
        alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not {m for m in imported if "callbacks" in m or "transformers" in m or "torch" in m}, imported
    assert not hasattr(watch, "WatchCallback") and not hasattr(watch, "HeldOutCallback")
    old = re.compile(r"from helpers\.watch import[^\n]*(WatchCallback|HeldOutCallback)")
    users = [str(path.relative_to(root)) for folder in ("helpers", "notebooks", "tests", "bench", "tools", "dev",
                                                         "examples")
             for path in (root / folder).rglob("*") if path.suffix in (".py", ".ipynb", ".md")
             and old.search(path.read_text(errors="replace").replace('\\n', "\n"))]
    assert users == []
    loaded = subprocess.run([sys.executable, "-c", "import sys, helpers.watch; print('torch' in sys.modules)"],
                            capture_output=True, text=True, check=True, cwd=root).stdout.strip()
    assert loaded == "False"

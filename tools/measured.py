"""The README's "Measured" section, written from the benchmarks' own JSON (one source for every number).

    python tools/measured.py            # print the section
    python tools/measured.py --write    # rewrite it in README.md, between the measured markers

Each ``bench/measured/<name>.json`` is the stdout of ``python bench/<name>.py`` on the project's 2-core
machine, committed as it was printed. ``tests/test_measured.py`` fails when the README's section is not
what this script writes from them, or when a profile's ``minutes`` disagree with ``course.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "bench" / "measured"
START, END = "<!-- measured:start (tools/measured.py --write) -->", "<!-- measured:end -->"
COLAB_START, COLAB_END = "<!-- colab:start (tools/measured.py --write) -->", "<!-- colab:end -->"


def load(name: str) -> dict:
    return json.loads((MEASURED / f"{name}.json").read_text())


def pct(x: float) -> str:
    return f"{100 * x:.1f}%".replace(".0%", "%")


def render() -> str:
    course, learning, overhead = load("course"), load("learning"), load("overhead")
    rewards, data, evals = load("rewards"), load("data_prep"), load("eval_throughput")
    smoke, demo, test = course["course-smoke"], course["course-demo"], course["test"]
    warm, after, before = learning["after_warmup"], learning["after"], learning["before"]
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
        f"for its {learning['recipe']['time_budget_minutes']}-minute budget |",
        f"| `make test` | {test['seconds']:.0f} s ({test['seconds'] / 60:.1f} min) | with the bundled model "
        "already built |",
        "",
        f"What the `cpu-demo` recipe learns ({after['n_prompts']} held-out two-number sums, greedy): the base "
        f"model answers {pct(before['accuracy'])} in the format; after the format-only warm-up "
        f"({learning['recipe']['warmup_examples']} single-digit sums) it has the format ({pct(warm['format_rate'])}) "
        f"and {pct(warm['accuracy'])} accuracy; GRPO then takes it to {pct(after['accuracy'])} "
        f"(`bench/learning.py`, {learning['steps']} GRPO steps, {learning['train_seconds']:.0f} s of training): "
        f"GRPO's own gain is {100 * learning['grpo_gain']:+.1f} points.",
    ]
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
        f"`cpu-demo` (`eval_throughput.py`).",
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


def replace_between(text: str, start: str, end: str, new: str) -> str:
    head, rest = text.split(start, 1)
    return head + new + rest.split(end, 1)[1]


def main() -> int:
    if "--write" in sys.argv:
        readme = ROOT / "README.md"
        text = replace_between(readme.read_text(), START, END, render())
        readme.write_text(replace_between(text, COLAB_START, COLAB_END, render_colab()))
    else:
        print(render() + "\n\n" + render_colab())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

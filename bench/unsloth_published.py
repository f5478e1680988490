"""What Unsloth's own T4 GRPO notebooks measured: read from their stored outputs, so the course can quote them.

    python bench/unsloth_published.py --notebooks PATH_TO_A_CLONE_OF_unslothai/notebooks

Reads three notebooks' saved outputs (``nb/Qwen2.5_(3B)-GRPO.ipynb``, ``nb/Gemma3_(1B)-GRPO.ipynb``,
``nb/Qwen3_(4B)-GRPO.ipynb``): the versions in Unsloth's banner, the GPU, the model and how it was loaded, the
GRPO settings, the trainer's progress bar (steps done of steps asked, wall time) and, where the notebook kept it,
the per-step reward table. Prints ONE JSON object, one entry per notebook:

    {"source": {"repository", "commit"}, "runs": {name: {"path", "gpu", "versions", "model", "load_in_4bit",
     "precision", "num_generations", "max_seq_length", "max_completion_length", "steps_done", "steps_asked", "wall_seconds",
     "seconds_per_step", "reward_by_25_steps"?}}}

These are someone else's runs on an older stack, not the course's recipe: the course quotes them as such
(``bench/measured/gpu/unsloth_published.json``). Needs no network; not a test.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
from pathlib import Path

NOTEBOOKS = {"qwen2.5-3b": "nb/Qwen2.5_(3B)-GRPO.ipynb", "gemma3-1b": "nb/Gemma3_(1B)-GRPO.ipynb",
             "qwen3-4b": "nb/Qwen3_(4B)-GRPO.ipynb"}


def _texts(nb: dict) -> list[tuple[str, str]]:
    """``(source, printed text)`` of every code cell (streams and HTML outputs joined)."""
    out = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        printed = "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/html", ""))
                          for o in cell.get("outputs", []))
        out.append(("".join(cell["source"]), printed))
    return out


def _search(pattern: str, text: str, cast=str):
    found = re.search(pattern, text)
    return cast(found.group(1)) if found else None


def _seconds(clock: str) -> int:
    parts = [int(p) for p in clock.split(":")]
    return sum(p * 60 ** i for i, p in enumerate(reversed(parts)))


def read_run(nb: dict) -> dict:
    """The facts of one notebook's stored run."""
    cells = _texts(nb)
    printed = "\n".join(p for _, p in cells)
    source = "\n".join(s for s, _ in cells)
    grpo = next(s for s, _ in cells if "GRPOConfig(" in s)
    run = {
        "gpu": _search(r"(Tesla \w+)", printed),
        "versions": {"unsloth": _search(r"Unsloth (\d{4}\.\d+\.\d+)", printed),
                     "transformers": _search(r"Transformers: ([\w.]+?)\.?\s", printed),
                     "vllm": _search(r"vLLM: ([\w.]+?)\.?\s", printed) or _search(r"LLM engine \(v([\w.]+)\)", printed),
                     "torch": (_search(r"Torch: ([\w.+]+)", printed) or "").rstrip(".") or None},
        "model": _search(r'model_name\s*=\s*"([^"]+)"', source),
        "load_in_4bit": _search(r"load_in_4bit\s*=\s*(True|False)", source) == "True",
        "precision": "float32" if "Switching to float32" in printed else
                     "float16" if "Bfloat16 = FALSE" in printed else "bfloat16",
        "num_generations": _search(r"num_generations\s*=\s*(\d+)", grpo, int),
        "max_seq_length": _search(r"max_seq_length\s*=\s*(\d+)", source, int),
        "max_completion_length": _search(r"max_completion_length\s*=\s*([^,\n]+)", grpo).strip(),
    }
    progress = [m for _, p in cells if "GRPO" in p or "reward" in p for m in re.findall(r"\[(\d+)/(\d+) ([\d:]+)", p)]
    done, asked, clock = progress[-1]
    run.update(steps_done=int(done), steps_asked=int(asked), wall_seconds=_seconds(clock),
               seconds_per_step=round(_seconds(clock) / int(done), 1))
    table = next((p for _, p in cells if "<th>reward</th>" in p), None)
    if table:
        rows = [re.findall(r"<td>\s*([^<]*?)\s*</td>", tr) for tr in
                re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>", 1)[1], re.S)]
        header = re.findall(r"<th>([^<]*)</th>", table.split("<tbody>", 1)[0])
        reward = [float(r[header.index("reward")]) for r in rows]
        run["reward_by_25_steps"] = [round(statistics.fmean(reward[i:i + 25]), 3) for i in range(0, len(reward), 25)]
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--notebooks", type=Path, required=True, help="a clone of github.com/unslothai/notebooks")
    args = ap.parse_args()
    commit = subprocess.run(["git", "-C", str(args.notebooks), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or None
    runs = {}
    for name, path in NOTEBOOKS.items():
        text = (subprocess.run(["git", "-C", str(args.notebooks), "show", f"HEAD:{path}"], capture_output=True,
                               text=True, check=True).stdout if commit else (args.notebooks / path).read_text())
        runs[name] = {"path": path, **read_run(json.loads(text))}
    from archive import stamped  # bench/archive.py: the command, commit, date and machine
    print(json.dumps(stamped({"source": {"repository": "github.com/unslothai/notebooks", "commit": commit}, "runs": runs}),
                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

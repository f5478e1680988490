"""Where the stored measurements are: ``bench/measured/<family>/<name>.json``, one folder per experiment family.

A file's name is unique across the families, so a short name finds it: the notebooks' and docs' quoted numbers
(``<!--bench judge.json agreement.all.n-->``), ``dev/measured.py`` and the tests name files that way.
``bench/measured/INDEX.md`` lists every file with the command, commit, date and machine that produced it
(``python dev/archive.py --write``; tests/test_archive.py fails when it is stale).

Example:
    >>> path("judge.json").relative_to(MEASURED).as_posix()
    'judge/judge.json'
    >>> load("course")["cpus"]
    2
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

MEASURED = Path(__file__).resolve().parent / "measured"

#: Each family folder: (the script that writes its files, what they measure). A new result goes into its script's
#: family; a new family gets a row here and a line in INDEX.md.
FAMILIES: dict[str, tuple[str, str]] = {
    "course": ("bench/course.py", "the course runner: every notebook's minutes on each CPU profile"),
    "learning": ("bench/learning.py", "one training run (warm-up and GRPO) scored on held-out rows, "
                                      "arithmetic or the JSON task; `history_*` keep every step's log"),
    "learning_curve": ("bench/learning_curve.py", "held-out accuracy every few steps of one run"),
    "learning_seeds": ("bench/learning_seeds.py", "a recipe over several seeds: the course's and every variant tried"),
    "checkpoints": ("bench/checkpoints.py", "a sweep's saved adapters scored again, at other steps or on other "
                                            "seeds' held-out sums"),
    "warmup_probe": ("bench/warmup_probe.py", "what the warm-up alone gives, before any GRPO"),
    "readiness": ("bench/readiness.py", "notebook 03's pre-flight at the start of runs whose outcome is known"),
    "step_profile": ("bench/step_profile.py", "one GRPO step, phase by phase, on CPU settings"),
    "speed": ("bench/overhead.py, rewards.py, data_prep.py, eval_throughput.py, cpu_processes.py",
              "what the course's own parts cost: callbacks, rewards, data preparation, evaluation, two processes"),
    "loss_types": ("bench/loss_types.py", "`loss_type` variants at equal budget (notebook 06)"),
    "tools": ("bench/tools.py", "GRPO through TRL's tool loop (notebook 07)"),
    "judge": ("bench/judge.py", "an LLM judge as a reward (notebook 08)"),
    "serve": ("bench/serve.py", "the adapter exported and served by llama.cpp (notebook 04), and its build"),
    "gpu": ("dev/gpu_check.py, bench/t4_memory.py, bench/unsloth_published.py, make gpu-pins",
            "the GPU path: the check on a lent GPU, T4 memory, Unsloth's published runs, Colab's pins"),
}


def path(name: str) -> Path:
    """The stored file called ``name`` (``"judge.json"`` or ``"judge"``) in whichever family holds it."""
    name = name if name.endswith(".json") else f"{name}.json"
    found = sorted(MEASURED.glob(f"*/{name}"))
    if len(found) != 1:
        raise FileNotFoundError(f"{len(found)} files named {name} in {MEASURED}/<family>/ (need exactly 1): "
                                "see bench/measured/INDEX.md for the stored files")
    return found[0]


def exists(name: str) -> bool:
    """Whether a file called ``name`` is stored (in any family)."""
    return any(MEASURED.glob(f"*/{name if name.endswith('.json') else name + '.json'}"))


def load(name: str) -> Any:
    """The JSON of the stored file called ``name``."""
    return json.loads(path(name).read_text())


def files() -> list[Path]:
    """Every stored file, family by family."""
    return sorted(MEASURED.glob("*/*.json"))


def stamped(result: dict) -> dict:
    """``result`` headed by what produced it, as INDEX.md lists it: ``command`` (this process's), ``commit``, ``date``
    and ``machine`` (``bench.record``'s), each where ``result`` does not say it already. A bench script prints this.

    >>> sorted(stamped({"accuracy": 0.5}))
    ['accuracy', 'command', 'commit', 'date', 'machine']
    """
    if str(MEASURED.parents[1]) not in sys.path:  # run as `python bench/x.py`: the project is not on the path
        sys.path.insert(0, str(MEASURED.parents[1]))
    from bench import record

    out = {"command": " ".join(["python", *sys.argv]), "commit": record.commit(), "date": record.stamp(), **result}
    mine = result.get("machine")
    out["machine"] = {**record.machine(), **mine} if isinstance(mine, dict) else mine or record.machine()
    return out

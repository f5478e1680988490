"""The course as Colab runs it: each notebook opened from its badge gets a fresh machine and kernel.

On Colab nothing of notebook 03's kernel survives into notebook 04: the only thing they share is the
run folder kept on Google Drive, named by ``COURSE_RUNS`` (``helpers.runs.use_persistent_runs``), and
there is no checkout of the course in the working directory (``/content``). These tests run the
notebooks that way, each in its own fresh kernel process (nbclient), with ``COURSE_RUNS`` set to a
temporary "Drive" folder, the kernel's working directory a temporary folder outside the repository
and ``COURSE_RUN_DIR`` unset, on the ``cpu-smoke`` profile:

* 03 then 04: 04 finds 03's adapter in the Drive run folder (no short fallback run) and writes its
  outputs there;
* 04 alone, on an empty Drive folder: it says it has no adapter and trains the short run
  (``profile.fallback_minutes``), not the full profile.

Cells that nbval skips (``# NBVAL_SKIP``, tag ``nbval-skip``: the GPU-only cells) are left out,
exactly as under ``make test``; the exercise solutions that conftest.py adds under nbval are not run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbclient
import nbformat
import nbval.plugin as nbval_plugin
import pytest
from nbclient.exceptions import CellExecutionError

from helpers.profiles import get_profile

pytestmark = pytest.mark.slow  # runs notebooks 03 and 04 on the bundled model (~100 s on 2 cores)

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
PROFILE = "cpu-smoke"
RUN_NAME = f"lab-{PROFILE}"

#: Prepended to each notebook: what the fresh kernel sees (helpers' origin, cwd, the run variables).
PROBE = """\
import json, os, sys
import helpers
print("PROBE " + json.dumps({"helpers": helpers.__file__, "cwd": os.getcwd(), "executable": sys.executable,
                             "COURSE_RUN_DIR": os.environ.get("COURSE_RUN_DIR"),
                             "COURSE_RUNS": os.environ.get("COURSE_RUNS"),
                             "COURSE_PROFILE": os.environ.get("COURSE_PROFILE")}))
"""


def skipped_by_nbval(cell: nbformat.NotebookNode) -> bool:
    """True for a code cell nbval skips: a ``# NBVAL_SKIP`` comment or an ``nbval-skip`` tag (nbval's own parsing)."""
    options = dict(nbval_plugin.find_metadata_tags(cell.metadata))
    options.update(nbval_plugin.find_comment_markers(cell.source))
    return bool(options.get("skip"))


def outputs_text(nb: nbformat.NotebookNode) -> str:
    """Every cell's stream outputs and ``text/plain`` results (and errors), joined in order."""
    parts = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                parts.append(out.text)
            elif out.output_type in ("execute_result", "display_data"):
                parts.append(str(out.get("data", {}).get("text/plain", "")) + "\n")
            elif out.output_type == "error":
                parts.append(f"[cell {i}] {out.ename}: {out.evalue}\n")
    return "".join(parts)


def tail(text: str, n: int = 4000) -> str:
    return text if len(text) <= n else "...\n" + text[-n:]


def execute(name: str, cwd: Path) -> tuple[dict, str]:
    """Run ``notebooks/<name>`` in a fresh kernel process started in ``cwd``; return (probe, outputs text)."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nb.cells = [c for c in nb.cells if not (c.cell_type == "code" and skipped_by_nbval(c))]
    nb.cells.insert(0, nbformat.v4.new_code_cell(PROBE))
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str(cwd)}})
    try:
        client.execute()
    except CellExecutionError as err:
        pytest.fail(f"{name} failed in a fresh kernel (cwd {cwd}):\n{tail(str(err))}\n"
                    f"--- outputs so far:\n{tail(outputs_text(nb))}", pytrace=False)
    probe = next(json.loads(line[len("PROBE "):]) for out in nb.cells[0].outputs if out.output_type == "stream"
                 for line in out.text.splitlines() if line.startswith("PROBE "))
    return probe, outputs_text(nb)


@pytest.fixture
def colab(tmp_path, monkeypatch):
    """A Colab-like session: Drive runs in ``<tmp>/drive-runs``, cwd ``<tmp>/content``, no COURSE_RUN_DIR."""
    drive, content = tmp_path / "drive-runs", tmp_path / "content"
    drive.mkdir()
    content.mkdir()
    monkeypatch.setenv("COURSE_RUNS", str(drive))
    monkeypatch.setenv("COURSE_PROFILE", PROFILE)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    for name in ("COURSE_RUN_DIR", "COURSE_TIME_BUDGET", "COURSE_MODEL", "KAGGLE_KERNEL_RUN_TYPE"):
        monkeypatch.delenv(name, raising=False)
    # the kernel inherits this environment: make it import helpers from this checkout, whatever the
    # editable install points at (the probe cell checks it does)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), *paths]))
    monkeypatch.chdir(content)
    return drive, content


def check_probe(probe: dict, drive: Path, content: Path, name: str) -> None:
    assert Path(probe["helpers"]).resolve().is_relative_to(ROOT), (
        f"{name}'s kernel imported helpers from {probe['helpers']}, not from {ROOT}: PYTHONPATH not inherited")
    assert Path(probe["cwd"]).resolve() == content.resolve(), probe
    assert probe["COURSE_RUN_DIR"] is None and probe["COURSE_RUNS"] == str(drive), probe
    assert probe["COURSE_PROFILE"] == PROFILE, probe


def check_nothing_outside_the_run(content: Path, drive: Path, text: str) -> None:
    written = sorted(str(p.relative_to(content)) for p in content.rglob("*"))
    assert not written, f"written into the working directory instead of the run folder: {written[:20]}\n{tail(text)}"
    assert sorted(p.name for p in drive.iterdir()) == [RUN_NAME], (
        f"COURSE_RUNS holds {sorted(p.name for p in drive.iterdir())}, expected only {RUN_NAME}")


def test_04_finds_03s_adapter_on_drive_across_fresh_kernels(colab):
    drive, content = colab
    run = drive / RUN_NAME
    profile = get_profile(PROFILE)

    probe, text03 = execute("03_grpo_training.ipynb", content)
    check_probe(probe, drive, content, "03")
    adapter = run / "adapter" / "adapter_config.json"
    assert adapter.is_file(), f"03 left no adapter in {run}: {sorted(p.name for p in run.glob('*'))}\n{tail(text03)}"
    assert f"run folder: {run}" in text03, tail(text03)
    trained = json.loads((run / "train_config.json").read_text())
    assert trained["profile"]["time_budget_minutes"] == profile.time_budget_minutes, trained["profile"]
    weights = sorted(run.glob("adapter/*.safetensors"))
    assert weights, sorted(p.name for p in (run / "adapter").iterdir())
    before = {p: p.read_bytes() for p in [*weights, run / "train_config.json"]}

    probe, text04 = execute("04_merge_and_inference.ipynb", content)
    check_probe(probe, drive, content, "04")
    assert f"run folder: {run}" in text04, f"04 chose another run folder than 03's {run}:\n{tail(text04)}"
    assert "No adapter in" not in text04, f"04 did not find 03's adapter in {run}:\n{tail(text04)}"
    changed = [p.name for p, data in before.items() if p.read_bytes() != data]
    assert not changed, f"04 retrained instead of using 03's adapter: {changed} changed\n{tail(text04)}"
    evaluation = json.loads((run / "eval.json").read_text())
    assert "after GRPO" in evaluation["sides"] and evaluation["profile"] == PROFILE, evaluation
    assert (run / "merged" / "config.json").is_file() and (run / "figures" / "eval.png").is_file(), (
        f"04's outputs are not in the run folder {run}: {sorted(p.name for p in run.iterdir())}\n{tail(text04)}")
    check_nothing_outside_the_run(content, drive, text03 + text04)


def test_04_alone_on_an_empty_drive_trains_the_short_run(colab):
    drive, content = colab
    run = drive / RUN_NAME
    profile = get_profile(PROFILE)
    assert profile.fallback_minutes != profile.time_budget_minutes  # else the short run is not observable

    probe, text = execute("04_merge_and_inference.ipynb", content)
    check_probe(probe, drive, content, "04")
    assert f"run folder: {run}" in text, tail(text)
    said = (f"No adapter in {run / 'adapter'}. Training a short one now: profile {PROFILE!r}'s recipe, "
            f"stopped after {profile.fallback_minutes:g} minutes")
    assert said in text, f"04 did not announce the short run ({said!r}):\n{tail(text)}"
    assert (run / "adapter" / "adapter_config.json").is_file(), sorted(p.name for p in run.iterdir())
    short = json.loads((run / "train_config.json").read_text())
    assert short["profile"]["time_budget_minutes"] == profile.fallback_minutes, (
        f"the fallback run used a time budget of {short['profile']['time_budget_minutes']} minutes, not the "
        f"profile's fallback_minutes={profile.fallback_minutes}: {short.get('summary')}")
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert 1 <= len(steps) <= profile.max_steps, steps
    assert short["summary"]["global_step"] == steps[-1]["step"], (short["summary"], steps[-1])
    evaluation = json.loads((run / "eval.json").read_text())
    assert "after GRPO" in evaluation["sides"], evaluation
    check_nothing_outside_the_run(content, drive, text)

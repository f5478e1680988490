"""The course as Colab runs it: each notebook opened from its badge gets a fresh machine and kernel.

On Colab nothing of notebook 03's kernel survives into notebook 04: the only thing they share is the
run folder kept on Google Drive, named by ``COURSE_RUNS`` (``helpers.runs.use_persistent_runs``), and
there is no checkout of the course in the working directory (``/content``). nbval runs every notebook
that way already (conftest.py: a fresh stand-in Drive in ``COURSE_RUNS``, ``COURSE_RUN_DIR`` unset, the
kernel's working folder a fresh empty folder, ``PYTHONPATH`` this checkout; its last cell checks that
nothing was written outside the Drive) and keeps its runs of 03 and 04 for this file, on ``cpu-smoke``:

* 03 then 04: 04, in a fresh kernel process (nbclient) started in a fresh working folder, finds the
  adapter nbval's run of 03 left on its Drive (no short fallback run, the weights untouched) and
  writes its evaluation, figure and merged model there. Only the cells of 04 these assertions need
  run (:func:`trimmed_04`: through the merge, without the pass@k sampling); nbval runs all of 04;
* 04 alone, on an empty Drive folder: nbval's own run of 04 said it has no adapter and trained the
  short run (``profile.fallback_minutes``), not the full profile.

Where this session does not run 03 or 04 whole under nbval (this file alone, ``-k``, another profile or
time budget), each test runs the notebooks itself, whole, in fresh kernels on a temporary Drive, as
before. Cells that nbval skips (``# NBVAL_SKIP``, tag ``nbval-skip``: the GPU-only cells) are left out,
exactly as under ``make test``.
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
from tests.shared import cell_text, nbval_run

pytestmark = pytest.mark.slow  # runs notebook 04 (trimmed; alone, 03 and 04 twice) on the bundled model

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
PROFILE = "cpu-smoke"
RUN_NAME = f"lab-{PROFILE}"
NB03, NB04 = "03_grpo_training.ipynb", "04_merge_and_inference.ipynb"
#: What the ``colab`` fixture sets or removes: nbval's run is the same check only in this environment.
SAME_ENV = {"COURSE_PROFILE": PROFILE, "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg", "COURSE_RUN_DIR": None,
            "COURSE_TIME_BUDGET": None, "COURSE_MODEL": None, "KAGGLE_KERNEL_RUN_TYPE": None}

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
    return "".join(cell_text(cell.get("outputs", []), f"cell {i}") for i, cell in enumerate(nb.cells))


def tail(text: str, n: int = 4000) -> str:
    return text if len(text) <= n else "...\n" + text[-n:]


def trimmed_04(cells: list[nbformat.NotebookNode]) -> list[nbformat.NotebookNode]:
    """Notebook 04's code cells that the 03-then-04 assertions need: through the merge, without pass@k sampling.

    The cells after the merge (verification, chat, recipe) and the pass@k cells run under nbval; here they
    would only repeat that on 03's adapter. Fails when 04 no longer has the cells the assertions read."""
    code = [c for c in cells if c.cell_type == "code"]
    merge = next((i for i, c in enumerate(code) if "merge_and_unload" in c.source), None)
    kept = [c for c in code[:None if merge is None else merge + 1] if "pass_at_k" not in c.source]
    for needed in ("run_dir(", "ensure_adapter(", "write_eval(", '"eval.png"', "merge_and_unload"):
        assert any(needed in c.source for c in kept), (
            f"notebook 04 has no cell with {needed!r} before its merge: update trimmed_04 to the cells that "
            "write what test_04_finds_03s_adapter_on_drive_across_fresh_kernels reads")
    return kept


def execute(name: str, cwd: Path, trim=None) -> tuple[dict, str]:
    """Run ``notebooks/<name>`` (its cells ``trim`` keeps) in a fresh kernel process started in ``cwd``.

    Returns (probe, outputs text)."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nb.cells = [c for c in nb.cells if not (c.cell_type == "code" and skipped_by_nbval(c))]
    if trim is not None:
        nb.cells = trim(nb.cells)
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


def nbval_runs_whole(request: pytest.FixtureRequest, name: str) -> bool:
    """True when this session runs ``notebooks/<name>`` under nbval, every item of it, in :data:`SAME_ENV`."""
    if any(os.environ.get(k) != v for k, v in SAME_ENV.items()):
        return False
    ours = [item for item in request.session.items
            if isinstance(item, nbval_plugin.IPyNbCell) and Path(item.path).resolve() == (NOTEBOOKS / name).resolve()]
    return bool(ours) and [item.name for item in ours] == getattr(ours[0].parent, "course_items", None)


def nbval_record(name: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """This session's nbval run of ``notebooks/<name>`` (conftest.py keeps it): waited for, and checked whole."""
    record = nbval_run(f"notebooks/{name}", tmp_path_factory)
    failed = [cell for cell in record["failed"] if not cell.startswith("Solution")]
    if failed:
        pytest.fail(f"nbval's run of {name} in this session, which this test reads, failed: {failed} (see those "
                    f"items' own failures)\n{tail(record['text'])}", pytrace=False)
    assert record["ran"] == record["items"], (
        f"nbval's run of {name} ran {len(record['ran'])} of its {len(record['items'])} items: "
        f"{sorted(set(record['items']) - set(record['ran']))} missing")
    probe = record["probe"]
    assert probe and all(probe[k] == v for k, v in SAME_ENV.items()), (
        f"nbval's kernel for {name} saw another environment than {SAME_ENV}: {probe}")
    return record


def colab_session(monkeypatch: pytest.MonkeyPatch, drive: Path, content: Path) -> None:
    """A Colab-like session: Drive runs in ``drive``, cwd ``content``, no COURSE_RUN_DIR (undone after the test)."""
    monkeypatch.setenv("COURSE_RUNS", str(drive))
    for name, value in SAME_ENV.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    # the kernel inherits this environment: make it import helpers from this checkout, whatever the
    # editable install points at (the probe cell checks it does)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), *paths]))
    monkeypatch.chdir(content)


@pytest.fixture
def colab(tmp_path, monkeypatch):
    """A fresh Colab-like session: an empty Drive ``<tmp>/drive-runs``, cwd an empty ``<tmp>/content``."""
    drive, content = tmp_path / "drive-runs", tmp_path / "content"
    drive.mkdir()
    content.mkdir()
    colab_session(monkeypatch, drive, content)
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


def test_04_finds_03s_adapter_on_drive_across_fresh_kernels(request, tmp_path, tmp_path_factory, monkeypatch):
    """Reads nbval's run of 03 where this session has one; else runs 03 itself. Then 04 in a fresh kernel."""
    profile = get_profile(PROFILE)
    trim = None
    if nbval_runs_whole(request, NB03):  # 03 ran whole under nbval the Colab way: its Drive is 04's Drive
        record = nbval_record(NB03, tmp_path_factory)
        drive, content03 = Path(record["drive"]), Path(record["content"])
        probe, text03 = record["probe"], record["text"]
        check_probe(probe, drive, content03, "03 (nbval)")
        check_nothing_outside_the_run(content03, drive, text03)
        content = tmp_path / "content"  # a new session's /content
        content.mkdir()
        colab_session(monkeypatch, drive, content)
        trim = trimmed_04
    else:
        drive, content = request.getfixturevalue("colab")
        probe, text03 = execute(NB03, content)
        check_probe(probe, drive, content, "03")
    run = drive / RUN_NAME
    adapter = run / "adapter" / "adapter_config.json"
    assert adapter.is_file(), f"03 left no adapter in {run}: {sorted(p.name for p in run.glob('*'))}\n{tail(text03)}"
    assert f"run folder: {run}" in text03, tail(text03)
    trained = json.loads((run / "train_config.json").read_text())
    assert trained["profile"]["time_budget_minutes"] == profile.time_budget_minutes, trained["profile"]
    weights = sorted(run.glob("adapter/*.safetensors"))
    assert weights, sorted(p.name for p in (run / "adapter").iterdir())
    before = {p: p.read_bytes() for p in [*weights, run / "train_config.json"]}

    probe, text04 = execute(NB04, content, trim=trim)
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


def test_04_alone_on_an_empty_drive_trains_the_short_run(request, tmp_path_factory):
    """Reads nbval's own run of 04 (a fresh empty Drive) where this session has one; else runs 04 itself."""
    profile = get_profile(PROFILE)
    assert profile.fallback_minutes != profile.time_budget_minutes  # else the short run is not observable

    if nbval_runs_whole(request, NB04):
        record = nbval_record(NB04, tmp_path_factory)
        drive, content = Path(record["drive"]), Path(record["content"])
        probe, text = record["probe"], record["text"]
    else:
        drive, content = request.getfixturevalue("colab")
        probe, text = execute(NB04, content)
    run = drive / RUN_NAME
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

"""bench/archive.py and dev/archive.py: every stored measurement in its family's folder, found by its short name, and
listed in bench/measured/INDEX.md with the command, commit, date and machine that produced it."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter

import pytest

from bench import archive
from dev.archive import FROM_GIT, INDEX, ROOT, blob, provenance, recorded, render


def test_every_stored_file_is_in_a_family_folder_under_a_unique_name():
    top = {p.name for p in archive.MEASURED.glob("*.json")}
    assert top == {FROM_GIT.name}, f"{top - {FROM_GIT.name}} at the top of bench/measured/: put it in its family"
    families = {p.name for p in archive.MEASURED.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert families == set(archive.FAMILIES), "a folder with no row in bench.archive.FAMILIES, or a row with no folder"
    twice = [name for name, n in Counter(p.name for p in archive.files()).items() if n > 1]
    assert not twice, f"{twice}: a short name must name one file (the notebooks' <!--bench NAME ...--> find it so)"
    assert all(p.parent.parent == archive.MEASURED for p in archive.files())


def test_a_short_name_finds_its_file_and_a_missing_one_says_where_to_look():
    assert archive.path("judge.json") == archive.MEASURED / "judge" / "judge.json" == archive.path("judge")
    assert archive.load("course")["cpus"] == 2 and archive.exists("course") and not archive.exists("nothing")
    with pytest.raises(FileNotFoundError, match="INDEX.md"):
        archive.path("nothing.json")


def test_the_index_is_what_dev_archive_writes():
    assert INDEX.read_text() == render(), "bench/measured/INDEX.md is stale: run `python dev/archive.py --write`"
    for path in archive.files():
        assert f"]({path.parent.name}/{path.name})" in INDEX.read_text()


def test_each_file_says_what_produced_it_or_git_does_for_a_file_stored_before():
    """A result records its command, commit, date and machine (bench/record.py); an older file's commit and date come
    from from_git.json, which must hold the very bytes stored: a file changed since is a new result, and says them."""
    git = provenance()
    for path in archive.files():
        said = recorded(json.loads(path.read_text()))
        if said["commit"] and said["date"]:
            assert path.name not in git, f"{path.name} says its commit and date: drop it from from_git.json"
        else:
            assert path.name in git, f"{path.name} says no commit or date: a new result records them (bench/record.py)"
            assert git[path.name]["blob"] == blob(path), (
                f"{path.name} changed since {git[path.name]['commit'][:7]}, the commit from_git.json names: a new "
                "result records its command, commit, date and machine itself, and its from_git.json entry goes")
    assert set(git) <= {p.name for p in archive.files()}, "from_git.json names a file that is not stored"


def test_the_commits_from_git_hold_the_files_as_stored():
    """Each from_git.json entry is right: its commit holds, at its path, the file's bytes (one git call)."""
    git = provenance()
    asked = "".join(f"{e['commit']}:{e['path']}\n" for e in git.values())
    done = subprocess.run(["git", "cat-file", "--batch-check"], input=asked, capture_output=True, text=True, cwd=ROOT)
    held = [line.split()[0] for line in done.stdout.splitlines()]
    assert held == [e["blob"] for e in git.values()], f"{FROM_GIT.name} names commits that do not hold those files"


def test_the_machine_and_command_are_read_from_what_a_result_says():
    said = recorded({"command": "python bench/x.py", "commit": "abc1234", "date": "2026-12-02",
                     "cpu": {"model": "Intel(R) Xeon(R) Processor", "cores": 2, "capability": "AVX512", "amx": True}})
    assert said == {"command": "python bench/x.py", "commit": "abc1234", "date": "2026-12-02",
                    "machine": "Intel(R) Xeon(R) Processor, 2 cores, AVX512, AMX"}
    runs = recorded({"runs": [{"command": "a", "cpu_capability": "AVX2"}, {"command": "b", "cpu_capability": "AVX2"}]})
    assert runs["command"] == "a (and 1 more, in `runs`)" and runs["machine"] == "AVX2 (runs)" and runs["commit"] is None
    assert recorded({"machine": {"gpu": "NVIDIA H100 80GB HBM3", "cpus": 16}})["machine"] == "NVIDIA H100 80GB HBM3, 16 cores"


#: A path into the archive named in the docs, notebooks or code: ``bench/measured/<family>/<name>.json``.
CITED = re.compile(r"bench/measured/([\w./-]+\.json)")


def test_every_path_into_the_archive_that_the_project_names_exists():
    """The docs, notebooks, helpers, bench scripts, dev tools and tests name files by their place in a family folder
    (the quoted numbers' short names are checked by tests/test_quoted.py)."""
    folders = ["docs", "notebooks", "helpers", "bench", "dev", "tools", "tests"]
    texts = [p for f in folders for p in (ROOT / f).rglob("*") if p.suffix in (".md", ".ipynb", ".py")
             and "measured" not in p.relative_to(ROOT).parts[:2] and ".ipynb_checkpoints" not in p.parts]
    missing = sorted({f"{p.relative_to(ROOT)}: bench/measured/{m}" for p in [ROOT / "README.md", *texts]
                      for m in CITED.findall(p.read_text()) if "*" not in m and "<" not in m
                      and not (archive.MEASURED / m).is_file() and not m.startswith("gpu/gpu_check_t4_real")})
    assert not missing, "paths into bench/measured/ that name no stored file:\n" + "\n".join(missing)


def test_a_new_result_is_stamped_with_what_produced_it_and_keeps_what_it_says(monkeypatch):
    from bench import record

    monkeypatch.setattr("sys.argv", ["bench/x.py", "--steps", "3"])
    out = archive.stamped({"accuracy": 0.5, "machine": {"threads": 1}})
    assert out == {"command": "python bench/x.py --steps 3", "commit": record.commit(), "date": record.stamp(),
                   "accuracy": 0.5, "machine": {**record.machine(), "threads": 1}}
    assert list(out)[:3] == ["command", "commit", "date"] and out["commit"]
    kept = archive.stamped({"command": "python bench/checkpoints.py a.json", "machine": "AMD EPYC (Zen 1, AVX2)"})
    assert kept["command"] == "python bench/checkpoints.py a.json" and kept["machine"] == "AMD EPYC (Zen 1, AVX2)"
    assert all(recorded(out).values()), "INDEX.md reads all four from a stamped result"

"""helpers.runs: where things live, run folders, the course's data files, atomic writes, the free-disk check."""

from __future__ import annotations

import io
import json
import shutil
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import runs
from helpers.profiles import REPO_REF, get_profile
from helpers.runs import (
    atomic_folder,
    cache_dir,
    check_free_disk,
    data_file,
    project_root,
    read_json,
    run_dir,
    runs_root,
    write_bytes,
    write_json,
)

ROOT = Path(__file__).resolve().parents[1]


def _siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


# --------------------------------------------------------------------------- where things live


def test_project_root_is_this_checkout():
    assert project_root() == ROOT
    assert (ROOT / "pyproject.toml").is_file()


def test_paths_follow_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path / "c"))
    monkeypatch.setenv("COURSE_RUNS", str(tmp_path / "r"))
    assert cache_dir() == tmp_path / "c"
    assert runs_root() == tmp_path / "r"
    monkeypatch.setenv("COURSE_RUNS", "~/my-runs")
    assert runs_root() == Path.home() / "my-runs"
    monkeypatch.delenv("COURSE_RUNS")
    assert runs_root() == ROOT / "runs"
    monkeypatch.setattr(runs, "project_root", lambda: None)  # a bare install: the working folder
    monkeypatch.chdir(tmp_path)
    assert runs_root() == tmp_path / "runs"


def test_cache_dir_defaults_to_the_user_cache(monkeypatch):
    from platformdirs import user_cache_dir

    monkeypatch.delenv("COURSE_CACHE", raising=False)
    assert cache_dir() == Path(user_cache_dir("grpo-course"))
    monkeypatch.setenv("COURSE_CACHE", "  ")  # blank counts as unset
    assert cache_dir() == Path(user_cache_dir("grpo-course"))


# --------------------------------------------------------------------------- run folders


def test_run_dir_follows_course_run_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_RUN_DIR", str(tmp_path / "my-run"))
    assert run_dir("cpu-demo") == tmp_path / "my-run" and (tmp_path / "my-run").is_dir()


def test_default_run_dir_is_per_profile(monkeypatch, tmp_path):
    monkeypatch.delenv("COURSE_RUN_DIR", raising=False)
    monkeypatch.setenv("COURSE_RUNS", str(tmp_path))
    assert run_dir("cpu-demo") == tmp_path / "lab-cpu-demo" and (tmp_path / "lab-cpu-demo").is_dir()
    monkeypatch.setenv("COURSE_PROFILE", "cpu-smoke")
    assert run_dir() == tmp_path / "lab-cpu-smoke" and (tmp_path / "lab-cpu-smoke").is_dir()


# --------------------------------------------------------------------------- the course's data files


def test_data_file_finds_the_checkout_copy():
    assert data_file("custom_example.csv") == ROOT / "data" / "custom_example.csv"
    assert data_file("gsm8k_sample/test.jsonl").is_file()


def test_data_file_on_a_bare_install_fetches_once_or_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "project_root", lambda: None)
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    urls = []

    def fake_urlopen(url, timeout=None):
        urls.append(url)
        return io.BytesIO(b"question,answer\n")

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    path = data_file("custom_example.csv")
    assert path == tmp_path / "data" / "custom_example.csv" and path.read_text() == "question,answer\n"
    assert urls == [f"https://raw.githubusercontent.com/grpo-course/grpo-course/{REPO_REF}/data/custom_example.csv"]
    assert data_file("custom_example.csv") == path and len(urls) == 1  # cached
    assert sorted(p.name for p in path.parent.iterdir()) == ["custom_example.csv"]  # no temporary file left

    def offline(url, timeout=None):
        raise OSError("no network")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(FileNotFoundError, match="could not be fetched.*no network.*pip install -e"):
        data_file("custom_broken.csv")
    assert not (tmp_path / "data" / "custom_broken.csv").exists()


# --------------------------------------------------------------------------- atomic files


def test_write_json_is_atomic_and_readable(tmp_path):
    path = write_json(tmp_path / "a" / "x.json", {"n": 1, "path": Path("/x")})
    assert read_json(path) == {"n": 1, "path": "/x"}  # what JSON cannot hold is written as text
    assert path.read_text().endswith("}\n")
    write_json(path, [1, 2])
    assert read_json(path) == [1, 2] and _siblings(path) == ["x.json"]


def test_write_json_lines_writes_one_object_per_line(tmp_path):
    path = write_json(tmp_path / "m.jsonl", [{"step": 1, "at": Path("/x")}, {"step": 2}], lines=True)
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"step": 1, "at": "/x"}, {"step": 2}]
    assert write_json(path, [], lines=True).read_text() == "" and _siblings(path) == ["m.jsonl"]


def test_write_bytes_replaces_a_file_whole(tmp_path, monkeypatch):
    path = write_bytes(tmp_path / "deep" / "f.bin", b"old")
    assert path.read_bytes() == b"old"

    def killed(src, dst):
        raise KeyboardInterrupt  # the process dies between writing the temporary file and the rename

    monkeypatch.setattr(runs.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_bytes(path, b"new")
    assert path.read_bytes() == b"old"  # never a half-written file under the real name


# --------------------------------------------------------------------------- atomic folders


def test_atomic_folder_renames_into_place(tmp_path):
    out = tmp_path / "deep" / "model"
    with atomic_folder(out) as tmp:
        assert tmp.parent == out.parent and tmp != out and not out.exists()
        (tmp / "weights.bin").write_text("w")
    assert (out / "weights.bin").read_text() == "w" and _siblings(out) == ["model"]


def test_atomic_folder_refuses_a_non_empty_folder(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "old.bin").write_text("old")
    with pytest.raises(FileExistsError, match="already exists and is not empty.*overwrite=True"):
        with atomic_folder(out):
            pytest.fail("the block must not run")
    assert (out / "old.bin").read_text() == "old" and _siblings(out) == ["model"]
    (out / "old.bin").unlink()
    with atomic_folder(out) as tmp:  # an empty folder is fine
        (tmp / "new.bin").write_text("new")
    assert [p.name for p in out.iterdir()] == ["new.bin"]


@pytest.mark.parametrize("error", [RuntimeError("half written"), KeyboardInterrupt()])
def test_atomic_folder_cleans_up_on_error_and_leaves_the_old_folder(tmp_path, error):
    out = tmp_path / "model"
    with pytest.raises(type(error)):
        with atomic_folder(out) as tmp:
            (tmp / "part.bin").write_text("x")
            raise error
    assert list(tmp_path.iterdir()) == []  # nothing half-written looks complete
    out.mkdir()
    (out / "good.bin").write_text("good")
    with pytest.raises(type(error)):
        with atomic_folder(out, overwrite=True) as tmp:
            (tmp / "part.bin").write_text("x")
            raise error
    assert [p.name for p in out.iterdir()] == ["good.bin"] and _siblings(out) == ["model"]


def test_atomic_folder_overwrite_replaces_the_folder(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "old.bin").write_text("old")
    (out / "sub").mkdir()
    with atomic_folder(out, overwrite=True) as tmp:
        (tmp / "new.bin").write_text("new")
        assert (out / "old.bin").exists()  # the old folder stays until the new one is complete
    assert sorted(p.name for p in out.iterdir()) == ["new.bin"]
    assert _siblings(out) == ["model"]  # the old copy is removed


# --------------------------------------------------------------------------- free disk


def test_check_free_disk_returns_the_free_bytes(tmp_path):
    assert check_free_disk(tmp_path, 1) == shutil.disk_usage(tmp_path).free
    assert check_free_disk(tmp_path / "not" / "yet", 1) > 0  # a folder still to be created


def test_check_free_disk_names_the_shortfall(tmp_path, monkeypatch):
    monkeypatch.setattr(runs.shutil, "disk_usage", lambda p: SimpleNamespace(free=1.5e9))
    with pytest.raises(OSError) as err:
        check_free_disk(tmp_path / "merged", 3_210_000_000)
    msg = str(err.value)
    assert msg.startswith(f"Not enough disk for the merged model: it needs about 3.21 GB in {tmp_path}, and "
                          "1.50 GB are free.")
    assert "keep only the adapter" in msg
    with pytest.raises(OSError, match="Not enough disk for a GGUF export"):
        check_free_disk(tmp_path, 2e9, what="a GGUF export")
    assert check_free_disk(tmp_path, 1.5e9) == 1.5e9


# --------------------------------------------------------------------------- run folders that outlive a session


def _fake_colab(monkeypatch, mount):
    """Install a stand-in ``google.colab`` whose ``drive.mount`` is ``mount``."""
    import sys
    import types

    google = types.ModuleType("google")
    colab = types.ModuleType("google.colab")
    colab.drive = SimpleNamespace(mount=mount)
    google.colab = colab
    monkeypatch.setitem(sys.modules, "google", google)
    monkeypatch.setitem(sys.modules, "google.colab", colab)


def _unset(monkeypatch, name: str) -> None:
    """Remove ``name`` from the environment for this test only. ``monkeypatch.delenv(raising=False)`` records
    nothing when the variable is unset, so what ``use_persistent_runs`` then sets would outlive the test (and reach
    the notebook kernels started later on this worker): setting it first makes monkeypatch restore "unset"."""
    monkeypatch.setenv(name, "")
    monkeypatch.delenv(name)


def test_persistent_runs_on_colab_mount_drive_and_set_course_runs(monkeypatch, tmp_path, capsys):
    mounted = []
    drive_runs = tmp_path / "drive" / "MyDrive" / "grpo-course" / "runs"
    monkeypatch.setattr(runs, "DRIVE_RUNS", drive_runs)
    _unset(monkeypatch, "COURSE_RUNS")
    monkeypatch.delenv("COURSE_RUN_DIR", raising=False)
    _fake_colab(monkeypatch, lambda where: mounted.append(where))
    assert runs.use_persistent_runs(True) == drive_runs
    assert mounted == [str(tmp_path / "drive")]                  # the mount point above MyDrive
    assert drive_runs.is_dir() and runs.os.environ["COURSE_RUNS"] == str(drive_runs)
    assert run_dir("colab-t4") == drive_runs / "lab-colab-t4"   # where every notebook now looks
    assert "kept in" in capsys.readouterr().out
    assert runs.use_persistent_runs(True) is None and mounted == [str(tmp_path / "drive")]  # asked once


def test_persistent_runs_declined_on_colab_keeps_content_and_says_so(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(runs, "DRIVE_RUNS", tmp_path / "drive" / "MyDrive" / "g" / "runs")
    _unset(monkeypatch, "COURSE_RUNS")

    def declined(where):
        raise RuntimeError("credential propagation was unsuccessful")

    _fake_colab(monkeypatch, declined)
    assert runs.use_persistent_runs(True) is None
    assert "COURSE_RUNS" not in runs.os.environ
    out = capsys.readouterr().out
    assert "not mounted" in out and "KEEP_RUNS = False" in out


def test_persistent_runs_never_asks_when_told_not_to_or_off_colab(monkeypatch, tmp_path):
    _unset(monkeypatch, "COURSE_RUNS")
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    _fake_colab(monkeypatch, lambda where: pytest.fail("asked for Drive although KEEP_RUNS is False"))
    assert runs.use_persistent_runs(False) is None
    import sys

    monkeypatch.delitem(sys.modules, "google.colab")
    assert runs.use_persistent_runs(True) is None and "COURSE_RUNS" not in runs.os.environ  # a laptop


def test_persistent_runs_on_kaggle_use_the_working_folder(monkeypatch, tmp_path):
    _unset(monkeypatch, "COURSE_RUNS")
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    monkeypatch.setattr(runs, "KAGGLE_RUNS", tmp_path / "working" / "runs")
    assert runs.use_persistent_runs() == tmp_path / "working" / "runs"
    assert runs.os.environ["COURSE_RUNS"] == str(tmp_path / "working" / "runs")


def test_persistent_runs_leave_a_chosen_course_runs_alone(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_RUNS", str(tmp_path / "mine"))
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    assert runs.use_persistent_runs() is None
    assert runs.os.environ["COURSE_RUNS"] == str(tmp_path / "mine")


def test_unset_leaves_no_course_runs_behind():
    """What the helper above promises, checked with monkeypatch itself: "unset" is restored after the test."""
    import os

    patch = pytest.MonkeyPatch()
    before = os.environ.get("COURSE_RUNS")
    _unset(patch, "COURSE_RUNS")
    os.environ["COURSE_RUNS"] = "/set/by/use_persistent_runs"
    patch.undo()
    assert os.environ.get("COURSE_RUNS") == before


def test_free_space_on_the_drive_mount_is_the_drive_quota(tmp_path, monkeypatch):
    """A temporary folder stands in for Colab's Drive mount; disk_usage answers as two filesystems would."""
    mount = tmp_path / "drive"
    run = mount / "MyDrive" / "grpo-course" / "runs" / "lab-colab-t4"
    run.mkdir(parents=True)
    (tmp_path / "content").mkdir()
    monkeypatch.setattr(runs, "DRIVE_MOUNT", mount)
    monkeypatch.setattr(runs.shutil, "disk_usage",
                        lambda p: SimpleNamespace(free=2.5e9 if Path(p).is_relative_to(mount) else 80e9))
    assert runs.free_space(run / "merged") == (2.5e9, run, True)   # the merge's folder, not made yet: its parent
    assert runs.free_space(tmp_path / "content" / "merged") == (80e9, tmp_path / "content", False)
    assert runs.describe_free(run) == ("2.5 GB left in your Google Drive quota, shared with Gmail and Google Photos "
                                       "(15 GB on a free account)")
    assert runs.describe_free(tmp_path / "content") == "80.0 GB free on this machine's disk"
    with pytest.raises(OSError) as err:
        check_free_disk(run / "merged", 6.3e9)
    msg = str(err.value)
    assert msg.startswith("Not enough space in your Google Drive quota") and "6.30 GB in" in msg and "2.50 GB" in msg
    assert "empty Drive's bin" in msg and 'MERGED = Path("/content/merged")' in msg
    assert check_free_disk(tmp_path / "content" / "merged", 6.3e9) == 80e9  # this machine's disk has room

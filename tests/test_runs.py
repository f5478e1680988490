"""Run folders and their self-description."""

import json

from helpers.config import get_profile
from helpers.runs import read_json, record_run_info, run_dir, write_json


def test_run_dir_follows_course_run_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_RUN_DIR", str(tmp_path / "my-run"))
    assert run_dir() == tmp_path / "my-run" and (tmp_path / "my-run").is_dir()


def test_default_run_dir_is_per_profile(monkeypatch, tmp_path):
    monkeypatch.delenv("COURSE_RUN_DIR", raising=False)
    monkeypatch.setenv("COURSE_RUNS", str(tmp_path))
    assert run_dir("cpu-smoke") == tmp_path / "lab-cpu-smoke"


def test_write_json_is_atomic_and_readable(tmp_path):
    path = write_json(tmp_path / "a" / "x.json", {"n": 1})
    assert read_json(path) == {"n": 1}
    assert not list(path.parent.glob("*.tmp"))


def test_run_info_records_profile_versions_and_keeps_earlier_keys(tmp_path):
    record_run_info(tmp_path, get_profile("cpu-smoke"), notebook="01")
    record_run_info(tmp_path, get_profile("cpu-smoke"), adapter="adapter/")
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["profile"]["name"] == "cpu-smoke"
    assert info["versions"]["trl"] and info["versions"]["transformers"]
    assert info["notebook"] == "01" and info["adapter"] == "adapter/"

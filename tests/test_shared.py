"""tests/shared.py: work done once per session, its result (or its failure) read by every later caller."""

from __future__ import annotations

import pytest

from .shared import once


def test_once_runs_the_work_once_and_stores_its_failure_for_the_next_caller(tmp_path_factory):
    calls = []

    def produce(folder):
        calls.append(folder)
        (folder / "made").write_text("x")
        return {"folder": str(folder)}

    first = once("test-shared-ok", tmp_path_factory, produce)
    assert once("test-shared-ok", tmp_path_factory, produce) == first and len(calls) == 1
    assert (calls[0] / "made").is_file() and first["folder"] == str(calls[0])

    def broken(folder):
        calls.append(folder)
        raise RuntimeError("out of memory")

    for _ in range(2):  # the second caller (the other worker) gets the same failure, without running it again
        with pytest.raises(pytest.fail.Exception, match="out of memory"):
            once("test-shared-broken", tmp_path_factory, broken)
    assert len(calls) == 2

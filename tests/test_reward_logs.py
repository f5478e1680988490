"""helpers.reward_logs: each reward's returned values and printed text kept per step in the run folder."""

from __future__ import annotations

import asyncio
import json
import sys
from types import SimpleNamespace

import pytest

from helpers.reward_logs import logged, step_of


def test_logged_keeps_each_steps_rewards_in_the_run_folder(tmp_path):
    def shout(completions, **kwargs):
        return [float(len(c)) for c in completions]

    async def later(completions, **kwargs):
        return [1.0 for _ in completions]

    sync, asyn = logged(shout, tmp_path), logged(later, tmp_path)
    assert sync.__name__ == "shout" and asyncio.iscoroutinefunction(asyn)
    assert sync(completions=["ab", "c"], trainer_state=SimpleNamespace(global_step=3)) == [2.0, 1.0]
    assert asyncio.run(asyn(completions=["x"])) == [1.0]
    rows = [json.loads(line) for line in (tmp_path / "shout.jsonl").read_text().splitlines()]
    assert rows == [{"step": 4, "reward": 2.0}, {"step": 4, "reward": 1.0}]  # TRL scores step 4 at global_step 3
    assert (tmp_path / "later.jsonl").read_text() == '{"step": null, "reward": 1.0}\n'
    assert not (tmp_path / "shout.log").exists()   # printed nothing: no empty log
    assert step_of(SimpleNamespace(global_step=0)) == 1 and step_of(None) is None


def test_what_a_reward_prints_is_shown_and_kept_under_its_step(tmp_path, capsys):
    def talkative(completions, **kwargs):
        print(f"scoring {len(completions)}")
        print("first:", completions[0], end="")     # no newline at the end: the log adds one
        return [0.5] * len(completions)

    reward = logged(talkative, tmp_path)
    for step in (0, 1):
        reward(completions=["a", "b"], trainer_state=SimpleNamespace(global_step=step))
    assert capsys.readouterr().out == "scoring 2\nfirst: ascoring 2\nfirst: a"   # still printed, unchanged
    assert (tmp_path / "talkative.log").read_text() == (
        "--- step 1 ---\nscoring 2\nfirst: a\n--- step 2 ---\nscoring 2\nfirst: a\n")
    assert not type(sys.stdout).__name__ == "_Tee"   # stdout given back after the call


def test_concurrent_async_rewards_keep_their_own_prints(tmp_path):
    """TRL gathers async rewards on one event loop: their prints interleave on stdout but not in their logs."""
    async def one(completions, **kwargs):
        for i in range(3):
            print(f"one {i}")
            await asyncio.sleep(0.01)
        return [1.0]

    async def two(completions, **kwargs):
        for i in range(3):
            await asyncio.sleep(0.005)
            print(f"two {i}")
        return [2.0]

    async def both():
        return await asyncio.gather(logged(one, tmp_path)(completions=["x"]), logged(two, tmp_path)(completions=["x"]))

    assert asyncio.run(both()) == [[1.0], [2.0]]
    assert (tmp_path / "one.log").read_text() == "--- step None ---\none 0\none 1\none 2\n"
    assert (tmp_path / "two.log").read_text() == "--- step None ---\ntwo 0\ntwo 1\ntwo 2\n"
    assert type(sys.stdout).__name__ != "_Tee"


def test_a_reward_that_raises_still_gives_stdout_back(tmp_path):
    def broken(completions, **kwargs):
        print("about to fail")
        raise ValueError("bad completion")

    before = sys.stdout
    with pytest.raises(ValueError, match="bad completion"):
        logged(broken, tmp_path)(completions=["x"])
    assert sys.stdout is before and not (tmp_path / "broken.jsonl").exists()
    assert (tmp_path / "broken.log").read_text() == "--- step None ---\nabout to fail\n"   # its prints kept

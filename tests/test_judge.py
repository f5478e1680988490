"""helpers.judge: the judge reward against real HTTP servers on 127.0.0.1.

The fast tests run a small OpenAI-compatible server in a thread (http.server) that answers as told: yes, no, garbage,
not at all, slowly; the slow ones ask llama.cpp's server with the bundled model's GGUF. Training through a judge
that dies and comes back is tests/test_judge_fault.py."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from helpers.judge import (FAILED, LATENCY, SECONDS, UNPARSED, agreement, cohen_kappa, judge_messages, judge_reward,
                           judge_warnings, parse_verdict, question_of, rubric_reward)

PROMPT = [{"role": "system", "content": "Respond in the format."}, {"role": "user", "content": "What is 40 + 2?"}]
RIGHT, WRONG = "42\n</reasoning>\n<answer>\n42\n</answer>", "41\n</reasoning>\n<answer>\n41\n</answer>"


class Judge(ThreadingHTTPServer):
    """An OpenAI-compatible chat endpoint whose reply is ``answer(user_text)``; counts requests and overlap."""

    daemon_threads = True

    def __init__(self, answer, delay: float = 0.0, logprobs: dict | None = None):
        self.answer, self.delay, self.logprobs = answer, delay, logprobs
        self.requests, self.in_flight, self.most_in_flight, self.lock = 0, 0, 0, threading.Lock()
        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):  # noqa: N802
        server: Judge = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with server.lock:
            server.requests += 1
            server.in_flight += 1
            server.most_in_flight = max(server.most_in_flight, server.in_flight)
        time.sleep(server.delay)
        with server.lock:
            server.in_flight -= 1
        reply = server.answer(body["messages"][-1]["content"])
        if reply is None:  # a broken server: not JSON at all
            payload, kind = b"<html>502 Bad Gateway</html>", "text/html"
        else:
            logprobs = None
            if server.logprobs and body.get("logprobs"):
                logprobs = {"content": [{"token": reply, "logprob": 0.0, "bytes": None, "top_logprobs": [
                    {"token": t, "logprob": lp, "bytes": None} for t, lp in server.logprobs.items()]}]}
            payload = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                                  "choices": [{"index": 0, "finish_reason": "stop", "logprobs": logprobs,
                                               "message": {"role": "assistant", "content": reply}}]}).encode()
            kind = "application/json"
        self.send_response(200 if reply is not None else 502)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


def truthful(user: str) -> str:
    return "Yes." if "<answer>\n42\n</answer>" in user else "No, it is wrong."


def run(reward, completions, **kwargs):
    return asyncio.run(reward(prompts=[PROMPT] * len(completions), completions=completions, **kwargs))


@pytest.mark.parametrize("text, expected", [
    ("yes", 1.0), ("Yes, 42 is right.", 1.0), ("**Correct**", 1.0), ("NO.", 0.0), ("Incorrect: 41", 0.0),
    ("The answer 42 is wrong", 0.0), ("", None), (None, None), ("<|im_end|>", None), ("maybe", None),
    (42, None), (["yes"], 1.0), ("y" * 100_000, None), ("\x00\udcff", None),
])
def test_the_parser_reads_a_verdict_or_none_and_never_raises(text, expected):
    assert parse_verdict(text) == expected


def test_the_prompt_holds_the_question_the_completion_and_only_a_reference_when_given():
    assert question_of(PROMPT) == "What is 40 + 2?" and question_of("plain text") == "plain text"
    plain, ref = judge_messages("Q?", "A", None), judge_messages("Q?", "A", "42")
    assert "Q?" in plain[1]["content"] and "A" in plain[1]["content"] and "Reference" not in plain[1]["content"]
    assert "Reference answer: 42" in ref[1]["content"] and plain[0]["role"] == "system"


def test_a_truthful_judge_scores_right_and_wrong_and_logs_per_step(tmp_path):
    judge, metrics, extra = Judge(truthful), [], {}
    reward = judge_reward(judge.url, scoring="text", prefill="<reasoning>\n", log_dir=tmp_path)
    scores = run(reward, [RIGHT, WRONG, [{"role": "assistant", "content": RIGHT}]],
                 log_metric=lambda k, v: metrics.append((k, v)), log_extra=lambda k, v: extra.update({k: v}))
    assert scores == [1.0, 0.0, 1.0] and reward.__name__ == "judge_reward"
    logged_metrics = dict(metrics)
    assert logged_metrics[FAILED] == 0 and logged_metrics[UNPARSED] == 0 and logged_metrics[LATENCY] > 0
    assert logged_metrics[SECONDS] >= logged_metrics[LATENCY]
    assert extra["judge_reward_reply"] == ["Yes.", "No, it is wrong.", "Yes."]
    lines = [json.loads(line) for line in (tmp_path / "judge_reward.jsonl").read_text().splitlines()]
    assert [x["score"] for x in lines] == [1.0, 0.0, 1.0] and lines[0]["question"] == "What is 40 + 2?"
    assert lines[0]["completion"].startswith("<reasoning>\n42")  # the prefill put back


def test_identical_requests_are_asked_once():
    judge = Judge(truthful)
    reward = judge_reward(judge.url, scoring="text")
    assert run(reward, [RIGHT, RIGHT, WRONG]) == [1.0, 1.0, 0.0]
    assert run(reward, [RIGHT, WRONG]) == [1.0, 0.0]
    assert judge.requests == 2 and reward.stats.cache_hits == 3


def test_concurrency_is_bounded_and_pays_on_a_server_that_answers_in_parallel():
    slow = Judge(truthful, delay=0.3)
    completions = [f"{i}\n</reasoning>\n<answer>\n{i}\n</answer>" for i in range(8)]
    start = time.perf_counter()
    run(judge_reward(slow.url, scoring="text", concurrency=4, cache=False), completions)
    parallel = time.perf_counter() - start
    assert slow.most_in_flight == 4
    start = time.perf_counter()
    run(judge_reward(slow.url, scoring="text", concurrency=1, cache=False), completions)
    assert slow.most_in_flight == 4 and time.perf_counter() - start > 2.5 * parallel


@pytest.mark.parametrize("answer", [lambda u: "I think the sum is fine", lambda u: ""])
def test_a_reply_with_no_verdict_is_none_and_counted_unparsed(answer):
    metrics = {}
    reward = judge_reward(Judge(answer).url, scoring="text")
    assert run(reward, [RIGHT, WRONG], log_metric=metrics.__setitem__) == [None, None]
    assert metrics[UNPARSED] == 1 and metrics[FAILED] == 0 and reward.stats.unparsed == 2


def test_a_broken_server_is_retried_with_backoff_then_none():
    judge, metrics = Judge(lambda u: None), {}
    reward = judge_reward(judge.url, retries=2, backoff=0.1)
    start = time.perf_counter()
    assert run(reward, [RIGHT], log_metric=metrics.__setitem__) == [None]
    assert judge.requests == 3 and time.perf_counter() - start >= 0.3 and metrics[FAILED] == 1
    assert "InternalServerError" in reward.stats.errors[0] or "APIStatusError" in reward.stats.errors[0]


def test_no_server_at_all_gives_none_at_once():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    reward = judge_reward(f"http://127.0.0.1:{port}/v1", retries=1, backoff=0.05)
    start = time.perf_counter()
    assert run(reward, [RIGHT, WRONG]) == [None, None] and time.perf_counter() - start < 5
    assert reward.stats.failed == 2 and "APIConnectionError" in reward.stats.errors[0]


def test_a_server_that_never_answers_times_out_into_none():
    with socket.socket() as hung:  # accepts connections, never replies
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        reward = judge_reward(f"http://127.0.0.1:{hung.getsockname()[1]}/v1", timeout=0.5, retries=0)
        start = time.perf_counter()
        assert run(reward, [RIGHT]) == [None] and time.perf_counter() - start < 3
    assert "Timeout" in reward.stats.errors[0]


def test_logprob_scoring_is_p_yes_among_yes_and_no_and_falls_back_to_the_text():
    import math
    graded = Judge(lambda u: "No", logprobs={"No": math.log(0.6), "Yes": math.log(0.2), " maybe": math.log(0.2)})
    assert run(judge_reward(graded.url), [RIGHT]) == [pytest.approx(0.25)]
    assert run(judge_reward(Judge(lambda u: "No").url), [RIGHT]) == [0.0]  # no logprobs sent: the text
    with pytest.raises(ValueError, match="scoring="):
        judge_reward(graded.url, scoring="vibes")


def test_the_rubric_gates_then_weighs_and_drops_a_silent_criterion():
    asked = []

    def gate(completions, **kwargs):
        return [1.0 if "<answer>" in c else 0.0 for c in completions]

    async def judge(completions, **kwargs):
        asked.extend(completions)
        return [None if "9" in c else 1.0 for c in completions]

    def short(completions, **kwargs):
        return [1.0 if len(c) < 40 else 0.0 for c in completions]

    rubric = rubric_reward(gate, [(judge, 0.5), (short, 0.5)])
    out = run(rubric, ["no tags", RIGHT, "<answer>9</answer>", "<answer>" + "x" * 60])
    assert out == [0.0, 1.0, 1.0, 0.5] and "no tags" not in asked and rubric.__name__ == "rubric_reward"
    assert asyncio.run(rubric_reward(gate, [(judge, 1.0)])(prompts=["p"], completions=["<answer>9"])) == [None]


def test_kappa_and_agreement():
    assert cohen_kappa([1, 0, 1, 0], [1, 0, 1, 0]) == 1.0 and cohen_kappa([0, 0, 0, 0], [1, 0, 1, 0]) == 0.0
    assert cohen_kappa([1, 0, 1, 0], [0, 1, 0, 1]) == -1.0
    with pytest.raises(ValueError):
        cohen_kappa([], [])
    got = agreement([0.9, 0.2, None, 0.7], [True, True, False, False])
    assert got["answered"] == 0.75 and got["agreement"] == pytest.approx(1 / 3)
    assert got["false_yes"] == 1.0 and got["false_no"] == 0.5 and got["auc"] == 0.5  # 0.9 > 0.7, 0.2 < 0.7
    assert agreement([None], [True])["answered"] == 0.0
    never_yes = agreement([0.3, 0.28, 0.1, 0.25], [True, True, False, False])  # all below 0.5, but ranked right
    assert never_yes["kappa"] == 0.0 and never_yes["false_no"] == 1.0 and never_yes["auc"] == 1.0
    assert agreement([0.5, 0.5], [True, False])["auc"] == 0.5


def test_a_judge_that_stops_answering_is_named_once_per_outage():
    history = [{"step": s, FAILED: v} for s, v in enumerate([0, 1, 1, 0, 0.5, 1, None], start=1)]
    history.insert(2, {"step": 2, "eval_accuracy": 0.5})  # entries without the metric change nothing
    found = judge_warnings(history)
    assert [(w.name, w.step) for w in found] == [("judge-unavailable", 2), ("judge-unavailable", 6)]
    assert "Start the server again" in str(found[0])


@pytest.mark.slow
def test_the_bundled_model_judges_through_llama_cpps_server():
    """The real judge: llama.cpp's server with the bundled GGUF, asked through the openai client; then it stops."""
    from helpers.export import bundled_gguf
    from helpers.serve import llama_server, port_is_free

    completions = [RIGHT, WRONG, "I don't know", RIGHT]
    with llama_server(bundled_gguf(), threads=1) as server:
        reward = judge_reward(server.base_url, prefill="<reasoning>\n")
        scores = run(reward, completions)
        text = run(judge_reward(server.base_url, scoring="text", max_tokens=4), completions)
    assert all(s is not None and 0.0 <= s <= 1.0 for s in scores) and scores[0] == scores[3]
    assert reward.stats.requests == 3 and reward.stats.cache_hits == 1 and reward.stats.failed == 0
    assert all(t in (0.0, 1.0, None) for t in text)
    assert server.process.poll() is not None and port_is_free(server.port)
    after = run(judge_reward(server.base_url, retries=0), [RIGHT])  # the server is gone: None, no exception
    assert after == [None]


def test_the_watch_callback_prints_each_outage_once():
    from types import SimpleNamespace

    from transformers import TrainerState

    from helpers.judge import JudgeWatchCallback

    printed, state = [], TrainerState()
    callback = JudgeWatchCallback(print_fn=printed.append)
    for step, failed in enumerate([0.0, 1.0, 1.0, 0.0, 1.0], start=1):
        state.log_history.append({"step": step, FAILED: failed})
        callback.on_log(SimpleNamespace(report_to=["none"]), state, None, logs=state.log_history[-1])
    assert [line.split(":")[0] for line in printed] == ["WARNING [judge-unavailable] step 2",
                                                      "WARNING [judge-unavailable] step 5"]


def test_a_server_outlives_no_kernel_killed_with_sigkill(tmp_path):
    """A kernel killed outright (nbval stops kernels with SIGKILL) runs no atexit: the watchdog stops its server."""
    import os
    import signal
    import subprocess
    import sys

    script = ("import subprocess, sys, time\nfrom helpers.judge import stop_with_this_process\n"
              "server = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
              "stop_with_this_process(server)\nprint(server.pid, flush=True)\ntime.sleep(300)\n")
    kernel = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    server = int(kernel.stdout.readline())
    os.killpg(server, 0)  # running, in a group of its own
    kernel.send_signal(signal.SIGKILL)
    kernel.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.killpg(server, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.killpg(server, signal.SIGKILL)
        pytest.fail("the server outlived its killed kernel")


def test_the_source_lines_notebook_08_cites_say_what_it_says():
    """Notebook 08 cites TRL, transformers and llama-cpp-python by line: the installed files must agree."""
    from pathlib import Path

    import llama_cpp
    import transformers
    import trl

    def lines(package, *parts):
        return (Path(package.__file__).parent.joinpath(*parts)).read_text().splitlines()

    grpo = lines(trl, "trainer", "grpo_trainer.py")
    for line, text in [(717, "self._has_async_funcs = any(inspect.iscoroutinefunction(func)"),
                       (1679, "async_funcs_info.append((i, reward_func, reward_func_name))"),
                       (1717, "asyncio.run_coroutine_threadsafe(_run_async_funcs(), self.async_loop).result()"),
                       (1648, 'reward_kwargs["log_extra"] = self._log_completion_extra'),
                       (1651, 'reward_kwargs["log_metric"] = self._log_metric'),
                       (1633, "self._pending_metrics[name].append(value)"),
                       (2875, "for name in sorted(self._pending_metrics):"),
                       (1704, "output = [r if r is not None else torch.nan for r in output]"),
                       (2848, "mean_rewards = torch.nanmean(rewards_per_func[:, i]).item()"),
                       (2789, ".nansum(dim=1)"), (2852, ".nansum(dim=1)"),
                       (2785, "unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)"),
                       (2836, "advantages = torch.nan_to_num(advantages, nan=0.0)")]:
        assert text in grpo[line - 1], (line, grpo[line - 1])
    trainer = lines(transformers, "trainer.py")
    assert "TrainerState.load_from_json(os.path.join(resume_from_checkpoint, TRAINER_STATE_NAME))" in trainer[1638]
    assert "torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))" in trainer[4024]
    assert sum("TRAINING_ARGS_NAME" in line for line in trainer) == 3  # defined, saved twice, never loaded
    utils = lines(transformers, "trainer_utils.py")
    assert utils[1132].startswith("def compare_trainer_and_checkpoint_args") and "warning_once" in utils[1168]
    app = lines(llama_cpp, "server", "app.py")
    assert app[63] == "llama_outer_lock = Lock()" and app[64] == "llama_inner_lock = Lock()"

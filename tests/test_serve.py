"""helpers.serve: llama.cpp's OpenAI-compatible server as a real process on 127.0.0.1, queried with `openai`.

Each test checks that no server process is left behind, on success and on every error."""

from __future__ import annotations

import os
import signal
import socket

import pytest

from helpers.serve import ServerError, llama_complete, llama_server, load_llama, port_is_free
from helpers.tasks import get_task
from tests.adapters import QUESTIONS
from tests.llama_files import llama_files

pytestmark = pytest.mark.slow
PREFILL = get_task("arithmetic").prefill


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return llama_files(tmp_path_factory)["f16"]


def _gone(server) -> bool:
    """The process has exited, nothing listens on its port, its log is removed."""
    try:
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
        listening = True
    except OSError:
        listening = False
    return server.process.poll() is not None and not listening and port_is_free(server.port) \
        and not server.log.exists()


def test_one_chat_request_answers_as_llama_cpp_in_the_notebook(gguf):
    """The served answer (the GGUF's chat template, prefill included) is the in-process answer to the prompt the
    course's tokenizer renders: same runtime, same file, greedy."""
    from openai import OpenAI
    from transformers import AutoTokenizer

    from helpers.prompts import render

    messages = [{"role": "user", "content": QUESTIONS[0]}]
    with llama_server(gguf, threads=1) as server:
        client = OpenAI(base_url=server.base_url, api_key="local", max_retries=0)
        reply = client.chat.completions.create(model="local", messages=messages, max_tokens=24, temperature=0.0)
    assert _gone(server)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent.parent / "merged"))  # the course's template
    prompt = render(tok, messages)
    assert prompt.endswith(PREFILL)
    expected, _ = llama_complete(load_llama(gguf, threads=1), [prompt], 24)
    assert reply.choices[0].message.content == expected[0] and reply.usage.completion_tokens > 0


def test_a_port_in_use_is_named_and_nothing_starts(gguf):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServerError, match=rf"Port {port} on 127.0.0.1 is already in use"):
            with llama_server(gguf, port=port):
                pass


def test_an_error_in_the_block_stops_the_server(gguf):
    with pytest.raises(ValueError, match="the learner's mistake"):
        with llama_server(gguf, threads=1) as server:
            raise ValueError("the learner's mistake")
    assert _gone(server)


def test_a_server_that_dies_mid_request_is_reported_with_its_exit_code(gguf):
    from openai import OpenAI

    with pytest.raises(ServerError, match=r"stopped \(exit code -9\) while a request ran") as caught:
        with llama_server(gguf, threads=1) as server:
            client = OpenAI(base_url=server.base_url, api_key="local", max_retries=0)
            stream = client.chat.completions.create(model="local", messages=[{"role": "user", "content": "Count."}],
                                                    max_tokens=200, temperature=0.0, stream=True)
            next(iter(stream))  # the answer has begun
            os.killpg(server.process.pid, signal.SIGKILL)
            for _ in stream:
                pass
    assert _gone(server) and caught.value.__cause__ is not None


def test_a_server_that_does_not_answer_in_time_is_stopped(gguf):
    with pytest.raises(ServerError, match="did not answer on port .* within 0.01 s"):
        with llama_server(gguf, timeout=0.01):
            pass
    # the server's command line (helpers.serve.server_command): `python -m helpers.serve --llama-server --model ...`
    assert not [p for p in os.popen("ps -eo args").read().splitlines() if str(gguf) in p and "--llama-server" in p]


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ServerError, match="missing.gguf does not exist"):
        with llama_server(tmp_path / "missing.gguf"):
            pass

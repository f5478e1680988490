"""llama.cpp on this machine (notebook 04, sections 7 and 10): greedy answers, and its OpenAI-compatible server.

:func:`llama_server` starts ``python -m llama_cpp.server`` (llama-cpp-python's server) as a real process on a free port,
waits until it answers, and stops it when the ``with`` block ends, on success and on error alike; the ``openai``
client talks to it with ``base_url=server.base_url``. :func:`llama_complete` runs the same runtime in this process.

Example:
    >>> port = free_port()
    >>> 1024 < port < 65536 and port_is_free(port)
    True
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

HOST = "127.0.0.1"


class ServerError(RuntimeError):
    """The llama.cpp server could not start, or stopped; the message names the port or file and what to do."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the system picks it)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Whether a server could bind ``port`` on 127.0.0.1 now (as uvicorn binds: ``SO_REUSEADDR``, so the
    connections an earlier server closed do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
        return True


@dataclass
class Server:
    """A running llama.cpp server: ``base_url`` for ``openai.OpenAI(base_url=..., api_key=...)``."""

    process: subprocess.Popen
    port: int
    model: Path
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def log_tail(self, chars: int = 1200) -> str:
        """The end of the server's own output (stdout and stderr)."""
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def amx_cpu() -> bool:
    """Whether this CPU reports Intel AMX (``amx_int8`` in /proc/cpuinfo)."""
    info = Path("/proc/cpuinfo")
    return info.is_file() and " amx_int8" in info.read_text()


@contextlib.contextmanager
def _no_extra_buffers() -> Iterator[None]:
    """llama.cpp's model parameters with ``use_extra_bufts = False`` on an AMX CPU, while a model loads.

    On the course's 2-core AVX-512/AMX machine (a VM) llama.cpp 0.3.36's AMX buffers crash the process (SIGSEGV) on
    the first batched prompt of a Q8_0 or Q4_1 file (one token at a time, or with them off, it runs).
    ``Llama()`` has no keyword for the field, so the defaults it reads are wrapped for the load."""
    if not amx_cpu():
        yield
        return
    import llama_cpp.llama_cpp as lib
    default = lib.llama_model_default_params

    def params() -> Any:
        value = default()
        value.use_extra_bufts = False
        return value

    lib.llama_model_default_params = params
    try:
        yield
    finally:
        lib.llama_model_default_params = default


def server_command(model: str | Path, port: int, lora: str | Path | None = None, n_ctx: int = 2048,
                   threads: int | None = None) -> list[str]:
    """The command line of llama-cpp-python's server (``llama_cpp.server``; options: ``--help``), started through
    ``python -m helpers.serve --llama-server`` so that :func:`_no_extra_buffers` holds in it too."""
    cmd = [sys.executable, "-m", "helpers.serve", "--llama-server", "--model", str(model), "--host", HOST,
           "--port", str(port), "--n_ctx", str(n_ctx), "--verbose", "False"]
    if lora is not None:
        cmd += ["--lora_path", str(lora)]
    if threads:
        cmd += ["--n_threads", str(threads), "--n_threads_batch", str(threads)]
    return cmd


@contextlib.contextmanager
def llama_server(model: str | Path, port: int | None = None, lora: str | Path | None = None,
                 timeout: float = 120.0, threads: int | None = None, n_ctx: int = 2048) -> Iterator[Server]:
    """Serve ``model`` (a GGUF; ``lora``: a LoRA GGUF on it) on 127.0.0.1 until the block ends; nothing is left
    running afterwards. ``port=None``: a free one. Raises :class:`ServerError` for a port in use, a server that
    does not answer within ``timeout`` seconds, and a server that died while the block ran."""
    model = Path(model)
    for path in (model, lora):
        if path is not None and not Path(path).is_file():
            raise ServerError(f"{path} does not exist: convert the model first (notebook 04 section 7).")
    if port is not None and not port_is_free(port):
        raise ServerError(f"Port {port} on {HOST} is already in use (another server, maybe an earlier one still "
                          f"running: `lsof -i :{port}` names it). Stop it, or pass port=None for a free port.")
    port = port if port is not None else free_port()
    handle, name = tempfile.mkstemp(prefix=f"llama-server-{port}-", suffix=".log")
    os.close(handle)
    log = Path(name)
    with open(log, "wb") as out:
        process = subprocess.Popen(server_command(model, port, lora, n_ctx, threads), stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    server = Server(process, port, model, log)
    try:
        _wait_ready(server, timeout)
        try:
            yield server
        except Exception as error:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(0.5)  # a server killed mid-request may take a moment to be reaped
            if process.poll() is not None:  # the server's death explains the error: say so
                raise ServerError(f"The llama.cpp server on port {port} stopped (exit code {process.returncode}) "
                                  f"while a request ran: {type(error).__name__}. Its log ends:\n{server.log_tail()}\n"
                                  "Start it again (the with block); if it dies again, the log says why "
                                  "(out of memory: a smaller n_ctx or a quantised file).") from error
            raise
    finally:
        stop(process)
        log.unlink(missing_ok=True)


def _wait_ready(server: Server, timeout: float) -> None:
    """Poll ``GET /v1/models`` until it answers 200; fail early when the process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            tail = server.log_tail()
            if "address already in use" in tail.lower():
                raise ServerError(f"Port {server.port} on {HOST} was taken before the server could bind it: run "
                                  "again (port=None picks another free port).")
            raise ServerError(f"The llama.cpp server for {server.model} exited at start (code "
                              f"{server.process.returncode}). Its log ends:\n{tail}")
        try:
            with urllib.request.urlopen(f"{server.base_url}/models", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(0.2)
    raise ServerError(f"The llama.cpp server for {server.model} did not answer on port {server.port} within "
                      f"{timeout:g} s (a loaded machine loads slowly: pass a longer timeout). Its log ends:\n"
                      f"{server.log_tail()}")


def stop(process: subprocess.Popen, grace: float = 10.0) -> None:
    """Stop a server process and its process group: SIGTERM, then SIGKILL after ``grace`` seconds."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def load_llama(model: str | Path, lora: str | Path | None = None, threads: int | None = None,
               n_ctx: int = 2048) -> Any:
    """llama.cpp in this process (``llama_cpp.Llama``), quiet, on ``threads`` threads (default: llama.cpp's)."""
    from llama_cpp import Llama
    kwargs: dict[str, Any] = {"n_threads": threads, "n_threads_batch": threads} if threads else {}
    with _no_extra_buffers():
        return Llama(model_path=str(model), lora_path=str(lora) if lora else None, n_ctx=n_ctx, verbose=False,
                     seed=0, **kwargs)


def llama_complete(llm: Any, prompts: Sequence[str], max_tokens: int) -> tuple[list[str], int]:
    """Greedy completions of already rendered prompts (the notebook's text, prefill included) and the number of
    tokens generated, as ``(texts, tokens)``."""
    texts, tokens = [], 0
    for prompt in prompts:
        out = llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, top_k=1, seed=0)
        texts.append(out["choices"][0]["text"])
        tokens += out["usage"]["completion_tokens"]
    return texts, tokens


def latest_gguf(root: str | Path | None = None) -> Path:
    """The model the newest run under ``root`` (default: the course's runs) exported: ``gguf/model-f16.gguf`` where
    there is one (notebook 04's 16-bit file), else the newest ``.gguf`` in ``gguf/`` (Unsloth's export)."""
    from .runs import runs_root
    root = Path(root) if root is not None else runs_root()
    found = [p for p in root.glob("*/gguf/*.gguf") if not p.name.startswith("adapter")]
    if not found:
        raise ServerError(f"No exported model under {root} (looked for */gguf/*.gguf): run notebook 04 through "
                          "its GGUF section first, or pass a .gguf file.")
    return run_gguf(max(found, key=lambda p: p.stat().st_mtime).parent.parent)


def run_gguf(run: str | Path) -> Path:
    """The model one run folder exported: ``RUN/gguf/model-f16.gguf``, else the newest other ``RUN/gguf/*.gguf``."""
    folder = Path(run) / "gguf"
    found = [p for p in folder.glob("*.gguf") if not p.name.startswith("adapter")]
    if not found:
        raise ServerError(f"No exported model in {folder}: run notebook 04 through its GGUF section first.")
    f16 = folder / "model-f16.gguf"
    return f16 if f16.is_file() else max(found, key=lambda p: p.stat().st_mtime)


def main(argv: Sequence[str] | None = None) -> None:
    """``make serve``: serve the latest run's GGUF (or the one given) in the foreground, until Ctrl-C."""
    import argparse
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("model", nargs="?", help="a .gguf file or a run folder (default: the latest run's)")
    ap.add_argument("--port", type=int, default=8080)
    args = ap.parse_args(argv)
    try:
        if args.model and args.model.endswith(".gguf"):
            model = Path(args.model)
        elif args.model:  # a run folder: only its own files
            model = run_gguf(args.model)
        else:
            model = latest_gguf()
    except ServerError as error:
        raise SystemExit(str(error)) from None
    if not model.is_file():
        raise SystemExit(f"{model} does not exist: convert the model first (notebook 04 section 7).")
    if not port_is_free(args.port):
        raise SystemExit(f"Port {args.port} on {HOST} is already in use: `make serve PORT=8081`, or stop the other "
                         f"server (`lsof -i :{args.port}` names it).")
    print(f"serving {model} at http://{HOST}:{args.port}/v1 (Ctrl-C stops it)\n"
          f"  from openai import OpenAI\n"
          f"  client = OpenAI(base_url='http://{HOST}:{args.port}/v1', api_key='local')\n"
          f"  client.chat.completions.create(model='local', messages=[{{'role': 'user', 'content': "
          f"'What is 23 + 19?'}}], temperature=0)", flush=True)
    os.execv(sys.executable, server_command(model, args.port))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--llama-server"]:  # what llama_server starts: llama_cpp.server, AMX buffers off
        from llama_cpp.server.__main__ import main as llama_cpp_server
        sys.argv = ["llama_cpp.server", *sys.argv[2:]]
        with _no_extra_buffers():
            llama_cpp_server()
    else:
        main()

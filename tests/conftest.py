"""Shared fixtures: real engines, each loaded once per test session.

Engines are async. All of them run on one event loop owned by a background thread
(``aio``), the way the runtime hosts several engines on one loop; tests stay plain
functions and call ``aio.run(engine.method(...))``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

# The same defaults as scripts/runtime_env.sh, for runs of pytest outside `make test`.
for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "RAY_AUTH_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
    "ANONYMIZED_TELEMETRY": "False",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "OMP_WAIT_POLICY": "PASSIVE",
}.items():
    os.environ.setdefault(_key, _value)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

# The runtime-hosted engines (one Ray runtime, vLLM loaded once): runtime, llm, call.
from tests.fixtures_runtime import call, llm, runtime  # noqa: E402,F401
# One vLLM OpenAI-compatible server per session, and a request-recording proxy in front of it.
from tests.fixtures_served import embedding_proxy, embedding_server, model_server, recording_proxy  # noqa: E402,F401

T = TypeVar("T")


class LoopRunner:
    """One event loop in a daemon thread; ``run(coro)`` blocks until the coroutine finishes
    and re-raises its exception in the caller."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="teola-test-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 600) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture(scope="session")
def aio():
    runner = LoopRunner()
    yield runner
    runner.close()


def _started(aio: LoopRunner, engine):
    aio.run(engine.start())
    return engine


# -- retrieval-side engines ----------------------------------------------------------------------
@pytest.fixture(scope="session")
def embedder(aio):
    """The default embedder: bundled all-MiniLM-L6-v2 on the CPU."""
    from teola_plugin.engines import SentenceTransformerEmbedder

    engine = _started(aio, SentenceTransformerEmbedder())
    yield engine
    aio.run(engine.close())


@pytest.fixture(scope="session")
def reranker(aio, embedder):
    """The default (bi-encoder) reranker; shares the embedder's loaded MiniLM."""
    from teola_plugin.engines import Reranker

    engine = _started(aio, Reranker())
    yield engine
    aio.run(engine.close())


@pytest.fixture(scope="session")
def bm25(aio):
    """BM25 over every bundled corpus (5,098 passages)."""
    from teola_plugin.engines import BM25SearchEngine

    engine = _started(aio, BM25SearchEngine())
    yield engine
    aio.run(engine.close())


@pytest.fixture()
def vector_store(aio):
    """A fresh in-memory vector store per test (cheap; isolated from every other store)."""
    from teola_plugin.engines import ChromaVectorStore

    engine = _started(aio, ChromaVectorStore())
    yield engine
    aio.run(engine.close())


@pytest.fixture(scope="session")
def corpus_embeddings(aio, embedder) -> Callable[[str], tuple[list, np.ndarray]]:
    """``get(name) -> (passages, embeddings)`` for a bundled corpus, embedded by the embedder.

    Long passages embed at ~40/s on 2 CPU cores (hotpotqa-dev-500 takes ~2 min), so the
    result is kept on disk, keyed by the model and the exact texts, and later sessions
    load it in milliseconds: under ``$TEOLA_CACHE_DIR`` (default
    ``$XDG_CACHE_HOME/teola_plugin``, i.e. ``~/.cache/teola_plugin``), outside the work
    tree so that fresh clones on the same machine (CI) reuse it. Delete it to recompute.
    """
    from teola_plugin import datasets

    root = os.environ.get("TEOLA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "teola_plugin")
    cache_dir = Path(root) / "test-corpus-embeddings"
    cache_dir.mkdir(parents=True, exist_ok=True)
    model_id = embedder.describe()["model_path"]
    memo: dict[str, tuple[list, np.ndarray]] = {}

    def get(name: str) -> tuple[list, np.ndarray]:
        if name not in memo:
            passages = datasets.load_corpus(name)
            h = hashlib.sha256(model_id.encode())
            for p in passages:
                h.update(p.id.encode() + b"\0" + p.text.encode() + b"\0")
            path = cache_dir / f"{name}-{h.hexdigest()[:16]}.npy"
            if path.exists():
                emb = np.load(path)
            else:
                emb = aio.run(embedder.embed([p.text for p in passages]))
                tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
                np.save(tmp, emb)
                os.replace(tmp, path)  # atomic: a concurrent session never reads half a file
            memo[name] = (passages, emb)
        return memo[name]

    return get

"""A process killed (SIGKILL) in the middle of ingesting into a persistent chromadb
directory: on restart every acknowledged document is there, whole, and no insert call is
half-applied. Real chromadb, real files; the vectors are deterministic per document id
(what is under test is the store's durability, not the embedder)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tests.reliability import repo_root

PER_CALL = 20
DIM = 32

WRITER = textwrap.dedent(f"""
    import asyncio, sys
    import numpy as np
    from teola_plugin.engines import ChromaVectorStore

    def doc(i):
        rng = np.random.default_rng(i)
        return f"doc-{{i}}", rng.standard_normal({DIM}).astype(np.float32), f"text of document {{i}} " * 3

    async def main(path):
        store = ChromaVectorStore(persist_dir=path)
        await store.start()
        await store.create_index("docs", {DIM})
        call = 0
        while True:  # until killed
            batch = [doc(call * {PER_CALL} + j) for j in range({PER_CALL})]
            await store.insert("docs", [b[0] for b in batch], np.stack([b[1] for b in batch]),
                               [b[2] for b in batch], [{{"call": call}} for _ in batch])
            print(f"ACK {{call}}", flush=True)  # acknowledged: insert returned
            call += 1

    asyncio.run(main(sys.argv[1]))
""")


def expected(i: int) -> tuple[str, np.ndarray, str]:
    rng = np.random.default_rng(i)
    return f"doc-{i}", rng.standard_normal(DIM).astype(np.float32), f"text of document {i} " * 3


@pytest.mark.parametrize("acks_before_kill", [3, 12])
def test_kill_during_ingestion_keeps_every_acknowledged_document_whole(tmp_path, acks_before_kill):
    path = tmp_path / "chroma"
    env = {**os.environ, "ANONYMIZED_TELEMETRY": "False"}
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=repo_root(), env=env)
    acked: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(acked) < acks_before_kill:
            line = proc.stdout.readline()
            assert line, f"writer exited early: {proc.stderr.read()[-2000:]}"
            acked.append(int(line.split()[1]))
            assert time.monotonic() < deadline, "writer too slow"
    finally:
        proc.send_signal(signal.SIGKILL)  # mid-ingestion: it never stops writing on its own
        proc.wait(30)

    import asyncio

    from teola_plugin.engines import ChromaVectorStore

    async def reopen():
        store = ChromaVectorStore(persist_dir=path)
        await store.start()
        try:
            coll = store._client.get_collection(store._prefix + "docs")
            got = coll.get(include=["embeddings", "documents", "metadatas"])
            first = expected(acked[0] * PER_CALL)
            hits = await store.search("docs", first[1][None, :], k=1)
            return got, hits, await store.count("docs")
        finally:
            await store.close()

    got, hits, count = asyncio.run(reopen())
    ids = got["ids"]
    assert count == len(ids)
    by_call: dict[int, set[str]] = {}
    for doc_id, vec, text, meta in zip(ids, got["embeddings"], got["documents"], got["metadatas"]):
        i = int(doc_id.split("-")[1])
        want_id, want_vec, want_text = expected(i)
        assert text == want_text and meta == {"call": i // PER_CALL}  # whole, not half-written
        assert np.allclose(np.asarray(vec, dtype=np.float32), want_vec, atol=1e-6)
        by_call.setdefault(i // PER_CALL, set()).add(doc_id)
    for call in acked:  # every acknowledged document is there
        assert len(by_call.get(call, ())) == PER_CALL, f"acknowledged call {call} lost documents"
    for call, members in by_call.items():  # an unacknowledged call: all of it or nothing
        assert len(members) == PER_CALL, f"call {call} half-applied: {len(members)} of {PER_CALL}"
    assert hits[0][0].id == f"doc-{acked[0] * PER_CALL}"  # and the index still answers

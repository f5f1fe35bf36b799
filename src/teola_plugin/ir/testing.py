"""Deterministic stand-in engines for the reference interpreter (tests, docs, fidelity checks).

Every handler is a pure function of its inputs (plus the toy vector store), obeys the
splitting law of ir/ops.py, and hashes with sha256 (Python's ``hash`` is salted per
process), so two runs of a graph and of any optimized version of it must agree exactly.
The runtime can be checked against the same handlers.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .graph import PGraph
from .interpreter import Interpreter
from .node import Primitive
from .ops import Op

Handler = Callable[[Primitive, dict[str, Any]], Mapping[str, Any]]


@dataclass(frozen=True)
class ToyHit:
    id: str
    text: str
    score: float


def digest(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:8], "big")


def toy_vector(text: str, dim: int = 4) -> tuple[float, ...]:
    return tuple(((digest(text, i) % 2001) - 1000) / 1000 for i in range(dim))


def latest_first_order(graph: PGraph) -> list[str]:
    """A topological order that prefers the most recently added ready node: any result that
    changes under it depended on an ordering no edge guarantees."""
    rank = {name: i for i, name in enumerate(graph._prims)}
    indegree = {n: len(graph.predecessors(n)) for n in rank}
    ready = [(-rank[n], n) for n, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, name = heapq.heappop(ready)
        order.append(name)
        for s in graph.successors(name):
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(ready, (-rank[s], s))
    return order


WEB = [f"web page {i} about topic {i % 7}" for i in range(40)]


class ToyEngines:
    """Handlers for every engine op. ``store`` maps an INDEX handle to its (vector, doc)
    rows: vector_insert appends and returns the handle, as a real store does; ``calls``
    counts handler calls per op; ``prefixes`` holds what llm_partial_prefill cached and
    ``prefix_hits`` the prompts that found their prefix cached."""

    def __init__(self, chunk_words: int = 3) -> None:
        self.chunk_words = chunk_words
        self.store: dict[Any, list[tuple[tuple[float, ...], str]]] = {}
        self.calls: Counter[str] = Counter()
        self.prefixes: list[str] = []
        self.prefix_hits: list[str] = []
        self.log: list[Any] = []

    def handlers(self) -> dict[Op, Handler]:
        ops = [Op.CHUNK, Op.EMBED, Op.VECTOR_INSERT, Op.VECTOR_SEARCH, Op.RERANK, Op.SEARCH,
               Op.LLM_PARTIAL_PREFILL, Op.LLM_PREFILL, Op.LLM_DECODE, Op.OPAQUE]
        return {op: self._counted(op, getattr(self, op.value)) for op in ops}

    def run(self, graph: PGraph, *, adversarial: bool = False, **inputs: Any) -> dict[str, Any]:
        """Interpret ``graph`` on these engines; ``adversarial`` runs ready nodes newest
        first, the opposite of the graph's own tie-breaking."""
        order = latest_first_order(graph) if adversarial else None
        return Interpreter(graph, self.handlers(), order=order).run(**inputs)

    def _counted(self, op: Op, fn: Handler) -> Handler:
        def handler(prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
            self.calls[op.value] += 1
            return fn(prim, inputs)
        return handler

    # -- engines -------------------------------------------------------------------------
    def chunk(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        chunks = []
        for doc in inputs["docs"]:
            words = str(doc).split()
            chunks += [" ".join(words[i:i + self.chunk_words]) for i in range(0, len(words), self.chunk_words)]
        return {"chunks": chunks, "texts": list(chunks)}

    def embed(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        return {"vectors": [toy_vector(t) for t in inputs["texts"]]}

    def vector_insert(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        if len(inputs["vectors"]) != len(inputs["docs"]):
            raise ValueError("vectors and docs differ in length")
        self.store.setdefault(inputs["index"], []).extend(zip(inputs["vectors"], map(str, inputs["docs"])))
        return {"index": inputs["index"]}

    def vector_search(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        rows = self.store.get(inputs["index"], [])
        k = int(prim.attrs.get("top_k", 3))
        out = []
        for q in inputs["vectors"]:
            scored = sorted(((round(sum(a * b for a, b in zip(q, v)), 9), doc) for v, doc in rows),
                            key=lambda sd: (-sd[0], sd[1]))  # a function of the rows' multiset
            out.append([ToyHit(doc, doc, s) for s, doc in scored[:k]])
        return {"hits": out}

    def rerank(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        q = inputs["query"]
        rescored = [ToyHit(h.id, h.text, (digest(q, h.text) % 1000) / 1000) for h in inputs["hits"]]
        rescored.sort(key=lambda h: (-h.score, h.id))
        return {"hits": rescored[: int(prim.attrs.get("top_n", 3))]}

    def search(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        k = int(prim.attrs.get("top_k", 3))
        out = []
        for q in inputs["queries"]:
            ranked = sorted(WEB, key=lambda page: (digest(q, page), page))[:k]
            out.append([ToyHit(p, p, 1.0 / (r + 1)) for r, p in enumerate(ranked)])
        return {"hits": out}

    def llm_partial_prefill(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        self.prefixes.append(inputs["prompt"])
        return {"done": None}

    def llm_prefill(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        prompt = inputs["prompt"]
        if any(prompt.startswith(p) for p in self.prefixes):
            self.prefix_hits.append(prompt)
        return {"state": prompt}

    def llm_decode(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        prompt = inputs["state"]
        h = digest(prompt)
        if prim.attrs.get("parse") == "lines":
            n = int(prim.attrs.get("est_items", 3))
            return {"text": "\n".join(f"query {i} on {h % 997}" for i in range(n))}
        return {"text": f"answer {h % 100_000} from {len(prompt)} chars"}

    def opaque(self, prim: Primitive, inputs: dict[str, Any]) -> Mapping[str, Any]:
        value = (prim.attrs.get("tag"), tuple(sorted((k, repr(v)) for k, v in inputs.items())))
        self.log.append(value)
        return {port: value for port in prim.outputs}

"""Batching policies of the engine schedulers: *which* queued requests run next, and how many.

The rule (topology-aware, the default): smallest key first,

    key(request) = (latest_start_s, seq)
    latest_start_s = query_arrival_s + critical_path_s - remaining_s

``remaining_s`` is the cost-model length of the longest path from this primitive to the end
of its query, this primitive included; ``critical_path_s`` is the query's whole critical path
when it started. ``latest_start_s`` is when the primitive must start for its query to finish
as early as it would alone (least laxity first). Within a query that is "longest remaining
path first": what is on the critical path goes before what has slack. Across queries, a
newer query's work goes before an older query's only while the older request still has
slack to give, so nothing starves: a request yields only to work whose own latest start
is earlier. (The rule used to be ``(-remaining_s, query_arrival_s)``: under load a newer
query's 100-passage upload ran before an older query's one-text question embedding, however
old, so that query waited for every upload that arrived after it: docs/scheduling.md.)

``fifo`` (arrival order only) is the ablation baseline; ``remaining_path`` the old rule.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Priority:
    """What a graph scheduler tells an engine scheduler about one request. The defaults are
    a request of its own: arrived now, on its critical path, nothing after it."""

    remaining_s: float = 0.0  # critical path from this primitive to the query's end
    query_arrival_s: float = field(default_factory=time.time)  # when the query started (time.time())
    query_id: str = ""
    critical_path_s: float | None = None  # the query's, when it started; None: remaining_s (on its path)

    @property
    def latest_start_s(self) -> float:
        """When this request must start for its query to finish as early as it would alone."""
        path = self.remaining_s if self.critical_path_s is None else self.critical_path_s
        return self.query_arrival_s + path - self.remaining_s


@dataclass(frozen=True)
class BatchPolicy:
    """How one engine forms batches.

    max_batch_size  requests merged into one engine call (vLLM: how many are in flight)
    max_wait_s      how long the oldest request may wait for a fuller batch while the engine
                    has a free slot. 0 (the default) is work-conserving: an idle engine starts
                    at once, and while it is busy requests pile up and leave together as the
                    next batch, which batches across queries without adding any delay
    max_batch_items work items (texts, hits, vectors, queries) in one engine call; None = no
                    cap. A CPU model gains little throughput from bigger batches, so merging
                    many requests only makes the first one wait for the last; the cap also
                    keeps the shards of a decomposed stage from being merged back into one
                    batch, which would undo their pipelining
    max_concurrent  batches running at once on this engine (1 for a CPU model: two
                    batches would only fight for the same cores)
    priority        "topology" (the rule above), "remaining_path" or "fifo"
    """

    max_batch_size: int = 32
    max_wait_s: float = 0.0
    max_batch_items: int | None = None
    max_concurrent: int = 1
    priority: str = "topology"

    def __post_init__(self) -> None:
        if (self.max_batch_size < 1 or self.max_concurrent < 1 or self.max_wait_s < 0
                or (self.max_batch_items is not None and self.max_batch_items < 1)):
            raise ValueError(f"invalid BatchPolicy {self}")
        if self.priority not in PRIORITY_RULES:
            raise ValueError(f"unknown priority rule {self.priority!r}; known: {sorted(PRIORITY_RULES)}")

    def key(self, priority: Priority, seq: int) -> tuple[Any, ...]:
        return PRIORITY_RULES[self.priority](priority, seq)

    def admits(self, size: int, items: int, n: int) -> bool:
        """The one rule that cuts batches (the engine scheduler's, and a Ray handle's grouping
        of one actor call): may a request of ``n`` work items join a batch that already holds
        ``size`` requests and ``items`` items? A request always starts an empty batch."""
        return size == 0 or (size < self.max_batch_size
                             and (self.max_batch_items is None or items + n <= self.max_batch_items))


def topology_key(p: Priority, seq: int) -> tuple[float, int]:
    return (p.latest_start_s, seq)


def remaining_path_key(p: Priority, seq: int) -> tuple[float, float, int]:
    return (-p.remaining_s, p.query_arrival_s, seq)


def fifo_key(p: Priority, seq: int) -> tuple[int]:
    return (seq,)


PRIORITY_RULES = {"topology": topology_key, "remaining_path": remaining_path_key, "fifo": fifo_key}

# Defaults per engine kind. vLLM batches continuously inside itself, so its scheduler only
# orders admission: many in flight, no waiting. CPU models run one batch at a time, capped
# in work items: on a CPU the embedder and the reranker process about as many items per
# second at batch 8 as at batch 64 (docs/benchmarks/engine_profiles.json), so a bigger
# batch only holds its first request back. (scripts/bench_batching.py and `teola demo`
# showed both effects: 32 queries waiting on one rerank batch; the shards of a decomposed
# ingestion merged back into one embed batch.)
DEFAULT_POLICIES: dict[str, BatchPolicy] = {
    "llm": BatchPolicy(max_batch_size=64, max_concurrent=64),
    "embedder": BatchPolicy(max_batch_size=64, max_batch_items=48, max_concurrent=1),
    "vector_store": BatchPolicy(max_batch_size=64, max_batch_items=2048, max_concurrent=1),
    "reranker": BatchPolicy(max_batch_size=32, max_batch_items=32, max_concurrent=1),
    "search": BatchPolicy(max_batch_size=64, max_batch_items=256, max_concurrent=1),
}


def default_policy(kind: str) -> BatchPolicy:
    return DEFAULT_POLICIES.get(kind, BatchPolicy())

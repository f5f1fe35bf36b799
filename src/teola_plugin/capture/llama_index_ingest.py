"""Document ingestion into a ``VectorStoreIndex`` under the executor.

Two modes (``TeolaExecutor(defer_ingestion=...)``):

* Eager (``defer_ingestion=False``): the embedding step of ``from_documents`` / ``insert`` /
  ``insert_nodes`` (``_get_node_with_embedding``) is one ``embed`` primitive run as a Teola
  query at call time (:func:`embedding_graph`); the call returns once the nodes are stored.
* Deferred (default): ``VectorStoreIndex._add_nodes_to_index`` — reached after LlamaIndex's
  own transformations / node parser ran, so node ids are LlamaIndex's — only records the
  nodes (:class:`PendingIngestion` on the index). The next query / retrieve through the
  executor on a ``VectorIndexRetriever`` of that index joins them into its graph
  (:func:`join_pending`): ``embed(pending nodes) -> vector_insert`` into the user's store
  (``FrameworkVectorStoreEngine``, LlamaIndex's own ``_add_nodes_to_index`` with the
  vectors, committed in the original node order whatever order shards finish in), the
  query embedding independent of them and the search depending on the insert. Every other
  read or write path flushes first (``llama_index/hooks.py``); a failure puts the
  uncommitted nodes back, so the next access retries them.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..ir.graph import PGraph
from ..ir.node import Ref
from ..ir.ops import Op
from ..ir.ports import PortType
from ..runtime.values import IndexHandle
from .llama_index_progress import NodeProgress

logger = logging.getLogger(__name__)

FLUSH_WAIT_S = 600.0  # bound on waiting for another thread's in-flight ingestion


def embedding_graph(engine: str, n_texts: int) -> PGraph:
    """``texts`` -> ``vectors`` on ``engine``: the nodes' embeddings as one primitive."""
    graph = PGraph("llama_index_ingest")
    texts = graph.input("texts", PortType.TEXTS)
    embed = graph.add(Op.EMBED, inputs={"texts": texts}, engine=engine, attrs={"est_items": n_texts},
                      origin="VectorStoreIndex")
    graph.output("vectors", embed.out())
    graph.validate()
    return graph


# -- pending state ------------------------------------------------------------------------------
@dataclass
class PendingBatch:
    """One ``_add_nodes_to_index(index_struct, nodes, **insert_kwargs)`` call, not yet run."""

    index_struct: Any
    nodes: list[Any]
    insert_kwargs: dict[str, Any] = field(default_factory=dict)
    show_progress: bool = False  # LlamaIndex's show_progress for this call: its embedding bar


_REGISTRY: dict[int, PendingIngestion] = {}  # strong refs: pending work is never garbage
_REGISTRY_LOCK = threading.Lock()
_ATEXIT = False
_ADD_NODES: Any = None  # VectorStoreIndex._add_nodes_to_index as LlamaIndex wrote it (set by hooks)


def set_original_add_nodes(fn: Any) -> None:
    global _ADD_NODES
    _ADD_NODES = fn


class PendingIngestion:
    """The nodes acknowledged to the caller but not yet stored, for one index, in order.
    At most one :class:`Claim` (a run committing them) exists at a time."""

    def __init__(self, index: Any) -> None:
        self.index = index
        self.cond = threading.Condition()
        self.batches: list[PendingBatch] = []
        self.claim: Claim | None = None

    @staticmethod
    def of(index: Any, create: bool = False) -> PendingIngestion | None:
        state = index.__dict__.get("_teola_pending")
        if state is None and create:
            state = index.__dict__["_teola_pending"] = PendingIngestion(index)
        return state

    def add(self, batch: PendingBatch) -> None:
        global _ATEXIT
        with self.cond:
            self.batches.append(batch)
        with _REGISTRY_LOCK:
            _REGISTRY[id(self)] = self
            if not _ATEXIT:  # registered after the runtime's own handlers, so it runs before them
                atexit.register(_flush_at_exit)
                _ATEXIT = True

    def has_work(self) -> bool:
        with self.cond:
            return bool(self.batches) or self.claim is not None

    def pending_index_ids(self) -> list[str]:
        """Ids ``as_retriever`` would have seen in ``index_struct.nodes_dict`` had the
        pending nodes been stored (``_add_nodes_to_index``'s rule)."""
        from llama_index.core.schema import ImageNode, IndexNode

        index = self.index
        all_nodes = not index._vector_store.stores_text or index._store_nodes_override
        with self.cond:
            batches = list(self.batches) + (self.claim.remaining() if self.claim else [])
        return [n.node_id for b in batches for n in b.nodes if all_nodes or isinstance(n, (ImageNode, IndexNode))]

    def try_claim(self, expected: list[PendingBatch]) -> Claim | None:
        """Take exactly ``expected`` (what a trace saw) for a run; ``None`` if it changed."""
        with self.cond:
            if self.claim is not None or len(self.batches) != len(expected) or any(
                    a is not b for a, b in zip(self.batches, expected)):
                return None
            self.claim, self.batches = Claim(self, self.batches, progress=True), []
            return self.claim

    def flush(self, timeout_s: float = FLUSH_WAIT_S) -> None:
        """Store everything pending with LlamaIndex's own code (embedding routed as usual);
        waits (bounded) for a run that holds a claim. On failure the nodes stay pending."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.cond:
                while self.claim is not None:
                    left = deadline - time.monotonic()
                    if left <= 0 or not self.cond.wait(left) and self.claim is not None:
                        raise TimeoutError(f"pending ingestion into {type(self.index).__name__} still in flight "
                                           f"after {timeout_s:.0f}s")
                if not self.batches:
                    _unregister(self)
                    return
                claim = self.claim = Claim(self, self.batches)
                self.batches = []
            try:
                claim.commit_eagerly()
            except BaseException:
                claim.release()
                raise

    def _done(self, claim: Claim, leftover: list[PendingBatch]) -> None:
        with self.cond:
            if self.claim is claim:
                self.claim = None
                self.batches[:0] = leftover  # uncommitted nodes go first again: order kept
            empty = not self.batches
            self.cond.notify_all()
        if empty:
            _unregister(self)


def _unregister(state: PendingIngestion) -> None:
    with _REGISTRY_LOCK:
        if not state.has_work():
            _REGISTRY.pop(id(state), None)


class Claim:
    """Commits a run's share of pending batches, in order. A graph run hands it vectors by
    node position (:meth:`receive`, from any shard in any order); only the ready prefix is
    stored, so the store, docstore and index struct see plain LlamaIndex's insertion order."""

    def __init__(self, state: PendingIngestion, batches: list[PendingBatch], progress: bool = False) -> None:
        self.state = state
        self.batches = batches
        # A graph run's bar counts vectors as they arrive; a flush embeds through
        # _add_nodes_to_index, whose embedding step shows its own bar.
        self.progress = NodeProgress.for_batches(batches if progress else [])
        self.lock = threading.Lock()
        self.batch_i = 0  # first batch not fully stored
        self.node_i = 0  # first node of it not stored
        self.vectors: dict[int, list[float]] = {}  # flat position -> vector
        self.offsets = []
        total = 0
        for b in batches:
            self.offsets.append(total)
            total += len(b.nodes)
        self.total = total
        self.finished = False
        self.closed = False  # released: a late insert of an abandoned run must not store twice

    def remaining(self) -> list[PendingBatch]:
        out = []
        for k in range(self.batch_i, len(self.batches)):
            b = self.batches[k]
            start = self.node_i if k == self.batch_i else 0
            if start < len(b.nodes):
                out.append(PendingBatch(b.index_struct, b.nodes[start:], b.insert_kwargs, b.show_progress))
        return out

    def _store(self, batch: PendingBatch, nodes: list[Any]) -> None:
        from .llama_index import framework_passthrough

        with framework_passthrough():  # the nodes carry their vectors: nothing is embedded again
            _ADD_NODES(self.state.index, batch.index_struct, nodes, **batch.insert_kwargs)

    def commit_eagerly(self) -> None:
        """Run LlamaIndex's ``_add_nodes_to_index`` on each batch (its embedding step routed
        through the executor when one is installed)."""
        for k in range(self.batch_i, len(self.batches)):
            b = self.batches[k]
            _ADD_NODES(self.state.index, b.index_struct, b.nodes[self.node_i:], show_progress=b.show_progress,
                       **b.insert_kwargs)
            self.batch_i, self.node_i = k + 1, 0
        self._finish()

    def receive(self, positions: list[int], vectors: list[Any]) -> None:
        """Vectors for flat node positions; stores whatever prefix is now complete."""
        with self.lock:
            if self.closed:
                raise RuntimeError("insert of an abandoned ingestion run (its nodes are pending again)")
            for p, v in zip(positions, vectors):
                self.vectors[int(p)] = [float(x) for x in v]
            self.progress.advance(int(p) for p in positions)
            while self.batch_i < len(self.batches):
                b = self.batches[self.batch_i]
                base = self.offsets[self.batch_i]
                end = self.node_i
                while end < len(b.nodes) and base + end in self.vectors:
                    end += 1
                if end > self.node_i:
                    nodes = []
                    for j in range(self.node_i, end):
                        node = b.nodes[j].model_copy()
                        node.embedding = self.vectors.pop(base + j)
                        nodes.append(node)
                    self._store(b, nodes)
                    self.node_i = end
                if self.node_i < len(b.nodes):
                    return
                self.batch_i, self.node_i = self.batch_i + 1, 0
            self._finish()

    def _finish(self) -> None:
        index = self.state.index
        struct = getattr(index, "_index_struct", None)  # (unset while from_documents is still building)
        if struct is not None:  # the index store's copy was taken before the nodes arrived
            index._storage_context.index_store.add_index_struct(struct)
        self.finished = True
        self.progress.close()
        self.state._done(self, [])

    def release(self) -> None:
        """A failed or abandoned run: what is not stored is pending again (first)."""
        with self.lock:
            if self.finished or self.closed:
                return
            self.closed = True
            leftover = self.remaining()
            self.progress.close()
        self.state._done(self, leftover)


def pending_states() -> list[PendingIngestion]:
    with _REGISTRY_LOCK:
        return list(_REGISTRY.values())


def flush_all(exclude: frozenset[int] = frozenset()) -> None:
    """Flush every index with pending ingestion (``exclude``: ``id`` of states to skip)."""
    errors = []
    for state in pending_states():
        if id(state) in exclude:
            continue
        try:
            state.flush()
        except Exception as exc:  # noqa: BLE001 — flush the others, then report
            errors.append(exc)
    if errors:
        raise errors[0]


def _flush_at_exit() -> None:
    try:
        flush_all()
    except Exception:  # noqa: BLE001 — the process is ending: say what was not stored
        left = sum(len(b.nodes) for s in pending_states() for b in s.batches)
        logger.exception("TeolaExecutor: %d deferred LlamaIndex nodes could not be stored at exit", left)


def flush_index(index: Any) -> None:
    state = PendingIngestion.of(index)
    if state is not None and state.has_work():
        state.flush()


# -- joining pending nodes into a query's graph ---------------------------------------------------
@dataclass
class Join:
    """A trace's use of one index's pending nodes: what it saw, and where the insert goes.
    ``join_id`` (unique per trace) is carried by the inserted documents; the store engine
    routes them to this join's claim by it, never by index name, so two runs touching one
    index (a late insert of an abandoned run, a newer run's claim) cannot meet."""

    state: PendingIngestion
    batches: list[PendingBatch]
    engine: Any  # FrameworkVectorStoreEngine
    index_name: str
    join_id: str = ""
    claim: Claim | None = None
    inserted: Ref | None = None  # the insert's INDEX output


def join_pending(tr: Any, retriever: Any, index: Ref, engine_name: str) -> Ref:
    """``index`` (the retriever's store handle), after the index's pending nodes were embedded
    and inserted by primitives of this graph; unchanged when nothing is pending or the nodes
    cannot be joined (those are then flushed before the graph runs)."""
    from llama_index.core.schema import MetadataMode

    from .llama_index_models import embedder_engine_for

    owner = getattr(retriever, "_index", None)
    state = PendingIngestion.of(owner) if owner is not None else None
    if state is None or not getattr(tr.ctx, "join_ingestion", False):
        return index
    with state.cond:
        in_flight, batches = state.claim is not None, list(state.batches)
    if in_flight:  # another run is storing them: wait for it (flush) before this graph runs
        tr.traced.ingestions.append(Join(state, batches, None, ""))
        return index
    if not batches:
        return index
    handle: IndexHandle = tr.traced.bound_inputs[index.port]  # store_index's bound input
    earlier = next((j for j in tr.traced.ingestions if j.state is state), None)
    if earlier is not None and earlier.inserted is not None and earlier.index_name == handle.name:
        return earlier.inserted  # the same retriever searching again (fusion): after the same insert
    nodes = [n for b in batches for n in b.nodes]
    embedder, _ = embedder_engine_for(tr.ctx.runtime, owner._embed_model)
    # Not joined (flushed before the graph runs): no engine for the model, nodes that bring
    # their own embeddings, or a second retriever of the index in this graph.
    if embedder is None or any(n.embedding is not None for n in nodes) or earlier is not None:
        tr.traced.ingestions.append(Join(state, batches, None, ""))
        return index
    engine = tr.traced.local_engines[engine_name]
    name = tr.graph.unique_name("ingest")
    texts = tr.bind_input(f"{name}_texts", [n.get_content(metadata_mode=MetadataMode.EMBED) for n in nodes],
                          PortType.TEXTS)
    # Positions, not node ids, name the nodes: a batch may repeat an id, and the store commits by
    # order. The join id routes them to this run's claim (FrameworkVectorStoreEngine.expect).
    join_id = f"{name}-{uuid.uuid4().hex}"
    docs = tr.bind_input(f"{name}_docs", [{"id": str(i), "text": "", "metadata": {"claim": join_id}}
                                          for i in range(len(nodes))], PortType.DOCS)
    # Added without the tracer's module-order edge: the query's own embedding does not wait.
    embed = tr.graph.add(Op.EMBED, name=f"{name}_embed", inputs={"texts": texts}, engine=embedder,
                         attrs={"est_items": len(nodes)}, origin="VectorStoreIndex")
    insert = tr.graph.add(Op.VECTOR_INSERT, name=f"{name}_insert",
                          inputs={"index": index, "vectors": embed.out("vectors"), "docs": docs},
                          engine=engine_name, attrs={"est_items": len(nodes)}, origin="VectorStoreIndex")
    tr.traced.ingestions.append(Join(state, batches, engine, handle.name, join_id, inserted=insert.out("index")))
    return insert.out("index")

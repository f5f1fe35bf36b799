"""Deferred ingestion's state: nodes acknowledged to the caller, not yet stored.

Only an index whose stores are all LlamaIndex's in-memory ones is deferred
(``ingestion_policy.py``). ``VectorStoreIndex._add_nodes_to_index`` — reached after
LlamaIndex's own transformations, so node ids are LlamaIndex's — then records its nodes here
(:class:`PendingIngestion` on the index, in call order). They are stored by whichever comes
first:

* the next query / retrieve through the executor on that index, which claims them and embeds
  and inserts them in its own graph (``capture/llama_index_ingest.py``: ``join_pending``;
  committed in node order whatever order shards finish in: :class:`Claim`);
* any other read or write of the index, or read of its in-memory stores (the docstore's and
  index store's key-value store, the vector store: ``storage_context.docstore.docs``,
  ``to_dict()``), which flushes first (``ingest_hooks.py``; :func:`flush_stores`);
* the idle flush: a background thread stores what nobody claimed within ``idle_flush_s``
  (``TeolaExecutor``), so pending state is bounded in time.

A failure puts the uncommitted nodes back (first, order kept); the next access retries them
and raises where the caller sees it. When the runtime that would embed them shuts down, or the
interpreter exits, pending nodes are *handed back*: stored later, if anything reads them, by
LlamaIndex's own code (``_add_nodes_to_index`` with the index's embed model), so no flush ever
starts engines while the process ends.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import logging
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..capture.llama_index import framework_passthrough
from ..capture.llama_index_progress import NodeProgress

logger = logging.getLogger(__name__)

IDLE_FLUSH_S = 5.0  # default: deferred nodes nobody claimed this long are stored in the background
FLUSH_WAIT_S = 600.0  # bound on waiting for another thread's in-flight ingestion
RETRY_MAX_S = 60.0  # a failing idle flush retries after 2x, 4x ... its idle time, at most this
EXIT_WAIT_S = 10.0  # at exit: how long an idle flush already storing nodes gets to finish


@dataclass
class PendingBatch:
    """One ``_add_nodes_to_index(index_struct, nodes, **insert_kwargs)`` call, not yet run."""

    index_struct: Any
    nodes: list[Any]
    insert_kwargs: dict[str, Any] = field(default_factory=dict)
    show_progress: bool = False  # LlamaIndex's show_progress for this call: its embedding bar


_REGISTRY: dict[int, PendingIngestion] = {}  # strong refs: pending work is never garbage
_STATES: dict[int, PendingIngestion] = {}  # id(index) -> its state, while the index lives
_REGISTRY_LOCK = threading.Lock()
_ADD_NODES: Any = None  # VectorStoreIndex._add_nodes_to_index as LlamaIndex wrote it (set by hooks)


def set_original_add_nodes(fn: Any) -> None:
    global _ADD_NODES
    _ADD_NODES = fn


_NO_FLUSH: contextvars.ContextVar[bool] = contextvars.ContextVar("teola_no_flush", default=False)


@contextlib.contextmanager
def no_flush() -> Iterator[None]:
    """Inside, reading the index or its stores does not store pending nodes first: LlamaIndex's
    own code storing them (a flush, a run's inserts) or only taking references (retriever
    construction, insert), and a lowered search (it searches what its run joined)."""
    token = _NO_FLUSH.set(True)
    try:
        yield
    finally:
        _NO_FLUSH.reset(token)


def flushing() -> bool:
    """Does a read of an index or its stores made now store their pending nodes first?"""
    return not _NO_FLUSH.get()


def stores_of(index: Any) -> list[Any]:
    """What ``index`` stores into: its vector stores, and the key-value stores under its
    docstore and index store (every read of those goes through them)."""
    context = index._storage_context
    return [index._vector_store, *context.vector_stores.values(),
            getattr(context.docstore, "_kvstore", None), getattr(context.index_store, "_kvstore", None)]


def flush_stores(store: Any) -> None:
    """Store the pending nodes of every index storing into ``store`` before it is read: plain
    LlamaIndex had stored them when the call that added them returned."""
    if not _REGISTRY or _NO_FLUSH.get():  # the common case: nothing pending
        return
    for state in pending_states():
        if state.has_work() and any(s is store for s in stores_of(state.index)):
            state.flush()


class PendingIngestion:
    """The nodes acknowledged to the caller but not yet stored, for one index, in order.
    At most one :class:`Claim` (a run committing them) exists at a time."""

    def __init__(self, index: Any) -> None:
        # Weak: the index's state lives beside it (``_STATES``), not on it, so the index copies
        # and pickles as plain's; held strongly while nodes are pending (``_pinned``), so
        # acknowledged nodes are stored even when the caller dropped the index itself.
        self._index = weakref.ref(index)
        self._pinned: Any = None
        self.cond = threading.Condition()
        self.batches: list[PendingBatch] = []
        self.claim: Claim | None = None
        self.runtime: Any = None  # the runtime whose engines were to embed them
        self.idle_flush_s: float | None = None  # None: only queries, reads and persist store them
        self.flush_due: float | None = None  # monotonic time of the next idle flush
        self.handed_back = False  # stored by LlamaIndex's own code, never by a runtime

    @property
    def index(self) -> Any:
        index = self._index()
        if index is None:  # cannot happen while nodes are pending (pinned)
            raise ReferenceError("the index of this pending ingestion was garbage collected")
        return index

    @staticmethod
    def of(index: Any, create: bool = False) -> PendingIngestion | None:
        with _REGISTRY_LOCK:
            state = _STATES.get(id(index))
            if state is None and create:
                state = _STATES[id(index)] = PendingIngestion(index)
                weakref.finalize(index, _STATES.pop, id(index), None)  # by id: an index need not hash
        return state

    def add(self, batch: PendingBatch, runtime: Any = None, idle_flush_s: float | None = None) -> None:
        with self.cond:
            self.batches.append(batch)
            if runtime is not None:
                self.runtime, self.handed_back = runtime, False
            self.idle_flush_s = idle_flush_s
            self._schedule_idle_flush(time.monotonic())
        with _REGISTRY_LOCK:
            _REGISTRY[id(self)] = self
            self._pinned = self.index
        _register_exit_hand_back()
        if idle_flush_s is not None:
            IDLE_FLUSHER.wake()

    def _schedule_idle_flush(self, now: float, after_s: float | None = None) -> None:
        """(Under ``cond``.) The next idle flush, counted from the latest change."""
        wait = after_s if after_s is not None else self.idle_flush_s
        self.flush_due = None if wait is None or not self.batches else now + wait

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
        """Take exactly ``expected`` (what a trace saw) for a run; ``None`` if it changed or
        the nodes were handed back to LlamaIndex's own code."""
        with self.cond:
            if self.handed_back or self.claim is not None or len(self.batches) != len(expected) or any(
                    a is not b for a, b in zip(self.batches, expected)):
                return None
            self.claim, self.batches = Claim(self, self.batches, progress=True), []
            self.flush_due = None
            return self.claim

    def flush(self, timeout_s: float = FLUSH_WAIT_S) -> None:
        """Store everything pending with LlamaIndex's own code (embedding routed through the
        executor unless handed back); waits (bounded) for a run that holds a claim. On failure
        the nodes stay pending and the error is raised."""
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
                self.batches, self.flush_due = [], None
                plain = self.handed_back
            try:
                if plain:  # LlamaIndex's own embedding code, not the executor's engines
                    with framework_passthrough():
                        claim.commit_eagerly()
                else:
                    claim.commit_eagerly()
            except BaseException:
                claim.release()
                raise

    def hand_back(self) -> None:
        """From now on the nodes are stored by LlamaIndex's own code (no runtime needed)."""
        with self.cond:
            self.handed_back, self.flush_due = True, None

    def _done(self, claim: Claim, leftover: list[PendingBatch]) -> None:
        with self.cond:
            if self.claim is claim:
                self.claim = None
                self.batches[:0] = leftover  # uncommitted nodes go first again: order kept
                if not self.handed_back:
                    self._schedule_idle_flush(time.monotonic())
            empty = not self.batches
            self.cond.notify_all()
        if empty:
            _unregister(self)
        elif self.flush_due is not None:
            IDLE_FLUSHER.wake()


def _unregister(state: PendingIngestion) -> None:
    with _REGISTRY_LOCK:
        if not state.has_work():
            _REGISTRY.pop(id(state), None)
            state._pinned = None


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
        with framework_passthrough(), no_flush():  # the nodes carry their vectors: nothing is embedded again
            _ADD_NODES(self.state.index, batch.index_struct, nodes, **batch.insert_kwargs)

    def commit_eagerly(self) -> None:
        """Run LlamaIndex's ``_add_nodes_to_index`` on each batch (its embedding step routed
        through the executor when one is installed)."""
        for k in range(self.batch_i, len(self.batches)):
            b = self.batches[k]
            with no_flush():  # its own reads of the stores it is filling
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


def flush_index(index: Any) -> None:
    state = PendingIngestion.of(index)
    if state is not None and state.has_work():
        state.flush()


def hand_back(runtime: Any = None) -> None:
    """Pending nodes meant for ``runtime``'s engines (all, when ``None``) are stored by
    LlamaIndex's own code from now on: the runtime is going away."""
    for state in pending_states():
        if runtime is None or state.runtime is runtime:
            state.hand_back()


# -- the idle flush ----------------------------------------------------------------------------
class IdleFlusher:
    """One daemon thread that stores pending nodes nobody claimed within their idle time.
    A failing flush leaves them pending (the next read retries and raises) and is retried
    after a growing wait."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._backoff: dict[int, float] = {}  # state id -> wait after its last failure

    def wake(self) -> None:
        with self._cond:
            if self._stopped:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="teola-idle-flush", daemon=True)
                self._thread.start()
            self._cond.notify()

    def stop(self, wait_s: float = EXIT_WAIT_S) -> None:
        """No more idle flushes; a flush already running gets ``wait_s`` to finish."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(wait_s)

    def _due(self) -> tuple[list[PendingIngestion], float | None]:
        now, ready, next_at = time.monotonic(), [], None
        for state in pending_states():
            due = state.flush_due
            if due is None or state.claim is not None:
                continue  # not idle-flushed, or a run is storing it (it reschedules if it fails)
            if due <= now:
                ready.append(state)
            else:
                next_at = due if next_at is None else min(next_at, due)
        return ready, None if next_at is None else next_at - now

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._stopped:
                        return
                    ready, wait = self._due()
                    if ready:
                        break
                    self._cond.wait(wait)
            for state in ready:
                self._flush(state)

    def _flush(self, state: PendingIngestion) -> None:
        try:
            state.flush()
            self._backoff.pop(id(state), None)
        except Exception as exc:  # noqa: BLE001 — kept pending; the next reader gets the error
            if self._stopped or state.handed_back:  # LlamaIndex's own code stores them from now on
                self._backoff.pop(id(state), None)
                return
            wait = min(RETRY_MAX_S, 2 * self._backoff.get(id(state), state.idle_flush_s or 1.0))
            self._backoff[id(state)] = wait
            with state.cond:
                state._schedule_idle_flush(time.monotonic(), after_s=wait)
            logger.warning("TeolaExecutor: storing %d deferred LlamaIndex nodes in the background failed (%s: %s); "
                           "they stay pending, retried in %.0f s and by the next read of the index, which raises "
                           "the error", sum(len(b.nodes) for b in state.batches), type(exc).__name__, exc, wait)


IDLE_FLUSHER = IdleFlusher()

# -- exit --------------------------------------------------------------------------------------
_EXIT_REGISTERED = False
_EXIT_LOCK = threading.Lock()


def _register_exit_hand_back() -> None:
    global _EXIT_REGISTERED
    with _EXIT_LOCK:
        if not _EXIT_REGISTERED:
            atexit.register(_at_exit)
            _EXIT_REGISTERED = True


def _at_exit() -> None:
    """The process is ending: start no engine and no flush. Every store a deferred index
    writes is in this process's memory, so what plain LlamaIndex would keep is kept: an
    ``atexit`` handler of the app that persists the index still stores every node (handed
    back: LlamaIndex's own code embeds them)."""
    hand_back()
    IDLE_FLUSHER.stop()

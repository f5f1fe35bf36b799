"""Ingestion's hooks on LlamaIndex: defer where that is safe, store first where anything reads.

``VectorStoreIndex._(async_)add_nodes_to_index`` (the step after LlamaIndex's own node parsing, in
``from_documents`` / ``insert`` / ``insert_nodes``) records its nodes when the installed
executor defers ingestion, an engine serves the index's embed model and every store of the
index is LlamaIndex's in-memory one (``ingestion_policy.py``; ``pending_ingestion.py`` holds
them); otherwise LlamaIndex's own code stores them before the call returns, with the embedding
routed to the engine (``hooks.py``). A later insert appends (stored in order). Everything else
that reads or changes the index or its stores stores the pending nodes first:
``index.vector_store`` / ``index.docstore`` / ``index.ref_doc_info`` / ``index.index_struct``, ``delete_nodes`` /
``delete_ref_doc`` / ``update_ref_doc`` / ``refresh_ref_docs`` / ``ainsert_nodes`` / ``ainsert``,
``StorageContext.persist`` and the in-memory stores' own ``persist``, every read of those
stores (``storage_context.docstore.docs`` / ``get_document`` / ``document_exists``, the index
store's structs, the vector store's ``get`` / ``query`` / ``to_dict``: through the key-value
stores under them; ``BM25Retriever.from_defaults(docstore=...)`` reads so), and every query /
retrieve not run through the executor (``hooks``). ``as_retriever`` does not flush (the next
query joins the nodes into its graph) but gives the retriever the node ids plain LlamaIndex
would (pending ones included). ``index.index_struct`` flushes too (its ``nodes_dict``, its
JSON). Not covered: reading a store's ``data`` attribute directly. ``show_progress`` (LlamaIndex's embedding bar) is kept with
the recorded nodes and honoured where Teola embeds them (``capture/llama_index_progress.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from llama_index.core.indices.base import BaseIndex
from llama_index.core.indices.vector_store.base import VectorStoreIndex
from llama_index.core.indices.vector_store.retrievers.retriever import VectorIndexRetriever
from llama_index.core.storage.storage_context import StorageContext

from llama_index.core.storage.docstore import SimpleDocumentStore
from llama_index.core.storage.index_store import SimpleIndexStore
from llama_index.core.storage.kvstore.simple_kvstore import MutableMappingKVStore, SimpleKVStore
from llama_index.core.vector_stores import SimpleVectorStore

from ..capture.llama_index_progress import embedding_bar
from ..runtime.runtime import before_shutdown
from .ingestion_policy import ingestion_path
from .pending_ingestion import (
    PendingBatch,
    PendingIngestion,
    flush_all,
    flush_index,
    flush_stores,
    flushing,
    hand_back,
    no_flush,
    set_original_add_nodes,
)

_SAVED: dict[tuple[type, str], Any] = {}
_INHERITED = object()  # saved for a method the class inherits (uninstall removes the wrapper)


def _flushing(index: Any) -> None:
    if flushing():
        flush_index(index)


def _deferred(index: Any, index_struct: Any, nodes: Any, insert_kwargs: dict[str, Any],
              show_progress: bool) -> bool:
    """Record the nodes if the installed executor may defer ingestion for ``index`` (with the
    caller's ``show_progress``: the run that embeds them shows LlamaIndex's bar). The path
    taken is kept on the index for explain()."""
    from ..capture.llama_index_models import embedder_engine_for
    from .hooks import active_executor

    executor = active_executor()
    if not nodes or executor is None:
        return False
    served = embedder_engine_for(executor.runtime, index._embed_model)[0] is not None
    path = ingestion_path(index, executor.defer_ingestion, served)
    index.__dict__["_teola_ingestion_path"] = path
    if not path.deferred:
        return False
    # The nodes as they are now: plain embeds and stores them during this call (copies, and the
    # docstore's JSON), so what the caller does to its node objects afterwards is not stored.
    snapshot = [node.model_copy(deep=True) for node in nodes]
    PendingIngestion.of(index, create=True).add(
        PendingBatch(index_struct, snapshot, insert_kwargs, show_progress=bool(show_progress)),
        runtime=executor.runtime, idle_flush_s=executor.idle_flush_s)
    return True


# LlamaIndex's embed_nodes shows its bar around the embedding call; where the executor embeds
# at call time instead (defer_ingestion=False, a flush), the same bar goes around that query.
def _embedding_bar(executor: Any, index: Any, nodes: Any, show_progress: bool) -> Any | None:
    from ..capture.llama_index_models import embedder_engine_for

    missing = sum(1 for n in nodes if n.embedding is None)
    if not show_progress or not missing or embedder_engine_for(executor.runtime, index._embed_model)[0] is None:
        return None  # no bar asked for, nothing to embed, or LlamaIndex's own code (and bar) runs
    return embedding_bar(missing)


@contextlib.contextmanager
def _bar_around(executor: Any, index: Any, nodes: Any, show_progress: bool) -> Iterator[Callable[[Any], Any]]:
    """LlamaIndex's bar around one Teola embedding query; yields ``done(embedded)``."""
    bar = _embedding_bar(executor, index, nodes, show_progress)

    def done(embedded: Any) -> Any:
        if bar is not None and embedded is not None:
            bar.update(bar.total - bar.n)  # one Teola query returns every vector at once
        return embedded

    try:
        yield done
    finally:
        if bar is not None:
            bar.close()


def embed_index_nodes(executor: Any, index: Any, nodes: Any, show_progress: bool = False) -> Any:
    """``TeolaExecutor.embed_index_nodes`` with LlamaIndex's bar when the caller asked for it."""
    with _bar_around(executor, index, nodes, show_progress) as done:
        return done(executor.embed_index_nodes(index, nodes))


async def aembed_index_nodes(executor: Any, index: Any, nodes: Any, show_progress: bool = False) -> Any:
    with _bar_around(executor, index, nodes, show_progress) as done:
        return done(await executor.aembed_index_nodes(index, nodes))


def _add_nodes(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def add_nodes_to_index(self: Any, index_struct: Any, nodes: Any, show_progress: bool = False,
                           **insert_kwargs: Any) -> None:
        if _deferred(self, index_struct, nodes, insert_kwargs, show_progress):
            return None
        flush_index(self)  # earlier pending nodes first: the store keeps insertion order
        return original(self, index_struct, nodes, show_progress, **insert_kwargs)

    return add_nodes_to_index


def _async_add_nodes(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def async_add_nodes_to_index(self: Any, index_struct: Any, nodes: Any, show_progress: bool = False,
                                       **insert_kwargs: Any) -> None:
        if _deferred(self, index_struct, nodes, insert_kwargs, show_progress):  # stored by the sync code on flush
            return None
        await asyncio.to_thread(flush_index, self)
        return await original(self, index_struct, nodes, show_progress, **insert_kwargs)

    return async_add_nodes_to_index


def _as_retriever(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def as_retriever(self: Any, **kwargs: Any) -> Any:
        with no_flush():
            retriever = original(self, **kwargs)
        state = PendingIngestion.of(self)
        if state is not None and state.has_work() and getattr(retriever, "_node_ids", None) is not None:
            known = set(retriever._node_ids)
            retriever._node_ids = retriever._node_ids + [i for i in state.pending_index_ids() if i not in known]
        return retriever

    return as_retriever


def _without_flush(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        with no_flush():
            return original(*args, **kwargs)

    return call


def _flush_first(original: Callable[..., Any]) -> Callable[..., Any]:
    if asyncio.iscoroutinefunction(original):
        @functools.wraps(original)
        async def acall(self: Any, *args: Any, **kwargs: Any) -> Any:
            await asyncio.to_thread(flush_index, self)
            return await original(self, *args, **kwargs)

        return acall

    @functools.wraps(original)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        flush_index(self)
        return original(self, *args, **kwargs)

    return call


def _flush_property(original: property) -> property:
    def get(self: Any) -> Any:
        _flushing(self)
        return original.fget(self)

    return property(get, original.fset, original.fdel, original.__doc__)


def _store_read(original: Callable[..., Any]) -> Callable[..., Any]:
    """A read of an in-memory store: the pending nodes of the indexes storing into it first."""
    @functools.wraps(original)
    def read(self: Any, *args: Any, **kwargs: Any) -> Any:
        flush_stores(self)
        return original(self, *args, **kwargs)

    return read


def _persist(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def persist(self: Any, *args: Any, **kwargs: Any) -> Any:
        flush_all()  # any index may write into these stores
        return original(self, *args, **kwargs)

    return persist


_HOOKS: tuple[tuple[type, str, Callable[[Any], Any]], ...] = (
    (VectorStoreIndex, "_add_nodes_to_index", _add_nodes),
    (VectorStoreIndex, "_async_add_nodes_to_index", _async_add_nodes),
    (VectorStoreIndex, "as_retriever", _as_retriever),
    (VectorIndexRetriever, "__init__", _without_flush),
    (BaseIndex, "insert", _without_flush),
    (VectorStoreIndex, "vector_store", _flush_property),
    (BaseIndex, "docstore", _flush_property),
    (VectorStoreIndex, "ref_doc_info", _flush_property),  # it reads index_struct before the docstore
    (BaseIndex, "index_struct", _flush_property),  # user code's read (LlamaIndex's own use _index_struct)
    (BaseIndex, "storage_context", _flush_property),  # its stores, read or pickled by user code
    (BaseIndex, "__getstate__", _flush_first),  # a copy or pickle of the index holds what plain's would
    (VectorStoreIndex, "delete_nodes", _flush_first),
    (VectorStoreIndex, "adelete_nodes", _flush_first),
    (VectorStoreIndex, "delete_ref_doc", _flush_first),
    (VectorStoreIndex, "adelete_ref_doc", _flush_first),
    (BaseIndex, "update_ref_doc", _flush_first),
    (BaseIndex, "aupdate_ref_doc", _flush_first),
    (BaseIndex, "refresh_ref_docs", _flush_first),
    (BaseIndex, "arefresh_ref_docs", _flush_first),
    (VectorStoreIndex, "ainsert_nodes", _flush_first),
    (BaseIndex, "ainsert", _flush_first),
    # reads of the in-memory stores themselves (a docstore's and an index store's go through
    # their key-value store; async reads call these); LlamaIndex's own writes while building
    # or inserting only put, so they do not flush what they just deferred
    (MutableMappingKVStore, "get", _store_read),
    (MutableMappingKVStore, "get_all", _store_read),
    (SimpleKVStore, "to_dict", _store_read),
    (SimpleVectorStore, "get", _store_read),
    (SimpleVectorStore, "get_nodes", _store_read),
    (SimpleVectorStore, "query", _store_read),
    (SimpleVectorStore, "to_dict", _store_read),
    (StorageContext, "persist", _persist),
    (SimpleVectorStore, "persist", _persist),
    (SimpleDocumentStore, "persist", _persist),
    (SimpleIndexStore, "persist", _persist),
)


def install() -> None:
    """Wrap the methods above once."""
    for cls, name, wrap in _HOOKS:
        if (cls, name) not in _SAVED:
            original = cls.__dict__.get(name, _INHERITED)  # __getstate__: object's
            _SAVED[cls, name] = original
            setattr(cls, name, wrap(getattr(cls, name) if original is _INHERITED else original))
    set_original_add_nodes(_SAVED[VectorStoreIndex, "_add_nodes_to_index"])
    # A runtime going away hands back the nodes its engines were to embed (LlamaIndex's own
    # code stores them if anything reads them), so no flush needs a closed runtime.
    before_shutdown(hand_back)


def uninstall() -> None:
    """Store what is pending, then restore LlamaIndex's methods."""
    flush_all()
    for (cls, name), original in list(_SAVED.items()):
        if original is _INHERITED:
            delattr(cls, name)
        else:
            setattr(cls, name, original)
        del _SAVED[cls, name]

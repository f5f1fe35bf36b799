"""Document ingestion in a traced LlamaIndex graph: graphs only, no state.

* :func:`embedding_graph`: the nodes' embeddings as one ``embed`` primitive, for ingestion
  stored at call time (``from_documents`` / ``insert`` under the executor).
* :func:`join_pending`: a query on an index whose ingestion was deferred embeds and inserts
  those nodes in its own graph (``embed(pending nodes) -> vector_insert`` into the user's
  store, the query's own embedding independent of them, the search after the insert).

Which ingestion is deferred, the pending nodes themselves, their claims and flushes live in
``llama_index/pending_ingestion.py``; the trace reads them through
``TraceContext.pending_of`` (given by the executor), so capture never imports upward.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from ..ir.graph import PGraph
from ..ir.node import Ref
from ..ir.ops import Op
from ..ir.ports import PortType
from ..runtime.values import IndexHandle


def embedding_graph(engine: str, n_texts: int) -> PGraph:
    """``texts`` -> ``vectors`` on ``engine``: the nodes' embeddings as one primitive."""
    graph = PGraph("llama_index_ingest")
    texts = graph.input("texts", PortType.TEXTS)
    embed = graph.add(Op.EMBED, inputs={"texts": texts}, engine=engine, attrs={"est_items": n_texts},
                      origin="VectorStoreIndex")
    graph.output("vectors", embed.out())
    graph.validate()
    return graph


@dataclass
class Join:
    """A trace's use of one index's pending nodes: what it saw, and where the insert goes.
    ``join_id`` (unique per trace) is carried by the inserted documents; the store engine
    routes them to this join's claim by it, never by index name, so two runs touching one
    index (a late insert of an abandoned run, a newer run's claim) cannot meet."""

    state: Any  # llama_index.pending_ingestion.PendingIngestion
    batches: list[Any]  # its PendingBatch list as the trace saw it
    engine: str | None  # the LlamaIndexStoreEngine's name; None: not joined (flushed before the graph runs)
    index_name: str
    join_id: str = ""
    claim: Any = None  # the run's Claim, taken at plan time
    inserted: Ref | None = None  # the insert's INDEX output


def ingestion_note(tr: Any, retriever: Any) -> None:
    """explain()'s line on how ``retriever``'s index stored its documents (recorded by the
    ingestion hooks when an executor handled them)."""
    owner = getattr(retriever, "_index", None)
    path = owner.__dict__.get("_teola_ingestion_path") if owner is not None else None
    if path is not None and not any(n.kind == "ingestion" and n.reason == str(path) for n in tr.traced.notes):
        tr.note("ingestion", owner, "ingestion", str(path))


def join_pending(tr: Any, retriever: Any, index: Ref, engine_name: str) -> Ref:
    """``index`` (the retriever's store handle), after the index's pending nodes were embedded
    and inserted by primitives of this graph; unchanged when nothing is pending or the nodes
    cannot be joined (those are then flushed before the graph runs)."""
    from llama_index.core.schema import MetadataMode

    from .llama_index_embed_events import EmbedEvents, insert_batches
    from .llama_index_models import embedder_engine_for

    ingestion_note(tr, retriever)
    owner = getattr(retriever, "_index", None)
    pending_of = tr.ctx.pending_of
    state = pending_of(owner) if owner is not None and pending_of is not None else None
    if state is None:
        return index
    if not tr.ctx.join_ingestion:  # a graph built to run later (a sub-query): store them first
        with state.cond:
            pending = state.claim is not None or bool(state.batches)
        if pending:
            tr.traced.ingestions.append(Join(state, [], None, ""))
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
    name = tr.graph.unique_name("ingest")
    texts = tr.bind_input(f"{name}_texts", [n.get_content(metadata_mode=MetadataMode.EMBED) for n in nodes],
                          PortType.TEXTS)
    # Positions, not node ids, name the nodes: a batch may repeat an id, and the store commits by
    # order. The join id routes them to this run's claim (LlamaIndexStoreEngine.expect).
    join_id = f"{name}-{uuid.uuid4().hex}"
    docs = tr.bind_input(f"{name}_docs", [{"id": str(i), "text": "", "metadata": {"claim": join_id}}
                                          for i in range(len(nodes))], PortType.DOCS)
    # Added without the tracer's module-order edge: the query's own embedding does not wait.
    embed = tr.graph.add(Op.EMBED, name=f"{name}_embed", inputs={"texts": texts}, engine=embedder,
                         attrs={"est_items": len(nodes)}, origin="VectorStoreIndex")
    events = EmbedEvents.of(owner._embed_model)
    if events is not None:  # the embedding calls plain made when the nodes were added
        events.add_step(tr.graph, texts, embed.out("vectors"), "VectorStoreIndex", sizes=insert_batches(
            (len(b.nodes) for b in batches), owner._insert_batch_size, owner._embed_model.embed_batch_size))
    insert = tr.graph.add(Op.VECTOR_INSERT, name=f"{name}_insert",
                          inputs={"index": index, "vectors": embed.out("vectors"), "docs": docs},
                          engine=engine_name, attrs={"est_items": len(nodes)}, origin="VectorStoreIndex")
    tr.traced.ingestions.append(Join(state, batches, engine_name, handle.name, join_id, inserted=insert.out("index")))
    return insert.out("index")

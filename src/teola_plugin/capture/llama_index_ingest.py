"""Document ingestion into a ``VectorStoreIndex`` under the executor: the node embeddings.

With a TeolaExecutor installed, ``VectorStoreIndex.from_documents`` / ``insert`` /
``insert_nodes`` / ``build_index_from_nodes`` still run LlamaIndex's own code for
everything (transformations / node parser, node ids, docstore, index struct, the store's
``add``), except the one expensive step: the embeddings of nodes that have none are
computed by one ``embed`` primitive over all their texts (``MetadataMode.EMBED``, as
``embed_nodes`` builds them), run as a Teola query on the embedder engine that serves the
index's embed model (stage decomposition may shard it into pipelined batches; the engine
batches it with other queries' embeddings). The index then holds exactly the nodes, ids
and embeddings plain LlamaIndex stores, and nothing is deferred: the call returns once the
nodes are in the store, as in plain LlamaIndex.

Not done (yet): deferring the ingestion into the *next* query's graph (chunk -> embed ->
vector_insert joining that query's retrieval, so document and query embedding overlap).
That needs every read path of the index and its stores to flush first; see
docs/architecture.md.
"""

from __future__ import annotations

from ..ir.graph import PGraph
from ..ir.ops import Op
from ..ir.ports import PortType


def embedding_graph(engine: str, n_texts: int) -> PGraph:
    """``texts`` -> ``vectors`` on ``engine``: the nodes' embeddings as one primitive."""
    graph = PGraph("llama_index_ingest")
    texts = graph.input("texts", PortType.TEXTS)
    embed = graph.add(Op.EMBED, inputs={"texts": texts}, engine=engine, attrs={"est_items": n_texts},
                      origin="VectorStoreIndex")
    graph.output("vectors", embed.out())
    graph.validate()
    return graph

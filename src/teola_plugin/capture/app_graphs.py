"""The paper's applications as the tracer lowers them (for tests, docs and demos).

Users never write these: the framework tracers produce the same shapes from LlamaIndex /
LangChain objects. Every node waits (``after``) on the one emitted before it
(``ModuleOrder``), because a framework runs its modules one after another and the tracer
records that order; dependency pruning is what removes the waits that are not real.

Each ``add_*`` function appends one module's primitives, so benchmarks can compose
many applications into one graph; ``naive_rag`` / ``advanced_rag`` / ``search_augmented``
build a whole application.
"""

from __future__ import annotations

from typing import Any

from ..ir.graph import PGraph
from ..ir.node import Primitive, Ref
from ..ir.ops import Op
from ..ir.ports import PortType
from .llm_calls import emit_llm_call
from .lowerable import LLMCallSpec
from .module_order import ModuleOrder

CHUNKS_PER_DOC = 2  # SentenceSplitter(chunk_size=512) on the bundled corpora, roughly
TOKENS_PER_HIT = 128

QA_TEMPLATE: list[Any] = [
    "You are a helpful assistant. Answer the question using only the context below. "
    "If the context does not contain the answer, say that you do not know.\n\nQuestion: ",
    {"var": "question"},
    "\n\nContext:\n",
    {"var": "context", "field": "text", "join": "\n\n"},
    "\n\nAnswer:",
]
EXPANSION_TEMPLATE: list[Any] = [
    "You are a search assistant. Write {n} different search queries, one per line, that "
    "would help answer the question below. Output only the queries.\n\nQuestion: ",
    {"var": "question"},
    "\n\nQueries:\n",
]
SEARCH_TEMPLATE: list[Any] = [
    "Answer the question using the web search results below and cite the results you "
    "use.\n\nQuestion: ",
    {"var": "question"},
    "\n\nSearch results:\n",
    {"var": "results", "field": "text", "join": "\n\n"},
    "\n\nAnswer:",
]


def add_ingestion(t: ModuleOrder, docs: Ref, index: Ref, n_docs: int) -> Ref:
    """SentenceSplitter -> embed -> insert; returns the INDEX handle holding the data."""
    n_chunks = n_docs * CHUNKS_PER_DOC
    chunk = t.add(Op.CHUNK, inputs={"docs": docs}, attrs={"est_items": n_docs, "chunk_size": 512},
                  origin="SentenceSplitter")
    embed = t.add(Op.EMBED, inputs={"texts": chunk.out("texts")}, attrs={"est_items": n_chunks},
                  origin="HuggingFaceEmbedding")
    insert = t.add(Op.VECTOR_INSERT, inputs={"index": index, "vectors": embed.out("vectors"),
                                             "docs": chunk.out("chunks")},
                   attrs={"est_items": n_chunks}, origin="VectorStoreIndex")
    return insert.out("index")


def add_retrieval(t: ModuleOrder, question: Ref, index: Ref, top_k: int) -> Ref:
    """VectorIndexRetriever: embed the question, search, keep the one query's hits."""
    origin = "VectorIndexRetriever"
    batch = t.add(Op.AGGREGATE, inputs={"in0": question}, attrs={"mode": "list"}, origin=origin)
    embed = t.add(Op.EMBED, inputs={"texts": batch.out()}, attrs={"est_items": 1}, origin=origin)
    search = t.add(Op.VECTOR_SEARCH, inputs={"index": index, "vectors": embed.out()},
                   attrs={"top_k": top_k, "est_items": 1}, origin=origin)
    pick = t.add(Op.AGGREGATE, inputs={"in0": search.out()}, attrs={"mode": "pick", "index": 0},
                 origin=origin)
    return pick.out()


def add_llm_call(t: ModuleOrder, parts: list[Any], values: dict[str, Ref], origin: str,
                 est_prompt_tokens: int, max_tokens: int, **decode_attrs: Any) -> Primitive:
    """format -> prefill -> decode on the default LLM engine, greedy; returns the decode."""
    fmt = t.add(Op.FORMAT, inputs=values, attrs={"parts": parts}, origin=origin)
    return emit_llm_call(t.add, fmt.out(), LLMCallSpec(None, max_tokens=max_tokens), origin, est_prompt_tokens,
                         **decode_attrs)


def add_synthesis(t: ModuleOrder, question: Ref, hits: Ref, n_hits: int) -> Ref:
    decode = add_llm_call(t, QA_TEMPLATE, {"question": question, "context": hits},
                          "CompactAndRefine", 64 + n_hits * TOKENS_PER_HIT, 128)
    return decode.out("text")


def add_expanded_retrieval(t: ModuleOrder, question: Ref, index: Ref, num_queries: int,
                           top_k: int) -> Ref:
    """QueryFusionRetriever: LLM writes queries (one per line), each is retrieved, RRF fuses."""
    origin = "QueryFusionRetriever"
    parts = [p.replace("{n}", str(num_queries)) if isinstance(p, str) else p
             for p in EXPANSION_TEMPLATE]
    decode = add_llm_call(t, parts, {"question": question}, origin, 72, 24 * num_queries,
                          parse="lines", est_items=num_queries)
    embed = t.add(Op.EMBED, inputs={"texts": decode.out("items")},
                  attrs={"est_items": num_queries}, origin=origin)
    search = t.add(Op.VECTOR_SEARCH, inputs={"index": index, "vectors": embed.out()},
                   attrs={"top_k": top_k, "est_items": num_queries}, origin=origin)
    fuse = t.add(Op.AGGREGATE, inputs={"in0": search.out()}, attrs={"mode": "rrf", "k": 60},
                 origin=origin)
    return fuse.out()


def add_rerank(t: ModuleOrder, question: Ref, hits: Ref, n_hits: int, top_n: int) -> Ref:
    rerank = t.add(Op.RERANK, inputs={"query": question, "hits": hits},
                   attrs={"top_n": top_n, "est_items": n_hits}, origin="SentenceTransformerRerank")
    return rerank.out()


def add_web_search(t: ModuleOrder, question: Ref, top_k: int) -> Ref:
    origin = "SearchTool"
    batch = t.add(Op.AGGREGATE, inputs={"in0": question}, attrs={"mode": "list"}, origin=origin)
    search = t.add(Op.SEARCH, inputs={"queries": batch.out()}, attrs={"top_k": top_k, "est_items": 1},
                   origin=origin)
    pick = t.add(Op.AGGREGATE, inputs={"in0": search.out()}, attrs={"mode": "pick", "index": 0},
                 origin=origin)
    return pick.out()


def _inputs(g: PGraph, prefix: str, *names: str) -> list[Ref]:
    types = {"question": PortType.TEXT, "docs": PortType.DOCS, "index": PortType.INDEX}
    return [g.input(prefix + n, types[n]) for n in names]


def build_naive_rag(g: PGraph, prefix: str = "", n_docs: int = 100, top_k: int = 5) -> PGraph:
    question, docs, index = _inputs(g, prefix, "question", "docs", "index")
    t = ModuleOrder(g)
    index = add_ingestion(t, docs, index, n_docs)
    hits = add_retrieval(t, question, index, top_k)
    g.output(prefix + "answer", add_synthesis(t, question, hits, top_k))
    g.output(prefix + "sources", hits)
    return g


def build_advanced_rag(g: PGraph, prefix: str = "", num_queries: int = 3, top_k: int = 5,
                       rerank_top_n: int = 3, n_docs: int = 100) -> PGraph:
    question, docs, index = _inputs(g, prefix, "question", "docs", "index")
    t = ModuleOrder(g)
    index = add_ingestion(t, docs, index, n_docs)
    fused = add_expanded_retrieval(t, question, index, num_queries, top_k)
    hits = add_rerank(t, question, fused, num_queries * top_k, rerank_top_n)
    g.output(prefix + "answer", add_synthesis(t, question, hits, rerank_top_n))
    g.output(prefix + "sources", hits)
    return g


def build_search_augmented(g: PGraph, prefix: str = "", top_k: int = 5) -> PGraph:
    (question,) = _inputs(g, prefix, "question")
    t = ModuleOrder(g)
    hits = add_web_search(t, question, top_k)
    decode = add_llm_call(t, SEARCH_TEMPLATE, {"question": question, "results": hits},
                          "SearchAugmentedSynthesizer", 64 + top_k * TOKENS_PER_HIT, 128)
    g.output(prefix + "answer", decode.out("text"))
    g.output(prefix + "sources", hits)
    return g


def naive_rag(n_docs: int = 100, top_k: int = 5) -> PGraph:
    """Document QA: ingest the documents, retrieve for the question, answer."""
    return build_naive_rag(PGraph("naive_rag"), n_docs=n_docs, top_k=top_k)


def advanced_rag(num_queries: int = 3, top_k: int = 5, rerank_top_n: int = 3,
                 n_docs: int = 100) -> PGraph:
    """Naive RAG plus LLM query expansion, reciprocal-rank fusion and reranking."""
    return build_advanced_rag(PGraph("advanced_rag"), num_queries=num_queries, top_k=top_k,
                              rerank_top_n=rerank_top_n, n_docs=n_docs)


def search_augmented(top_k: int = 5) -> PGraph:
    """Search-engine-augmented generation: search the question, answer from the results."""
    return build_search_augmented(PGraph("search_augmented"), top_k=top_k)


APPS = {"naive_rag": naive_rag, "advanced_rag": advanced_rag, "search_augmented": search_augmented}

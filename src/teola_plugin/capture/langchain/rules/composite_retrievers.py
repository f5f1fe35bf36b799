"""Retrievers built from other retrievers (langchain_classic): multi-query, ensemble,
contextual compression. The inner retrievers are lowered by their own rules (or run
unchanged); what combines them runs by the composite's own code, so results are identical.

* ``MultiQueryRetriever``: its ``llm_chain`` writes queries, one per line -> retrieval per
  query -> unique union; where the chain's list is its decode's lines, the decode is marked
  ``parse="lines"`` so decode pipelining can retrieve for each query as soon as its line is
  complete. Its runs inside are plain's: the chain's, one retriever run per query.
* ``EnsembleRetriever``: the retrievers run as parallel branches; the fusion is the
  retriever's own ``weighted_reciprocal_rank``.
* ``MergerRetriever`` (LOTR): the retrievers run as parallel branches; the merge is its
  ``merge_documents``' interleaving.
* ``MultiVectorRetriever`` / ``ParentDocumentRetriever``: the search over the small chunks
  is lowered as a vector retriever's (embed -> vector_search on the user's store, with the
  retriever's ``search_type`` and ``search_kwargs``); the parent documents are read from its
  ``docstore`` by its own rule (the chunks' ``id_key``, first appearance first, missing
  ones dropped), in one CPU step.
* ``ContextualCompressionRetriever``: the base retriever is lowered; a ``TeolaReranker``
  compressor becomes hits -> ``rerank`` (on its engine) -> documents (``documents.py``,
  the same conversion the compressor uses when called directly); an ``EmbeddingsFilter``
  embeds on the embedder engine (``embeddings_filter.py``); ``LLMChainExtractor`` /
  ``LLMChainFilter`` ask their chain about every document at once (``llm_compressors.py``);
  any other compressor (``CrossEncoderReranker``, ``LLMListwiseRerank``, ...) runs its own
  ``compress_documents`` unchanged as one opaque primitive.
"""

from __future__ import annotations

import logging
from typing import Any

from langchain_core.documents import Document
from langchain_core.vectorstores import VectorStoreRetriever

from ....ir.node import Ref
from ....ir.ops import Op
from ....runtime.caller import as_the_caller_calls
from ..documents import documents_to_hits, hits_to_documents
from ..tracer import OUT, NotLowerable, LangChainTracer, component_name, lowering
from ...overrides import overridden
from ..values import Kind, Record, Traced, Value
from .callbacks import retriever_reporters
from .embeddings_filter import is_embeddings_filter, lower_embeddings_filter
from .llm_compressors import is_llm_compressor, lower_llm_compressor
from .retrievers import BY_VECTOR, check_vector_retriever, reported_search, search_lists


def lower_multi_query(t: LangChainTracer, mq: Any, value: Value) -> Value:
    """``generate_queries`` is the retriever's ``llm_chain`` lowered as any chain (its own
    runs: the sequence, prompt, model call, parser). Where that chain ends in the decode's
    lines, decode pipelining can search each query as soon as its line is decoded; the last
    step (:func:`_queries_documents`) then pairs plain's queries with those searches."""
    from langchain_classic.chains.llm import LLMChain

    if isinstance(mq.llm_chain, LLMChain):  # its output is a dict; not lowered
        raise NotLowerable("llm_chain is a legacy LLMChain")
    if not (isinstance(value, Traced) and value.kind is Kind.TEXT):
        raise NotLowerable("the query is not known to be a str")
    embedding = check_vector_retriever(t, mq.retriever)
    lines = t.lower(mq.llm_chain, Record.of({"question": value}))
    origin = component_name(mq)
    decode = lines.lines_of if isinstance(lines, Traced) else None
    if decode is not None:  # the parser's list is the decode's lines: searched line by line
        t.graph.set_attrs(decode, parse="lines", est_items=3)
        searched = Ref(decode, "items")
    else:  # searched once the chain's output is known (the parser's own list)
        searched = t.materialise(lines)
    inputs = {"queries": t.materialise(lines), "searched": searched,
              "lists": search_lists(t, mq.retriever, embedding, searched, 3)}
    if mq.include_original:
        question = t.add(Op.AGGREGATE, name="query_list", inputs={"in0": t.materialise(value)},
                         attrs={"mode": "list"}, origin=origin)
        inputs |= {"question": question.out(),
                   "question_lists": search_lists(t, mq.retriever, embedding, question.out(), 1)}
    prim = t.add(Op.OPAQUE, name="unique_union", inputs=inputs, outputs=[OUT], origin=origin,
                 attrs={"fn": _queries_documents(mq)})
    return Traced(prim.out(OUT), Kind.DOCUMENTS)


MULTI_QUERY_LOGGER = "langchain_classic.retrievers.multi_query"  # the module's logger, as the docs enable it


def _queries_documents(mq: Any) -> Any:
    """``retrieve_documents`` then ``unique_union``, from the searches the graph ran: each of
    plain's queries (the parser's list, then the question under ``include_original``) reads
    the documents of the search for that very text, reporting the retriever run plain's
    ``retriever.invoke`` reports; a query no search had (the decode's lines are stripped,
    the parser's are not) runs the retriever's own code, so the union is plain's."""
    retriever = mq.retriever
    report_start, report_end = retriever_reporters(retriever)

    async def union(queries: list[str], searched: list[str], lists: list[list[Document]],
                    question: list[str] | None = None, question_lists: list[list[Document]] | None = None) -> Any:
        if mq.verbose:  # generate_queries' own log line, before the retriever runs it reports
            logging.getLogger(MULTI_QUERY_LOGGER).info("Generated queries: %s", queries)
        found = dict(zip(searched, lists))
        if question is not None:
            found.setdefault(question[0], question_lists[0])
            queries = [*queries, question[0]]
        documents: list[Document] = []
        for query in queries:
            if query in found:
                run = await report_start(query)
                documents += await report_end(run, found[query])
            else:
                documents += await as_the_caller_calls(retriever.invoke, retriever.ainvoke, query)  # under this run
        return mq.unique_union(documents)

    return union


def _member_lists(t: LangChainTracer, retrievers: list[Any], value: Value) -> dict[str, Ref]:
    """Each member retriever lowered as a parallel branch, its run tagged as its composite's
    child config tags it (``retriever_1``, ...): input port ``in{i}`` -> its documents."""
    lists = t.branches([lambda i=i, r=r: t.lower(r, value, f"retriever_{i + 1}") for i, r in enumerate(retrievers)])
    return {f"in{i}": t.materialise(v) for i, v in enumerate(lists)}


def lower_ensemble(t: LangChainTracer, ensemble: Any, value: Value) -> Value:
    inputs = _member_lists(t, ensemble.retrievers, value)
    fuse_ranks = ensemble.weighted_reciprocal_rank

    def fuse(**ranked: Any) -> Any:
        # As EnsembleRetriever.rank_fusion: str results become Documents, then its own fusion.
        doc_lists = [[Document(page_content=d) if isinstance(d, str) else d for d in ranked[f"in{i}"]]
                     for i in range(len(ranked))]
        return fuse_ranks(doc_lists)

    prim = t.add(Op.OPAQUE, name="rank_fusion", inputs=inputs, outputs=[OUT], origin=component_name(ensemble),
                 attrs={"fn": fuse, "pure": True})
    return Traced(prim.out(OUT), Kind.DOCUMENTS)


def lower_merger(t: LangChainTracer, merger: Any, value: Value) -> Value:
    """``MergerRetriever`` (LOTR): its retrievers as parallel branches, then its
    ``merge_documents``' interleaving (every retriever's first document, then every second...)."""
    from langchain_classic.retrievers.merger_retriever import MergerRetriever

    redefined = ", ".join(overridden(merger, MergerRetriever, ("_get_relevant_documents", "_aget_relevant_documents",
                                                               "merge_documents", "amerge_documents")))
    if redefined:
        raise NotLowerable(f"{type(merger).__name__} redefines {redefined}")
    inputs = _member_lists(t, merger.retrievers, value)

    def merge(**found: Any) -> list[Any]:
        lists = [found[f"in{i}"] for i in range(len(found))]
        return [docs[i] for i in range(max(map(len, lists), default=0)) for docs in lists if i < len(docs)]

    prim = t.add(Op.OPAQUE, name="merge_documents", inputs=inputs, outputs=[OUT], origin=component_name(merger),
                 attrs={"fn": merge, "pure": True})
    return Traced(prim.out(OUT), Kind.DOCUMENTS)


def lower_multi_vector(t: LangChainTracer, retriever: Any, value: Value) -> Value:
    """The chunks' search as the vector retriever over the same store and arguments (what
    ``MultiVectorRetriever._get_relevant_documents`` calls: ``similarity_search``,
    ``max_marginal_relevance_search`` or ``similarity_search_with_relevance_scores`` with
    ``search_kwargs``), then the parents by its rule."""
    from langchain_classic.retrievers.multi_vector import MultiVectorRetriever

    redefined = ", ".join(overridden(retriever, MultiVectorRetriever,
                                     ("_get_relevant_documents", "_aget_relevant_documents")))
    if redefined:
        raise NotLowerable(f"{type(retriever).__name__} redefines {redefined}")
    if not isinstance(value, Traced) or value.kind is not Kind.TEXT:
        raise NotLowerable("the query is not known to be a str")
    search_type = getattr(retriever.search_type, "value", retriever.search_type)
    if search_type not in BY_VECTOR:
        raise NotLowerable(f"search_type {search_type!r} (lowered: {', '.join(map(repr, BY_VECTOR))})")
    chunks = VectorStoreRetriever(vectorstore=retriever.vectorstore, search_type=search_type,
                                  search_kwargs=dict(retriever.search_kwargs))
    embedding = check_vector_retriever(t, chunks)
    id_key, docstore = retriever.id_key, retriever.docstore

    async def parents(lists: list[list[Document]]) -> list[Document]:
        ids: list[Any] = []
        for chunk in lists[0]:
            if id_key in chunk.metadata and chunk.metadata[id_key] not in ids:
                ids.append(chunk.metadata[id_key])
        found = await as_the_caller_calls(docstore.mget, docstore.amget, ids)  # invoke: mget; ainvoke: amget
        return [d for d in found if d is not None]

    def parent_documents(lists: Ref) -> Ref:
        return t.add(Op.OPAQUE, name="parent_documents", inputs={"lists": lists}, outputs=[OUT],
                     attrs={"fn": parents}, origin=component_name(retriever)).out(OUT)

    return reported_search(t, retriever, chunks, embedding, value, parent_documents)


def _is_teola_reranker(compressor: Any) -> bool:
    return callable(getattr(compressor, "teola_reranker_engine", None))


def lower_compression(t: LangChainTracer, retriever: Any, value: Value) -> Value:
    query = t.materialise(value)
    docs = t.materialise(t.lower(retriever.base_retriever, value))
    compressor, origin = retriever.base_compressor, component_name(retriever)
    if _is_teola_reranker(compressor):
        to_hits = t.add(Op.OPAQUE, name="to_hits", inputs={"docs": docs}, outputs=[OUT], origin=origin,
                        attrs={"fn": _async(documents_to_hits), "pure": True})
        attrs = {} if compressor.top_n is None else {"top_n": int(compressor.top_n)}
        rerank = t.add(Op.RERANK, name="rerank", engine=compressor.teola_reranker_engine(),
                       inputs={"query": query, "hits": to_hits.out(OUT)}, attrs=attrs,
                       origin=component_name(compressor))
        back = t.add(Op.OPAQUE, name="to_documents", inputs={"docs": docs, "hits": rerank.out()},
                     outputs=[OUT], origin=origin, attrs={"fn": _async(hits_to_documents), "pure": True})
        return Traced(back.out(OUT), Kind.DOCUMENTS)
    for recognised, lower in ((is_embeddings_filter, lower_embeddings_filter),
                              (is_llm_compressor, lower_llm_compressor)):
        if recognised(compressor):
            compressed = lower(t, compressor, docs, query)
            if compressed is not None:
                return Traced(compressed, Kind.DOCUMENTS)
    compress, acompress = compressor.compress_documents, compressor.acompress_documents

    async def compress_unchanged(docs: Any, query: Any) -> Any:
        if not docs:  # as the retriever: no call on no documents
            return []
        return list(await as_the_caller_calls(compress, acompress, docs, query))

    name = component_name(compressor)
    prim = t.add(Op.OPAQUE, name="compress", inputs={"docs": docs, "query": query}, outputs=[OUT],
                 origin=name, attrs={"fn": compress_unchanged})
    t.note_opaque(compressor, prim.name, f"document compressor {type(compressor).__name__} is not a "
                  "TeolaReranker: its compress_documents runs unchanged")
    return Traced(prim.out(OUT), Kind.DOCUMENTS)


def _async(fn: Any) -> Any:
    async def run(**kwargs: Any) -> Any:
        return fn(**kwargs)

    return run


def _register() -> None:
    try:
        from langchain_classic.retrievers import ContextualCompressionRetriever, EnsembleRetriever, MergerRetriever
        from langchain_classic.retrievers.multi_query import MultiQueryRetriever
        from langchain_classic.retrievers.multi_vector import MultiVectorRetriever
    except ImportError:  # langchain-classic is optional
        return
    lowering(MultiQueryRetriever)(lower_multi_query)
    lowering(EnsembleRetriever)(lower_ensemble)
    lowering(MergerRetriever)(lower_merger)
    lowering(ContextualCompressionRetriever)(lower_compression)
    lowering(MultiVectorRetriever)(lower_multi_vector)


_register()

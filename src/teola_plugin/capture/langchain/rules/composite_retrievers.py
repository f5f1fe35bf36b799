"""Retrievers built from other retrievers (langchain_classic): multi-query, ensemble,
contextual compression. The inner retrievers are lowered by their own rules (or run
unchanged); what combines them runs by the composite's own code, so results are identical.

* ``MultiQueryRetriever``: LLM writes queries, one per line -> retrieval per query ->
  unique union; the decode is marked ``parse="lines"`` so decode pipelining can retrieve
  for each query as soon as its line is complete.
* ``EnsembleRetriever``: the retrievers run as parallel branches; the fusion is the
  retriever's own ``weighted_reciprocal_rank``.
* ``MultiVectorRetriever`` / ``ParentDocumentRetriever``: the search over the small chunks
  is lowered as a vector retriever's (embed -> vector_search on the user's store, with the
  retriever's ``search_type`` and ``search_kwargs``); the parent documents are read from its
  ``docstore`` by its own rule (the chunks' ``id_key``, first appearance first, missing
  ones dropped), in one CPU step.
* ``ContextualCompressionRetriever``: the base retriever is lowered; a ``TeolaReranker``
  compressor becomes hits -> ``rerank`` (on its engine) -> documents (``documents.py``,
  the same conversion the compressor uses when called directly); any other compressor
  (``CrossEncoderReranker``, LLM extractors, ...) runs its own ``compress_documents``
  unchanged as one opaque primitive.
"""

from __future__ import annotations

from typing import Any

from langchain_core.documents import Document
from langchain_core.language_models import BaseLanguageModel
from langchain_core.prompts import BasePromptTemplate
from langchain_core.runnables import RunnableSequence
from langchain_core.vectorstores import VectorStoreRetriever

from ....ir.node import Ref
from ....ir.ops import Op
from ....runtime.caller import as_the_caller_calls
from ..documents import documents_to_hits, hits_to_documents
from ..tracer import OUT, NotLowerable, LangChainTracer, component_name, lowering
from ...overrides import overridden
from ..values import Kind, PendingPrompt, Record, Traced, Value
from .models import add_llm_call
from .prompts import template_variables
from .retrievers import check_vector_retriever, reported_search, search_lists


def lower_multi_query(t: LangChainTracer, mq: Any, value: Value) -> Value:
    """Lines are stripped (LangChain strips only the whole answer): the same text to the
    MiniLM tokenizer, which ignores surrounding whitespace; a whitespace-only line is no
    query here, while LangChain searches it."""
    from langchain_classic.retrievers.multi_query import LineListOutputParser

    chain = mq.llm_chain
    steps = chain.steps if isinstance(chain, RunnableSequence) else []
    if (len(steps) != 3 or not isinstance(steps[0], BasePromptTemplate)
            or not isinstance(steps[1], BaseLanguageModel)
            or type(steps[2]) is not LineListOutputParser):
        raise NotLowerable("llm_chain is not prompt | model | LineListOutputParser")
    if mq.include_original:
        raise NotLowerable("include_original=True is not lowered yet")
    embedding = check_vector_retriever(t, mq.retriever)
    prompt, model, _ = steps
    if not (isinstance(value, Traced) and value.kind is Kind.TEXT):
        raise NotLowerable("the query is not known to be a str")
    variables = template_variables(prompt, Record.of({"question": value}))
    decode, _, _, _ = add_llm_call(t, model, PendingPrompt(prompt, variables, component_name(prompt)),
                                parse="lines", est_items=3)
    lists = search_lists(t, mq.retriever, embedding, decode.out("items"), 3)
    union = t.add(Op.AGGREGATE, name="unique_union", inputs={"in0": lists},
                  attrs={"mode": "union"}, origin=component_name(mq))
    return Traced(union.out(), Kind.DOCUMENTS)


def lower_ensemble(t: LangChainTracer, ensemble: Any, value: Value) -> Value:
    lists = t.branches([lambda r=r: t.lower(r, value) for r in ensemble.retrievers])
    inputs = {f"in{i}": t.materialise(v) for i, v in enumerate(lists)}
    fuse_ranks = ensemble.weighted_reciprocal_rank

    def fuse(**ranked: Any) -> Any:
        # As EnsembleRetriever.rank_fusion: str results become Documents, then its own fusion.
        doc_lists = [[Document(page_content=d) if isinstance(d, str) else d for d in ranked[f"in{i}"]]
                     for i in range(len(ranked))]
        return fuse_ranks(doc_lists)

    prim = t.add(Op.OPAQUE, name="rank_fusion", inputs=inputs, outputs=[OUT], origin=component_name(ensemble),
                 attrs={"fn": fuse, "pure": True})
    return Traced(prim.out(OUT), Kind.DOCUMENTS)


def lower_multi_vector(t: LangChainTracer, retriever: Any, value: Value) -> Value:
    """The chunks' search as the vector retriever over the same store and arguments (what
    ``MultiVectorRetriever._get_relevant_documents`` calls: ``similarity_search`` or
    ``max_marginal_relevance_search`` with ``search_kwargs``), then the parents by its rule."""
    from langchain_classic.retrievers.multi_vector import MultiVectorRetriever

    redefined = ", ".join(overridden(retriever, MultiVectorRetriever,
                                     ("_get_relevant_documents", "_aget_relevant_documents")))
    if redefined:
        raise NotLowerable(f"{type(retriever).__name__} redefines {redefined}")
    if not isinstance(value, Traced) or value.kind is not Kind.TEXT:
        raise NotLowerable("the query is not known to be a str")
    search_type = getattr(retriever.search_type, "value", retriever.search_type)
    if search_type not in ("similarity", "mmr"):
        raise NotLowerable(f"search_type {search_type!r} (lowered: 'similarity', 'mmr')")
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
        from langchain_classic.retrievers import ContextualCompressionRetriever, EnsembleRetriever
        from langchain_classic.retrievers.multi_query import MultiQueryRetriever
        from langchain_classic.retrievers.multi_vector import MultiVectorRetriever
    except ImportError:  # langchain-classic is optional
        return
    lowering(MultiQueryRetriever)(lower_multi_query)
    lowering(EnsembleRetriever)(lower_ensemble)
    lowering(ContextualCompressionRetriever)(lower_compression)
    lowering(MultiVectorRetriever)(lower_multi_vector)


_register()

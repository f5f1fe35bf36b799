"""Retrievers over the user's own vector store: embed -> vector_search on that store.

The store stays the user's object: the plan serves it as an engine (its own similarity
search by vector, exactly what the retriever calls after embedding the query), so the
documents come back as the store returns them. Lowered only where that equivalence is
known: ``InMemoryVectorStore`` with an embeddings object computed by a Teola engine.
"""

from __future__ import annotations

from typing import Any

from langchain_core.prompts import BasePromptTemplate
from langchain_core.runnables import RunnableSequence
from langchain_core.vectorstores import InMemoryVectorStore, VectorStoreRetriever

from ....ir.node import Ref
from ....ir.ops import Op
from ..protocols import LowerableEmbeddings, LowerableLanguageModel
from ..tracer import CannotLower, LangChainTracer, component_name, lowering
from ..values import Kind, PendingPrompt, Record, Traced, Value
from .models import add_llm_call
from .prompts import template_variables


def _check_vector_retriever(retriever: Any) -> None:
    """Raise CannotLower unless ``retriever`` is a similarity search we can reproduce."""
    if not isinstance(retriever, VectorStoreRetriever):
        raise CannotLower(f"inner retriever {type(retriever).__name__} is not a VectorStoreRetriever")
    if retriever.search_type != "similarity":
        raise CannotLower(f"search_type {retriever.search_type!r} (only 'similarity' is lowered)")
    extra = sorted(set(retriever.search_kwargs) - {"k"})
    if extra:
        raise CannotLower(f"search_kwargs {extra} (only 'k' is lowered)")
    store = retriever.vectorstore
    if not isinstance(store, InMemoryVectorStore):
        raise CannotLower(f"vector store {type(store).__name__} (only InMemoryVectorStore is lowered)")
    if not isinstance(store.embedding, LowerableEmbeddings):
        raise CannotLower("the store's embeddings do not run on a Teola engine (use TeolaEmbeddings)")


def _search(t: LangChainTracer, retriever: VectorStoreRetriever, queries: Ref, n_queries: int) -> Ref:
    """embed(queries) -> vector_search on the user's store: one document list per query."""
    origin = component_name(retriever)
    store = retriever.vectorstore
    index, engine = t.store_input(store)
    embed = t.add(Op.EMBED, name="embed", engine=store.embedding.teola_embedder_engine(),
                  inputs={"texts": queries}, attrs={"est_items": n_queries}, origin=origin)
    search = t.add(Op.VECTOR_SEARCH, name="vector_search", engine=engine,
                   inputs={"index": index, "vectors": embed.out()},
                   attrs={"top_k": int(retriever.search_kwargs.get("k", 4)), "est_items": n_queries},
                   origin=origin)
    return search.out()


@lowering(VectorStoreRetriever)
def lower_vector_retriever(t: LangChainTracer, retriever: VectorStoreRetriever, value: Value) -> Value:
    _check_vector_retriever(retriever)
    origin = component_name(retriever)
    query = t.materialise(value)
    batch = t.add(Op.AGGREGATE, name="query_list", inputs={"in0": query}, attrs={"mode": "list"}, origin=origin)
    lists = _search(t, retriever, batch.out(), 1)
    pick = t.add(Op.AGGREGATE, name="documents", inputs={"in0": lists},
                 attrs={"mode": "pick", "index": 0}, origin=origin)
    return Traced(pick.out(), Kind.DOCUMENTS)


def _register_multi_query() -> None:
    try:
        from langchain_classic.retrievers.multi_query import LineListOutputParser, MultiQueryRetriever
    except ImportError:  # langchain-classic is optional
        return

    @lowering(MultiQueryRetriever)
    def lower_multi_query(t: LangChainTracer, mq: MultiQueryRetriever, value: Value) -> Value:
        """LLM writes queries, one per line -> retrieval per query -> unique union.

        The decode is marked parse="lines", so decode pipelining can retrieve for each
        query as soon as its line is complete. Lines are stripped (LangChain strips only
        the whole answer): the same text to the MiniLM tokenizer, which ignores surrounding
        whitespace; a whitespace-only line is no query here, while LangChain searches it.
        """
        chain = mq.llm_chain
        steps = chain.steps if isinstance(chain, RunnableSequence) else []
        if (len(steps) != 3 or not isinstance(steps[0], BasePromptTemplate)
                or not isinstance(steps[1], LowerableLanguageModel)
                or type(steps[2]) is not LineListOutputParser):
            raise CannotLower("llm_chain is not prompt | Teola model | LineListOutputParser")
        if mq.include_original:
            raise CannotLower("include_original=True is not lowered yet")
        _check_vector_retriever(mq.retriever)
        prompt, model, _ = steps
        if not (isinstance(value, Traced) and value.kind is Kind.TEXT):
            raise CannotLower("the query is not known to be a str")
        variables = template_variables(prompt, Record.of({"question": value}))
        decode, _ = add_llm_call(t, model, PendingPrompt(prompt, variables, component_name(prompt)),
                              parse="lines", est_items=3)
        lists = _search(t, mq.retriever, decode.out("items"), 3)
        union = t.add(Op.AGGREGATE, name="unique_union", inputs={"in0": lists},
                      attrs={"mode": "union"}, origin=component_name(mq))
        return Traced(union.out(), Kind.DOCUMENTS)


_register_multi_query()

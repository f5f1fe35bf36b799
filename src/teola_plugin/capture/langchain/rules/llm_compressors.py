"""LangChain's LLM document compressors (``LLMChainExtractor``, ``LLMChainFilter``, the first
examples of its contextual-compression docs): one chain call per retrieved document, as one
fan-out.

Both ask their ``llm_chain`` (``prompt | llm | parser``) about each document on its own:
``LLMChainExtractor.compress_documents`` one ``invoke`` after another (only its async variant
batches), ``LLMChainFilter`` through ``batch``. The calls are independent, so the lowered
compressor expands, when the documents are known, into one sub-graph per document (the
chain lowered as any chain: ``dynamic.expand_each``), all started at once: their prefills
and decodes share the engine's batches instead of waiting on each other. Each call is sent
as the chain sends it and reports the chain's own callback run, a child of the retriever's,
as each of plain's does; where calls fail, the first document's failure is raised, as plain's
loop or ``batch`` raises it (the others' calls were sent all the same, as its async variant
sends them). What the compressor makes of the answers is its own code: its
``compress_documents`` runs on the computed answers (:class:`_Answered` hands them back), so
which documents it keeps, their text and metadata are plain's.

A legacy ``LLMChain`` (a dict output) runs as it is.
"""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import Runnable

from ....ir.node import Ref
from ....ir.ops import Op
from ...served_models import installed_classes
from ..tracer import OUT, LangChainTracer, component_name
from .dynamic import Failed, expand_each

LLM_COMPRESSORS = ("langchain_classic.retrievers.document_compressors:LLMChainExtractor",
                   "langchain_classic.retrievers.document_compressors:LLMChainFilter")


def is_llm_compressor(compressor: Any) -> bool:
    """Exactly one of the two classes (a subclass may ask its chain differently)."""
    return type(compressor) in installed_classes(*LLM_COMPRESSORS)


class _Answered(Runnable):
    """The chain's answers the engines computed, handed back in the order the compressor asks
    for them (one ``invoke`` per document, or one ``batch``): its own code then picks."""

    def __init__(self, answers: list[Any]) -> None:
        self._answers = list(answers)
        self._next = 0

    def invoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
        answer = self._answers[self._next]
        self._next += 1
        return answer

    def batch(self, inputs: list[Any], config: Any = None, **kwargs: Any) -> list[Any]:
        return [self.invoke(x) for x in inputs]


def lower_llm_compressor(t: LangChainTracer, compressor: Any, docs: Ref, query: Ref) -> Ref | None:
    """documents -> one lowered chain call per document (an expansion) -> the compressor's
    own selection. None for a legacy ``LLMChain`` (then it runs as it is)."""
    from langchain_classic.chains.llm import LLMChain

    chain, get_input = compressor.llm_chain, compressor.get_input
    if isinstance(chain, LLMChain):
        return None
    t.streams_text = False  # the calls' streams are known at run time only (as RunnableEach's)
    planner, origin = t.planner, component_name(compressor)

    async def ask_each(docs: list[Any], query: str) -> Any:
        if not docs:
            return []
        return await expand_each(planner, chain, [get_input(query, doc) for doc in docs], origin,
                                 failures_as_values=True)

    answers = t.add(Op.OPAQUE, name="ask_each_document", inputs={"docs": docs, "query": query}, outputs=[OUT],
                    origin=origin, attrs={"fn": ask_each, "expands": "one chain call per document",
                                          "expands_into": (chain,)})
    t.note_expands(compressor, answers)

    async def compress(docs: list[Any], query: str, answers: list[Any]) -> list[Any]:
        if not docs:  # as ContextualCompressionRetriever: no call on no documents
            return []
        failed = next((a for a in answers if isinstance(a, Failed)), None)
        if failed is not None:  # plain's loop (and batch) raises the first document's failure
            raise failed.error
        answered = compressor.model_copy(update={"llm_chain": _Answered(answers)})
        return list(answered.compress_documents(docs, query))

    return t.add(Op.OPAQUE, name="compress", outputs=[OUT], origin=origin, attrs={"fn": compress, "pure": True},
                 inputs={"docs": docs, "query": query, "answers": answers.out(OUT)}).out(OUT)

"""``QueryFusionRetriever``: the LLM writes queries -> retrieval per query and retriever -> fusion.

    query ─┬─ retriever_i(query)                         (as each retriever lowers)
           └─ prompt -> llm_prefill -> llm_decode(parse="lines")
                          └─ items -> embed -> vector_search   (per vector retriever; decode
                                                                pipelining may run it per line)
    all of it -> fuse: the retriever's own ``_retrieve`` replayed on these results

Fidelity: the prompt is ``query_gen_prompt.format(...)`` sent as ``complete`` sends it;
``fuse`` calls ``QueryFusionRetriever._get_queries`` and ``_retrieve`` themselves on a
*replay* object whose LLM answer and sub-retrievals are the graph's, so the parsing
(backtick strip, blank lines, the ``num_queries - 1`` cap), the ``(query_str, retriever)``
result dict and every fusion mode are LlamaIndex's own code. The streamed retrieval runs on
the decode's stripped lines; a generated query that is not the line at its position (only
when backticks or exotic line breaks make LlamaIndex parse differently) is retrieved by the
sub-retriever itself, and retrieved lines beyond the cap are ignored, so nothing changes the
result. Retrievers that are not lowered as vector search retrieve the parsed queries inside
the ``fuse`` step (their own ``retrieve``, after the decode). Each generated query's search
the graph ran is reported in ``fuse`` as plain's ``retrieve`` (``aretrieve`` where plain awaits
it) reports it: its spans, ``RetrievalStart`` / ``End`` events and ``RETRIEVE`` callback event.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from llama_index.core.indices.vector_store.retrievers.retriever import VectorIndexRetriever
from llama_index.core.retrievers.fusion_retriever import QueryFusionRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle

from ..ir import semantics
from ..ir.node import INPUT, Ref
from ..ir.ops import Op
from ..ir.semantics import CHARS_PER_TOKEN
from .llama_index import (
    RETRIEVER_RULES,
    LlamaIndexTracer,
    NotLowerable,
    framework_call,
    lowering_rule,
)
from .llama_index_embed_events import EmbedEvents
from .llama_index_llm_events import CompleteEvents, return_reply
from .llama_index_models import llm_call_spec
from .llama_index_rules import check_vector_retriever, store_index
from .llama_index_span_events import retrieve_events
from .llama_index_spans import instant_span, model_call_spans, running_async, unspanned
from .llm_calls import emit_llm_call
from .lowerable import LLMCallSpec


@lowering_rule(RETRIEVER_RULES, QueryFusionRetriever)
def lower_query_fusion(tr: LlamaIndexTracer, fusion: QueryFusionRetriever) -> Ref:
    origin = type(fusion).__name__
    generates = fusion.num_queries > 1
    spec = llm_call_spec(tr.ctx.runtime, fusion._llm, tr.traced.engines) if generates else None

    inputs: dict[str, Ref] = {"query": tr.query}
    with tr.spans.awaited(fusion.use_async):  # its sync _retrieve awaits them under use_async
        for i, retriever in enumerate(fusion._retrievers):  # the original query, as each retriever lowers
            inputs[f"original{i}"] = tr.lower_retriever(retriever)
    streamed: set[int] = set()
    if generates:
        text, items = _generate_queries(tr, fusion, spec, origin)
        inputs["text"] = text
        for i, retriever in enumerate(fusion._retrievers):
            searched = _search_items(tr, retriever, items, fusion.num_queries - 1)
            if searched is not None:
                inputs[f"generated{i}"], vectors = searched
                if vectors is not None:
                    inputs[f"vectors{i}"] = vectors
                streamed.add(i)
    fuse = FusionReplay(fusion, streamed)
    return tr.cpu_step("fuse", fuse, inputs, origin, pure=not fusion.object_map)


def _generate_queries(tr: LlamaIndexTracer, fusion: QueryFusionRetriever, spec: LLMCallSpec,
                      origin: str) -> tuple[Ref, Ref]:
    """``_get_queries``'s LLM call (``complete``): (decoded text, its stripped non-blank lines)."""
    def prompt_text(query: QueryBundle) -> str:
        return fusion.query_gen_prompt.format(num_queries=fusion.num_queries - 1, query=query.query_str)

    def prompt(query: QueryBundle) -> Any:
        return spec.to_completion_prompt(prompt_text(query))

    # a format the LLM's own code renders
    request = tr.add(Op.FORMAT, name=tr.graph.unique_name("query_gen_prompt"), inputs={"query": tr.query},
                     attrs={"render": framework_call(prompt)}, origin=origin).out()
    est_tokens = len(fusion.query_gen_prompt) // CHARS_PER_TOKEN + 16
    outer_span, inner_spans = model_call_spans(tr.spans.span, fusion._llm, "complete")  # the model's own spans
    with outer_span as outer:
        with inner_spans as inners:
            decode = emit_llm_call(tr.add, request, spec, origin, est_tokens, parse="lines",
                                   est_items=fusion.num_queries - 1)
        return_reply(fusion._llm, False, decode, outer, *inners)  # each returns the model's CompletionResponse
        events = CompleteEvents.of(fusion._llm, prompt_text)
        if events is not None:  # the LLM's own events (not in module order: they wait only for what they report)
            events.add_steps(tr.graph, {"query": tr.query}, decode, origin)
    return decode.out("text"), decode.out("items")


def _search_items(tr: LlamaIndexTracer, retriever: Any, items: Ref, n: int) -> tuple[Ref, Ref | None] | None:
    """embed(items) -> vector_search, one hit list per generated line, and the lines' vectors
    where their embedding events are Teola's to report (in ``fuse``, for the lines plain
    embeds: not those beyond its cap); None when ``retriever`` is not a vector search the
    graph can reproduce."""
    if type(retriever) is not VectorIndexRetriever:
        return None
    try:
        check_vector_retriever(retriever)
    except NotLowerable:
        return None
    engine_name, attrs, _ = tr.query_embedding(retriever._embed_model)
    if engine_name is None:
        return None
    origin = type(retriever).__name__
    embed = tr.add(Op.EMBED, inputs={"texts": items}, engine=engine_name, attrs={"est_items": n, **attrs},
                   origin=origin)
    index, engine = store_index(tr, retriever)
    search = tr.add(Op.VECTOR_SEARCH, inputs={"index": index, "vectors": embed.out()}, engine=engine,
                    attrs={"top_k": retriever.similarity_top_k, "est_items": n}, origin=origin)
    reported = EmbedEvents.of(retriever._embed_model) is not None and "embed_text" not in attrs
    return search.out(), embed.out() if reported else None


class FusionReplay:
    """The ``fuse`` step: the fusion retriever's own ``_retrieve`` on the graph's results."""

    def __init__(self, fusion: QueryFusionRetriever, streamed: set[int]) -> None:
        self.fusion = fusion
        self.streamed = frozenset(streamed)
        self.__qualname__ = "fuse[QueryFusionRetriever]"

    def __call__(self, query: QueryBundle, text: str = "", **lists: Any) -> list[NodeWithScore]:
        fusion = self.fusion
        lines = semantics.parse_items(text, "lines") if text else []
        retrievers = fusion._retrievers

        def results_for(j: int, q: QueryBundle, i: int) -> list[NodeWithScore]:
            if j == 0:
                nodes = lists[f"original{i}"]
            elif i in self.streamed and j - 1 < len(lines) and lines[j - 1] == q.query_str:
                vectors = lists.get(f"vectors{i}")
                nodes = reported_retrieve(retrievers[i], q, lists[f"generated{i}"][j - 1],
                                          async_=fusion.use_async or running_async(),
                                          vector=None if vectors is None else vectors[j - 1])
            else:  # not retrieved in the graph: the sub-retriever's own retrieve
                nodes = retrievers[i].retrieve(q)
            # Fusion rescores in place; each plain retrieve returns fresh NodeWithScore objects.
            return [n.model_copy() for n in nodes]

        replay = _Replay(fusion, text, results_for)
        # its own code without its span: the graph reports the ``_retrieve`` span it stands for
        nodes = unspanned(fusion, "_retrieve", bound_to=replay)(query)
        return fusion._handle_recursive_retrieval(query, nodes)  # BaseRetriever.retrieve's last step


_QUERY = Ref(INPUT, "query")  # the query a replayed retrieval's events read (given, not a graph value)


def reported_retrieve(retriever: Any, query: QueryBundle, found: list[NodeWithScore], async_: bool,
                      vector: Any = None) -> list[NodeWithScore]:
    """``retriever.retrieve(query)`` (``aretrieve`` where plain awaits it) for a generated query
    the graph searched: its ``retrieve`` and ``_retrieve`` spans with its events and callback
    event (``retrieve_events``, as a lowered retriever's), and inside them the embedding of
    the query (its ``vector``, when its events are Teola's to report), as plain reports them,
    around its own last step on the graph's ``found`` nodes."""
    outer, inner = ("aretrieve", "_aretrieve") if async_ else ("retrieve", "_retrieve")
    events, known = retrieve_events(retriever, _QUERY), lambda ref: query
    embedded = EmbedEvents(retriever._embed_model) if vector is not None else None  # traced as heard
    with instant_span(retriever, outer, args=lambda values: {"str_or_query_bundle": query}) as returned:
        state = events.start(known)
        with instant_span(retriever, inner, args=lambda values: {"query_bundle": query}, result=found):
            if embedded is not None:  # its search ran in the graph; its embedding is reported here
                embedded.report([query.query_str], [vector], async_=async_)
        nodes = returned.result = retriever._handle_recursive_retrieval(query, found)
        events.end(state, nodes, known)
    return nodes


class _Replay:
    """Stands in for the fusion retriever inside its own methods: the LLM's answer and the
    sub-retrievals come from the graph; everything else is the retriever's."""

    use_async = False  # the sync path builds the same result dict as the async one

    def __init__(self, fusion: QueryFusionRetriever, text: str, results_for: Any) -> None:
        self._fusion = fusion
        self._llm = SimpleNamespace(complete=lambda prompt, **_: SimpleNamespace(text=text))
        self._results_for = results_for

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fusion, name)

    def _get_queries(self, original_query: str) -> list[QueryBundle]:
        return type(self._fusion)._get_queries(self, original_query)

    def _run_sync_queries(self, queries: list[QueryBundle]) -> dict[tuple[str, int], list[NodeWithScore]]:
        results = {}
        for j, query in enumerate(queries):
            for i in range(len(self._fusion._retrievers)):
                results[(query.query_str, i)] = self._results_for(j, query, i)
        return results

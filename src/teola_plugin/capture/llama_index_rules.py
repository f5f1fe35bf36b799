"""The built-in LlamaIndex lowering rules (registered on import by ``capture.llama_index``).

* ``RetrieverQueryEngine``: retriever -> node postprocessors -> response synthesizer.
* ``VectorIndexRetriever`` over an embedding-only store (``SimpleVectorStore``,
  ``ChromaVectorStore``, ``FaissVectorStore``, ``QdrantVectorStore``) in the default or MMR
  query mode: ``embed`` (on the embedder engine when it computes the model's vectors, on a served
  engine for a served model) -> query vector -> ``vector_search`` on the
  user's own store (``LlamaIndexStoreEngine``) -> the retriever's recursive-retrieval
  step. Under an async call, a store whose ``aquery`` is its own (Qdrant's async client) is
  searched by it, on the caller's loop, as plain's ``aretrieve`` searches.
* ``AutoMergingRetriever``: its vector retriever (lowered) -> its own merging into parents.
* Node postprocessors that are plain functions of (nodes, query) (and of the docstore:
  ``PrevNextNodePostprocessor``): the framework's own ``postprocess_nodes`` as a CPU step.
* ``CompactAndRefine`` / ``Refine`` / ``SimpleSummarize`` / ``TreeSummarize`` /
  ``Accumulate`` / ``CompactAndAccumulate`` / ``Generation`` with a TeolaLLM: a run-time
  expansion into LLM-call chains (``llama_index_synthesis``). A streaming synthesizer runs
  after the graph (which then outputs the nodes), so the response can stream.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from llama_index.core.callbacks.schema import CBEventType, EventPayload
from llama_index.core.indices.vector_store.retrievers.retriever import VectorIndexRetriever
from llama_index.core.postprocessor import (
    FixedRecencyPostprocessor,
    KeywordNodePostprocessor,
    LongContextReorder,
    MetadataReplacementPostProcessor,
    PrevNextNodePostprocessor,
    SimilarityPostprocessor,
)
from llama_index.core.query_engine.citation_query_engine import CitationQueryEngine
from llama_index.core.query_engine.retriever_query_engine import RetrieverQueryEngine
from llama_index.core.retrievers import AutoMergingRetriever
from llama_index.core.response_synthesizers import Accumulate
from llama_index.core.vector_stores.types import VectorStoreQueryMode

from ..engines.llama_index_store import LlamaIndexStoreEngine
from ..ir.node import Ref
from ..ir.ops import Op
from ..ir.ports import PortType
from ..runtime.caller import as_the_caller_calls
from ..runtime.engine_needs import EngineNeeds
from ..runtime.values import IndexHandle
from .llama_index import (
    POSTPROCESSOR_RULES,
    QUERY_ENGINE_RULES,
    RETRIEVER_RULES,
    SYNTHESIZER_RULES,
    LlamaIndexTracer,
    NotLowerable,
    TraceContext,
    has_no_vector,
    lowering_rule,
)
from .llama_index_ingest import join_pending
from .llama_index_models import llm_call_spec
from .llama_index_span_events import callback_event
from .llama_index_spans import unspanned
from .llama_index_synthesis import LLM_SYNTHESIZERS, SynthesisPlanner
from .lowerable import LowerableLLM

# Stores whose query result depends on the query embedding alone in the default mode: the
# search request carries vectors, not the query string (Qdrant reads the query text only in
# its sparse and hybrid modes; FAISS never). Not MilvusVectorStore: its package needs
# pymilvus < 3 and langchain-milvus >= 0.4 needs >= 3, so it is neither installed nor tested here.
EMBEDDING_ONLY_STORES = frozenset({"SimpleVectorStore", "ChromaVectorStore", "FaissVectorStore", "QdrantVectorStore"})
# Query modes whose search those stores run from the query vector alone: MMR re-ranks the
# candidates by their own embeddings (SimpleVectorStore, Chroma; Qdrant and FAISS search as in
# the default mode). The engine runs the retriever's own query, mode and kwargs included.
VECTOR_ONLY_MODES = frozenset({VectorStoreQueryMode.DEFAULT, VectorStoreQueryMode.MMR})


def _unobserved_prompts(component: Any) -> dict[str, Any]:
    """``component.get_prompts()`` without the spans LlamaIndex's instrumentation opens around
    its ``_get_prompts`` / ``_get_prompt_modules`` (plain's query reads no prompts that way)."""
    own = getattr(type(component)._get_prompts, "__wrapped__", None)
    modules = getattr(type(component)._get_prompt_modules, "__wrapped__", None)
    if own is None or modules is None:
        return component.get_prompts()
    prompts = dict(own(component))
    for name, module in modules(component).items():
        prompts.update({f"{name}:{key}": p for key, p in _unobserved_prompts(module).items()})
    return prompts


@lowering_rule(QUERY_ENGINE_RULES, RetrieverQueryEngine)
def lower_retriever_query_engine(tr: LlamaIndexTracer, engine: RetrieverQueryEngine) -> dict[str, Ref]:
    nodes = tr.lower_retriever(engine.retriever)
    for postprocessor in engine._node_postprocessors:  # RetrieverQueryEngine.retrieve's order
        nodes = tr.lower_postprocessor(postprocessor, nodes)
    response = tr.lower_synthesizer(engine._response_synthesizer, nodes)
    return {"nodes": nodes} if response is None else {"response": response, "nodes": nodes}


@lowering_rule(QUERY_ENGINE_RULES, CitationQueryEngine)
def lower_citation_query_engine(tr: LlamaIndexTracer, engine: CitationQueryEngine) -> dict[str, Ref]:
    """``CitationQueryEngine``: its ``retrieve`` (retriever -> node postprocessors) -> its own
    ``_create_citation_nodes`` (each node split into numbered "Source N:" chunks) -> the
    response synthesizer with its citation prompts; the answer's sources are those chunks."""
    # its _query's own RETRIEVE callback event, around its retrieve and the citation nodes
    with tr.spans.span(engine, "_query", reported=False,
                       events=callback_event(engine, tr.query, CBEventType.RETRIEVE, EventPayload.NODES)) as scope:
        nodes = tr.lower_retriever(engine._retriever)
        for postprocessor in engine._node_postprocessors:
            nodes = tr.lower_postprocessor(postprocessor, nodes)
        cited = tr.cpu_step("citation_nodes", lambda nodes: engine._create_citation_nodes(nodes), {"nodes": nodes},
                            type(engine).__name__)
        scope.result = cited
    response = tr.lower_synthesizer(engine._response_synthesizer, cited)
    return {"nodes": cited} if response is None else {"response": response, "nodes": cited}


def check_vector_retriever(retriever: VectorIndexRetriever) -> None:
    """Raise NotLowerable unless searching ``retriever``'s store by vector reproduces it."""
    store = retriever._vector_store
    if type(store).__name__ not in EMBEDDING_ONLY_STORES:
        raise NotLowerable(f"vector store {type(store).__name__} is not known to search by embedding alone")
    if retriever._vector_store_query_mode not in VECTOR_ONLY_MODES or not retriever._needs_embedding():
        raise NotLowerable(f"query mode {retriever._vector_store_query_mode.value!r} is not lowered")


def has_own_async_query(store: Any) -> bool:
    """Is ``store.aquery`` its own code, not LlamaIndex's default that calls ``query``?"""
    from llama_index.core.vector_stores.types import BasePydanticVectorStore

    return getattr(type(store), "aquery", None) is not BasePydanticVectorStore.aquery


def store_index(tr: LlamaIndexTracer, retriever: VectorIndexRetriever) -> tuple[Ref, str]:
    """The graph input naming ``retriever``'s store (searched in place) and its engine's name;
    when the index has deferred documents, the handle comes out of their ``vector_insert``
    (``join_pending``), so every search of the store in this graph waits for them."""
    store = retriever._vector_store
    name = f"llama_index-{type(store).__name__}-{id(store):x}"
    # One engine per store and runtime: a second executor on the runtime must bind on the
    # engine that serves the store. It goes when the store is collected (an index built per
    # request is not kept), before the store's id, and so the name, can be reused.
    tr.traced.engines.local_engine(name, lambda: LlamaIndexStoreEngine(store, name=name), owner=store,
                                   bind=retriever)
    handle = IndexHandle(LlamaIndexStoreEngine.index_name(retriever))
    index = tr.bind_input(f"index_{len(tr.traced.bound_inputs)}", handle, PortType.INDEX)
    return join_pending(tr, retriever, index, name), name


@lowering_rule(RETRIEVER_RULES, VectorIndexRetriever)
def lower_vector_index_retriever(tr: LlamaIndexTracer, retriever: VectorIndexRetriever) -> Ref:
    check_vector_retriever(retriever)
    origin = type(retriever).__name__
    vectors = tr.lower_query_vector(retriever._embed_model, origin)
    index, engine = store_index(tr, retriever)
    attrs: dict[str, Any] = {"top_k": retriever.similarity_top_k, "est_items": 1}
    if has_own_async_query(retriever._vector_store):  # plain's aretrieve uses it (Qdrant's async client)
        attrs["async_search"] = True
    search = tr.add(Op.VECTOR_SEARCH, inputs={"index": index, "vectors": vectors}, engine=engine,
                    attrs=attrs, origin=origin)

    def found(query: Any, hits: list[list[Any]]) -> list[Any]:
        # a query with no text: plain's own search without a vector (its store's nodes or error)
        return retriever._get_nodes_with_embeddings(query) if has_no_vector(query) else hits[0]

    def retrieved_nodes(query: Any, hits: list[list[Any]]) -> list[Any]:
        # BaseRetriever.retrieve's step after _retrieve: IndexNode objects, de-duplication.
        return retriever._handle_recursive_retrieval(query, found(query, hits))

    async def retrieved_objects(query: Any, hits: list[list[Any]]) -> list[Any]:
        # IndexNode objects (a query engine, a retriever) are queried as the caller queries:
        # aretrieve's step awaits their async methods, on the caller's loop
        return await as_the_caller_calls(retriever._handle_recursive_retrieval,
                                         retriever._ahandle_recursive_retrieval, query, found(query, hits))

    return tr.cpu_step("retrieved_nodes", retrieved_objects if retriever.object_map else retrieved_nodes,
                       {"query": tr.query, "hits": search.out()}, origin, pure=not retriever.object_map)


@lowering_rule(RETRIEVER_RULES, AutoMergingRetriever)
def lower_auto_merging_retriever(tr: LlamaIndexTracer, retriever: AutoMergingRetriever) -> Ref:
    """``AutoMergingRetriever``: its vector retriever, lowered, then its own ``_retrieve``
    merging what that found into their parents from its docstore (CPU; the docstore may change,
    so not pure)."""
    nodes = tr.lower_retriever(retriever._vector_retriever)

    def merged(query: Any, nodes: list[Any]) -> list[Any]:
        found = _Retrieved(retriever, "_vector_retriever", nodes)
        return retriever._handle_recursive_retrieval(query, unspanned(retriever, "_retrieve", bound_to=found)(query))

    return tr.cpu_step("auto_merge", merged, {"query": tr.query, "nodes": nodes}, type(retriever).__name__,
                       pure=False)


class _Retrieved:
    """Stands in for a retriever inside its own code: its inner retriever (``attr``) answers with
    the nodes the graph retrieved; everything else is the retriever's."""

    def __init__(self, retriever: Any, attr: str, nodes: list[Any]) -> None:
        self._retriever = retriever
        setattr(self, attr, SimpleNamespace(retrieve=lambda query: list(nodes)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._retriever, name)


@lowering_rule(POSTPROCESSOR_RULES, SimilarityPostprocessor, LongContextReorder, MetadataReplacementPostProcessor,
               FixedRecencyPostprocessor, KeywordNodePostprocessor, PrevNextNodePostprocessor)
def lower_cpu_postprocessor(tr: LlamaIndexTracer, postprocessor: Any, nodes: Ref) -> Ref:
    """Functions of (nodes, query), and of the docstore for ``PrevNextNodePostprocessor``:
    nothing to schedule but the framework's own code."""
    reads_docstore = isinstance(postprocessor, PrevNextNodePostprocessor)  # not pure: the docstore changes
    return tr.cpu_step("postprocess",
                       lambda nodes, query: postprocessor.postprocess_nodes(nodes, query_bundle=query),
                       {"nodes": nodes, "query": tr.query}, type(postprocessor).__name__, pure=not reads_docstore)


@lowering_rule(SYNTHESIZER_RULES, *LLM_SYNTHESIZERS)
def lower_llm_synthesizer(tr: LlamaIndexTracer, synthesizer: Any, nodes: Ref) -> Ref | None:
    planner = synthesis_planner(tr.ctx, synthesizer, tr.traced.engines)
    if planner.streaming:  # tokens reach the caller after the graph returned the nodes
        tr.traced.streaming_synthesis = planner
        tr.note("(after the graph)", synthesizer, "expands", planner.describe() + "; the final call streams")
        return None
    warm = planner.warm_prompt()  # split_prefill may warm its early part while retrieval runs
    ref = tr.cpu_step("synthesize", planner, {"query": tr.query, "nodes": nodes}, type(synthesizer).__name__,
                      pure=False, **({"warm_prompt": warm} if warm else {}))
    tr.note(ref.node, synthesizer, "expands", planner.describe())
    return ref


def synthesis_planner(ctx: TraceContext, synthesizer: Any, needs: EngineNeeds) -> SynthesisPlanner:
    """What plans ``synthesizer``'s LLM calls at run time (its engine recorded in ``needs``);
    ``NotLowerable`` when its type has no rule or this instance cannot be lowered."""
    if type(synthesizer) not in SYNTHESIZER_RULES:
        raise NotLowerable(f"no lowering rule for the response synthesizer {type(synthesizer).__name__}")
    llm = synthesizer._llm
    spec = llm_call_spec(ctx.runtime, llm, needs)
    # The plugin's own model streams engine tokens; a framework model's lowered call streams
    # only when its own streaming request is known (a served model's ``stream=True``).
    if not isinstance(llm, LowerableLLM) and synthesizer._streaming and not spec.streamed_request:
        raise NotLowerable(f"{type(llm).__name__} cannot stream in LlamaIndex (its own code runs)")
    for flag, what in ((synthesizer._multimodal, "multimodal"),
                       (getattr(synthesizer, "_output_cls", None), "output_cls"),
                       (getattr(synthesizer, "_structured_answer_filtering", False), "structured_answer_filtering")):
        if flag:
            raise NotLowerable(f"{what} synthesis is not lowered yet")
    if isinstance(synthesizer, Accumulate) and synthesizer._streaming:
        raise NotLowerable("Accumulate cannot stream (LlamaIndex raises ValueError; its own code runs)")
    parsers = [spec.parse_output] + [getattr(p, "output_parser", None) for p in _unobserved_prompts(synthesizer).values()]
    if synthesizer._streaming and any(p is not None for p in parsers):
        raise NotLowerable("streaming with an output parser (LlamaIndex raises NotImplementedError; its own "
                           "code runs)")
    return SynthesisPlanner(synthesizer, llm, spec, ctx.prepare_expansion)

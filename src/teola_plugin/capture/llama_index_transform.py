"""``TransformQueryEngine`` with ``HyDEQueryTransform``: the LLM writes a hypothetical answer
document, then the inner query engine answers the query searching with that document's
embedding (and the query's own, with ``include_original``).

    query -> hyde: one LLM call, ``llm.predict(hyde_prompt, context_str=query_str)`` (built by
             the LLM's own code, as every lowered ``predict``)
          -> transformed_query: the inner engine's traced graph, run with the QueryBundle the
             transform builds (``custom_embedding_strs`` = [document] + the query's own)

The inner engine is traced once and lowered as it lowers alone, so its retrieval embeds both
strings in one engine batch and its synthesis answers the original query string, as plain's
``_query`` does. Any other transform runs its own code (an LLM step decomposition, a
metadata-dependent rewrite), as does a HyDE whose LLM Teola does not serve.
"""

from __future__ import annotations

from llama_index.core.indices.query.query_transform import HyDEQueryTransform
from llama_index.core.query_engine import TransformQueryEngine
from llama_index.core.schema import QueryBundle

from ..ir.expansion import Expansion
from ..ir.node import Ref
from .llama_index import QUERY_ENGINE_RULES, LlamaIndexTracer, NotLowerable, lowering_rule
from .llama_index_models import llm_call_spec
from .llama_index_predict import PredictAndParse
from .llama_index_tools import EngineGraphs


@lowering_rule(QUERY_ENGINE_RULES, TransformQueryEngine)
def lower_transform_query_engine(tr: LlamaIndexTracer, engine: TransformQueryEngine) -> dict[str, Ref]:
    transform = engine._query_transform
    if type(transform) is not HyDEQueryTransform:
        raise NotLowerable(f"query transform {type(transform).__name__} (lowered: HyDEQueryTransform)")
    spec = llm_call_spec(tr.ctx.runtime, transform._llm, tr.traced.engines)  # NotLowerable: the engine runs as it is
    inner = EngineGraphs(tr, {"inner": engine._query_engine}, "query engine")
    origin = type(transform).__name__
    hyde = PredictAndParse(transform._llm, spec, transform._hyde_prompt,
                           lambda query: {"context_str": query.query_str}, _as_is, origin, tr.ctx.prepare_expansion,
                           within=(transform, "_run"))
    document = tr.cpu_step("hyde", hyde, {"query": tr.query}, origin, pure=False)
    tr.note(document.node, transform, "expands", hyde.describe())
    response = tr.cpu_step("transformed_query", TransformedQuery(transform, inner),
                           {"query": tr.query, "document": document}, type(engine).__name__, pure=False)
    tr.note(response.node, engine, "expands",
            "expands at run time into the inner query engine's graph, searching with the hypothetical document")
    return {"response": response}


def _as_is(text: str) -> str:
    return text


class TransformedQuery:
    """(query, hypothetical document) -> the inner engine's graph on the transformed query."""

    def __init__(self, transform: HyDEQueryTransform, inner: EngineGraphs) -> None:
        self.transform = transform
        self.inner = inner
        self.__qualname__ = "transformed_query[TransformQueryEngine]"

    def __call__(self, query: QueryBundle, document: str) -> Expansion:
        return self.inner.query("inner", transformed(self.transform, query, document))


def transformed(transform: HyDEQueryTransform, query: QueryBundle, document: str) -> QueryBundle:
    """The QueryBundle ``HyDEQueryTransform._run`` returns for ``document``."""
    embedding_strs = [document]
    if transform._include_original:
        embedding_strs.extend(query.embedding_strs)
    return QueryBundle(query_str=query.query_str, custom_embedding_strs=embedding_strs)

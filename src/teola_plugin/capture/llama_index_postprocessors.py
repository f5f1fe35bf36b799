"""Node postprocessors that call a model: ``LLMRerank`` and ``SentenceTransformerRerank``.

``LLMRerank`` splits the nodes into batches of ``choice_batch_size`` and asks the LLM about
each batch independently. How many batches there are depends on the retrieved nodes, so the
lowering is a run-time expansion: one ``prompt -> llm_prefill -> llm_decode`` per batch, all
independent (their prefills can share an engine batch), then a step that runs
``LLMRerank._postprocess_nodes`` itself on a replay object whose LLM hands back the graph's
answers in batch order: batching, prompt kwargs, the parse function and the final sort /
``top_n`` are LlamaIndex's own code.

``SentenceTransformerRerank`` scores with a sentence-transformers ``CrossEncoder``. Teola's
reranker engine computes the same thing only when it serves that very cross-encoder; the
default engine is the bundled all-MiniLM-L6-v2 *bi-encoder* (cosine of embeddings, other
scores and possibly another order), and no cross-encoder weights are available offline to
check equivalence, so it is not lowered: it runs unchanged as an opaque step and
``explain()`` / the log say why.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.postprocessor.llm_rerank import LLMRerank
from llama_index.core.postprocessor.sbert_rerank import SentenceTransformerRerank
from llama_index.core.schema import NodeWithScore, QueryBundle

from ..ir.graph import PGraph
from ..ir.node import Ref
from ..runtime.handlers import Expansion
from .llama_index import POSTPROCESSOR_RULES, LlamaIndexTracer, NotLowerable, lowering_rule
from .llama_index_models import engine_llm
from .llama_index_synthesis import cpu_step, llm_call


@lowering_rule(POSTPROCESSOR_RULES, LLMRerank)
def lower_llm_rerank(tr: LlamaIndexTracer, rerank: LLMRerank, nodes: Ref) -> Ref:
    requests = engine_llm(tr.ctx.runtime, rerank.llm)
    planner = LLMRerankPlanner(rerank, requests, tr.ctx.prepare_expansion)
    ref = tr.cpu_step("llm_rerank", planner, {"nodes": nodes, "query": tr.query}, type(rerank).__name__, pure=False)
    tr.note(ref.node, rerank, "expands", "expands at run time into one independent prompt -> llm_prefill -> "
            f"llm_decode chain per batch of {rerank.choice_batch_size} nodes, then LLMRerank's own parse and sort")
    return ref


class LLMRerankPlanner:
    """The ``llm_rerank`` primitive's function: (nodes, query) -> Expansion -> reranked nodes."""

    def __init__(self, rerank: LLMRerank, requests: Any, prepare: Any) -> None:
        self.rerank = rerank
        self.requests = requests  # builds the engine requests of rerank.llm
        self.prepare = prepare
        self.__qualname__ = "llm_rerank[LLMRerank]"

    def __call__(self, nodes: list[NodeWithScore], query: QueryBundle | None) -> Any:
        rerank = self.rerank
        if query is None or not nodes:  # its own early exits (ValueError / [])
            return rerank.postprocess_nodes(nodes, query_bundle=query)
        origin = type(rerank).__name__
        graph = PGraph(origin)
        answers = [llm_call(graph, self.requests, rerank.choice_select_prompt,
                            rerank._get_predict_kwargs(batch, query.query_str), origin)
                   for batch in rerank._get_node_batches(nodes)]

        def reranked(**out: str) -> list[NodeWithScore]:
            replay = _RerankReplay(rerank, [out[f"a{i}"] for i in range(len(answers))])
            return type(rerank)._postprocess_nodes(replay, nodes, query)

        graph.output("out", cpu_step(graph, "reranked", reranked, {f"a{i}": a for i, a in enumerate(answers)},
                                     origin))
        return Expansion(self.prepare(graph), {})


class _RerankReplay:
    """Stands in for the LLMRerank inside its own ``_postprocess_nodes``: ``llm.predict``
    returns the graph's answers in batch order; everything else is the reranker's."""

    def __init__(self, rerank: LLMRerank, answers: list[str]) -> None:
        self._rerank = rerank
        pending = iter(answers)
        self.llm = _AnsweringLLM(lambda: next(pending))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rerank, name)


class _AnsweringLLM:
    def __init__(self, answer: Any) -> None:
        self._answer = answer

    def predict(self, *args: Any, **kwargs: Any) -> str:
        return self._answer()


@lowering_rule(POSTPROCESSOR_RULES, SentenceTransformerRerank)
def decline_cross_encoder(tr: LlamaIndexTracer, rerank: SentenceTransformerRerank, nodes: Ref) -> Ref:
    specs = getattr(tr.ctx.runtime, "specs", {})
    cross = next((s.kwargs.get("cross_encoder_path") for s in specs.values() if s.kind == "reranker"), None)
    served = (f"the cross-encoder at {cross} (lowering onto it is not implemented: no cross-encoder "
              "weights exist offline to check that it scores like this one)" if cross else
              "the all-MiniLM-L6-v2 bi-encoder, whose scores and order differ")
    raise NotLowerable(f"scores with the cross-encoder {rerank.model!r}; Teola's reranker engine serves {served}, "
                       "so the rerank primitive would change the result")

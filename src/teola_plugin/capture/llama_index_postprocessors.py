"""Node postprocessors that call a model: ``LLMRerank`` and ``SentenceTransformerRerank``.

``LLMRerank`` splits the nodes into batches of ``choice_batch_size`` and asks the LLM about
each batch independently. How many batches there are depends on the retrieved nodes, so the
lowering is a run-time expansion: one ``prompt -> llm_prefill -> llm_decode`` per batch, all
independent (their prefills can share an engine batch), then a step that runs
``LLMRerank._postprocess_nodes`` itself on a replay object whose LLM hands back the graph's
answers in batch order: batching, prompt kwargs, the parse function and the final sort /
``top_n`` are LlamaIndex's own code.

``SentenceTransformerRerank`` scores with a sentence-transformers ``CrossEncoder``. It is
lowered to a ``rerank`` primitive only on a reranker engine that scores exactly as it does:
one whose ``cross_encoder_path`` is the same directory as its ``model`` (same path or
``os.path.samefile``; engines from the runtime's specs or served in-process with
``Runtime.add_local_engine``) and whose ``max_length`` equals its CrossEncoder's (LlamaIndex
loads with 512; an engine left at ``None`` uses the model's own and is not assumed equal).
Both load the directory without an explicit activation, so both apply the model's default
one; an activation that is not a ``torch.*`` class (a custom one trusted via
``trust_remote_code``, which the engine does not pass) is declined. Device and batch
composition are not compared: they only change float rounding. Otherwise it runs
unchanged as an opaque step and ``explain()`` / the log say why (no engine serves that
cross-encoder, naming what each serves; or which setting differs).

Lowered, the graph is ``rerank_pairs`` (each node's ``MetadataMode.EMBED`` content as a hit
whose id is its position) -> ``rerank`` (every node scored, no ``top_n``) -> ``reranked``,
which runs ``SentenceTransformerRerank._postprocess_nodes`` itself with a stand-in model whose
``predict`` returns the engine's scores in node order (as float32, the CrossEncoder's own
dtype): the score assignment, ``keep_retrieval_score``, callback event, sort and ``top_n``
are LlamaIndex's own code.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llama_index.core.postprocessor.llm_rerank import LLMRerank
from llama_index.core.postprocessor.sbert_rerank import SentenceTransformerRerank
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from ..engines.base import Hit
from ..engines.reranker import Reranker
from ..ir.graph import PGraph
from ..ir.node import Ref
from ..ir.ops import Op
from .llama_index import POSTPROCESSOR_RULES, LlamaIndexTracer, NotLowerable, lowering_rule
from .llama_index_models import llm_call_spec
from .llama_index_spans import SpanPlan, span_in_building, unspanned
from .llama_index_synthesis import cpu_step, llm_call
from .lowerable import LLMCallSpec
from .vllm_identity import same_model


@lowering_rule(POSTPROCESSOR_RULES, LLMRerank)
def lower_llm_rerank(tr: LlamaIndexTracer, rerank: LLMRerank, nodes: Ref) -> Ref:
    planner = LLMRerankPlanner(rerank, llm_call_spec(tr.ctx.runtime, rerank.llm, tr.traced.engines), tr.ctx.prepare_expansion)
    ref = tr.cpu_step("llm_rerank", planner, {"nodes": nodes, "query": tr.query}, type(rerank).__name__, pure=False)
    tr.note(ref.node, rerank, "expands", "expands at run time into one independent prompt -> llm_prefill -> "
            f"llm_decode chain per batch of {rerank.choice_batch_size} nodes, then LLMRerank's own parse and sort")
    return ref


class LLMRerankPlanner:
    """The ``llm_rerank`` primitive's function: (nodes, query) -> Expansion -> reranked nodes."""

    def __init__(self, rerank: LLMRerank, spec: LLMCallSpec, prepare: Any) -> None:
        self.rerank = rerank
        self.spec = spec  # how rerank.llm's calls run on an engine
        self.prepare = prepare
        self.__qualname__ = "llm_rerank[LLMRerank]"

    def __call__(self, nodes: list[NodeWithScore], query: QueryBundle | None) -> Any:
        rerank = self.rerank
        if query is None or not nodes:  # its own early exits (ValueError / [])
            return rerank.postprocess_nodes(nodes, query_bundle=query)
        origin = type(rerank).__name__
        graph = PGraph(origin)
        plan = SpanPlan(graph)

        def reranked(**out: str) -> list[NodeWithScore]:
            replay = _RerankReplay(rerank, [out[f"a{i}"] for i in range(len(answers))])
            return unspanned(rerank, "_postprocess_nodes", bound_to=replay)(nodes, query)

        # each call reports its predict / chat spans with their events inside the reranker's
        # _postprocess_nodes span, as plain's (its async path opens none)
        with plan.building(), span_in_building(rerank, "_postprocess_nodes",
                                               args=lambda v: {"nodes": nodes, "query_bundle": query}) as span:
            answers = [llm_call(graph, rerank.llm, self.spec, rerank.choice_select_prompt,
                                rerank._get_predict_kwargs(batch, query.query_str), origin)
                       for batch in rerank._get_node_batches(nodes)]
            out = cpu_step(graph, "reranked", reranked, {f"a{i}": a for i, a in enumerate(answers)}, origin)
        if span is not None:
            span.result = out
        graph.output("out", out)
        return plan.expansion(self.prepare(graph))


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
def lower_cross_encoder(tr: LlamaIndexTracer, rerank: SentenceTransformerRerank, nodes: Ref) -> Ref:
    engine = cross_encoder_engine(tr.ctx.runtime, rerank)
    origin = type(rerank).__name__
    hits = tr.cpu_step("rerank_pairs", _pairs_as_hits, {"nodes": nodes, "query": tr.query}, origin)
    query_str = tr.cpu_step("query_str", _query_str, {"query": tr.query}, origin)
    scored = tr.add(Op.RERANK, name=tr.graph.unique_name("rerank"), engine=engine,
                    inputs={"query": query_str, "hits": hits}, origin=origin)
    # No top_n on the primitive: every node is scored, then LlamaIndex's own code sorts and cuts.
    return tr.cpu_step("reranked", CrossEncoderScores(rerank),
                       {"nodes": nodes, "query": tr.query, "hits": scored.out()}, origin, pure=False)


def reranker_engines(runtime: Any) -> dict[str, dict[str, Any]]:
    """Each reranker engine of ``runtime`` and its scoring settings: from the specs (no engine
    call) and from engines served in-process (``Runtime.add_local_engine``)."""
    out = {name: {"cross_encoder_path": spec.kwargs.get("cross_encoder_path"),
                  "max_length": spec.kwargs.get("max_length")}
           for name, spec in getattr(runtime, "specs", {}).items() if spec.kind == "reranker"}
    for name, engine in runtime.local_engines().items():
        if isinstance(engine, Reranker):
            out[name] = {"cross_encoder_path": engine.cross_encoder_path, "max_length": engine.max_length}
    return out


def cross_encoder_engine(runtime: Any, rerank: SentenceTransformerRerank) -> str:
    """The reranker engine that scores exactly as ``rerank`` does, else NotLowerable saying why."""
    engines = reranker_engines(runtime)
    candidates = [n for n, s in engines.items() if same_model(s["cross_encoder_path"], rerank.model)]
    if not candidates:
        serving = "; ".join(f"{n!r}: " + (f"the cross-encoder at {s['cross_encoder_path']}" if s["cross_encoder_path"]
                                          else "the all-MiniLM-L6-v2 bi-encoder (other scores, possibly another order)")
                            for n, s in sorted(engines.items())) or "no reranker engine"
        raise NotLowerable(f"scores with the cross-encoder {rerank.model!r}, which no Teola reranker engine serves "
                           f"({serving}), so a rerank primitive would change the result")
    model = getattr(rerank, "__pydantic_private__", None) or {}
    model = model.get("_model")
    if model is None:
        raise NotLowerable(f"its CrossEncoder {rerank.model!r} is not loaded, so its scoring settings are unknown")
    activation = _fullname(getattr(model, "activation_fn", None))
    if not activation.startswith("torch."):
        # The engine loads without trust_remote_code: it would fall back to the default activation.
        raise NotLowerable(f"its CrossEncoder applies the activation {activation}, which the reranker engine "
                           "(loaded without trust_remote_code) would not apply")
    length = getattr(model, "max_seq_length", None)
    for name in candidates:
        if engines[name]["max_length"] == length:
            return name
    name = candidates[0]
    raise NotLowerable(f"scores with the cross-encoder {rerank.model!r} truncated to max_length={length}; the reranker "
                       f"engine {name!r} serving it uses max_length={engines[name]['max_length']!r} (None: the "
                       "model's own), which can change scores; give the engine that max_length to lower it")


def _fullname(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _query_str(query: QueryBundle | None) -> str:
    return "" if query is None else query.query_str


def _pairs_as_hits(nodes: list[NodeWithScore], query: QueryBundle | None) -> list[Hit]:
    """The texts SentenceTransformerRerank pairs with the query; a hit's id is the node's position.
    Nothing for no query: no engine call, and LlamaIndex's own code then raises its error."""
    if query is None:
        return []
    return [Hit(id=str(i), score=0.0, text=n.node.get_content(metadata_mode=MetadataMode.EMBED))
            for i, n in enumerate(nodes)]


class CrossEncoderScores:
    """``reranked``: runs ``SentenceTransformerRerank._postprocess_nodes`` itself on a replay whose
    CrossEncoder returns the engine's scores in node order (its callback event, score
    assignment, ``keep_retrieval_score``, sort and ``top_n`` are LlamaIndex's own code)."""

    def __init__(self, rerank: SentenceTransformerRerank) -> None:
        self.rerank = rerank
        self.__qualname__ = "reranked[SentenceTransformerRerank]"

    def __call__(self, nodes: list[NodeWithScore], query: QueryBundle | None, hits: list[Hit]) -> list[NodeWithScore]:
        by_position = {int(h.id): h.score for h in hits}
        if query is not None and sorted(by_position) != list(range(len(nodes))):
            raise RuntimeError(f"the reranker engine returned scores for node positions {sorted(by_position)}, "
                               f"expected 0..{len(nodes) - 1}")
        # The engine's float64 holds the CrossEncoder's float32 exactly; LlamaIndex sets those.
        scores = np.asarray([by_position.get(i, 0.0) for i in range(len(nodes))], dtype=np.float32)
        replay = _ScoresReplay(self.rerank, scores)
        return type(self.rerank)._postprocess_nodes(replay, nodes, query)


class _ScoresReplay:
    """Stands in for the SentenceTransformerRerank: ``_model.predict`` returns the engine's scores."""

    def __init__(self, rerank: SentenceTransformerRerank, scores: Any) -> None:
        self._rerank = rerank
        self._model = _ScoringModel(scores)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rerank, name)


class _ScoringModel:
    def __init__(self, scores: Any) -> None:
        self._scores = scores

    def predict(self, pairs: Any, *args: Any, **kwargs: Any) -> Any:
        if len(pairs) != len(self._scores):
            raise RuntimeError(f"{len(pairs)} (query, node) pairs but {len(self._scores)} engine scores")
        return self._scores

"""``SubQuestionQueryEngine``: the LLM writes sub-questions -> each one's query engine -> synthesis.

    query -> question generation (one LLM call; parsed by the generator's own output parser)
          -> sub_queries: one sub-graph per sub-question, all at once, each the traced graph
             of the tool's query engine (lowered as that engine lowers)
          -> collect: LlamaIndex's own answer nodes (``_construct_node``) -> the synthesizer
             (its LLM calls expanded as a query engine's are) with the sub-queries' sources

Fidelity: the question-generation request is ``LLMQuestionGenerator.generate``'s
(``llm.predict(prompt, tools_str=..., query_str=...)``, built by the LLM's own code) and its
answer is parsed by the prompt's own output parser; any other generator (or an LLM Teola does
not serve) runs its own ``generate``. The tools' query engines are traced once here and run
per sub-question, so a sub-question's answer is the one ``query_engine.query(question)``
gives. A sub-query that raises (an unknown tool name included) is logged and left out, as
``_query_subq`` does. Sub-queries run concurrently whether
or not the engine was built with ``use_async`` (they are independent; ``use_async`` only
changes how LlamaIndex awaits them), so their embeddings, searches and LLM calls share the
engines' batches. Each sub-query reports ``_query_subq``'s ``SUB_QUESTION`` callback event
(the question, then its answer pair with sources; a failure's exception), around the tool's
own query events and spans, and the final synthesis its ``synthesize`` span with its events,
so ``LlamaDebugHandler.get_event_pairs(CBEventType.SUB_QUESTION)`` (the engine's docs read
the answers that way) gives plain's pairs; ``verbose`` prints the same lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llama_index.core.callbacks.schema import CBEventType, EventPayload
from llama_index.core.query_engine import sub_question_query_engine
from llama_index.core.query_engine.sub_question_query_engine import SubQuestionAnswerPair, SubQuestionQueryEngine
from llama_index.core.question_gen.llm_generators import LLMQuestionGenerator
from llama_index.core.question_gen.prompts import build_tools_text
from llama_index.core.schema import QueryBundle
from llama_index.core.utils import get_color_mapping, print_text

from ..ir.node import Ref
from ..ir.expansion import Expansion
from .llama_index import QUERY_ENGINE_RULES, LlamaIndexTracer, NotLowerable, lowering_rule
from .llama_index_models import llm_call_spec
from .llama_index_rules import synthesis_planner
from .llama_index_predict import PredictAndParse
from .llama_index_span_events import CallbackEvent, synthesize_events
from .llama_index_synthesis import SynthesisPlanner
from .llama_index_tools import EngineGraphs, run_all


@lowering_rule(QUERY_ENGINE_RULES, SubQuestionQueryEngine)
def lower_sub_question_engine(tr: LlamaIndexTracer, engine: SubQuestionQueryEngine) -> dict[str, Ref]:
    origin = type(engine).__name__
    synthesizer = engine._response_synthesizer
    try:
        planner = synthesis_planner(tr.ctx, synthesizer, tr.traced.engines)
    except NotLowerable as exc:
        planner, why = None, str(exc)
    if planner is not None and planner.streaming:
        raise NotLowerable("a streaming response synthesizer (the engine runs its own code, its "
                           "sub-queries still on Teola)")
    tools = EngineGraphs(tr, engine._query_engines, "tool")
    questions = _question_generation(tr, engine, origin)
    answers = tr.cpu_step("sub_queries", SubQueries(engine, tools),
                          {"query": tr.query, "sub_questions": questions}, origin, pure=False)
    tr.note(answers.node, engine, "expands",
            f"expands at run time into one sub-graph per generated sub-question (tools: {', '.join(tools.apps)}), "
            "run concurrently")
    answered = tr.cpu_step("answer_nodes", AnswerNodes(engine), {"answers": answers}, origin, pure=False)
    if planner is None:  # the synthesizer's own synthesize (its own span and events)
        response = tr.cpu_step("synthesize", Collect(engine, None), {"query": tr.query, "answered": answered},
                               origin, pure=False)
        tr.note(response.node, synthesizer, "opaque", why)
        return {"response": response}
    with tr.spans.span(synthesizer, "synthesize", events=synthesize_events(synthesizer, tr.query,
                                                                           lambda v: _nodes(v(answered))),
                       args=lambda v: {"query": v(tr.query), "nodes": _nodes(v(answered))}) as span:
        response = tr.cpu_step("synthesize", Collect(engine, planner), {"query": tr.query, "answered": answered},
                               origin, pure=False)
        if span is not None:
            span.result = response
    tr.note(response.node, synthesizer, "expands", planner.describe())
    return {"response": response}


def _nodes(answered: Answered | None) -> list[Any] | None:
    return None if answered is None else answered.nodes


def _question_generation(tr: LlamaIndexTracer, engine: SubQuestionQueryEngine, origin: str) -> Ref:
    """The sub-questions: ``LLMQuestionGenerator.generate``'s LLM call on its engine, or the
    generator's own ``generate``."""
    generator = engine._question_gen
    metadatas = engine._metadatas
    if type(generator) is LLMQuestionGenerator:
        try:
            spec = llm_call_spec(tr.ctx.runtime, generator._llm, tr.traced.engines)
        except NotLowerable as exc:
            why = f"question generation: {exc}"
        else:
            tools_str, prompt = build_tools_text(metadatas), generator._prompt
            step = PredictAndParse(generator._llm, spec, prompt,
                                   lambda query: {"tools_str": tools_str, "query_str": query.query_str},
                                   lambda text: prompt.output_parser.parse(text).parsed_output,
                                   "LLMQuestionGenerator", tr.ctx.prepare_expansion, within=(generator, "generate"))
            ref = tr.cpu_step("question_gen", step, {"query": tr.query}, origin, pure=False)
            tr.note(ref.node, generator, "expands", step.describe())
            return ref
    else:
        why = f"question generator {type(generator).__name__} is not lowered (its own generate runs)"
    return tr.opaque("question_gen", generator, lambda query: generator.generate(metadatas, query),
                     {"query": tr.query}, why)


@dataclass(frozen=True)
class SubAnswer:
    """One sub-question's outcome: its Response, or None when it failed (``asked``: whether
    its query started, i.e. its tool exists; plain prints the question only then)."""

    sub_q: Any
    response: Any
    asked: bool


class SubQueries:
    """(query, sub-questions) -> Expansion: each sub-question's tool graph, all independent;
    the output is the list of :class:`SubAnswer`."""

    def __init__(self, engine: SubQuestionQueryEngine, tools: EngineGraphs) -> None:
        self.engine = engine
        self.tools = tools
        self.__qualname__ = "sub_queries[SubQuestionQueryEngine]"

    def __call__(self, query: QueryBundle, sub_questions: list[Any]) -> Expansion:
        return run_all("sub_query", [lambda sub_q=sub_q: self.sub_query(sub_q) for sub_q in sub_questions],
                       list, type(self.engine).__name__)

    def sub_query(self, sub_q: Any) -> Any:
        """The sub-question's query in ``_query_subq``'s ``SUB_QUESTION`` callback event (the
        question -> its answer pair, or the failure)."""
        event = CallbackEvent(self.engine.callback_manager, CBEventType.SUB_QUESTION)
        event_id = event.start({EventPayload.SUB_QUESTION: SubQuestionAnswerPair(sub_q=sub_q)})
        if sub_q.tool_name not in self.tools:  # _query_subq's KeyError: logged, left out
            failure = KeyError(sub_q.tool_name)
            event.failed(event_id, failure)
            _log_failure(sub_q, failure)
            return SubAnswer(sub_q, None, asked=False)

        def answered(response: Any) -> SubAnswer:
            pair = SubQuestionAnswerPair(sub_q=sub_q, answer=str(response), sources=response.source_nodes)
            event.end(event_id, {EventPayload.SUB_QUESTION: pair})
            return SubAnswer(sub_q, response, asked=True)

        def failed(exc: Exception) -> dict[str, Any]:
            event.failed(event_id, exc)
            _log_failure(sub_q, exc)
            return {"out": SubAnswer(sub_q, None, asked=True)}

        return self.tools.query(sub_q.tool_name, QueryBundle(sub_q.sub_question), then=answered,
                                recover=(Exception, failed))


def _log_failure(sub_q: Any, exc: Exception) -> None:
    """What ``_query_subq`` logs for a sub-question that failed (it then leaves it out)."""
    sub_question_query_engine.logger.warning(f"[{sub_q.tool_name}] Failed to run {sub_q.sub_question}",
                                             exc_info=exc)


@dataclass(frozen=True)
class Answered:
    """The answered sub-questions as the synthesizer gets them: one node per answer pair
    (``_construct_node``) and the sub-queries' own sources."""

    nodes: list[Any]
    source_nodes: list[Any]


class AnswerNodes:
    """The engine's own tail of ``_query`` before synthesis: verbose lines, answer pairs -> nodes."""

    def __init__(self, engine: SubQuestionQueryEngine) -> None:
        self.engine = engine
        self.__qualname__ = "answer_nodes[SubQuestionQueryEngine]"

    def __call__(self, answers: list[SubAnswer]) -> Answered:
        engine = self.engine
        if engine._verbose:
            print_text(f"Generated {len(answers)} sub questions.\n")
        colors = get_color_mapping([str(i) for i in range(len(answers))])
        # The lines _query_subq prints: one sub-question after the other (Q, A, Q, A); under
        # use_async its tasks all print their question as they start, then their answers.
        questions_first = engine._verbose and engine._use_async
        for i, answer in enumerate(answers):
            if questions_first and answer.asked:
                print_text(f"[{answer.sub_q.tool_name}] Q: {answer.sub_q.sub_question}\n", color=colors[str(i)])
        qa_pairs = []
        for i, answer in enumerate(answers):
            sub_q = answer.sub_q
            if engine._verbose and answer.asked and not questions_first:
                print_text(f"[{sub_q.tool_name}] Q: {sub_q.sub_question}\n", color=colors[str(i)])
            if answer.response is None:
                continue
            text = str(answer.response)
            if engine._verbose:
                print_text(f"[{sub_q.tool_name}] A: {text}\n", color=colors[str(i)])
            qa_pairs.append(SubQuestionAnswerPair(sub_q=sub_q, answer=text, sources=answer.response.source_nodes))
        return Answered([engine._construct_node(pair) for pair in qa_pairs],
                        [node for pair in qa_pairs for node in pair.sources])


class Collect:
    """The synthesis over the answer nodes: the planner's expansion, or (``planner`` None) the
    synthesizer's own ``synthesize``."""

    def __init__(self, engine: SubQuestionQueryEngine, planner: SynthesisPlanner | None) -> None:
        self.engine = engine
        self.planner = planner
        self.__qualname__ = "synthesize[SubQuestionQueryEngine]"

    def __call__(self, query: QueryBundle, answered: Answered) -> Any:
        if self.planner is None:
            return self.engine._response_synthesizer.synthesize(query=query, nodes=answered.nodes,
                                                                additional_source_nodes=answered.source_nodes)
        if not answered.nodes:
            return self.planner(query, answered.nodes)
        return self.planner.expansion(query, answered.nodes, answered.source_nodes)

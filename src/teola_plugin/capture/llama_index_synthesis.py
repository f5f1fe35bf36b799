"""Response synthesis as run-time expansions: how many LLM calls a synthesizer makes depends
on the retrieved text, so the graph of those calls is built when the nodes are known.

Each LLM call becomes ``prompt -> llm_prefill -> llm_decode``: the ``prompt`` primitive runs
the framework's own code (the synthesizer's template, the model's ``LLMCallSpec.to_engine_prompt``, i.e.
``LLM.predict``'s formatting and chat handling), so the engine receives the request plain
LlamaIndex sends. Packing text into prompts uses the synthesizer's prompt helper
(``repack`` / ``truncate``) exactly where ``Refine._run_refine_loop`` and
``SimpleSummarize.get_response`` use it.

Refine (and compact, which is refine over packed chunks) is sequential: each prompt holds
the previous answer, so each step expands into its call plus a step that expands the next.
Tree summarize packs the texts (``repack``, as ``TreeSummarize.get_response``); one packed
chunk is the final call, several are independent calls (one graph level, so their prefills
can share an engine batch) followed by a step that expands the next level over their
summaries. Accumulate's calls (one per repacked chunk of each node) are all independent;
its own ``_format_response`` joins them (``CompactAndAccumulate`` repacks the texts first, as
its own ``get_response``). ``Generation`` makes one call from the query alone. LlamaIndex's
``use_async`` only changes how it awaits these calls, never which calls or their results, so
both settings plan the same.
Streaming synthesizers stream the final call's tokens (graph output ``stream``); the
executor then builds the ``StreamingResponse`` itself.
"""

from __future__ import annotations

import contextlib
import inspect
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from llama_index.core.base.response.schema import Response
from llama_index.core.prompts.prompt_utils import get_biggest_prompt
from llama_index.core.response_synthesizers import (Accumulate, CompactAndRefine, Generation, Refine,
                                                    SimpleSummarize, TreeSummarize)
from llama_index.core.response_synthesizers.compact_and_accumulate import CompactAndAccumulate
from llama_index.core.response_synthesizers.refine import StructuredRefineResponse
from llama_index.core.utils import temp_set_attrs
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from ..ir.graph import PGraph
from ..ir.node import Ref
from ..ir.ops import Op
from ..ir.semantics import CHARS_PER_TOKEN
from ..ir.expansion import Expansion
from .llama_index import framework_call
from .llama_index_llm_events import LLMEvents, return_reply
from .llama_index_span_events import GetResponseEvents
from .llama_index_spans import SpanPlan, instant_span, model_call_spans, span_in_building
from .llm_calls import emit_llm_call
from .lowerable import LLMCallSpec
from .prompt_parts import marked_parts

EMPTY = "Empty Response"  # what LlamaIndex answers when the LLM says nothing
# the synthesizers whose LLM calls SynthesisPlanner plans (exact types: a subclass may override them)
LLM_SYNTHESIZERS = (CompactAndRefine, Refine, SimpleSummarize, TreeSummarize, Accumulate, CompactAndAccumulate,
                    Generation)


CONTEXT_TOKENS_GUESS = 512  # the retrieved text a first call's prompt holds (cost model only)


def _entered_span(instance: Any, method: str, **kwargs: Any) -> contextlib.AbstractContextManager[Any]:
    """A span of the plan being built, entered now: the synthesis is planned at run time, in
    plain's ``get_response``, and its packing's own spans nest in it."""
    return span_in_building(instance, method, entered=True, **kwargs)


class SynthesisPlanner:
    """The ``synthesize`` primitive's function: (query, nodes) -> Expansion producing the Response."""

    def __init__(self, synthesizer: Any, llm: Any, spec: LLMCallSpec, prepare: Callable[[PGraph], PGraph]) -> None:
        self.synthesizer = synthesizer
        self.llm = llm  # the synthesizer's LLM: its metadata sizes the packing
        self.spec = spec  # how its calls run on an engine
        self.prepare = prepare
        self.__qualname__ = f"synthesize[{type(synthesizer).__name__}]"

    def describe(self) -> str:
        if isinstance(self.synthesizer, SimpleSummarize):
            return "expands at run time into one prompt -> llm_prefill -> llm_decode chain"
        if isinstance(self.synthesizer, TreeSummarize):
            return ("expands at run time into one level of independent prompt -> llm_prefill -> llm_decode "
                    "chains per packed chunk, then the next level over their summaries, up to one final call")
        if isinstance(self.synthesizer, Accumulate):
            return ("expands at run time into independent prompt -> llm_prefill -> llm_decode chains, "
                    "one per repacked chunk of each node, joined by Accumulate's own formatting")
        if isinstance(self.synthesizer, Generation):
            return "expands at run time into one prompt -> llm_prefill -> llm_decode chain of the query alone"
        return ("expands at run time into one prompt -> llm_prefill -> llm_decode chain per packed chunk, "
                "in sequence (each refine prompt holds the previous answer)")

    @property
    def streaming(self) -> bool:
        return bool(self.synthesizer._streaming)

    @property
    def streams_in_get_response(self) -> bool:
        """Does a streaming ``get_response`` call ``llm.stream`` itself (its spans open there),
        not in a generator read later (a refine's program's ``stream_call``)?"""
        return not isinstance(self.synthesizer, Refine)

    def __call__(self, query: QueryBundle, nodes: list[NodeWithScore], prefix: Any = None) -> Any:
        """``prefix``: split_prefill's warm-up of :meth:`warm_prompt` is done (its signal)."""
        if not nodes:  # BaseSynthesizer.synthesize answers without calling the LLM
            return Response(self.synthesizer._empty_response)
        return self.expansion(query, nodes)

    def warm_prompt(self) -> dict[str, Any] | None:
        """The template the first calls fill (the QA template; tree_summarize: the summary
        template), for split_prefill: rendered by the LLM's own code for a step with inputs
        ``query`` (known first) and ``nodes`` (retrieved), so the pass can warm what comes
        before the nodes' text while retrieval runs. None when marks do not describe it."""
        synth, spec = self.synthesizer, self.spec
        if isinstance(synth, Generation):
            return None  # its prompt holds no retrieved text
        template = synth._summary_template if isinstance(synth, TreeSummarize) else synth._text_qa_template

        def render(query: Any, nodes: str) -> Any:
            # ``nodes`` is only ever a mark or split_prefill's cut: the calls' real context is
            # packed by the synthesizer at run time, never here; ``query`` is a mark or the bundle
            query_str = query if isinstance(query, str) else query.query_str
            return spec.to_engine_prompt(template.partial_format(query_str=query_str), context_str=nodes)

        parts = marked_parts(render, ["query", "nodes"])
        if parts is None:
            return None
        literal = sum(len(p) for p in parts if isinstance(p, str))
        return {"render": render, "parts": parts, "engine": spec.engine,
                "est_prompt_tokens": literal // CHARS_PER_TOKEN + CONTEXT_TOKENS_GUESS}

    def build_graph(self, query: QueryBundle, nodes: list[NodeWithScore],
                    additional_source_nodes: list[NodeWithScore] = ()) -> PGraph:
        """The calls for these (non-empty) nodes, as ``synthesize`` makes them. Output ``out``:
        the Response (its sources: ``nodes`` then ``additional_source_nodes``); when
        streaming, the answer text, and the final decode is also output ``stream``."""
        return self.built(query, nodes, additional_source_nodes)[0]

    def expansion(self, query: QueryBundle, nodes: list[NodeWithScore],
                  additional_source_nodes: list[NodeWithScore] = ()) -> Expansion:
        """:meth:`build_graph` as the expansion of a ``synthesize`` step, reporting the spans
        its ``get_response`` and LLM calls open (``llama_index_spans.py``)."""
        graph, plan = self.built(query, nodes, additional_source_nodes)
        return plan.expansion(graph)

    def built(self, query: QueryBundle, nodes: list[NodeWithScore],
              additional_source_nodes: list[NodeWithScore] = (), refine_chunks: list[str] | None = None
              ) -> tuple[PGraph, SpanPlan]:
        """:meth:`build_graph` and the plan of the spans its primitives stand for; a streaming
        synthesis's ``refine_chunks`` are :meth:`get_response_reported`'s."""
        synth = self.synthesizer
        texts = [n.node.get_content(metadata_mode=MetadataMode.LLM) for n in nodes]
        graph = PGraph(f"{type(synth).__name__}")
        plan = SpanPlan(graph)
        # a streaming synthesis's get_response spans close before its run (get_response_reported)
        opened: list[Any] = []  # the get_response spans, which return the answer text
        spans = (self._get_response_spans(query.query_str, texts, opened=opened) if not self.streaming
                 else contextlib.nullcontext(refine_chunks))
        with plan.building(), spans as chunks:
            self._answer(graph, query.query_str, texts, chunks)
        for span in opened:
            span.result = graph.outputs["out"]
        if not self.streaming:
            sources = list(nodes) + list(additional_source_nodes)
            response = graph.add(Op.OPAQUE, name="response", inputs={"text": graph.outputs["out"]},
                                 origin=type(synth).__name__,
                                 attrs={"fn": framework_call(
                                     lambda text: synth._prepare_response_output(text, sources)), "pure": True})
            graph.output("out", response.out())  # the synthesize primitive's one port
        return self.prepare(graph), plan

    def get_response_reported(self, query_str: str, nodes: list[NodeWithScore], async_: bool
                              ) -> contextlib.AbstractContextManager[list[str] | None]:
        """A streaming synthesis's ``get_response`` spans (a refine's events with them), opened
        and closed around the planning of its calls (plain's return the token generator before
        any token is read); yields the refine chunks (compacted once, as plain does)."""
        texts = [n.node.get_content(metadata_mode=MetadataMode.LLM) for n in nodes]
        return self._get_response_spans(query_str, texts, instant_span, "aget_response" if async_ else "get_response")

    @contextlib.contextmanager
    def _get_response_spans(self, query_str: str, texts: list[str], open_span: Callable[..., Any] = _entered_span,
                            method: str = "get_response", opened: list[Any] | None = None
                            ) -> Iterator[list[str] | None]:
        """The ``get_response`` spans ``synthesize`` opens (a compacting synthesizer's own around
        its parent's over the texts it hands on; a refine's with its events), by ``open_span``
        (the plan's, entered now, or one reported at once); yields the chunks the calls go over
        when it computed them (a refine's; a compact accumulate's repacked texts, packed once
        as plain's). The packing runs inside them, where plain's does (its ``split_text`` spans).
        ``opened``: collects the plan's spans (their result is the answer, once it is built)."""
        synth = self.synthesizer
        spans = opened if opened is not None else []
        with contextlib.ExitStack() as stack:
            if isinstance(synth, (CompactAndRefine, CompactAndAccumulate)):  # handed on to its parent class's
                spans.append(stack.enter_context(open_span(
                    synth, method, args=lambda v: {"query_str": query_str, "text_chunks": texts})))
            chunks = self.refine_chunks(query_str, texts)
            handed = self.handed_on(query_str, texts, chunks)
            events = GetResponseEvents(query_str, chunks) if chunks is not None else None
            inner = handed if handed is not None else texts
            spans.append(stack.enter_context(open_span(
                synth, method, events=events, args=lambda v: {"query_str": query_str, "text_chunks": inner})))
            spans[:] = [span for span in spans if span is not None]
            yield chunks if chunks is not None else handed

    def handed_on(self, query_str: str, texts: list[str], refine_chunks: list[str] | None = None
                  ) -> list[str] | None:
        """The texts a compacting synthesizer's ``get_response`` hands its parent class's (a
        compact refine's compacted chunks, ``refine_chunks`` when known; a compact accumulate's
        repacked texts); None for the others, which open one ``get_response`` span."""
        synth = self.synthesizer
        if isinstance(synth, CompactAndRefine):
            return refine_chunks if refine_chunks is not None else self.refine_chunks(query_str, texts)
        if isinstance(synth, CompactAndAccumulate):
            return self._repacked(query_str, texts)
        return None

    def _repacked(self, query_str: str, texts: list[str]) -> list[str]:
        """``CompactAndAccumulate.get_response``'s repacking of its texts."""
        synth = self.synthesizer
        template = synth._text_qa_template.partial_format(query_str=query_str)
        with temp_set_attrs(synth._prompt_helper):
            return synth._prompt_helper.repack(template, texts, llm=self.llm)

    def refine_chunks(self, query_str: str, texts: list[str]) -> list[str] | None:
        """The chunks a refine's loop goes over (a compact refine's compacted, as its
        ``get_response`` compacts them); None for the other synthesizers."""
        synth = self.synthesizer
        if isinstance(synth, (SimpleSummarize, TreeSummarize, Accumulate, Generation)):
            return None
        return synth._make_compact_text_chunks(query_str, texts) if isinstance(synth, CompactAndRefine) else texts

    def answer_graph(self, query_str: str, texts: list[str], prepare: bool = True,
                     refine_chunks: list[str] | None = None) -> PGraph:
        """``get_response(query_str, texts)``'s calls: output ``out`` is the answer text it
        returns; when streaming, the final decode is also output ``stream``. ``refine_chunks``:
        the chunks the calls go over when the caller has them (:meth:`refine_chunks`' result; a
        compact accumulate's repacked texts, :meth:`handed_on`)."""
        return self.answer_calls(query_str, texts, refine_chunks, prepare)[0]

    def answer_calls(self, query_str: str, texts: list[str], refine_chunks: list[str] | None = None,
                     prepare: bool = True) -> tuple[PGraph, SpanPlan]:
        """:meth:`answer_graph` and the plan of its LLM calls' spans (a caller inside plain's
        ``get_response`` spans: ``instrumentation.answered``)."""
        graph = PGraph(f"{type(self.synthesizer).__name__}")
        plan = SpanPlan(graph)
        with plan.building():
            self._answer(graph, query_str, texts, refine_chunks)
        return (self.prepare(graph) if prepare else graph), plan

    def _answer(self, graph: PGraph, query_str: str, texts: list[str], refine_chunks: list[str] | None) -> None:
        synth = self.synthesizer
        if isinstance(synth, SimpleSummarize):
            answer = self._simple_summarize(graph, query_str, texts)
        elif isinstance(synth, TreeSummarize):
            answer = TreeLevels(self, query_str).build(graph, texts)
        elif isinstance(synth, Accumulate):
            answer = self._accumulate(graph, query_str, texts, refine_chunks)
        elif isinstance(synth, Generation):
            answer = self._generation(graph, query_str)
        else:
            chunks = refine_chunks if refine_chunks is not None else self.refine_chunks(query_str, texts)
            answer = RefineLoop(self, query_str, chunks).build(graph, None)
        graph.output("out", answer)

    def llm_call(self, graph: PGraph, template: Any, prompt_args: dict[str, Any], origin: str,
                 streamed: bool = False, program: Any = None) -> Ref:
        return llm_call(graph, self.llm, self.spec, template, prompt_args, origin, streamed, program)

    def _simple_summarize(self, graph: PGraph, query_str: str, texts: list[str]) -> Ref:
        synth = self.synthesizer
        template = synth._text_qa_template.partial_format(query_str=query_str)
        truncated = synth._prompt_helper.truncate(prompt=template, text_chunks=["\n".join(texts)], llm=self.llm)
        text = self.llm_call(graph, template, {"context_str": truncated}, type(synth).__name__, streamed=self.streaming)
        if self.streaming:
            graph.output("stream", text)
        return cpu_step(graph, "answer", lambda text: text or EMPTY, {"text": text}, type(synth).__name__)

    def _generation(self, graph: PGraph, query_str: str) -> Ref:
        """``Generation.get_response``: ``predict`` (or ``stream``) of its input prompt with
        the query, the retrieved text unused; the answer as the LLM returns it."""
        synth = self.synthesizer
        text = self.llm_call(graph, synth._input_prompt, {"query_str": query_str}, type(synth).__name__,
                             streamed=self.streaming)
        if self.streaming:
            graph.output("stream", text)
        return text

    def _accumulate(self, graph: PGraph, query_str: str, texts: list[str], repacked: list[str] | None = None) -> Ref:
        """``Accumulate.get_response``: every call independent, joined by its own code
        (``CompactAndAccumulate``: over the texts repacked first, as its own; ``repacked``
        when the caller already packed them, so they are split once, as plain splits them)."""
        synth = self.synthesizer
        origin = type(synth).__name__
        template = synth._text_qa_template.partial_format(query_str=query_str)
        if isinstance(synth, CompactAndAccumulate):
            texts = repacked if repacked is not None else self._repacked(query_str, texts)
        answers = [self.llm_call(graph, template, synth._make_prompt_kwargs(packed), origin)
                   for chunk in texts
                   for packed in synth._prompt_helper.repack(template, [chunk], llm=self.llm)]
        separator = inspect.signature(type(synth).get_response).parameters["separator"].default
        return cpu_step(graph, "answer",
                        lambda **out: synth._format_response([out[f"a{i}"] for i in range(len(answers))], separator),
                        {f"a{i}": a for i, a in enumerate(answers)}, origin)


class TreeLevels:
    """``TreeSummarize.get_response`` one level at a time: repack, then either the final
    call or independent calls whose summaries the next level (built once they are
    decoded) summarizes."""

    def __init__(self, planner: SynthesisPlanner, query_str: str) -> None:
        synth = planner.synthesizer
        self.planner = planner
        self.query_str = query_str
        self.template = synth._summary_template.partial_format(query_str=query_str)
        self.helper = synth._prompt_helper
        self.origin = type(synth).__name__

    def build(self, graph: PGraph, texts: list[str]) -> Ref:
        chunks = self.helper.repack(self.template, text_chunks=texts, llm=self.planner.llm)
        if self.planner.synthesizer._verbose:  # its own line, at each level
            print(f"{len(chunks)} text chunks after repacking")
        if not chunks:  # TreeSummarize itself recurses on [] until RecursionError: same type, at once
            raise RecursionError("TreeSummarize: nothing to summarize after repacking (every text was "
                                 "empty); LlamaIndex recurses without end on this input")
        if len(chunks) == 1:  # the final answer, returned as predict() returns it
            text = self.planner.llm_call(graph, self.template, {"context_str": chunks[0]}, self.origin,
                                         streamed=self.planner.streaming)  # plain's llm.stream
            if self.planner.streaming:
                graph.output("stream", text)
            return text
        summaries = [self.planner.llm_call(graph, self.template, {"context_str": c}, self.origin) for c in chunks]
        level = cpu_step(graph, "summarize_next",
                         lambda **out: self.expand([out[f"s{i}"] for i in range(len(summaries))]),
                         {f"s{i}": s for i, s in enumerate(summaries)}, self.origin)
        if self.planner.streaming:  # the final call sits in a later level: stream through it
            graph.output("stream", level)
        return level

    def expand(self, summaries: list[str]) -> Expansion:
        """The next level: ``get_response`` recursing on the summaries (its own span)."""
        graph = PGraph(f"{self.origin}_level")
        plan = SpanPlan(graph)
        synth = self.planner.synthesizer
        with plan.building(), _entered_span(synth, "get_response",
                                            args=lambda v: {"query_str": self.query_str, "text_chunks": summaries}
                                            ) as span:
            graph.output("out", self.build(graph, summaries))
        if span is not None:
            span.result = graph.outputs["out"]
        return plan.expansion(self.planner.prepare(graph))


class RefineLoop:
    """``Refine._run_refine_loop`` unrolled one LLM call at a time (text chunks)."""

    def __init__(self, planner: SynthesisPlanner, query_str: str, chunks: list[str]) -> None:
        synth = planner.synthesizer
        self.planner = planner
        self.query_str = query_str
        self.qa = synth._text_qa_template
        self.refine = synth._refine_template
        self.helper = synth._prompt_helper
        self.origin = type(synth).__name__
        max_prompt = get_biggest_prompt([self.qa, self.refine])
        self.queue: deque[str] = deque(
            tc for chunk in chunks
            for tc in self.helper.repack(max_prompt, [chunk], llm=planner.llm, padding=synth._response_padding_size))

    def next_call(self, response: str | None) -> tuple[Any, dict[str, Any]] | None:
        """The next (template, prompt args), consuming chunks as the loop body does."""
        while self.queue:
            chunk = self.queue.popleft()
            if response is None:
                return self.qa.partial_format(query_str=self.query_str), {"context_str": chunk}
            template = self.refine.partial_format(query_str=self.query_str, existing_answer=response)
            repacked = self.helper.repack(template, [chunk], llm=self.planner.llm)
            if len(repacked) > 1:  # the answer grew: the chunk no longer fits in one prompt
                self.queue.extendleft(repacked)
                continue
            return template, {"context_msg": repacked[0]}
        return None

    def build(self, graph: PGraph, response: str | None) -> Ref:
        """Add the next call to ``graph``; returns a ref to the loop's final answer."""
        call = self.next_call(response)
        if call is None:
            return cpu_step(graph, "answer", lambda: final_answer(response), {}, self.origin)
        # a streaming Refine streams every call (its program's stream_call), the ones it reads itself too
        # plain's non-streaming loop calls its program (DefaultRefineProgram), which predicts
        program = None if self.planner.streaming else self.planner.synthesizer._program_factory(call[0])
        text = self.planner.llm_call(graph, *call, self.origin, streamed=self.planner.streaming, program=program)
        if not self.queue:  # the last call (a later repack cannot add calls: nothing is left)
            if self.planner.streaming:
                graph.output("stream", text)  # only the final answer streams, as in LlamaIndex
            return cpu_step(graph, "answer", lambda text: final_answer(text or response), {"text": text},
                                 self.origin)
        # The next prompt holds this answer: expand the rest once it is decoded.
        rest = cpu_step(graph, "refine_next", lambda text: self.expand(text or response), {"text": text},
                        self.origin)
        if self.planner.streaming:  # the final call sits in a later expansion: stream through it
            graph.output("stream", rest)
        return rest

    def expand(self, response: str | None) -> Expansion:
        graph = PGraph(f"{self.origin}_step")
        plan = SpanPlan(graph)
        with plan.building():
            graph.output("out", self.build(graph, response))
        return plan.expansion(self.planner.prepare(graph))


def llm_call(graph: PGraph, llm: Any, spec: LLMCallSpec, template: Any, prompt_args: dict[str, Any],
             origin: str, streamed: bool = False, program: Any = None) -> Ref:
    """One ``llm.predict(template, **prompt_args)`` (``streamed``: ``llm.stream``, read to its
    end; ``program``: the refine program whose ``__call__`` predicts) as prompt -> llm_prefill ->
    llm_decode (-> the output parser); returns the answer text ``predict`` returns. Built inside
    a span plan (:meth:`SpanPlan.building`), its steps stand for the spans plain opens: the
    program's, ``predict`` (the prompt, the parser), the model's ``chat`` / ``complete`` (its
    events; nested once per instrumented override) around the engine call."""
    chat = bool(llm.metadata.is_chat_model)
    inner = ("stream_chat" if streamed else "chat") if chat else ("stream_complete" if streamed else "complete")
    with contextlib.ExitStack() as spans:
        program_span = (spans.enter_context(span_in_building(program, "__call__", args=lambda v: dict(prompt_args)))
                        if program is not None else None)
        predict_span = spans.enter_context(span_in_building(llm, "stream" if streamed else "predict", label="predict",
                                                            args=lambda v: {"prompt": template, **prompt_args}))
        # a format the LLM's own code renders (its chat template, its request body)
        prompt = graph.add(Op.FORMAT, name=graph.unique_name("prompt"), origin=origin,
                           attrs={"render": framework_call(lambda: spec.to_engine_prompt(template, **prompt_args))})
        size = sum(len(str(v)) for v in prompt_args.values()) + len(template.get_template())
        outer_span, inner_spans = model_call_spans(span_in_building, llm, inner)
        with outer_span as outer:
            # the LLM's own callback / instrumentation events
            events = LLMEvents.of(llm, template, prompt_args, streamed)
            started = events.start_step(graph, {"prompt": prompt.out()}, origin) if events is not None else None
            with inner_spans as inners:  # a streamed call's start reports each chunk it hears
                decode = emit_llm_call(graph.add, prompt.out(), spec, origin, size // CHARS_PER_TOKEN,
                                       always_streamed=streamed,
                                       listener=started.out() if started is not None and streamed else None)
            text = decode.out("text")  # the decode's own: a caller may stream its tokens
            if started is not None:
                reported = events.end_step(graph, started, decode, origin)
                if not streamed:  # what reads the answer comes after the call's end, as after plain's predict
                    text = reported.out()
        if spec.parse_output is not None:
            text = graph.add(Op.OPAQUE, name=graph.unique_name("parse"), inputs={"text": text}, origin=origin,
                             attrs={"fn": framework_call(spec.parse_output), "pure": True}).out()
        if not streamed:  # what the spans' methods return (a stream's: a generator nobody holds)
            _returning(decode, llm, chat, text, program_span, predict_span, outer, *inners)
        return text


def _returning(decode: Any, llm: Any, chat: bool, answer: Ref, program_span: Any, predict_span: Any,
               *model_spans: Any) -> None:
    """The results plain's spans of one call exit with: the model's ``chat`` / ``complete`` its
    response, ``predict`` the answer, a refine program's ``__call__`` its structured response."""
    return_reply(llm, chat, decode, *model_spans)
    if predict_span is not None:
        predict_span.result = answer
    if program_span is not None:
        program_span.result = lambda values: StructuredRefineResponse(answer=values(answer), query_satisfied=True)


def final_answer(response: str | None) -> str:
    return response or EMPTY


def cpu_step(graph: PGraph, name: str, fn: Callable[..., Any], inputs: dict[str, Ref], origin: str) -> Ref:
    """A pure CPU step of a synthesis expansion."""
    return graph.add(Op.OPAQUE, name=graph.unique_name(name), inputs=inputs, origin=origin,
                     attrs={"fn": framework_call(fn), "pure": True}).out()

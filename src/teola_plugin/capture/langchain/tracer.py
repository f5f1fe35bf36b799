"""The LangChain tracer: walks a Runnable and lowers each component to primitives.

Lowering rules are registered per runnable type (``@lowering(PromptTemplate)``) and found
along the MRO, most specific first. A rule receives the tracer, the component and the
symbolic value of its input (``values.py``) and returns the symbolic value of its output.
A rule that cannot lower a particular instance raises :class:`NotLowerable` *before*
emitting anything; the component then runs unchanged as one ``opaque`` primitive that
calls its own ``invoke``, and the reason is kept for ``explain()``.

Module order. LangChain runs a sequence's steps one after another and a parallel's
branches concurrently; every primitive waits (``after``) on the *frontier* (what the
steps before it emitted last: ``capture/module_order.py``). Dependency pruning then
removes the waits that are not data flow.

Run-time decisions. ``RunnableEach`` and ``RunnableBranch`` only know at run time what
runs (how many elements, which branch): their primitive returns an ``Expansion`` built by
the tracer's :class:`SubPlanner` (the integration layer's: trace, optimize, serve stores).

Tracing only builds a graph: it never calls an engine or a component. A component left
opaque is logged once per type (WARNING on ``teola_plugin.capture.langchain``) with the reason.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from langchain_core.runnables.utils import AddableDict

from ...engines.langchain_store import FrameworkVectorStoreEngine
from ...ir.graph import PGraph
from ...ir.node import INPUT, Primitive, Ref
from ...ir.ops import Op
from ...ir.ports import PortType
from ...runtime.caller import as_the_caller_calls
from ...runtime.engine_needs import EngineNeeds
from ..common import ComponentNote, NotLowerable, Trace
from ..module_order import ModuleOrder
from ..opaque_warnings import OpaqueWarnings
from ..vllm_identity import ServedModel
from .component_state import ComponentState
from .run_scopes import RunScopeBuilder, RunScopes
from .step_runs import render_unreported, step_config
from .values import ChatReply, Kind, PendingPrompt, Record, Traced, Value

LoweringRule = Callable[["LangChainTracer", Any, Value], Value]
_RULES: dict[type, LoweringRule] = {}
OUT = "out"  # the output port of the opaque primitives the tracer emits
log = logging.getLogger("teola_plugin.capture.langchain")
warn_opaque_once = OpaqueWarnings(log, "%s runs unchanged (opaque, not scheduled by Teola): %s")


def lowering(*types: type) -> Callable[[LoweringRule], LoweringRule]:
    """Register ``rule`` for runnables of ``types`` (and their subclasses)."""

    def register(rule: LoweringRule) -> LoweringRule:
        for cls in types:
            _RULES[cls] = rule
        return rule

    return register


def rule_for(cls: type) -> LoweringRule | None:
    for klass in cls.__mro__:
        rule = _RULES.get(klass)
        if rule is not None:
            return rule
    return None


# dict types whose keys become graph inputs: LangChain's AddableDict is what a streamed
# dict accumulates into (a TeolaRunnable behind ``.assign`` or ``RunnableWithMessageHistory``)
KEYED_INPUTS = (dict, AddableDict)


@dataclass(frozen=True)
class InputLayout:
    """How a call's input becomes graph inputs. A dict with string keys is one graph input
    per key (so a template reading ``question`` reads that input directly); anything else
    is the single graph input ``input``. A trace is specialised on this layout."""

    keys: tuple[str, ...] | None
    text_keys: frozenset[str] = frozenset()  # inputs known to be str
    dict_type: type = dict  # a dict, or the AddableDict a stream accumulates

    @classmethod
    def of(cls, value: Any) -> InputLayout:
        if type(value) in KEYED_INPUTS and all(type(k) is str for k in value):
            return cls(tuple(value), frozenset(k for k, v in value.items() if isinstance(v, str)), type(value))
        return cls(None, frozenset({"input"}) if isinstance(value, str) else frozenset())

    @classmethod
    def example(cls, runnable: Any) -> InputLayout:
        """The layout ``runnable``'s input schema describes (for inspection before any call)."""
        try:
            schema = runnable.get_input_jsonschema()
        except Exception:  # noqa: BLE001 - pydantic cannot describe every schema (``typing.TypedDict``
            # state on Python < 3.12); plain ``get_graph`` never asks, so neither may inspection
            return cls(None, frozenset())
        props = schema.get("properties") if schema.get("type") == "object" else None
        if props:
            return cls(tuple(props), frozenset(k for k, p in props.items() if p.get("type") == "string"))
        return cls(None, frozenset({"input"}) if schema.get("type") == "string" else frozenset())

    def feed(self, value: Any) -> dict[str, Any]:
        return dict(value) if self.keys is not None else {"input": value}


FIELD_OUTPUT = "field:"  # graph outputs "field:<key>": a dict output's fields, streamed as they are ready


@dataclass(frozen=True)
class OutputShape:
    """How the graph output maps back to the chain's output, and what streams.

    A dict output with known keys (``RunnableParallel``, ``.assign``) streams as plain's
    does: one chunk per group of fields when they are ready (graph outputs ``field:<key>``),
    and the tokens of the one field an LLM decodes as ``{key: delta}``. A group is one field,
    except the input's own keys passed through first (``RunnablePassthrough.assign``), which
    plain sends as one chunk."""

    streams: str | None = None  # "text": str deltas, "message": AIMessageChunk deltas
    tokens_from: str | None = None  # the llm_decode whose tokens are the output (or its field)
    fields: tuple[str, ...] | None = None  # a dict output's keys, in order
    streaming_field: str | None = None  # the key whose value streams tokens
    field_groups: tuple[tuple[str, ...], ...] = ()  # the other keys, as the chunks that carry them


def text_tokens(output: OutputShape) -> str | None:
    """The node whose tokens are ``output``'s text as str deltas (an expansion streams it as
    its own text); None when it does not stream, or streams message chunks."""
    return output.tokens_from if output.streams == "text" and output.fields is None else None


@dataclass
class LangChainTrace(Trace):
    """A LangChain trace: the graph of one input layout, and how to feed and read it."""

    layout: InputLayout
    output: OutputShape
    stores: dict[str, str] = field(default_factory=dict)  # graph input -> the engine serving that store
    # Every lowered call's stream is its text's tokens (what a graph run streams); False: one
    # streams more (tool-call chunks), so a streamed call runs the chain as it is.
    streams_text: bool = True
    runs: RunScopes = field(default_factory=RunScopes)  # the callback run tree plain would report
    state: ComponentState = field(default_factory=ComponentState)  # the components' settings it was traced with

    @property
    def stale(self) -> bool:
        """Has a traced component's setting changed since (then this trace may not be plain's)?"""
        return not self.state.unchanged()

    def feed(self, input: Any) -> dict[str, Any]:
        """The graph's inputs for one call: the input's fields, and a handle per served store."""
        from ...runtime.values import IndexHandle

        feed = self.layout.feed(input)
        feed.update({name: IndexHandle(engine) for name, engine in self.stores.items()})
        return feed


def unwrap_partial(code: Any) -> Any:
    """The function a ``functools.partial`` (of a partial ...) wraps; ``code`` itself otherwise."""
    while isinstance(code, functools.partial):
        code = code.func
    return code


def langchains_own(code: Any) -> bool:
    """Is ``code`` (a function or class, or a ``functools.partial`` of one, as ``trim_messages``
    and ``with_structured_output`` build them) LangChain's own, its partner packages'
    (``langchain_openai``, ...) included, not the user's?"""
    root = (getattr(unwrap_partial(code), "__module__", None) or "").split(".")[0]
    return root == "langchain" or root.startswith("langchain_")  # langchain_core, _classic, _openai, ...


def component_name(runnable: Any) -> str:
    get_name = getattr(runnable, "get_name", None)
    return get_name() if callable(get_name) else type(runnable).__name__


def _no_rule_reason(runnable: Any) -> str:
    """Why a component without a lowering rule runs as it is; for a LangGraph graph, which of
    its nodes are chains (each run as its own optimized graph when the graph calls it) and
    which are functions (the chains they call run so)."""
    nodes = getattr(runnable, "nodes", None)
    if not type(runnable).__module__.startswith("langgraph.") or not isinstance(nodes, Mapping):
        return f"no lowering rule for {type(runnable).__name__}"
    kinds: dict[str, list[str]] = {"chain": [], "function": []}
    for name, node in nodes.items():
        if not name.startswith("__"):  # LangGraph's own entry node
            bound = getattr(node, "bound", None)
            kinds["function" if type(bound).__name__ == "RunnableCallable" else "chain"].append(name)
    listed = "; ".join(f"{kind} nodes: {', '.join(names)}" for kind, names in kinds.items() if names)
    return (f"a LangGraph graph, run as LangGraph runs it (nodes, edges, state, checkpoints)"
            + (f"; {listed}" if listed else ""))


def _node_base(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_]+", "_", name).strip("_") or "component"


@dataclass(frozen=True)
class SubPlan:
    """The graph a runnable met at run time runs on one input: its output ``"output"`` is
    ``runnable.invoke(input)``."""

    graph: PGraph
    inputs: dict[str, Any]
    tokens: str | None = None  # the node whose tokens are the output's text, if any
    observer: Any = None  # reports the sub-chain's callback runs (``langchain/run_tree.py``), if anyone listens


class SubPlanner(Protocol):
    """Builds, at run time, the graph a runnable runs on one concrete input (for expansions)."""

    async def sub_plan(self, runnable: Any, input: Any, tag: str | None = None) -> SubPlan:
        """``tag``: the one ``runnable``'s callback run carries under the caller's (``branch:N``)."""
        ...

    def engine_specs(self) -> Mapping[str, Any]:
        """The runtime's engine specs (what each engine serves), read without starting any."""
        ...


class TraceOnlyPlanner:
    """Trace without optimizing or serving stores (tracing tools, tests of the lowering)."""

    def __init__(self, engine_models: Mapping[str, ServedModel | str] | None = None) -> None:
        self.engine_models = dict(engine_models or {})

    async def sub_plan(self, runnable: Any, input: Any, tag: str | None = None) -> SubPlan:
        trace = trace_runnable(runnable, InputLayout.of(input), planner=self, engine_models=self.engine_models)
        return SubPlan(trace.graph, trace.feed(input), text_tokens(trace.output))

    def engine_specs(self) -> Mapping[str, Any]:
        return {}  # no runtime: framework models are not mapped onto engines


class LangChainTracer:
    def __init__(self, name: str = "langchain", *, planner: SubPlanner | None = None,
                 engine_models: Mapping[str, ServedModel | str] | None = None) -> None:
        self.engine_models = dict(engine_models or {})  # Teola LLM engine -> the model it serves
        self.planner: SubPlanner = planner or TraceOnlyPlanner(self.engine_models)
        self.graph = PGraph(name)
        self.order = ModuleOrder(self.graph)
        self.stores: dict[str, str] = {}  # graph input -> the engine serving that store
        self.engines = EngineNeeds()  # served models' engines and the stores' (provided before a run)
        self.notes: list[ComponentNote] = []
        self.streams_text = True  # every lowered call streams as its model does (see LangChainTrace)
        self._materialised: dict[int, tuple[Value, Ref]] = {}
        self.runs = RunScopeBuilder()  # the callback run tree plain reports (run_scopes.py)
        self.components: list[Any] = []  # every component lowered (or run opaque), for ComponentState

    def step_tag_of(self, component: Any) -> str | None:
        """The tag ``component``'s run carries (``seq:step:N``, ``map:key:K``; ``step_runs.py``).
        A rule asks when its primitives report that run themselves (a model call, a retriever,
        an opaque step's own ``invoke``); Teola reports the runs of the other components."""
        return self.runs.tag_of(component)

    def bound_config_of(self, component: Any) -> dict[str, Any]:
        """The run_name / tags / metadata ``with_config`` bindings give ``component``'s run."""
        return self.runs.bound_of(component)

    def current_run(self) -> int | None:
        """The run of the component being lowered (None: the chain's own)."""
        return self.runs.current_run()

    # -- emitting --------------------------------------------------------------------------
    def add(self, op: Op, *, name: str | None = None, **kwargs: Any) -> Primitive:
        """Append a primitive in module order (after what was emitted last)."""
        return self.order.add(op, name=self.graph.unique_name(name) if name else None, **kwargs)

    def branches(self, lowerings: Iterable[Callable[[], Value]]) -> list[Value]:
        """Lower concurrent branches (a RunnableParallel): each starts from the same frontier."""
        return self.order.branches(lowerings)

    def inputs(self, layout: InputLayout) -> Value:
        def declare(name: str) -> Traced:
            text = name in layout.text_keys
            return Traced(self.graph.input(name, PortType.TEXT if text else PortType.ANY),
                          Kind.TEXT if text else Kind.ANY)

        if layout.keys is None:
            return declare("input")
        return Record.of({key: declare(key) for key in layout.keys}, layout.dict_type)

    def store_input(self, store: Any) -> tuple[Ref, str]:
        """A graph input carrying the INDEX handle of the user's own vector store, and the
        engine name it is served under (one per store object)."""
        engine = f"langchain_store_{id(store):x}"
        for name, known in self.stores.items():
            if known == engine:
                return Ref("input", name), engine
        name = f"__store_{len(self.stores)}"
        self.stores[name] = engine
        # dropped when the user's store is collected (the name holds its id)
        self.engines.local_engine(engine, lambda: FrameworkVectorStoreEngine(store, name=engine), owner=store)
        return self.graph.input(name, PortType.INDEX), engine

    # -- lowering --------------------------------------------------------------------------
    def lower(self, runnable: Any, value: Value, tag: str | None = None) -> Value:
        """Lower ``runnable`` applied to ``value``; ``tag``: the one its run carries in plain
        (``seq:step:N`` as a sequence's step, ``map:key:K`` as a parallel's branch)."""
        mark = self.graph.mark()
        self.components.append(runnable)
        frame = self.runs.enter(runnable, tag, mark)
        rule = rule_for(type(runnable))
        try:
            if rule is None:
                out = self.opaque_call(runnable, value, _no_rule_reason(runnable))
            else:
                try:
                    out = rule(self, runnable, value)
                except NotLowerable as why:
                    self.runs.abandon(frame)
                    out = self.opaque_call(runnable, value, str(why))
        except BaseException:
            self.runs.frames.pop()
            raise
        self.runs.leave(frame, out, value, self.graph.added_since(mark))
        return out

    def opaque_call(self, runnable: Any, value: Value, reason: str, *, report: bool = True) -> Traced:
        """Run ``runnable.invoke`` (``ainvoke`` under an async call) unchanged on the
        materialised input. LangChain's config context (callbacks, tags) reaches it: the
        runtime copies the caller's context. ``report=False``: LangChain's own glue, no
        engine work and not the user's to change, is not listed (nor warned of) as opaque."""
        ref = self.materialise(value)
        invoke, ainvoke, tag = runnable.invoke, runnable.ainvoke, self.step_tag_of(runnable)
        bound = self.bound_config_of(runnable)

        async def call_unchanged(input: Any) -> Any:
            return await as_the_caller_calls(invoke, ainvoke, input, step_config(tag, bound))

        name = component_name(runnable)
        prim = self.add(Op.OPAQUE, name=_node_base(name), inputs={"input": ref},
                        attrs={"fn": call_unchanged}, origin=name, outputs=[OUT])
        if report:
            self.note_opaque(runnable, prim.name, reason)
        return Traced(prim.out(OUT))

    def note_opaque(self, runnable: Any, node: str, reason: str) -> None:
        """Record (for explain) and log (once per type) a component that runs unchanged."""
        self.notes.append(ComponentNote(node, component_name(runnable), "opaque", reason))
        warn_opaque_once(runnable, reason)

    def note_expands(self, runnable: Any, prim: Primitive) -> None:
        """Record (for explain) a step whose sub-graph is built when it runs: ``prim.attrs["expands"]``."""
        self.notes.append(ComponentNote(prim.name, component_name(runnable), "expands",
                                        f"expands at run time into {prim.attrs['expands']}, lowered and optimized"))

    def materialise(self, value: Value) -> Ref:
        """The run-time value of ``value`` as one ref (building dicts / messages / prompts)."""
        if isinstance(value, Traced):
            return value.ref
        memo = self._materialised.get(id(value))
        if memo is not None:
            return memo[1]
        if isinstance(value, Record):
            ref = self._build_dict(value)
        elif isinstance(value, ChatReply):
            ref = self._build_message(value)
        elif isinstance(value, PendingPrompt):
            ref = self._render_prompt(value)
        else:
            raise TypeError(f"not a traced value: {value!r}")
        self._materialised[id(value)] = (value, ref)  # the value is kept alive with its id
        return ref

    def _build_dict(self, record: Record) -> Ref:
        keys, dict_type = tuple(k for k, _ in record.fields), record.dict_type
        inputs = {k: self.materialise(v) for k, v in record.fields}

        async def build_dict(**fields: Any) -> Any:
            return dict_type({k: fields[k] for k in keys})

        prim = self.add(Op.OPAQUE, name="dict", inputs=inputs, outputs=[OUT],
                        attrs={"fn": build_dict, "pure": True}, origin="RunnableParallel")
        return prim.out(OUT)

    def _build_message(self, reply: ChatReply) -> Ref:
        from langchain_core.messages import AIMessage

        async def build_message(text: str, message: Any = None) -> Any:
            return message if message is not None else AIMessage(content=text)

        inputs = {"text": reply.text.ref} if reply.message is None else {"text": reply.text.ref, "message": reply.message}
        prim = self.add(Op.OPAQUE, name="ai_message", inputs=inputs, outputs=[OUT],
                        attrs={"fn": build_message, "pure": True}, origin="ChatModel")
        return prim.out(OUT)

    def _render_prompt(self, prompt: PendingPrompt) -> Ref:
        """A prompt nobody fuses into an LLM call: the template's own PromptValue."""
        template = prompt.template
        inputs = {k: self.materialise(v) for k, v in prompt.variables.fields}

        def render(**variables: Any) -> Any:  # the template's run: reported by the run tree
            return render_unreported(template, variables)

        prim = self.add(Op.FORMAT, name="format", inputs=inputs, attrs={"render": render},
                        origin=prompt.origin)
        self.runs.attribute(prim.name, prompt.run)
        return prim.out("prompt")

    # -- result ----------------------------------------------------------------------------
    def _record_shape(self, record: Record) -> OutputShape:
        """The first field whose value streams tokens streams them; every other field is a
        graph output of its own, sent as one chunk when ready."""
        shape, streaming, groups = OutputShape(), None, []
        passed_through = True  # still in the leading run of the input's own keys
        for key, item in record.fields:
            inner = _streams(item)
            passed_through = passed_through and isinstance(item, Traced) and item.ref == Ref(INPUT, key)
            if streaming is None and inner.streams is not None:
                shape, streaming = inner, key
                continue
            self.graph.output(FIELD_OUTPUT + key, self.materialise(item))
            if passed_through and groups:
                groups[-1] += (key,)
            else:
                groups.append((key,))
        return OutputShape(shape.streams, shape.tokens_from, tuple(k for k, _ in record.fields), streaming,
                           tuple(groups))

    def finish(self, value: Value, layout: InputLayout) -> LangChainTrace:
        shape = _streams(value)
        if isinstance(value, Record):
            shape = self._record_shape(value)
        self.graph.output("output", self.materialise(value))
        self.graph.validate()
        return LangChainTrace(self.graph, layout, shape, dict(self.stores), self.streams_text, self.runs.scopes,
                              ComponentState(self.components), notes=list(self.notes), engines=self.engines)


def _streams(value: Value) -> OutputShape:
    """What a value streams: its text's tokens, or its message's."""
    if isinstance(value, Traced) and value.tokens_from:
        return OutputShape("text", value.tokens_from)
    if isinstance(value, ChatReply) and value.text.tokens_from:
        return OutputShape("message", value.text.tokens_from)
    return OutputShape()


def trace_runnable(runnable: Any, layout: InputLayout, name: str | None = None, *,
                   planner: SubPlanner | None = None,
                   engine_models: Mapping[str, ServedModel | str] | None = None) -> LangChainTrace:
    """Lower ``runnable`` for inputs of ``layout`` into a primitive graph (runs nothing).
    ``engine_models`` (engine name -> ``ServedModel``, or just a model path) lets a framework
    model that names its model (LangChain's ``VLLM``) be mapped onto the Teola engine serving it."""
    from . import rules  # noqa: F401  (registers the built-in rules)

    tracer = LangChainTracer(name or _node_base(component_name(runnable)), planner=planner,
                             engine_models=engine_models)
    return tracer.finish(tracer.lower(runnable, tracer.inputs(layout)), layout)

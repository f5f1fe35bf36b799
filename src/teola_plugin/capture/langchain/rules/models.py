"""LLMs and chat models that run on a Teola engine: format -> llm_prefill -> llm_decode.

Lowered: models that describe their engine call (``LowerableLLM``, e.g. the
plugin's ``TeolaChatModel`` / ``TeolaLLM``), and LangChain's ``VLLM`` when a Teola engine
serves its model (``foreign.py``); ``.bind(stop=...)`` on them too. Any other model runs
unchanged. Each lowered call also gets two small CPU primitives that report it to the
caller's LangChain callbacks (``callbacks.py``): started with the real prompt, ended with
the decoded text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from langchain_core.language_models import BaseLanguageModel
from langchain_core.runnables import RunnableBinding

from ....ir.node import Primitive, Ref
from ....ir.ops import Op
from ....ir.semantics import CHARS_PER_TOKEN
from ...overrides import overridden_lowered_calls
from ...prompt_parts import marked_parts
from ...llm_calls import emit_llm_call
from ...lowerable import LLMCallSpec, LowerableLLM
from ..component_state import global_llm_cache
from ..tracer import NotLowerable, LangChainTracer, component_name, lowering
from ..step_runs import render_unreported
from ..values import ChatReply, Kind, PendingPrompt, Traced, Value
from .callbacks import INPUT_PORT, call_reporters
from .foreign import foreign_call_spec
from .prompts import literal_parts
from .served import is_served_model, served_call_spec

TOKENS_PER_VARIABLE = 64  # a cost-model guess for text that arrives at run time


@dataclass(frozen=True)
class ModelInput:
    """How the reporter rebuilds the model's own input (what plain's ``invoke`` receives, so
    ``on_chat_model_start`` hears plain's messages, ids and metadata included, not the engine
    prompt's): ``build(**values of refs)``, where ``refs`` are refs the format reads already."""

    refs: Mapping[str, Ref]
    build: Callable[..., Any]


def _prompt_format(t: LangChainTracer, value: Value, spec: LLMCallSpec,
                   origin: str) -> tuple[Primitive, int, ModelInput]:
    """One format primitive producing the engine prompt (the template, if any, and the
    model's own input conversion, fused), a prompt-length guess for the cost model, and the
    model's own input (:class:`ModelInput`)."""
    convert = spec.to_engine_prompt
    if isinstance(value, PendingPrompt):
        template = value.template
        inputs = {name: t.materialise(v) for name, v in value.variables.fields}

        def render(**variables: Any) -> Any:  # the template's run: reported by the run tree (run_tree.py)
            return convert(render_unreported(template, variables))

        parts = literal_parts(template, set(inputs)) if spec.string_prompts else None
        if parts is None:  # a chat template, a served model's request body: described by its own
            # rendering (format_prompt: no run, so no callback hears the trace)
            parts = marked_parts(lambda **marks: convert(template.format_prompt(**marks)), inputs)
        attrs: dict[str, Any] = {"render": render}
        if parts:
            attrs["parts"] = parts
        literal = sum(len(p) for p in parts if isinstance(p, str)) if parts else 256
        est = literal // CHARS_PER_TOKEN + TOKENS_PER_VARIABLE * len(inputs)
        fmt = t.add(Op.FORMAT, name="format", inputs=inputs, attrs=attrs, origin=value.origin)
        t.runs.attribute(fmt.name, value.run)  # it reports the template's run, where plain's template would
        return fmt, est, ModelInput(inputs, lambda **variables: render_unreported(template, variables))

    def render_input(input: Any) -> Any:
        return convert(input)

    given = t.materialise(value)
    fmt = t.add(Op.FORMAT, name="format", inputs={"input": given}, attrs={"render": render_input}, origin=origin)
    return fmt, TOKENS_PER_VARIABLE, ModelInput({"input": given}, lambda input: input)



def check_no_cache_or_limiter(model: Any) -> None:
    """NotLowerable when ``model``'s own call path does more than send its request: a cache it
    reads first (its ``cache``, or the global ``set_llm_cache`` one unless ``cache=False``: a
    hit sends nothing) or a rate limiter it waits on before sending."""
    cache = getattr(model, "cache", False)
    if cache is not False and (cache is not None or global_llm_cache() is not None):
        raise NotLowerable(f"{type(model).__name__} reads an LLM cache (a hit sends no request; its own code runs)")
    if getattr(model, "rate_limiter", None) is not None:
        raise NotLowerable(f"{type(model).__name__} waits on its rate_limiter (its own code runs)")


def call_spec(t: LangChainTracer, model: Any, stop: list[str] | None = None,
              call_kwargs: Mapping[str, Any] | None = None) -> LLMCallSpec:
    """The engine call ``model.invoke(..., stop=stop, **call_kwargs)`` makes; NotLowerable if unknown."""
    check_no_cache_or_limiter(model)
    if is_served_model(model):
        return served_call_spec(model, t.engines.served_engine, stop, call_kwargs)
    if call_kwargs:
        raise NotLowerable(f"bound model arguments {sorted(call_kwargs)} (only stop is lowered, and a served "
                           "chat model's tools)")
    if isinstance(model, LowerableLLM):
        changed = overridden_lowered_calls(model)
        if changed:
            raise NotLowerable(f"{type(model).__name__} overrides {', '.join(changed)}: its own code runs")
        spec = model.teola_call_spec()
        if stop is None:
            return spec
        params = {k: v for k, v in (spec.sampling_params or {}).items() if k != "stop"}
        if stop:  # an explicit stop replaces the model's own (an empty one clears it)
            params["stop"] = list(stop)
        return replace(spec, sampling_params=params)
    return foreign_call_spec(model, t.engine_models, stop)


def add_llm_call(t: LangChainTracer, model: Any, value: Value, stop: list[str] | None = None,
                 bound: dict[str, Any] | None = None, step: str | None = None,
                 call_kwargs: Mapping[str, Any] | None = None,
                 **decode_attrs: Any) -> tuple[Primitive, LLMCallSpec, Traced, Ref]:
    """format -> llm_prefill -> llm_decode for ``model`` on ``value`` (``bound``: the tracing
    config of a ``with_config`` binding, ``step``: its seq:step tag, for the callback run;
    ``call_kwargs``: a binding's call arguments, e.g. tools); returns the decode, the call
    spec, the reply text (after the callback report) and the reply message (the model's
    own, from a served model's reply; else None at run time)."""
    spec = call_spec(t, model, stop, call_kwargs)
    t.streams_text = t.streams_text and spec.streams_text
    origin = component_name(model)
    fmt, est_tokens, given = _prompt_format(t, value, spec, origin)
    report_start, report_end = call_reporters(model, spec, stop, bound, step, call_kwargs, given.build)
    started = t.graph.add(Op.OPAQUE, name=t.graph.unique_name("llm_start"),
                          inputs={"prompt": fmt.out(), **{f"{INPUT_PORT}{k}": r for k, r in given.refs.items()}},
                          outputs=["run"], attrs={"fn": report_start, "opens_run": True}, origin=origin,
                          after={fmt.name})
    decode = emit_llm_call(t.add, fmt.out(), spec, origin, est_tokens, listener=started.out("run"), **decode_attrs)
    ended = t.add(Op.OPAQUE, name="llm_end", inputs={"run": started.out("run"), "text": decode.out("text"),
                                                     "response": decode.out("response")},
                  attrs={"fn": report_end}, origin=origin, outputs=["text", "message"])
    return decode, spec, Traced(ended.out("text"), Kind.TEXT, tokens_from=decode.name), ended.out("message")


def _lower_call(t: LangChainTracer, model: Any, value: Value, stop: list[str] | None,
                bound: dict[str, Any] | None = None, step: str | None = None,
                call_kwargs: Mapping[str, Any] | None = None) -> Value:
    _, spec, text, message = add_llm_call(t, model, value, stop, bound, step, call_kwargs)
    if not spec.returns_message:
        return text
    return ChatReply(text, message if spec.to_result is not None else None)


@lowering(BaseLanguageModel)
def lower_model(t: LangChainTracer, model: BaseLanguageModel, value: Value) -> Value:
    return _lower_call(t, model, value, None, step=t.step_tag_of(model))


TRACING_ONLY_CONFIG = {"tags", "metadata", "run_name", "max_concurrency", "recursion_limit"}
# A model binding's config keys its lowered call reports as plain's would: ``callbacks``
# (``model.with_config(callbacks=[handler])``) hear the model's run, as the binding's merge adds them.
MODEL_RUN_CONFIG = {"callbacks"}


def _plain_bindings() -> tuple[type, ...]:
    """``RunnableBinding``, and the subclass a chat model's ``bind`` / ``with_config`` returns
    (langchain-core 1.x ``_ChatModelBinding``: typing only, "behaviorally identical")."""
    try:
        from langchain_core.language_models.chat_models import _ChatModelBinding
    except ImportError:  # older langchain-core: chat models bind to a RunnableBinding
        return (RunnableBinding,)
    return (RunnableBinding, _ChatModelBinding)


@lowering(RunnableBinding)
def lower_binding(t: LangChainTracer, binding: RunnableBinding, value: Value) -> Value:
    """``model.bind(stop=...)`` runs the model with that stop (a served chat model's
    ``bind_tools(...)`` with those tools: ``served.py``); ``x.with_config(tags=...)`` runs
    ``x`` (those keys only name the run for tracing; a model's call run keeps them, and a
    model's ``callbacks`` hear its run). A chat model's binding (``_ChatModelBinding``) is the
    same binding."""
    if type(binding) not in _plain_bindings() or binding.config_factories:
        raise NotLowerable(f"{type(binding).__name__} with config factories or a custom binding")
    is_model = isinstance(binding.bound, BaseLanguageModel)
    extra_config = sorted(set(binding.config) - TRACING_ONLY_CONFIG - (MODEL_RUN_CONFIG if is_model else set()))
    if extra_config:
        raise NotLowerable(f"config {extra_config} changes how the bound runnable runs")
    kwargs = dict(binding.kwargs)
    if is_model:
        stop = kwargs.pop("stop", None)
        tracing = {k: binding.config[k] for k in ("run_name", "tags", "metadata", "callbacks") if binding.config.get(k)}
        return _lower_call(t, binding.bound, value, None if stop is None else list(stop), tracing,
                           t.step_tag_of(binding), kwargs)
    if kwargs:
        raise NotLowerable(f"bound arguments {sorted(kwargs)}")
    return t.lower(binding.bound, value)

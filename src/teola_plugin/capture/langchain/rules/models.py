"""LLMs and chat models that run on a Teola engine: format -> llm_prefill -> llm_decode.

Only models that describe their engine call (``LowerableLanguageModel``, e.g. the plugin's
``TeolaChatModel`` / ``TeolaLLM``) are lowered; any other model runs unchanged.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseLanguageModel

from ....ir.node import Primitive
from ....ir.ops import Op
from ..protocols import LLMCallSpec, LowerableLanguageModel
from ..tracer import CannotLower, LangChainTracer, component_name, lowering
from ..values import ChatReply, Kind, PendingPrompt, Traced, Value
from .prompts import literal_parts

CHARS_PER_TOKEN = 4
TOKENS_PER_VARIABLE = 64  # a cost-model guess for text that arrives at run time


def _prompt_format(t: LangChainTracer, value: Value, spec: LLMCallSpec,
                   origin: str) -> tuple[Primitive, int]:
    """One format primitive producing the engine prompt (the template, if any, and the
    model's own input conversion, fused) and a prompt-length guess for the cost model."""
    convert = spec.to_engine_prompt
    if isinstance(value, PendingPrompt):
        template = value.template
        inputs = {name: t.materialise(v) for name, v in value.variables.fields}

        def render(**variables: Any) -> Any:
            return convert(template.invoke(variables))

        parts = literal_parts(template, set(inputs)) if spec.string_prompts else None
        attrs: dict[str, Any] = {"render": render}
        if parts:
            attrs["parts"] = parts
        literal = sum(len(p) for p in parts if isinstance(p, str)) if parts else 256
        est = literal // CHARS_PER_TOKEN + TOKENS_PER_VARIABLE * len(inputs)
        return t.add(Op.FORMAT, name="format", inputs=inputs, attrs=attrs, origin=value.origin), est

    def render_input(input: Any) -> Any:
        return convert(input)

    fmt = t.add(Op.FORMAT, name="format", inputs={"input": t.materialise(value)},
                attrs={"render": render_input}, origin=origin)
    return fmt, TOKENS_PER_VARIABLE


def add_llm_call(t: LangChainTracer, model: Any, value: Value,
                 **decode_attrs: Any) -> tuple[Primitive, LLMCallSpec]:
    """format -> llm_prefill -> llm_decode for ``model`` on ``value``; returns the decode."""
    if not isinstance(model, LowerableLanguageModel):
        raise CannotLower("not a Teola model: its engine is unknown (use TeolaChatModel / TeolaLLM)")
    spec = model.teola_call_spec()
    origin = component_name(model)
    fmt, est_tokens = _prompt_format(t, value, spec, origin)
    params = dict(spec.sampling_params)
    max_tokens = int(params.get("max_tokens", 256))
    prefill = t.add(Op.LLM_PREFILL, name="llm_prefill", engine=spec.engine, inputs={"prompt": fmt.out()},
                    attrs={"sampling_params": params, "max_tokens": max_tokens,
                           "est_prompt_tokens": est_tokens}, origin=origin)
    decode = t.add(Op.LLM_DECODE, name="llm_decode", engine=spec.engine, inputs={"state": prefill.out()},
                   attrs={"max_tokens": max_tokens, **decode_attrs}, origin=origin)
    return decode, spec


@lowering(BaseLanguageModel)
def lower_model(t: LangChainTracer, model: BaseLanguageModel, value: Value) -> Value:
    decode, spec = add_llm_call(t, model, value)
    text = Traced(decode.out("text"), Kind.TEXT, tokens_from=decode.name)
    return ChatReply(text) if spec.returns_message else text

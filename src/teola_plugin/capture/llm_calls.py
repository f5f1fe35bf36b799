"""One LLM call as primitives: ``llm_prefill -> llm_decode`` on the model's engine.

Both frameworks' rules (and the paper's app graphs) emit a call through
:func:`emit_llm_call`; what differs between them is only how the prompt is made (a
``format`` of template parts, or the framework's own rendering in a CPU step) and what
is reported around the call (callbacks, instrumentation events), which they add
themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..ir.node import Primitive, Ref
from ..ir.ops import Op
from .lowerable import LLMCallSpec

Add = Callable[..., Primitive]  # ``PGraph.add`` or a ``ModuleOrder``'s ``add``


def emit_llm_call(add: Add, prompt: Ref, spec: LLMCallSpec, origin: str, est_prompt_tokens: int,
                  listener: Ref | None = None, always_streamed: bool = False, **decode_attrs: Any) -> Primitive:
    """``prompt -> llm_prefill -> llm_decode`` for a call described by ``spec``; returns the
    decode (outputs ``text``, ``items`` with ``parse``, ``response``). ``max_tokens`` goes on
    the prefill, which opens the engine request, and on the decode, whose length it bounds;
    ``listener`` (a run handle) hears the decode's tokens and the call's failure (the request
    is sent after the run started, as the model's own generate reports it);
    ``always_streamed``: the call is sent as the model's streaming request even when nobody
    reads its tokens (the framework's own code streams it)."""
    max_tokens = spec.call_max_tokens
    errors = {"raise_error": spec.raise_error} if spec.raise_error else {}  # the model's own error types
    params = {} if spec.sampling_params is None else {"sampling_params": dict(spec.sampling_params)}
    streamed = {"streamed_request": spec.streamed_request} if spec.streamed_request else {}
    if streamed and always_streamed:
        streamed["always_streamed"] = True
    prefill_attrs = {**params, "max_tokens": max_tokens, "est_prompt_tokens": est_prompt_tokens, **errors, **streamed}
    heard = {"listener": listener} if listener is not None else {}
    prefill = add(Op.LLM_PREFILL, engine=spec.engine, inputs={"prompt": prompt, **heard}, attrs=prefill_attrs,
                  origin=origin)
    inputs = {"state": prefill.out(), **heard}
    return add(Op.LLM_DECODE, engine=spec.engine, inputs=inputs,
               attrs={"max_tokens": max_tokens, **decode_attrs, **errors}, origin=origin)

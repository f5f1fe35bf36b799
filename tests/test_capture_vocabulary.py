"""The capture vocabulary both frameworks share (pure logic: no framework, no engine)."""

from __future__ import annotations

from typing import ClassVar

from teola_plugin.capture.common import ComponentNote, Trace
from teola_plugin.capture.llm_calls import emit_llm_call
from teola_plugin.capture.lowerable import DEFAULT_MAX_TOKENS, LLMCallSpec
from teola_plugin.capture.module_order import ModuleOrder
from teola_plugin.capture.overrides import overridden_lowered_calls
from teola_plugin.ir import Op, PGraph, PortType


def test_module_order_chains_steps_and_joins_branches():
    g = PGraph("order")
    q = g.input("q", PortType.TEXT)
    order = ModuleOrder(g)
    first = order.add(Op.AGGREGATE, inputs={"in0": q}, attrs={"mode": "list"})
    left, right = order.branches([
        lambda: order.add(Op.EMBED, inputs={"texts": first.out()}).name,
        lambda: order.add(Op.SEARCH, inputs={"queries": first.out()}).name,
    ])
    last = order.add(Op.AGGREGATE, inputs={"a": g[left].out(), "b": g[right].out()}, attrs={"mode": "list"})
    assert g[left].after == g[right].after == {first.name}  # both branches start after the first step
    assert last.after == {left, right}  # what follows waits for both ends
    assert order.frontier == {last.name}


def test_emit_llm_call_carries_the_specs_request():
    g = PGraph("llm")
    prompt = g.input("prompt", PortType.PROMPT)
    greedy = emit_llm_call(g.add, prompt, LLMCallSpec(None), "App", 10)
    prefill = g[greedy.inputs["state"].node]
    assert "sampling_params" not in prefill.attrs  # the engine's defaults (greedy)
    assert prefill.attrs["max_tokens"] == greedy.attrs["max_tokens"] == DEFAULT_MAX_TOKENS
    assert prefill.engine == "llm" and "listener" not in greedy.inputs

    def raise_error(exc: BaseException) -> None:
        raise exc

    served = LLMCallSpec("served:x", sampling_params={}, max_tokens=32, streamed_request={"stream": True},
                         raise_error=raise_error)
    listener = g.input("run", PortType.ANY)
    decode = emit_llm_call(g.add, prompt, served, "ChatOpenAI", 7, listener=listener, parse="lines")
    prefill = g[decode.inputs["state"].node]
    assert prefill.attrs["sampling_params"] == {} and prefill.attrs["streamed_request"] == {"stream": True}
    assert prefill.attrs["est_prompt_tokens"] == 7 and prefill.engine == decode.engine == "served:x"
    assert decode.attrs["max_tokens"] == 32 and decode.attrs["parse"] == "lines"
    assert prefill.attrs["raise_error"] is decode.attrs["raise_error"] is raise_error
    assert decode.inputs["listener"] == listener
    assert LLMCallSpec("e", sampling_params={"max_tokens": 9}).call_max_tokens == 9
    g.output("text", decode.out("text"))
    g.validate()  # every attribute is one its op defines


def test_overridden_lowered_calls_reads_the_declaring_class():
    class Model:
        teola_lowered_calls: ClassVar[tuple[str, ...]] = ("invoke", "_generate")

        def invoke(self) -> None: ...

    class Renamed(Model):
        pass

    class Edited(Renamed):
        def _generate(self) -> None: ...

    assert overridden_lowered_calls(Model()) == [] and overridden_lowered_calls(Renamed()) == []
    assert overridden_lowered_calls(Edited()) == ["_generate"]
    assert overridden_lowered_calls(object()) == []


def test_a_traces_opaque_components_are_its_opaque_notes():
    notes = [ComponentNote("a", "X", "opaque", "no rule"), ComponentNote("b", "Y", "expands", "at run time")]
    trace = Trace(PGraph("t"), notes=notes)
    assert trace.opaque == notes[:1] and str(notes[0]) == "a (X): no rule"

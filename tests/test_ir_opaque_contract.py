"""One opaque-output contract (``ir.semantics.opaque_outputs``) for both executors.

Random graphs of the primitives both executors compute without engines (opaque steps with
one or two output ports, aggregates over them) run through the reference interpreter and
the runtime's graph scheduler (``hosting="local"``, no engine); every graph output must be
equal, and a function breaking the contract must fail the same way in both. The functions
return values that used to be read differently (``{"out": 1}`` was ``{"out": 1}`` in the
interpreter and ``1`` in the runtime): a one-port function's value is the port's value,
whatever it is.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from teola_plugin.ir import Op, PGraph, PortType, Ref
from teola_plugin.ir.interpreter import Interpreter
from teola_plugin.ir.semantics import opaque_outputs
from teola_plugin.runtime.runtime import Runtime

# What a one-port function may return: plain values and the mappings that used to be unpacked.
VALUES = [1, "text", None, [1, 2], {"out": 1}, {"out": [3]}, {"a": 1, "b": 2}, {"out": 1, "extra": 2}, ()]


def returning(value, tag: int):
    """A function of its inputs: ``value``, or (when ``value`` is "echo") what it was given."""
    def fn(**inputs):
        if value == "echo":
            return {"tag": tag, "inputs": sorted((k, repr(v)) for k, v in inputs.items())}
        return value
    return fn


@st.composite
def graphs(draw) -> tuple[PGraph, bool]:
    g = PGraph("contract")
    refs: list[Ref] = [g.input("x", PortType.ANY)]
    breaks = False
    for k in range(draw(st.integers(1, 8))):
        picked = draw(st.lists(st.sampled_from(refs), min_size=1, max_size=3, unique=True))
        inputs = {f"in{i}": r for i, r in enumerate(picked)}
        kind = draw(st.sampled_from(["one", "one", "two", "aggregate", "wrong_two"]))
        if kind == "aggregate":
            refs.append(g.add(Op.AGGREGATE, name=f"agg{k}", inputs=inputs, attrs={"mode": "list"}).out())
        elif kind == "one":
            value = draw(st.sampled_from([*VALUES, "echo"]))
            refs.append(g.add(Op.OPAQUE, name=f"one{k}", inputs=inputs, outputs=["out"],
                              attrs={"fn": returning(value, k)}).out())
        else:  # two ports: a mapping of exactly those ports, or (wrong_two) not
            a = draw(st.sampled_from([*VALUES, "echo"]))
            result = {"a": a, "b": k} if kind == "two" else draw(st.sampled_from([{"a": 1}, 5, {"a": 1, "c": 2}]))
            breaks |= kind == "wrong_two"
            prim = g.add(Op.OPAQUE, name=f"two{k}", inputs=inputs, outputs=["a", "b"],
                         attrs={"fn": (lambda r: lambda **_: r)(result)})
            refs += [prim.out("a"), prim.out("b")]
    for i, ref in enumerate(draw(st.lists(st.sampled_from(refs[1:]), min_size=1, max_size=4, unique=True))):
        g.output(f"y{i}", ref)
    g.validate()
    return g, breaks


def outcome(run) -> tuple[str, object]:
    try:
        return "ok", run()
    except TypeError as exc:
        return "TypeError", "must return a mapping of exactly those ports" in str(exc)


@pytest.fixture(scope="module")
def local_runtime():
    rt = Runtime({}, hosting="local")
    yield rt
    rt.shutdown()


@settings(derandomize=True, max_examples=60, deadline=None)
@given(case=graphs(), x=st.sampled_from([0, "q", {"out": 7}, [1]]))
def test_interpreter_and_runtime_agree_on_every_output_of_random_graphs_with_opaque_steps(local_runtime, case, x):
    graph, breaks = case
    reference = outcome(lambda: Interpreter(graph).run(x=x))
    runtime = outcome(lambda: local_runtime.run_sync(local_runtime.execute(graph, {"x": x}), timeout=60))
    assert runtime == reference
    if not breaks:
        assert reference[0] == "ok"


def test_the_contract_itself():
    assert opaque_outputs(["out"], {"out": 1}) == {"out": {"out": 1}}  # a value, not ports
    assert opaque_outputs(["text"], "t") == {"text": "t"}
    assert opaque_outputs(["a", "b"], {"b": 2, "a": 1}) == {"a": 1, "b": 2}
    with pytest.raises(TypeError, match=r"\['a', 'b'\] must return a mapping of exactly those ports, got \['a'\]"):
        opaque_outputs(["a", "b"], {"a": 1})

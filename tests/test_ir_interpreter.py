"""Reference interpreter: dispatch, generic semantics (shards, aggregates, templates,
decode items), value freeing, and error notes."""

from __future__ import annotations

import pytest

from teola_plugin.ir import Interpreter, Op, PGraph, PortType, Ref
from teola_plugin.ir import semantics
from teola_plugin.capture.app_graphs import advanced_rag, naive_rag, search_augmented
from teola_plugin.ir.testing import ToyEngines, ToyHit

DOCS = [f"document {i} " + " ".join(f"w{(i * 7 + j) % 13}" for j in range(8)) for i in range(12)]


def h(id_: str, score: float = 0.0) -> ToyHit:
    return ToyHit(id_, id_, score)


def run_aggregate(attrs, **inputs):
    g = PGraph()
    refs = {port: g.input(port) for port in inputs}
    g.output("out", g.add(Op.AGGREGATE, inputs=refs, attrs=attrs).out())
    return Interpreter(g).run(**inputs)["out"]


# -- aggregate modes ----------------------------------------------------------------------
def test_concat_orders_ports_naturally():
    inputs = {f"in{i}": [i] for i in (10, 2, 0, 1)}
    assert run_aggregate({"mode": "concat"}, **inputs) == [0, 1, 2, 10]


def test_union_dedupes_by_id_first_occurrence_wins():
    out = run_aggregate({"mode": "union"}, in0=[h("a", 1), h("b", 2)], in1=[h("b", 9), h("c", 3)])
    assert out == [h("a", 1), h("b", 2), h("c", 3)]
    assert run_aggregate({"mode": "union"}, in0=["x", "y"], in1=["y", "z"]) == ["x", "y", "z"]


def test_union_unpacks_hits_lists():
    assert run_aggregate({"mode": "union"}, in0=[[h("a")], [h("a"), h("b")]]) == [h("a"), h("b")]


def test_topk_is_descending_and_stable():
    out = run_aggregate({"mode": "topk", "k": 3}, in0=[h("a", 1), h("b", 5)], in1=[h("c", 5), h("d", 0)])
    assert [x.id for x in out] == ["b", "c", "a"]


def test_rrf_fuses_rankings():
    # a: 1/61 + 1/62 ; b: 1/62 + 1/61 ; c: 1/63 ; d: 1/61 -> a and b tie, first seen wins
    out = run_aggregate({"mode": "rrf"}, in0=[[h("a"), h("b"), h("c")], [h("b"), h("a")]], in1=[h("d")])
    assert [x.id for x in out] == ["a", "b", "d", "c"]
    top = run_aggregate({"mode": "rrf", "k": 1, "top": 1}, in0=[h("x"), h("y")], in1=[h("y")])
    assert [x.id for x in top] == ["y"]  # 1/3 + 1/2 beats 1/2


def test_join_pick_and_list():
    assert run_aggregate({"mode": "join"}, in1="later", in0="handle") == "handle"
    assert run_aggregate({"mode": "pick", "port": "in1"}, in0=1, in1=2) == 2
    assert run_aggregate({"mode": "pick", "index": 0}, in0=[["first"], ["second"]]) == ["first"]
    assert run_aggregate({"mode": "list"}, in0="q", in1="r") == ["q", "r"]


def test_format_renders_parts():
    g = PGraph()
    q, ctx = g.input("q", PortType.TEXT), g.input("ctx", PortType.HITS)
    f = g.add(Op.FORMAT, inputs={"question": q, "context": ctx},
              attrs={"parts": ["Q: ", {"var": "question"}, "\n", {"var": "context", "field": "text", "join": " | "}]})
    g.output("prompt", f.out())
    assert Interpreter(g).run(q="why?", ctx=[h("one"), h("two")])["prompt"] == "Q: why?\none | two"


# -- shards -----------------------------------------------------------------------------
@pytest.mark.parametrize("length,n", [(10, 3), (7, 7), (3, 5), (0, 2), (100, 8)])
def test_shard_slices_are_consecutive_and_cover_everything(length, n):
    items = list(range(length))
    shards = [semantics.shard_slice(items, i, n) for i in range(n)]
    assert [x for s in shards for x in s] == items
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_shard_attr_slices_split_inputs_only():
    seen = []
    g = PGraph()
    idx, vecs, docs = g.input("i", PortType.INDEX), g.input("v", PortType.VECTORS), g.input("d", PortType.DOCS)
    for i in range(3):
        g.add(Op.VECTOR_INSERT, name=f"ins{i}", inputs={"index": idx, "vectors": vecs, "docs": docs},
              attrs={"shard": (i, 3)})
    g.add(Op.VECTOR_INSERT, name="head_only", inputs={"index": idx, "vectors": vecs, "docs": docs},
          attrs={"shard": (1, 3), "sliced": ["docs"]})

    def insert(prim, inputs):
        seen.append((prim.name, inputs["index"], inputs["vectors"], inputs["docs"]))
        return {"index": inputs["index"]}

    Interpreter(g, {"vector_insert": insert}).run(i="IDX", v=list("abcdefg"), d=list("ABCDEFG"))
    assert seen == [("ins0", "IDX", list("ab"), list("AB")),
                    ("ins1", "IDX", list("cd"), list("CD")),
                    ("ins2", "IDX", list("efg"), list("EFG")),
                    ("head_only", "IDX", list("abcdefg"), list("CD"))]


def test_stream_attrs_do_not_change_values():
    g = advanced_rag()
    streamed = g.copy()
    streamed.set_attrs("llm_decode", stream_items=True)
    streamed.set_attrs("embed_1", stream_from="llm_decode")
    inputs = dict(question="w3?", docs=DOCS, index="idx")
    assert ToyEngines().run(g, **inputs) == ToyEngines().run(streamed, **inputs)


# -- dispatch and handlers -----------------------------------------------------------------
def test_subclass_overrides_one_op():
    class Loud(Interpreter):
        def embed(self, prim, inputs):
            return {"vectors": [t.upper() for t in inputs["texts"]]}

    g = PGraph()
    e = g.add(Op.EMBED, inputs={"texts": g.input("t", PortType.TEXTS)})
    g.output("v", e.out())
    assert Loud(g).run(t=["a", "b"]) == {"v": ["A", "B"]}


def test_decode_items_are_parsed_when_the_handler_gives_text_only():
    g = PGraph()
    d = g.add(Op.LLM_DECODE, inputs={"state": g.input("s", PortType.LLM_STATE)}, attrs={"parse": "lines"})
    g.output("items", d.out("items"))
    out = Interpreter(g, {"llm_decode": lambda p, i: {"text": " one \n\ntwo\n"}}).run(s=None)
    assert out == {"items": ["one", "two"]}


def test_missing_handler_and_bad_inputs():
    g = PGraph()
    e = g.add(Op.EMBED, inputs={"texts": g.input("t", PortType.TEXTS)})
    g.output("v", e.out())
    with pytest.raises(NotImplementedError, match="no handler for op 'embed'"):
        Interpreter(g).run(t=["a"])
    with pytest.raises(TypeError, match="missing inputs \\['t'\\]"):
        Interpreter(g).run()
    with pytest.raises(TypeError, match="unexpected inputs \\['u'\\]"):
        Interpreter(g).run(t=[], u=1)


def test_handler_error_keeps_its_type_and_names_the_primitive():
    def broken(prim, inputs):
        raise ValueError("store is full")

    g = naive_rag()
    engines = ToyEngines()
    handlers = {**engines.handlers(), Op.VECTOR_INSERT: broken}
    with pytest.raises(ValueError, match="store is full") as err:
        Interpreter(g, handlers).run(question="q", docs=DOCS, index="idx")
    assert err.value.__notes__ == [
        "While executing primitive vector_insert (vector_insert, traced from VectorStoreIndex)"]


def test_values_are_freed_after_their_last_reader():
    g = PGraph()
    x = g.input("x", PortType.ANY)
    a = g.add(Op.OPAQUE, name="a", inputs={"v": x}, outputs=["out"])
    b = g.add(Op.OPAQUE, name="b", inputs={"v": a.out()}, outputs=["out"])
    c = g.add(Op.OPAQUE, name="c", inputs={"v": b.out()}, outputs=["out"])
    g.add(Op.OPAQUE, name="unread", inputs={"v": x}, outputs=["out"])
    g.output("y", c.out())
    live: dict[str, set[Ref]] = {}

    class Spy(Interpreter):
        def opaque(self, prim, inputs):
            live[prim.name] = set(self.env)
            return {"out": inputs["v"]}

    interp = Spy(g)
    assert interp.run(x=1) == {"y": 1}
    assert Ref("a", "out") in live["b"]  # b is a's last reader: still held while b runs
    assert Ref("a", "out") not in live["c"]  # freed after b
    assert Ref("input", "x") in live["c"]  # x's last reader, "unread", runs after c
    assert Ref("b", "out") not in live["unread"]  # b's value went with its last reader c
    assert Ref("unread", "out") not in interp.env  # never read: never stored
    assert set(interp.env) == {Ref("c", "out")}  # only the graph output survives


def test_example_apps_run_on_toy_engines():
    inputs = dict(question="what about w3?", docs=DOCS, index="idx")
    rag = ToyEngines()
    out = rag.run(naive_rag(), **inputs)
    assert out["answer"].startswith("answer ") and len(out["sources"]) == 5
    assert rag.calls == {"chunk": 1, "embed": 2, "vector_insert": 1, "vector_search": 1,
                         "llm_prefill": 1, "llm_decode": 1}
    adv = ToyEngines().run(advanced_rag(), **inputs)
    assert len(adv["sources"]) == 3
    web = ToyEngines().run(search_augmented(), question="topic 3")
    assert [hit.id for hit in web["sources"]] and web["answer"].startswith("answer ")

"""PGraph: builder, editing, validation errors, analyses, renderings."""

from __future__ import annotations

import pickle

import networkx as nx
import pytest

from teola_plugin.errors import GraphValidationError
from teola_plugin.ir import OPS, Op, PGraph, PortType, Ref, compatible
from teola_plugin.capture.app_graphs import naive_rag


def small_graph() -> PGraph:
    """question -> list -> embed -> search(index) -> pick ; a side opaque waiting on embed."""
    g = PGraph("small")
    q = g.input("question", PortType.TEXT)
    index = g.input("index", PortType.INDEX)
    batch = g.add(Op.AGGREGATE, inputs={"in0": q}, attrs={"mode": "list"}, origin="Retriever")
    emb = g.add(Op.EMBED, inputs={"texts": batch.out()}, origin="Embedder")
    search = g.add(Op.VECTOR_SEARCH, inputs={"index": index, "vectors": emb.out("vectors")})
    pick = g.add(Op.AGGREGATE, inputs={"in0": search.out()}, attrs={"mode": "pick", "index": 0})
    g.add(Op.OPAQUE, name="audit", inputs={"x": q}, after=[emb], outputs=["y"])
    g.output("hits", pick.out())
    return g


# -- ports and ops ---------------------------------------------------------------------
def test_port_compatibility_rules():
    assert compatible(PortType.TEXT, PortType.TEXT)
    assert compatible(PortType.TEXT, PortType.PROMPT)
    assert not compatible(PortType.PROMPT, PortType.TEXT)
    assert compatible(PortType.ANY, PortType.VECTORS) and compatible(PortType.HITS, PortType.VALUE)
    assert not compatible(PortType.VECTORS, PortType.TEXTS)


def test_op_specs_match_the_vocabulary():
    assert set(OPS) == set(Op)
    insert = OPS[Op.VECTOR_INSERT]
    assert not insert.pure and insert.splittable and insert.split_inputs == ("vectors", "docs")
    assert OPS[Op.EMBED].batchable and OPS[Op.EMBED].engine == "embedder"
    assert OPS[Op.LLM_DECODE].streamable and OPS[Op.LLM_DECODE].outputs["items"] is PortType.TEXTS
    assert OPS[Op.FORMAT].variadic and not OPS[Op.RERANK].splittable
    assert not OPS[Op.OPAQUE].pure
    # the splitting law needs split ports to be real ports
    for spec in OPS.values():
        assert set(spec.split_inputs) <= set(spec.inputs)
        assert set(spec.split_outputs) <= set(spec.outputs)
    assert OPS["embed"] is OPS[Op.EMBED]  # Op hashes like its string


# -- builder ---------------------------------------------------------------------------
def test_builder_names_ports_and_queries():
    g = small_graph()
    assert [p.name for p in g.nodes] == ["aggregate", "embed", "vector_search", "aggregate_1", "audit"]
    emb = g["embed"]
    assert emb.engine == "embedder" and emb.origin == "Embedder" and emb.outputs == ("vectors",)
    assert g.ref("embed", "vectors") == Ref("embed", "vectors") == emb.out()
    assert g.consumers("embed") == ["vector_search"]
    assert g.followers("embed") == ["audit"]
    assert g.producers("vector_search") == ["embed"]  # the graph input is not a producer
    assert g.successors("embed") == ["vector_search", "audit"]
    assert g["audit"].outputs == ("y",) and not g["audit"].pure
    with pytest.raises(GraphValidationError, match="no output port 'nope'"):
        emb.out("nope")
    with pytest.raises(GraphValidationError, match="already taken"):
        g.add(Op.EMBED, name="embed")
    with pytest.raises(GraphValidationError, match="reserved"):
        g.add(Op.EMBED, name="input")


def test_primitives_are_read_only():
    g = small_graph()
    with pytest.raises(TypeError, match="read-only"):
        g["embed"].attrs["x"] = 1  # type: ignore[index]
    with pytest.raises(AttributeError):
        g["embed"].engine = "other"  # type: ignore[misc]
    g.set_attrs("embed", est_items=3)
    g.update("embed", engine="embedder_gpu")
    assert g["embed"].attrs["est_items"] == 3 and g["embed"].engine == "embedder_gpu"


def test_copy_is_independent_and_shares_untouched_primitives():
    g = small_graph()
    c = g.copy()
    c.set_attrs("embed", est_items=9)
    c.remove("audit")
    assert "audit" in g and "est_items" not in g["embed"].attrs
    assert c["vector_search"] is g["vector_search"]  # untouched: shared
    assert c["embed"] is not g["embed"]


def test_frozen_graph_refuses_edits():
    g = small_graph()
    with g.frozen(), pytest.raises(RuntimeError, match="frozen"):
        g.set_attrs("embed", est_items=1)
    g.set_attrs("embed", est_items=1)  # unfrozen again


def test_replace_uses_and_remove():
    g = small_graph()
    old = Ref("embed", "vectors")
    emb2 = g.add(Op.EMBED, inputs={"texts": Ref("aggregate", "out")})
    assert g.replace_uses(old, emb2.out()) == 1
    assert g["vector_search"].inputs["vectors"] == emb2.out()
    with pytest.raises(GraphValidationError, match="audit"):  # still waited on
        g.remove("embed")
    g.set_after("audit", [])
    g.remove("embed")
    assert "embed" not in g
    g.validate()
    with pytest.raises(GraphValidationError, match="graph output"):
        g.remove("aggregate_1")


def test_replace_uses_skips_the_new_node_itself():
    """Inserting a node after X and redirecting X's readers must not make it read itself."""
    g = small_graph()
    wrap = g.add(Op.AGGREGATE, inputs={"in0": Ref("aggregate_1", "out")}, attrs={"mode": "concat"})
    g.replace_uses(Ref("aggregate_1", "out"), wrap.out())
    assert wrap.inputs["in0"] == Ref("aggregate_1", "out")
    assert g.outputs["hits"] == wrap.out()
    g.validate()


def test_forward_references_resolve_when_the_node_appears():
    g = PGraph()
    q = g.input("q", PortType.TEXT)
    emb = g.add(Op.EMBED, inputs={"texts": Ref("batch", "out")})
    with pytest.raises(GraphValidationError, match="non-existent node 'batch'"):
        g.validate()
    g.add(Op.AGGREGATE, name="batch", inputs={"in0": q}, attrs={"mode": "list"})
    g.validate()
    assert [p.name for p in g.nodes] == ["batch", emb.name]


def test_graph_pickles():
    g = naive_rag()
    clone = pickle.loads(pickle.dumps(g))
    assert clone.summary() == g.summary()


# -- validation: every error names the primitive -----------------------------------------
def test_cycle_names_the_nodes_on_it():
    g = PGraph()
    a = g.add(Op.AGGREGATE, name="alpha", inputs={"in0": Ref("gamma", "out")})
    g.add(Op.AGGREGATE, name="beta", inputs={"in0": a.out()})
    g.add(Op.AGGREGATE, name="gamma", inputs={"in0": Ref("beta", "out")})
    g.add(Op.AGGREGATE, name="bystander")
    with pytest.raises(GraphValidationError) as err:
        g.validate()
    msg = str(err.value)
    assert "cycle" in msg and all(n in msg for n in ("alpha", "beta", "gamma"))
    assert "bystander" not in msg and err.value.node in {"alpha", "beta", "gamma"}


def test_control_dependency_cycle_is_found_too():
    g = PGraph()
    g.add(Op.AGGREGATE, name="first", after=["second"])
    g.add(Op.AGGREGATE, name="second", after=["first"])
    with pytest.raises(GraphValidationError, match="first.*second|second.*first"):
        g.validate()


def test_unbound_required_port():
    g = PGraph()
    g.add(Op.VECTOR_SEARCH, name="lonely_search", inputs={"vectors": g.input("v", PortType.VECTORS)},
          origin="VectorIndexRetriever")
    with pytest.raises(GraphValidationError, match="lonely_search.*VectorIndexRetriever.*'index' is unbound"):
        g.validate()


def test_unknown_op():
    g = PGraph()
    with pytest.raises(GraphValidationError, match="mystery_node.*unknown op 'teleport'") as err:
        g.add("teleport", name="mystery_node")
    assert err.value.node == "mystery_node"


def test_incompatible_port_types_name_both_types():
    g = PGraph()
    docs = g.input("docs", PortType.DOCS)
    g.add(Op.EMBED, name="bad_embed", inputs={"texts": docs})
    with pytest.raises(GraphValidationError, match=r"bad_embed.*expects texts but input\.docs is docs"):
        g.validate()


def test_unknown_port_and_bad_producer_port():
    g = PGraph()
    q = g.input("q", PortType.TEXTS)
    e = g.add(Op.EMBED, name="e1", inputs={"texts": q, "extra": q})
    with pytest.raises(GraphValidationError, match="e1.*no input port 'extra'"):
        g.validate()
    g2 = PGraph()
    q = g2.input("q", PortType.TEXTS)
    e = g2.add(Op.EMBED, name="e1", inputs={"texts": q})
    g2.add(Op.VECTOR_SEARCH, name="s1", inputs={"index": g2.input("i", PortType.INDEX),
                                                 "vectors": Ref(e.name, "nope")})
    with pytest.raises(GraphValidationError, match="s1.*'e1', which has no output port 'nope'"):
        g2.validate()


def test_missing_after_target():
    g = small_graph()
    g.add_after("aggregate_1", "ghost")
    with pytest.raises(GraphValidationError, match="aggregate_1.*unknown node 'ghost'"):
        g.validate()


def test_a_validated_graph_is_checked_again_after_any_edit():
    """validate() remembers a pass (a tracer's check spares the optimizer's); every edit,
    on the graph or on a copy, forgets it, so a later break is still reported."""
    g = small_graph()
    g.validate()
    copy = g.copy()
    copy.add_after("aggregate_1", "ghost")
    with pytest.raises(GraphValidationError, match="unknown node 'ghost'"):
        copy.validate()
    g.validate()  # the original was not edited
    g.add_after("aggregate_1", "ghost")
    with pytest.raises(GraphValidationError, match="unknown node 'ghost'"):
        g.validate()
    g.set_after("aggregate_1", ())
    g.validate()
    g.output("broken", Ref("nowhere", "out"))
    with pytest.raises(GraphValidationError, match="nowhere"):
        g.validate()


def test_output_to_missing_node_and_undeclared_input():
    g = small_graph()
    g.output("bad", Ref("nowhere", "out"))
    with pytest.raises(GraphValidationError, match="'bad' refers to nowhere.out"):
        g.validate()
    g2 = PGraph()
    g2.add(Op.AGGREGATE, name="agg", inputs={"in0": Ref("input", "undeclared")})
    with pytest.raises(GraphValidationError, match="agg.*undeclared graph input 'undeclared'"):
        g2.validate()


def test_format_template_vars_and_aggregate_modes_are_checked():
    g = PGraph()
    q = g.input("q", PortType.TEXT)
    g.add(Op.FORMAT, name="fmt", inputs={"question": q}, attrs={"parts": ["Q: ", {"var": "query"}]})
    with pytest.raises(GraphValidationError, match="fmt.*'query'"):
        g.validate()
    g2 = PGraph()
    g2.add(Op.AGGREGATE, name="agg", attrs={"mode": "average"})
    with pytest.raises(GraphValidationError, match="agg.*unknown aggregate mode 'average'"):
        g2.validate()


# -- analyses ---------------------------------------------------------------------------
def hand_graph() -> PGraph:
    """a -> b -> d, a -> c -> d, plus e waiting (control) on c. Costs: a1 b5 c2 d1 e10."""
    g = PGraph("hand")
    x = g.input("x", PortType.ANY)
    a = g.add(Op.AGGREGATE, name="a", inputs={"in0": x}, attrs={"est_latency_s": 1.0})
    b = g.add(Op.AGGREGATE, name="b", inputs={"in0": a.out()}, attrs={"est_latency_s": 5.0})
    c = g.add(Op.AGGREGATE, name="c", inputs={"in0": a.out()}, attrs={"est_latency_s": 2.0})
    d = g.add(Op.AGGREGATE, name="d", inputs={"in0": b.out(), "in1": c.out()}, attrs={"est_latency_s": 1.0})
    g.add(Op.AGGREGATE, name="e", after=["c"], attrs={"est_latency_s": 10.0})
    g.output("y", d.out())
    return g


def fixed_cost(prim) -> float:
    return prim.attrs["est_latency_s"]


def test_depth_levels():
    levels, depth = hand_graph().depth()
    assert levels == {"a": 0, "b": 1, "c": 1, "d": 2, "e": 2}
    assert depth == 3
    assert PGraph().depth() == ({}, 0)


def test_critical_path_counts_data_and_control_edges():
    length, path = hand_graph().critical_path(fixed_cost)
    assert path == ["a", "c", "e"] and length == pytest.approx(13.0)  # the control edge matters
    g = hand_graph()
    g.set_after("e", [])
    assert g.critical_path(fixed_cost) == (pytest.approx(10.0), ["e"])
    g.set_attrs("e", est_latency_s=0.5)
    assert g.critical_path(fixed_cost) == (pytest.approx(7.0), ["a", "b", "d"])


def test_critical_path_accepts_a_cost_model_object():
    class Model:
        def node_cost(self, prim):
            return 1.0
    assert hand_graph().critical_path(Model())[0] == pytest.approx(3.0)


def test_networkx_export_has_data_and_control_edges():
    nxg = hand_graph().to_networkx()
    assert isinstance(nxg, nx.MultiDiGraph)
    assert nxg.has_edge("c", "e", key="after") and nxg.edges["c", "e", "after"]["kind"] == "control"
    assert nxg.has_edge("b", "d", key="in0")
    assert nx.dag_longest_path_length(nxg) == 2


# -- renderings ---------------------------------------------------------------------------
def test_mermaid_shows_nodes_shapes_and_edges():
    g = small_graph()
    text = g.to_mermaid()
    assert text.startswith("flowchart TD")
    assert 'n_embed[["<b>embed</b><br/>embed @ embedder"]]' in text  # embedder shape
    assert 'n_vector_search[("' in text  # vector store: cylinder
    assert "n_aggregate -->|out| n_embed" in text  # data edge, labelled with the port
    assert "n_embed -.-> n_audit" in text  # control edge, dashed
    assert 'in_question(("question: text"))' in text and "in_index -->|index| n_vector_search" in text
    assert "n_aggregate_1 -->|out| out_hits" in text


def test_mermaid_shows_shard_and_stream_annotations():
    g = small_graph()
    g.set_attrs("embed", shard=(1, 4), stream_from="llm_decode")
    text = g.to_mermaid()
    assert "shard 2/4" in text and "streamed" in text


def test_dot_output():
    text = small_graph().to_dot()
    assert text.startswith('digraph "small" {') and text.rstrip().endswith("}")
    assert '"embed" -> "vector_search" [label="vectors"];' in text
    assert '"embed" -> "audit" [style=dashed];' in text
    assert '"vector_search" [label="vector_search\\nvector_search @ vector_store", shape=cylinder];' in text


def test_summary_lists_every_primitive():
    text = naive_rag().summary()
    assert "10 primitives" in text and "depth 10" in text
    for name in ("chunk", "vector_insert", "llm_decode"):
        assert f"\n{name} " in text
    assert "index=vector_insert.index" in text


def test_an_attribute_the_op_does_not_define_fails_validation():
    g = small_graph()
    g.set_attrs("vector_search", top_k=3, est_items=1, tag="mine")  # its own, and any op's
    g.validate()
    misspelt = g.copy()
    misspelt.set_attrs("vector_search", topk=3)
    with pytest.raises(GraphValidationError, match=r"unknown attribute\(s\) \['topk'\] for vector_search"):
        misspelt.validate()
    wrong_op = g.copy()
    wrong_op.set_attrs("embed", top_n=2)  # the reranker's attribute, on the wrong op
    with pytest.raises(GraphValidationError, match=r"unknown attribute\(s\) \['top_n'\] for embed"):
        wrong_op.validate()
    assert all(set(spec.attrs).isdisjoint({"est_items", "shard", "stream_from"}) for spec in OPS.values())

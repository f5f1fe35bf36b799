"""A primitive graph as a LangChain ``Graph``, so ``get_graph().draw_mermaid()`` shows what runs."""

from __future__ import annotations

from langchain_core.runnables.graph import Graph

from ..ir.graph import PGraph

INPUT_NODE, OUTPUT_NODE = "__start__", "__end__"


def to_langchain_graph(graph: PGraph) -> Graph:
    """Nodes are primitives (id = primitive name, metadata = op / engine / origin), plus a
    start and an end node; data edges are solid, remaining control waits conditional."""
    view = Graph()
    start = view.add_node(None, INPUT_NODE)
    nodes = {}
    for prim in graph.nodes:
        meta = {"op": str(prim.op), "engine": prim.engine, "origin": prim.origin}
        nodes[prim.name] = view.add_node(None, prim.name, metadata=meta)
    end = view.add_node(None, OUTPUT_NODE)
    for prim in graph.nodes:
        sources = {ref.node for ref in prim.inputs.values()}
        for source in sorted(sources):
            view.add_edge(nodes.get(source, start), nodes[prim.name])
        for waited in sorted(prim.after - sources):
            if waited in nodes:
                view.add_edge(nodes[waited], nodes[prim.name], conditional=True)
    for ref in graph.outputs.values():
        view.add_edge(nodes.get(ref.node, start), end)
    return view

"""A PGraph drawn with matplotlib: a picture that needs no Graphviz and no Mermaid renderer.

    draw_graph(graph, ax, "optimized")                    # onto any matplotlib axes
    to_png({"module order": before, "optimized": after}, "graphs.png")

Primitives sit in rows by depth (the first row has no predecessors), coloured by engine
kind; solid arrows carry data, dashed grey arrows are control dependencies, as in
``render.to_mermaid``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .graph import PGraph

COLORS = {"embedder": "#4C72B0", "vector_store": "#55A868", "llm": "#C44E52", "reranker": "#8172B2",
          "search": "#CCB974", "cpu": "#BBBBBB"}


def draw_graph(graph: PGraph, ax: Any, title: str = "") -> None:
    """Draw ``graph`` on the matplotlib axes ``ax``."""
    import networkx as nx
    from matplotlib.lines import Line2D

    g = graph.to_networkx()
    depth, _ = graph.depth()
    nx.set_node_attributes(g, depth, "layer")
    pos = nx.multipartite_layout(g, subset_key="layer", align="horizontal")
    pos = {n: (x, -y) for n, (x, y) in pos.items()}  # first layer at the top
    colors = [COLORS.get(graph[n].kind, "#DDDDDD") for n in g.nodes]
    data = [(u, v) for u, v, kind in g.edges(data="kind") if kind == "data"]
    control = [(u, v) for u, v, kind in g.edges(data="kind") if kind == "control"]
    nx.draw_networkx_nodes(g, pos, ax=ax, node_color=colors, node_size=500)
    nx.draw_networkx_labels(g, pos, ax=ax, font_size=6)
    nx.draw_networkx_edges(g, pos, ax=ax, edgelist=data, arrows=True, node_size=500)
    nx.draw_networkx_edges(g, pos, ax=ax, edgelist=control, style="dashed", edge_color="#999999",
                           arrows=True, node_size=500)
    ax.set_title(title or graph.name)
    ax.axis("off")
    ax.legend(handles=[Line2D([], [], marker="o", ls="", color=c, label=k) for k, c in COLORS.items()],
              loc="lower right", fontsize=7)


def to_png(graphs: Mapping[str, PGraph], path: str | Path, height: float = 10.0) -> Path:
    """The graphs side by side (title -> graph) in one PNG; returns the path."""
    from matplotlib.figure import Figure  # not pyplot: no display, no global figure state

    fig = Figure(figsize=(8 * len(graphs), height))
    axes = fig.subplots(1, len(graphs), squeeze=False)
    for ax, (title, graph) in zip(axes[0], graphs.items()):
        draw_graph(graph, ax, title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path

"""Human views of a PGraph: Mermaid, Graphviz DOT (text only, no graphviz needed), a table.

Shapes encode the engine kind, so a picture shows at a glance which engine does what;
dashed arrows are control dependencies, solid ones carry data (labelled with the port).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from .node import INPUT, Primitive
from .ops import Op

if TYPE_CHECKING:
    from .graph import PGraph

_MERMAID_SHAPES = {  # engine kind -> (open, close)
    "cpu": ('["', '"]'),
    "embedder": ('[["', '"]]'),
    "vector_store": ('[("', '")]'),
    "reranker": ('{{"', '"}}'),
    "search": ('[/"', '"/]'),
    "llm": ('(["', '"])'),
    "opaque": ('[/"', '"\\]'),
}
_DOT_SHAPES = {"cpu": "box", "embedder": "box3d", "vector_store": "cylinder", "reranker": "hexagon",
               "search": "parallelogram", "llm": "ellipse", "opaque": "trapezium"}


def short_attrs(prim: Primitive) -> list[str]:
    """The few attrs worth showing on a picture: how passes rewrote the node."""
    a = prim.attrs
    notes: list[str] = []
    if prim.op is Op.AGGREGATE:
        notes.append(a.get("mode", "concat") + (f" of {a['gathers']}'s shards" if a.get("gathers") else ""))
    if prim.shard:
        i, n = prim.shard
        notes.append(f"shard {i + 1}/{n}" + (f" of {a['shard_of']}" if a.get("shard_of") else ""))
    if a.get("stream_items"):
        notes.append("streams items")
    if a.get("stream_from"):
        notes.append("streamed")
    if a.get("prefix_of"):
        notes.append(f"prefix of {a['prefix_of']}")
    if a.get("cached_prefix_tokens"):
        notes.append(f"~{a['cached_prefix_tokens']} tok cached")
    return notes


def _shape_key(prim: Primitive) -> str:
    return "opaque" if prim.op is Op.OPAQUE else prim.kind


def _ids(graph: PGraph) -> dict[str, str]:
    ids: dict[str, str] = {}
    taken: set[str] = set()
    for name in graph.topological_order():
        base = "n_" + _slug(name)
        ident, i = base, 1
        while ident in taken:
            ident, i = f"{base}_{i}", i + 1
        taken.add(ident)
        ids[name] = ident
    return ids


def _slug(text: str) -> str:
    return re.sub(r"\W", "_", text)


def _endpoint(ids: dict[str, str], node: str, port: str) -> str:
    return f"in_{_slug(port)}" if node == INPUT else ids[node]


def to_mermaid(graph: PGraph) -> str:
    ids = _ids(graph)
    esc = lambda s: s.replace('"', "#quot;")  # noqa: E731
    lines = ["flowchart TD"]
    for name, type_ in graph.inputs.items():
        lines.append(f'  {_endpoint(ids, INPUT, name)}(("{esc(name)}: {type_}"))')
    for prim in graph.nodes:
        opening, closing = _MERMAID_SHAPES[_shape_key(prim)]
        label = "<br/>".join([f"<b>{prim.name}</b>", f"{prim.op} @ {prim.engine}", *short_attrs(prim)[:3]])
        lines.append(f"  {ids[prim.name]}{opening}{esc(label)}{closing}")
    for name in graph.outputs:
        lines.append(f'  out_{_slug(name)}>"{esc(name)}"]')
    for prim in graph.nodes:
        for ref in prim.inputs.values():
            if ref.node == INPUT or ref.node in ids:
                lines.append(f"  {_endpoint(ids, ref.node, ref.port)} -->|{ref.port}| {ids[prim.name]}")
        for target in sorted(prim.after):
            if target in ids:
                lines.append(f"  {ids[target]} -.-> {ids[prim.name]}")
    for name, ref in graph.outputs.items():
        if ref.node == INPUT or ref.node in ids:
            lines.append(f"  {_endpoint(ids, ref.node, ref.port)} -->|{ref.port}| out_{_slug(name)}")
    return "\n".join(lines) + "\n"


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(graph: PGraph) -> str:
    lines = [f"digraph {_q(graph.name)} {{", "  rankdir=TB;", '  node [fontname="Helvetica"];']
    for name, type_ in graph.inputs.items():
        lines.append(f"  {_q('input.' + name)} [label={_q(f'{name}: {type_}')}, shape=circle];")
    for prim in graph.nodes:
        label = "\\n".join([prim.name, f"{prim.op} @ {prim.engine}", *short_attrs(prim)])
        label = label.replace('"', '\\"')
        lines.append(f'  {_q(prim.name)} [label="{label}", shape={_DOT_SHAPES[_shape_key(prim)]}];')
    for name in graph.outputs:
        lines.append(f"  {_q('output.' + name)} [label={_q(name)}, shape=house];")
    for prim in graph.nodes:
        for ref in prim.inputs.values():
            src = "input." + ref.port if ref.node == INPUT else ref.node
            lines.append(f"  {_q(src)} -> {_q(prim.name)} [label={_q(ref.port)}];")
        for target in sorted(prim.after):
            lines.append(f"  {_q(target)} -> {_q(prim.name)} [style=dashed];")
    for name, ref in graph.outputs.items():
        src = "input." + ref.port if ref.node == INPUT else ref.node
        lines.append(f"  {_q(src)} -> {_q('output.' + name)} [label={_q(ref.port)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _short(value: Any) -> str:
    if isinstance(value, list) and len(value) > 3:
        return f"[{len(value)} items]"
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 24 else text[:21] + "..."


def summary(graph: PGraph) -> str:
    """One row per primitive, like torch.fx's print_tabular, plus inputs and outputs."""
    _, depth = graph.depth()
    ins = ", ".join(f"{n}:{t}" for n, t in graph.inputs.items()) or "-"
    outs = ", ".join(f"{n} <- {r}" for n, r in graph.outputs.items()) or "-"
    rows = [("name", "op", "engine", "inputs", "after", "attrs")]
    for p in graph.nodes:
        rows.append((
            p.name, p.op.value, p.engine,
            ", ".join(f"{port}={ref}" for port, ref in p.inputs.items()),
            ", ".join(sorted(p.after)),
            ", ".join(f"{k}={_short(v)}" for k, v in p.attrs.items()),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    table = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    head = (f"PGraph {graph.name!r}: {len(graph)} primitives, depth {depth}\n"
            f"inputs: {ins}\noutputs: {outs}")
    return head + "\n" + "\n".join(line.rstrip() for line in table) + "\n"

"""Meaning of the parts of a primitive that the IR itself defines, so every executor
(the reference interpreter, the runtime) computes them identically:

* sharding: which slice of a list the i-th of n shards sees;
* aggregate modes (the merges optimizer passes insert);
* format templates (``attrs["parts"]``) and decode item parsing (``attrs["parse"]``);
* what an opaque primitive's function returns (:func:`opaque_outputs`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Callable

# Characters per token, for estimates (the cost model's prompt sizes): about four for English
# text with the tokenizers of the models we serve. One constant for every lowering and pass.
CHARS_PER_TOKEN = 4

# ---------------------------------------------------------------------------- sharding


def shard_bounds(length: int, i: int, n: int) -> tuple[int, int]:
    """Consecutive, near-equal shards: shard i of n covers [i*L//n, (i+1)*L//n)."""
    return i * length // n, (i + 1) * length // n


def shard_slice(items: Sequence[Any], i: int, n: int) -> list[Any]:
    lo, hi = shard_bounds(len(items), i, n)
    return list(items[lo:hi])


def ordered_ports(ports: Sequence[str]) -> list[str]:
    """Natural order, so in2 comes before in10."""
    return sorted(ports, key=lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p)])


# --------------------------------------------------------------------------- aggregate


def _field(item: Any, name: str, default: Any = None) -> Any:
    if isinstance(item, Mapping):
        return item.get(name, default)
    return getattr(item, name, default)


def item_key(item: Any) -> Any:
    """Identity for de-duplication: a hit's ``id`` if it has one, else the item itself."""
    key = _field(item, "id")
    if key is None:
        key = item
    try:
        hash(key)
    except TypeError:
        return repr(key)
    return key


def _values(inputs: Mapping[str, Any]) -> list[Any]:
    return [inputs[p] for p in ordered_ports(list(inputs))]


def _rankings(inputs: Mapping[str, Any]) -> list[list[Any]]:
    """Each input is a ranked list, or a list of ranked lists (HITS_LIST) that is unpacked."""
    out: list[list[Any]] = []
    for value in _values(inputs):
        value = list(value)
        if value and all(isinstance(v, (list, tuple)) for v in value):
            out.extend(list(v) for v in value)
        else:
            out.append(value)
    return out


def _dedupe(items: list[Any]) -> list[Any]:
    seen: dict[Any, Any] = {}
    for item in items:
        seen.setdefault(item_key(item), item)  # first occurrence wins
    return list(seen.values())


def _concat(inputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> Any:
    return [x for value in _values(inputs) for x in value]


def _union(inputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> Any:
    return _dedupe([x for ranking in _rankings(inputs) for x in ranking])


def _topk(inputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> Any:
    key = attrs.get("key", "score")
    items = [x for ranking in _rankings(inputs) for x in ranking]
    items = sorted(items, key=lambda x: _field(x, key), reverse=True)  # stable for ties
    k = attrs.get("k")
    return items if k is None else items[: int(k)]


def _rrf(inputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> Any:
    """Reciprocal rank fusion: score(d) = sum over rankings of 1 / (k + rank of d)."""
    k = float(attrs.get("k", 60))
    score: dict[Any, float] = {}
    first: dict[Any, Any] = {}
    for ranking in _rankings(inputs):
        for rank, item in enumerate(ranking, start=1):
            key = item_key(item)
            first.setdefault(key, item)
            score[key] = score.get(key, 0.0) + 1.0 / (k + rank)
    fused = sorted(first, key=lambda key: score[key], reverse=True)  # stable: first seen wins ties
    top = attrs.get("top")
    return [first[key] for key in (fused if top is None else fused[: int(top)])]


def _join(inputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> Any:
    """Wait for every input, pass the first on (shards' identical INDEX handles)."""
    return _values(inputs)[0] if inputs else None


def _pick(inputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> Any:
    value = inputs[attrs.get("port") or ordered_ports(list(inputs))[0]]
    return value[attrs["index"]] if "index" in attrs else value


def _list(inputs: Mapping[str, Any], attrs: Mapping[str, Any]) -> Any:
    """Collect the inputs into one list (a question becomes a one-element query batch)."""
    return _values(inputs)


AGGREGATE_MODES: Mapping[str, Callable[[Mapping[str, Any], Mapping[str, Any]], Any]] = {
    "concat": _concat, "union": _union, "topk": _topk, "rrf": _rrf,
    "join": _join, "pick": _pick, "list": _list,
}


def aggregate(attrs: Mapping[str, Any], inputs: Mapping[str, Any]) -> Any:
    """Value of an aggregate primitive's ``out`` port. ``attrs["mode"]`` defaults to concat."""
    return AGGREGATE_MODES[attrs.get("mode", "concat")](inputs, attrs)


# ------------------------------------------------------------------------------ opaque


def opaque_outputs(outputs: Sequence[str], result: Any) -> dict[str, Any]:
    """Port values of an opaque primitive whose function returned ``result``. With one output
    port the return value *is* that port's value, whatever it is (a mapping ``{"out": 1}``
    included); with several it is a mapping holding exactly those ports."""
    if len(outputs) == 1:
        return {outputs[0]: result}
    if not isinstance(result, Mapping) or set(result) != set(outputs):
        got = sorted(result) if isinstance(result, Mapping) else type(result).__name__
        raise TypeError(f"an opaque primitive with outputs {sorted(outputs)} must return a mapping of "
                        f"exactly those ports, got {got}")
    return dict(result)


# ------------------------------------------------------------------------------ format


def template_vars(parts: Sequence[Any]) -> list[str]:
    return [p["var"] for p in parts if isinstance(p, Mapping)]


def render_value(part: Mapping[str, Any], value: Any) -> str:
    """A var part: strings as they are; lists joined by ``part["join"]`` (default newline),
    each item's ``part["field"]`` (e.g. a hit's text) or ``str(item)``."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        field = part.get("field")
        items = (str(_field(v, field)) if field else str(v) for v in value)
        return str(part.get("join", "\n")).join(items)
    return str(value)


def render(parts: Sequence[Any], values: Mapping[str, Any]) -> str:
    """Render a template: literal strings and ``{"var": port}`` entries, concatenated."""
    return "".join(p if isinstance(p, str) else render_value(p, values[p["var"]]) for p in parts)


# ------------------------------------------------------------------------------ decode


def parse_items(text: str, parse: str) -> list[str]:
    """Items of a decode's text: ``lines`` (non-blank, stripped) or ``json_list``."""
    if parse == "lines":
        return [line.strip() for line in text.splitlines() if line.strip()]
    if parse == "json_list":
        items = json.loads(text)
        if not isinstance(items, list):
            raise ValueError(f"expected a JSON list, got {type(items).__name__}")
        return [str(x) for x in items]
    raise ValueError(f"unknown parse mode {parse!r} (known: lines, json_list)")


def complete_items(partial: str, parse: str) -> list[str]:
    """The items of a decode's text so far that more text cannot change: a prefix of
    ``parse_items`` of the whole text, whatever follows. ``lines``: the terminated lines
    (split exactly as ``parse_items`` splits); ``json_list``: none until the text is whole."""
    if parse != "lines":
        return []
    lines = partial.splitlines(keepends=True)
    if lines and lines[-1].splitlines() == [lines[-1]]:  # the last line has no terminator yet
        lines.pop()
    return [line.strip() for line in lines if line.strip()]

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


# A framework's own render describes its template when each variable renders as a mark:
# the marks' order in the rendered prompt is the template's (``parts_from_marks``), and the
# prompt cut at the first mark is the part known before those variables
# (``prompt_before_cut``: split_prefill's warm-up of a prompt only the framework can render).
CUT = "\x00teola-cut\x00"


def var_mark(name: str) -> str:
    return f"\x00teola-var:{name}\x00"


def _texts(prompt: Any) -> list[str] | None:
    """The text a prompt carries, in order: a string; a request body's ``prompt``, or its
    ``messages``' contents (chat models); a list of messages. None: another shape."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, Mapping):
        if isinstance(prompt.get("prompt"), str):
            return [prompt["prompt"]]
        prompt = prompt.get("messages")
    if not isinstance(prompt, (list, tuple)):
        return None
    texts = []
    for message in prompt:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(str(c.get("text", "")) for c in content if isinstance(c, Mapping))
        elif content is not None:
            return None
    return texts


def parts_from_marks(prompt: Any, names: Sequence[str]) -> list[Any] | None:
    """``parts`` describing a prompt rendered with every variable as its ``var_mark``: the
    literal text around the marks (message separators left out: an estimate for the cost
    model) and the variables in the order they appear. None when a variable does not appear
    as its mark (a format spec, a converter, a non-text variable): the template is not
    described."""
    texts = _texts(prompt)
    if texts is None:
        return None
    text = "".join(texts)
    if any(var_mark(n) not in text for n in names):
        return None
    pattern = "(" + "|".join(re.escape(var_mark(n)) for n in names) + ")"
    parts: list[Any] = []
    for piece in re.split(pattern, text) if names else [text]:
        name = next((n for n in names if piece == var_mark(n)), None)
        if name is not None:
            parts.append({"var": name})
        elif piece:
            parts.append(piece)
    return parts


def render_format(attrs: Mapping[str, Any], inputs: Mapping[str, Any]) -> Any:
    """What a ``format`` primitive produces: the framework's own ``render`` when the lowering
    kept it (``parts`` then only describe the template), cut before its late variables for a
    prefix (``cut_vars``); else its ``parts`` rendered (one message of ``chat_role`` if set)."""
    render = attrs.get("render")
    if render is not None:
        cut = attrs.get("cut_vars")
        if cut is None:
            return render(**inputs)
        return prompt_before_cut(render(**inputs, **{v: CUT for v in cut}))
    prompt = globals()["render"](attrs["parts"], inputs)
    role = attrs.get("chat_role")  # chat models: the prompt is one message
    return [{"role": role, "content": prompt}] if role else prompt


def prompt_before_cut(prompt: Any) -> Any:
    """The prompt up to the first ``CUT``, in its own shape (a string, a request body, a
    message list: the message holding the cut keeps its text before it, later ones go);
    None when no cut is in it."""
    if isinstance(prompt, str):
        return prompt[:prompt.index(CUT)] if CUT in prompt else None
    if isinstance(prompt, Mapping):
        if isinstance(prompt.get("prompt"), str):
            cut = prompt_before_cut(prompt["prompt"])
            return None if cut is None else {**prompt, "prompt": cut}
        messages = prompt_before_cut(prompt.get("messages"))
        return None if messages is None else {**prompt, "messages": messages}
    if not isinstance(prompt, (list, tuple)):
        return None
    kept = []
    for message in prompt:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str) and CUT in content:
            return [*kept, {**message, "content": content[:content.index(CUT)]}]
        if isinstance(content, list) and any(CUT in str(c.get("text", "")) for c in content if isinstance(c, Mapping)):
            parts = []
            for c in content:
                text = str(c.get("text", "")) if isinstance(c, Mapping) else ""
                if CUT in text:
                    return [*kept, {**message, "content": [*parts, {**c, "text": text[:text.index(CUT)]}]}]
                parts.append(c)
        kept.append(message)
    return None


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

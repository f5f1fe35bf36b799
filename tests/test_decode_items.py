"""A pipelined decode hands its region every item, in order, as soon as it is complete:
the items streamed while decoding are exactly the items of the finished text, however the
text arrives in pieces (pure logic: the handler runs on a finished stream, no engine)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from teola_plugin.ir import Op, PGraph, PortType
from teola_plugin.ir import semantics
from teola_plugin.runtime.handlers import PrimitiveHandlers
from teola_plugin.runtime.values import LLMState

# Line breaks of every kind str.splitlines knows, "\r\n" included, among ordinary text.
TEXT = st.lists(st.sampled_from(["a", "bc", " ", "q1", "\n", "\r", "\r\n", "\u2028", "\x0c", "\n\n"]),
                max_size=20).map("".join)


def cut(text: str, cuts: list[int]) -> list[str]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in zip(points, points[1:])]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(TEXT, st.lists(st.integers(0, 100), max_size=6))
def test_complete_lines_are_a_prefix_of_the_final_items_at_every_point(text, cuts):
    final = semantics.parse_items(text, "lines")
    seen = ""
    for piece in cut(text, cuts):
        seen += piece
        done = semantics.complete_items(seen, "lines")
        assert done == final[:len(done)]
    assert len(semantics.complete_items(text + "\n", "lines")) == len(final)


class RecordingContext:
    """What llm_decode asks of its node context: tokens out, items out."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.tokens: list[str] = []

    def emit_item(self, item: str) -> None:
        self.items.append(item)

    def emit_token(self, text: str) -> None:
        self.tokens.append(text)


def decode(pieces: list[str], parse: str) -> tuple[dict, RecordingContext]:
    g = PGraph()
    g.add(Op.LLM_DECODE, inputs={"state": g.input("s", PortType.LLM_STATE)},
          attrs={"parse": parse, "stream_items": True}, name="d")
    state = LLMState("llm", "sid", [SimpleNamespace(text=p) for p in pieces], finished=True)
    ctx = RecordingContext()
    out = asyncio.run(PrimitiveHandlers().llm_decode(g["d"], {"state": state}, ctx))
    return out, ctx


@settings(max_examples=200, deadline=None, derandomize=True)
@given(TEXT, st.lists(st.integers(0, 100), max_size=6))
def test_a_streamed_lines_decode_emits_each_item_once_in_order(text, cuts):
    out, ctx = decode(cut(text, cuts), "lines")
    assert ctx.items == out["items"] == semantics.parse_items(text, "lines")
    assert "".join(ctx.tokens) == out["text"] == text


def test_lines_are_emitted_while_decoding_not_only_at_the_end():
    pieces = ["first query\nsec", "ond query\n", "third"]
    g = PGraph()
    g.add(Op.LLM_DECODE, inputs={"state": g.input("s", PortType.LLM_STATE)},
          attrs={"parse": "lines", "stream_items": True}, name="d")
    ctx, seen_at = RecordingContext(), []
    ctx.emit_token = lambda text: seen_at.append(len(ctx.items))  # items already out when each piece arrives
    state = LLMState("llm", "sid", [SimpleNamespace(text=p) for p in pieces], finished=True)
    asyncio.run(PrimitiveHandlers().llm_decode(g["d"], {"state": state}, ctx))
    assert seen_at == [0, 1, 2] and ctx.items == ["first query", "second query", "third"]


def test_a_streamed_json_list_decode_still_hands_over_all_its_items():
    """Its items complete only when the list closes; a region fed by it must still get them
    (it used to get none: the handler streamed lines only)."""
    out, ctx = decode(['["alpha", "be', 'ta", 3]'], "json_list")
    assert ctx.items == out["items"] == ["alpha", "beta", "3"]

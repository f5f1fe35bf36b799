"""The primitive vocabulary: one :class:`OpSpec` per :class:`Op`.

A spec is everything a pass or a scheduler may assume about an op without running it:
its ports, the engine kind that serves it, the algebraic flags passes rely on, and the
attributes a primitive of the op may carry (``attrs``, with :data:`COMMON_ATTRS`: a
primitive with any other attribute fails validation, so a misspelt one is caught where
it is written, not ignored where it is read).

The splitting law. A *splittable* op is an elementwise map over its ``split_inputs``
(other inputs are broadcast to every shard)::

    f(xs) == concat(f(xs[a:b]) for consecutive shards [a:b] of xs)

for every ``split_outputs`` port, and its other outputs are shard-invariant handles
(the same value from every shard, e.g. the INDEX that ``vector_insert`` wrote into).
Several split inputs / outputs of one op are aligned element by element.
Stage decomposition and decode pipelining are only correct because of this law, so a
new op may claim ``splittable`` only if it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Mapping

from .ports import PortType as T


class Op(StrEnum):
    CHUNK = "chunk"
    EMBED = "embed"
    VECTOR_INSERT = "vector_insert"
    VECTOR_SEARCH = "vector_search"
    RERANK = "rerank"
    SEARCH = "search"
    LLM_PARTIAL_PREFILL = "llm_partial_prefill"
    LLM_PREFILL = "llm_prefill"
    LLM_DECODE = "llm_decode"
    AGGREGATE = "aggregate"
    FORMAT = "format"
    OPAQUE = "opaque"

    # Hash as the string it equals (Enum's default hashes the member *name*, in Python):
    # OPS["embed"] then finds Op.EMBED, and spec lookups on hot paths stay in C.
    __hash__ = str.__hash__


@dataclass(frozen=True)
class OpSpec:
    op: Op
    inputs: Mapping[str, T]
    outputs: Mapping[str, T]
    engine: str  # default engine kind: cpu, embedder, vector_store, reranker, search, llm
    variadic_inputs: bool = False  # any input port names (all typed ANY)
    variadic_outputs: bool = False  # output port names given per primitive (typed VALUE)
    optional_inputs: tuple[str, ...] = ()  # ports that may stay unbound
    batchable: bool = False  # several queries' requests can share one engine call
    splittable: bool = False  # elementwise over split_inputs (see module docstring)
    split_inputs: tuple[str, ...] = ()
    split_outputs: tuple[str, ...] = ()
    streamable: bool = False  # emits items before it completes
    pure: bool = True  # no side effects: may be merged, reordered, or dropped if unused
    attrs: Mapping[str, str] = field(default_factory=dict)  # the op's own attributes -> meaning
    doc: str = field(default="", compare=False)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(self.outputs)

    @property
    def variadic(self) -> bool:
        return self.variadic_inputs

    def input_type(self, port: str) -> T | None:
        """Type of an input port, ``None`` if the op has no such port."""
        return T.ANY if self.variadic_inputs else self.inputs.get(port)

    def output_type(self, port: str) -> T | None:
        return T.VALUE if self.variadic_outputs else self.outputs.get(port)

    def unknown_attrs(self, attrs: Mapping[str, object]) -> list[str]:
        """The names in ``attrs`` that neither this op nor every op (COMMON_ATTRS) defines."""
        return sorted(k for k in attrs if k not in self.attrs and k not in COMMON_ATTRS)


# What any primitive may carry: the cost model's estimates, the marks the optimizer's passes
# leave, and a free label for tools and tests.
COMMON_ATTRS: Mapping[str, str] = MappingProxyType({
    "est_items": "how many items it handles (cost model)",
    "est_latency_s": "its latency, when known (overrides the cost model)",
    "shard": "(i, n): shard i of n of an op split by decompose_stages",
    "shard_of": "the primitive the shard was split from",
    "sliced": "the split inputs this shard slices itself at run time",
    "stream_from": "the llm_decode whose items it takes one at a time (pipeline_decode)",
    "item_outputs": "a pipelined region's outputs collected per item",
    "tag": "a label with no effect (tools, tests)",
})
_LLM_REQUEST = {
    "sampling_params": "the model's own sampling parameters ({}: in its request body; absent: greedy)",
    "max_tokens": "tokens to decode at most",
    "temperature": "sampling temperature (when not in sampling_params)",
    "raise_error": "the framework model's own translation of its client's errors",
}


def _spec(op: Op, inputs: dict[str, T], outputs: dict[str, T], engine: str, attrs: dict[str, str] | None = None,
          **flags) -> OpSpec:
    return OpSpec(op, MappingProxyType(inputs), MappingProxyType(outputs), engine,
                  attrs=MappingProxyType(attrs or {}), **flags)


OPS: Mapping[Op, OpSpec] = MappingProxyType({
    s.op: s
    for s in (
        # chunk also emits the chunks' texts so embed needs no DOCS->TEXTS conversion.
        _spec(Op.CHUNK, {"docs": T.DOCS}, {"chunks": T.DOCS, "texts": T.TEXTS}, "cpu",
              splittable=True, split_inputs=("docs",), split_outputs=("chunks", "texts"),
              attrs={"chunk_size": "characters per chunk", "chunk_overlap": "characters shared by neighbours",
                     "splitter": "the framework's own splitter, called instead"},
              doc="split documents into chunks"),
        _spec(Op.EMBED, {"texts": T.TEXTS}, {"vectors": T.VECTORS}, "embedder",
              attrs={"embed_text": "a framework model's own embedding of one text, called per text instead of "
                                   "the engine's batch (a served model: its requests go through the engine)"},
              batchable=True, splittable=True, split_inputs=("texts",), split_outputs=("vectors",),
              doc="embed each text"),
        _spec(Op.VECTOR_INSERT, {"index": T.INDEX, "vectors": T.VECTORS, "docs": T.DOCS},
              {"index": T.INDEX}, "vector_store", batchable=True, splittable=True,
              split_inputs=("vectors", "docs"), pure=False,
              doc="insert (vector, doc) pairs; the output handle proves the data is in"),
        _spec(Op.VECTOR_SEARCH, {"index": T.INDEX, "vectors": T.VECTORS}, {"hits": T.HITS_LIST},
              "vector_store", batchable=True, splittable=True, split_inputs=("vectors",),
              split_outputs=("hits",),
              attrs={"top_k": "hits per vector",
                     "store_search": "a user's store searched by its own method (runtime.values.StoreSearch)",
                     "async_search": "a user's store whose async search is its own: an async caller's "
                                     "search runs it, on the caller's loop"},
              doc="nearest neighbours, one ranked list per vector"),
        _spec(Op.RERANK, {"query": T.TEXT, "hits": T.HITS}, {"hits": T.HITS}, "reranker",
              batchable=True, attrs={"top_n": "hits kept"}, doc="re-score hits against the query, keep the best"),
        _spec(Op.SEARCH, {"queries": T.TEXTS}, {"hits": T.HITS_LIST}, "search", batchable=True,
              splittable=True, split_inputs=("queries",), split_outputs=("hits",), attrs={"top_k": "hits per query"},
              doc="keyword / web-style search, one ranked list per query"),
        _spec(Op.FORMAT, {}, {"prompt": T.PROMPT}, "cpu", variadic_inputs=True,
              attrs={"parts": "the template: literal strings and {'var': ...} references (semantics.render)",
                     "render": "the framework's own rendering of the inputs, instead of parts",
                     "chat_role": "a chat model's prompt: one message of this role",
                     "prefix_of": "the format whose literal prefix this is (split_prefill)",
                     "cut_vars": "with render: variables rendered as the cut mark; the prompt ends before it"},
              doc="render a prompt template (attrs['parts'])"),
        _spec(Op.LLM_PARTIAL_PREFILL, {"prompt": T.PROMPT}, {"done": T.SIGNAL}, "llm",
              batchable=True, attrs={"est_prompt_tokens": "prefix tokens (cost model)",
                                     "prefix_of": "the llm_prefill it warms"},
              doc="prefill a known prompt prefix into the prefix cache"),
        # `prefix` (optional) waits for the llm_partial_prefill that warmed the prefix cache:
        # a data edge on a SIGNAL, so no pass mistakes it for a removable module-order wait.
        # `listener` (optional, as the decode's): the call's failure is reported to it too
        _spec(Op.LLM_PREFILL, {"prompt": T.PROMPT, "prefix": T.SIGNAL, "listener": T.ANY}, {"state": T.LLM_STATE},
              "llm", batchable=True, optional_inputs=("prefix", "listener"),
              attrs={**_LLM_REQUEST, "est_prompt_tokens": "prompt tokens (cost model)",
                     "cached_prefix_tokens": "tokens a partial prefill cached (cost model)",
                     "streamed_request": "request overrides when the caller streams (a served model's)",
                     "always_streamed": "send streamed_request even when no caller reads the tokens "
                                        "(the framework's own code streams this call)"},
              doc="prefill the full prompt"),
        # `listener` (optional): a callable given each decoded delta as (text, the server's chunk
        # or None), empty ones included (a framework's token callbacks: LangChain's
        # on_llm_new_token, LlamaIndex's in-progress events), or None.
        _spec(Op.LLM_DECODE, {"state": T.LLM_STATE, "listener": T.ANY},
              {"text": T.TEXT, "items": T.TEXTS, "response": T.ANY}, "llm", optional_inputs=("listener",),
              streamable=True, attrs={**_LLM_REQUEST, "parse": "how the text splits into items (lines, json_list)",
                                      "stream_items": "emit each item as soon as it is complete"},
              doc="generate; attrs['parse'] splits the text into items; 'response' is a "
                                   "model server's reply (None in-process)"),
        _spec(Op.AGGREGATE, {}, {"out": T.ANY}, "cpu", variadic_inputs=True,
              attrs={"mode": "how the inputs merge (semantics.AGGREGATE_MODES)", "k": "topk: how many; rrf: its k",
                     "key": "topk: the score field", "top": "rrf: how many to keep", "port": "pick: the input",
                     "index": "pick: the element", "gathers": "the op whose shards it gathers (decompose_stages)"},
              doc="merge inputs (attrs['mode']: concat, union, topk, rrf, join, pick, list)"),
        # Impure by default: we cannot see inside; attrs['pure']=True opts in.
        _spec(Op.OPAQUE, {}, {}, "cpu", variadic_inputs=True, variadic_outputs=True, pure=False,
              attrs={"fn": "the function called with the inputs (may return an ir.expansion.Expansion)",
                     "pure": "True: no side effects (may be merged or dropped)",
                     "expands": "what it expands into at run time (explain)",
                     "expands_into": "the sub-components it expands into (inspection)",
                     "opens_run": "its 'run' output is a callback run the primitive reading it ends "
                                  "(the run tree errors it if the graph run fails first)",
                     "warm_prompt": "the template of the LLM calls it expands into ({render, parts, engine, "
                                    "est_prompt_tokens}: parts over its inputs), for split_prefill"},
              doc="call a framework component unchanged"),
    )
})


def spec_of(op: Op | str) -> OpSpec:
    """The spec of ``op``; ``KeyError`` for an unknown op."""
    return OPS[Op(op)]


def parse_op(op: Op | str) -> Op | None:
    """``op`` as an :class:`Op`, or ``None`` if it names no op."""
    try:
        return Op(op)
    except ValueError:
        return None

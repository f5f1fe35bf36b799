"""Port types: what flows along a data edge between two primitives.

Types are coarse on purpose. They catch wiring mistakes in lowering rules and passes
(a vector list fed where a prompt is expected) without modelling Python's type system.
"""

from __future__ import annotations

from enum import Enum


class PortType(str, Enum):
    ANY = "any"  # wildcard: accepts / is accepted by everything
    TEXT = "text"  # str
    TEXTS = "texts"  # list[str]
    VECTORS = "vectors"  # list of vectors
    DOCS = "docs"  # list of documents
    HITS = "hits"  # list of scored hits
    HITS_LIST = "hits_list"  # list[list[hit]]: one ranked list per query vector
    PROMPT = "prompt"  # str, rendered for an LLM
    LLM_STATE = "llm_state"  # opaque handle to a prefilled LLM request
    INDEX = "index"  # handle to a vector index; carrying it carries "data was inserted"
    SIGNAL = "signal"  # completion only, no payload
    VALUE = "value"  # any Python object (opaque components)

    def __str__(self) -> str:
        return self.value


_WILDCARDS = frozenset({PortType.ANY, PortType.VALUE})
# Implicit widenings. Kept tiny: every entry is a place where a type error can hide.
_WIDENINGS = frozenset({(PortType.TEXT, PortType.PROMPT)})


def compatible(src: PortType, dst: PortType) -> bool:
    """May an output of type ``src`` be bound to an input of type ``dst``?"""
    return src == dst or src in _WILDCARDS or dst in _WILDCARDS or (src, dst) in _WIDENINGS

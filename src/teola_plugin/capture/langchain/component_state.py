"""What a trace read of its components, to tell when a kept plan no longer fits them.

A ``TeolaRunnable`` traces a chain once per input layout and reuses the plan. Rules read
their components' settings while tracing: a retriever's ``search_type`` and
``search_kwargs`` become the graph's search, a model's ``streaming`` decides whether it is
lowered. A user who changes one of them between calls (``retriever.search_kwargs["k"] = 1``)
gets that change in plain LangChain at the next call, so the plan must follow: each traced
component's fields are snapshotted when the trace is made, and a plan whose components
changed since is traced again.

The snapshot is shallow: a field holding a scalar or a small container of them is compared
by value (containers are copied, so an in-place edit shows); any other object (a vector
store, a client, a nested runnable, which is snapshotted as a component of its own when the
trace lowers it) by identity. Containers too large to copy on every call are compared by
identity and length.

One setting is global: LangChain's LLM cache (``set_llm_cache``), which decides whether a
model's call is lowered at all (``rules/models.py``); it is compared by identity.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable
from typing import Any

MAX_ITEMS = 256  # items of a container compared by value
MAX_DEPTH = 4
_SCALARS = (str, bytes, int, float, complex, bool, type(None), enum.Enum)
_CONTAINERS = (dict, list, tuple, set, frozenset)


class _Same:
    """An object compared by identity (its own state is not the trace's business)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


def _token(value: Any, depth: int = 0) -> Any:
    if isinstance(value, _SCALARS):
        return value
    kind = type(value)
    if kind not in _CONTAINERS:
        return _Same(value)
    if depth >= MAX_DEPTH or len(value) > MAX_ITEMS:
        return _Same(value), len(value)
    if kind is dict:
        return dict, tuple((_token(k, depth + 1), _token(v, depth + 1)) for k, v in value.items())
    if kind in (set, frozenset):
        return kind, frozenset(_token(v, depth + 1) for v in value)
    return kind, tuple(_token(v, depth + 1) for v in value)


def _fields(component: Any) -> dict[str, Any]:
    """A component's own settings: a pydantic model's declared fields, a plain object's
    attributes; not what use caches beside them (a ``cached_property`` lands in ``__dict__``
    at first use: a lambda's ``deps``, the ``_serialized`` form a callback run reads), nor
    pydantic's private attributes."""
    own = getattr(component, "__dict__", {})
    declared = getattr(type(component), "model_fields", None)
    if isinstance(declared, dict):
        return {name: own[name] for name in declared if name in own}
    cls = type(component)
    return {name: value for name, value in own.items()
            if not isinstance(getattr(cls, name, None), functools.cached_property)}


class ComponentState:
    """The traced components' settings as they were when the trace was made."""

    def __init__(self, components: Iterable[Any] = ()) -> None:
        unique = {id(c): c for c in components}
        self._components = list(unique.values())
        self._snapshot = [self._read(c) for c in self._components]
        self._llm_cache = global_llm_cache()

    @staticmethod
    def _read(component: Any) -> dict[str, Any]:
        return {name: _token(value) for name, value in _fields(component).items()}

    def changed(self) -> list[str]:
        """``Type.field`` of each setting that differs from the snapshot (empty: none)."""
        out = []
        for component, then in zip(self._components, self._snapshot):
            now = self._read(component)
            if now != then:
                name = type(component).__name__
                out += [f"{name}.{k}" for k in sorted(set(now) | set(then), key=str) if now.get(k) != then.get(k)]
        if global_llm_cache() is not self._llm_cache:
            out.append("set_llm_cache")
        return out

    def unchanged(self) -> bool:
        return (global_llm_cache() is self._llm_cache
                and all(self._read(c) == then for c, then in zip(self._components, self._snapshot)))


def global_llm_cache() -> Any:
    """The cache ``set_llm_cache`` set (None: none)."""
    from langchain_core.globals import get_llm_cache

    return get_llm_cache()

"""The last N values kept for keys, the least recently used dropped first: the plans and
wrappers kept per chain and input layout, the prefixes a replica caches, the cancels an engine
actor remembers.

Keys built from ``id(obj)`` are only sound while ``obj`` is alive, so an entry can hold its
object (``keep``): a chain built afresh per call cannot hand its id to another chain while
its plan is still kept."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class Recent(Generic[V]):
    """A thread-safe least-recently-used map of at most ``limit`` entries."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._entries: OrderedDict[Hashable, tuple[Any, V]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            return self._lookup(key)

    def get_or_make(self, key: Hashable, make: Callable[[], V], keep: Any = None) -> V:
        """The value kept for ``key``, else ``make()``'s, made once under the lock (keep
        ``make`` cheap: lookups of other keys wait for it)."""
        with self._lock:
            value = self._lookup(key)
            if value is None:
                value = make()
                self._insert(key, value, keep)
            return value

    def put(self, key: Hashable, value: V, keep: Any = None) -> V:
        with self._lock:
            self._insert(key, value, keep)
        return value

    def pop(self, key: Hashable) -> V | None:
        """Remove ``key``'s entry; its value, or None when there was none."""
        with self._lock:
            entry = self._entries.pop(key, None)
        return None if entry is None else entry[1]

    def _lookup(self, key: Hashable) -> V | None:  # under the lock
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def _insert(self, key: Hashable, value: V, keep: Any) -> None:
        self._entries[key] = (keep, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.limit:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)

"""A copy-on-write multimap: the reverse index behind PGraph."""

from __future__ import annotations

from typing import Any, Iterable


class MultiIndex:
    """key -> ordered set of items (a dict used as a set, so iteration is deterministic).

    Copy-on-write per key: ``copy()`` is a shallow copy sharing every set, and whichever
    side edits a key first copies that one set. Edits stay O(1) however many readers a
    value has, and copying a graph stays O(number of keys).
    """

    __slots__ = ("_sets", "_owned")

    def __init__(self) -> None:
        self._sets: dict[Any, dict[Any, None]] = {}
        self._owned: set[Any] = set()  # keys whose set only this index holds

    def get(self, key: Any, default: Iterable[Any] = ()) -> Iterable[Any]:
        return self._sets.get(key, default)

    def add(self, key: Any, item: Any) -> None:
        self._own(key)[item] = None

    def discard(self, key: Any, item: Any) -> None:
        if item in self._sets.get(key, ()):
            items = self._own(key)
            del items[item]
            if not items:
                del self._sets[key]
                self._owned.discard(key)

    def pop(self, key: Any) -> None:
        self._sets.pop(key, None)
        self._owned.discard(key)

    def copy(self) -> MultiIndex:
        twin = MultiIndex()
        twin._sets = dict(self._sets)
        self._owned = set()  # every set is shared now
        return twin

    def _own(self, key: Any) -> dict[Any, None]:
        if key not in self._owned:
            self._sets[key] = dict(self._sets.get(key, {}))
            self._owned.add(key)
        return self._sets[key]

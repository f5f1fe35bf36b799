"""A user's own object (a framework's vector store, a retriever) as an in-process engine sees it.

Engines that wrap a user's object are served for the runtime's lifetime, but the object is
the user's: an app that builds a fresh index per request (document QA) must not have every
one of them kept alive by the runtime. So such engines hold the object weakly; the runtime
drops the engine when the object is collected (``Runtime.add_local_engine(owner=...)``).
While a query runs, its traced plan holds the object, so a live query never finds it gone.
Objects that cannot be weakly referenced are held strongly (kept, as before).
"""

from __future__ import annotations

import weakref
from typing import Generic, TypeVar

from ..errors import EngineInputError

T = TypeVar("T")


class UserObjectRef(Generic[T]):
    """A weak reference to ``obj`` (strong if ``obj`` does not allow weak references)."""

    def __init__(self, obj: T, what: str) -> None:
        self.what = what
        self.type_name = type(obj).__name__
        try:
            self._get = weakref.ref(obj)
        except TypeError:  # e.g. a class with __slots__ and no __weakref__
            self._get = lambda: obj

    def alive(self) -> bool:
        return self._get() is not None

    def __call__(self) -> T:
        obj = self._get()
        if obj is None:
            raise EngineInputError(f"the {self.what} ({self.type_name}) this engine served was garbage-collected; "
                                   "keep it (and the index or chain that uses it) referenced while querying")
        return obj

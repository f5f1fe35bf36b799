"""One log WARNING per component type that stays opaque, for both framework tracers.

Traces repeat on every query (LlamaIndex) or input layout (LangChain), so a warning per
trace would flood the log; one per type says what matters: this kind of component is
not scheduled by Teola.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_PROBING = contextvars.ContextVar("teola_probing_trace", default=False)


@contextmanager
def probing() -> Iterator[None]:
    """A trace made only to inspect a component (does it use an engine?), not to run it:
    what stays opaque there is not worth a warning."""
    token = _PROBING.set(True)
    try:
        yield
    finally:
        _PROBING.reset(token)


class OpaqueWarnings:
    """Callable ``(component, reason)``; ``template`` gets the type's qualified name and the reason."""

    def __init__(self, logger: logging.Logger, template: str) -> None:
        self.logger = logger
        self.template = template
        self.warned: set[type] = set()  # tests may discard a type to see its warning again
        self._lock = threading.Lock()

    def __call__(self, component: Any, reason: str) -> None:
        if _PROBING.get():
            return
        kind = type(component)
        with self._lock:
            if kind in self.warned:
                return
            self.warned.add(kind)
        self.logger.warning(self.template, f"{kind.__module__}.{kind.__qualname__}", reason)

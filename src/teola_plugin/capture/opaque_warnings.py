"""One log WARNING per component type that stays opaque, for both framework tracers.

Traces repeat on every query (LlamaIndex) or input layout (LangChain), so a warning per
trace would flood the log; one per type says what matters: this kind of component is
not scheduled by Teola.
"""

from __future__ import annotations

import logging
import threading
from typing import Any


class OpaqueWarnings:
    """Callable ``(component, reason)``; ``template`` gets the type's qualified name and the reason."""

    def __init__(self, logger: logging.Logger, template: str) -> None:
        self.logger = logger
        self.template = template
        self.warned: set[type] = set()  # tests may discard a type to see its warning again
        self._lock = threading.Lock()

    def __call__(self, component: Any, reason: str) -> None:
        kind = type(component)
        with self._lock:
            if kind in self.warned:
                return
            self.warned.add(kind)
        self.logger.warning(self.template, f"{kind.__module__}.{kind.__qualname__}", reason)

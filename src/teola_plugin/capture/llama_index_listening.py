"""Whether anyone hears a LlamaIndex component's events: only then does Teola report them."""

from __future__ import annotations

from typing import Any


def listened(component: Any, dispatcher: Any) -> bool:
    """A handler on ``component``'s callback manager, or an event handler on ``dispatcher``
    or a dispatcher it propagates to."""
    manager = getattr(component, "callback_manager", None)
    if manager is not None and manager.handlers:
        return True
    d = dispatcher
    while d is not None:
        if any(type(h).__name__ != "NullEventHandler" for h in d.event_handlers):
            return True
        d = d.parent if d.propagate else None
    return False

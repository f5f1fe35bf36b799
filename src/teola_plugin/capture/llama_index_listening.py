"""Reporting LlamaIndex events for work Teola ran: whether anyone hears a component's events
(only then are they reported), and how its events describe a model."""

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


def model_dict(model: Any) -> dict[str, Any]:
    """The model as LlamaIndex's events carry it (its ``to_payload``, which drops secrets;
    ``to_dict`` where a version lacks it)."""
    payload = getattr(model, "to_payload", None)
    return payload() if payload is not None else model.to_dict()

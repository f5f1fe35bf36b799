"""Reporting LlamaIndex events for work Teola ran: whether anyone hears a component's events
(only then are they reported), and how its events describe a model."""

from __future__ import annotations

from typing import Any

_NULL_HANDLERS = {"event_handlers": "NullEventHandler", "span_handlers": "NullSpanHandler"}  # LlamaIndex's defaults


def listened(component: Any, dispatcher: Any) -> bool:
    """A handler on ``component``'s callback manager, or an event handler on ``dispatcher``
    or a dispatcher it propagates to."""
    return has_callbacks(component) or has_handlers(dispatcher, "event_handlers")


def has_callbacks(component: Any) -> bool:
    """A handler on ``component``'s callback manager."""
    manager = getattr(component, "callback_manager", None)
    return bool(getattr(manager, "handlers", None))


def has_handlers(dispatcher: Any, kind: str) -> bool:
    """A handler of ``kind`` (``event_handlers``, ``span_handlers``) other than LlamaIndex's
    null one on ``dispatcher`` or a dispatcher it propagates to."""
    null = _NULL_HANDLERS[kind]
    d = dispatcher
    while d is not None:
        if any(type(h).__name__ != null for h in getattr(d, kind)):
            return True
        d = d.parent if d.propagate else None
    return False


def model_dict(model: Any) -> dict[str, Any]:
    """The model as LlamaIndex's events carry it (its ``to_payload``, which drops secrets;
    ``to_dict`` where a version lacks it)."""
    payload = getattr(model, "to_payload", None)
    return payload() if payload is not None else model.to_dict()

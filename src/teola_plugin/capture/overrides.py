"""Which methods a subclass of one of the plugin's model classes redefines.

A lowered model call asks the engine directly, bypassing the model's own ``complete`` /
``_generate`` / ``_get_query_embedding``. For the plugin's classes that is what those
methods do anyway; a subclass that redefines one may compute something else, so the
lowering rules decline it and its own code runs.

The plugin's model classes say which methods a lowered call replaces in a class attribute,
``LOWERED_CALLS_ATTR``, so capture reads it from the object and never imports the
integration packages above it.
"""

from __future__ import annotations

from typing import Any


LOWERED_CALLS_ATTR = "teola_lowered_calls"


def overridden_lowered_calls(obj: Any) -> list[str]:
    """The lowered calls (``teola_lowered_calls`` of the plugin class that declares them) that
    a subclass between ``type(obj)`` and that class defines itself; [] for other objects."""
    declaring = next((k for k in type(obj).__mro__ if LOWERED_CALLS_ATTR in k.__dict__), None)
    if declaring is None:
        return []
    return overridden(obj, declaring, tuple(getattr(declaring, LOWERED_CALLS_ATTR)))


def overridden(obj: Any, base: type, names: tuple[str, ...]) -> list[str]:
    """The ``names`` that a class between ``type(obj)`` and ``base`` defines itself. Looked up
    in the class dictionaries: frameworks wrap methods (instrumentation, callbacks), so the
    attribute read through the class is a new object at each access and cannot be compared."""
    if type(obj) is base or not isinstance(obj, base):
        return []
    mro = type(obj).__mro__
    own = mro[:mro.index(base)]
    return [name for name in names if any(name in klass.__dict__ for klass in own)]

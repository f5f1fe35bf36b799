"""Model-server calls made by framework code that Teola runs as it is, sent through Teola's
served engines (``scope.py``: when; ``openai_sdk.py``: how)."""

from .openai_sdk import install, uninstall
from .scope import (EXPLAIN_ROUTED, ServedCallScope, current_scope, routed_aiterate, routed_iterate,
                    routing_served_calls, set_fallback)

__all__ = ["EXPLAIN_ROUTED", "ServedCallScope", "current_scope", "install", "routed_aiterate", "routed_iterate",
           "routing_served_calls", "set_fallback", "uninstall"]

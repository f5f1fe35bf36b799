"""Model calls made by framework code that Teola runs as it is, sent through Teola's engines
(``scope.py``: when; ``openai_sdk.py``: model-server requests, to the served engines;
``embedding_calls.py``: sentence-transformers embeddings, to the embedder engine)."""

from . import embedding_calls, openai_sdk
from .scope import (EXPLAIN_ROUTED, ServedCallScope, current_scope, routed_aiterate, routed_iterate,
                    routed_run_stream, routing_served_calls, set_fallback)


def install() -> None:
    """Wrap the SDK's request methods and the loaded embedding classes (idempotent)."""
    openai_sdk.install()
    embedding_calls.install()


def uninstall() -> None:
    openai_sdk.uninstall()
    embedding_calls.uninstall()


__all__ = ["EXPLAIN_ROUTED", "ServedCallScope", "current_scope", "install", "routed_aiterate", "routed_iterate",
           "routed_run_stream", "routing_served_calls", "set_fallback", "uninstall"]

"""Every exception the library raises on purpose.

Each subclasses the builtin a caller would naturally catch (ValueError, TypeError,
TimeoutError, ...) so existing ``except`` clauses in user code keep working, and
``TeolaError`` so callers can catch ours as a family. docs/troubleshooting.md lists
them with their fixes.
"""

from __future__ import annotations


class TeolaError(Exception):
    """Base class of every error raised by teola_plugin itself."""


class ConfigError(TeolaError, ValueError):
    """A setting is invalid (unknown pass name, bad Ray address, bad engine option)."""


class ModelNotFoundError(TeolaError, FileNotFoundError):
    """The model directory does not exist or holds no model files."""


class ModelLoadError(TeolaError, RuntimeError):
    """The engine found the model but could not load it."""


class EngineInputError(TeolaError, ValueError):
    """An engine was called with input it cannot process (wrong type, wrong vector
    dimension, empty document list, unknown index). Raised before anything is written."""


class EngineNotStartedError(TeolaError, RuntimeError):
    """An engine method was called before ``start()`` (or after ``close()``)."""


class GraphValidationError(TeolaError, ValueError):
    """A primitive graph is malformed; the message names the offending primitive."""

    def __init__(self, message: str, node: str | None = None):
        super().__init__(message)
        self.node = node


class QueryTimeoutError(TeolaError, TimeoutError):
    """A query did not finish within its timeout; its outstanding work was cancelled."""


class EngineRestartedError(TeolaError, RuntimeError):
    """An engine's process died and was restarted while a query's LLM stream was open on
    it: the generation is lost (the query fails; later queries use the restarted engine)."""


class EngineStartTimeoutError(QueryTimeoutError):
    """A query's engines did not start within its timeout (e.g. Ray cannot place a replica:
    no node has the resources its ``EngineSpec`` asks for). The message names the engine
    and those resources; the half-started replicas were stopped, so a later query retries."""

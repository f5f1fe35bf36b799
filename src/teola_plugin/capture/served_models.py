"""Framework model objects that call an OpenAI-compatible server, as Teola served engines.

An app written from the frameworks' docs reaches vLLM (or SGLang, Ollama, a hosted API)
through LlamaIndex ``OpenAI`` / ``OpenAILike`` or LangChain ``ChatOpenAI`` / ``OpenAI`` /
``VLLMOpenAI``. Each of them configures an ``openai`` SDK client and sends one request body
per call. :func:`server_endpoint` reads the client settings into a
:class:`~teola_plugin.engines.llm_served.ServerEndpoint` (one served engine per endpoint,
shared by every model object that names it); the framework rules build the body with the
model's own code (``llama_index_served.py``, ``langchain/rules/served.py``).

A client Teola cannot reproduce stays the model's own call, with the reason in
``explain()``: a custom ``http_client`` (proxies, transports, event hooks), a timeout that
is not a number of seconds.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from ..engines.llm_served import ServerEndpoint

OPENAI_BASE_URL = "https://api.openai.com/v1"  # the SDK's default when nothing names a server


def installed_classes(*paths: str) -> tuple[type, ...]:
    """The classes ``"module:Class"`` whose (optional) packages are installed."""
    found = []
    for path in paths:
        module, _, name = path.partition(":")
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return tuple(found)


class UnreproducibleClient(Exception):
    """The model's client is configured in a way a served engine would not reproduce."""


def _secret(value: Any) -> str:
    if value is None:
        return "EMPTY"
    getter = getattr(value, "get_secret_value", None)  # pydantic SecretStr (LangChain)
    return str(getter() if callable(getter) else value)


def _timeout(value: Any) -> float | None:
    if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
        return None if value is None else float(value)
    raise UnreproducibleClient(f"its timeout {value!r} is not a number of seconds")


def _pairs(mapping: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((str(k), v) for k, v in (mapping or {}).items()))


def server_endpoint(*, base_url: Any, api_key: Any, organization: Any = None,
                    default_headers: Mapping[str, str] | None = None, default_query: Mapping[str, Any] | None = None,
                    timeout: Any = None, max_retries: Any = 2, http_client: Any = None) -> ServerEndpoint:
    """The endpoint an ``openai`` SDK client built with these settings talks to; raises
    :class:`UnreproducibleClient` when the engine's own client would behave differently."""
    if http_client is not None:
        raise UnreproducibleClient("it brings its own http_client (transport, proxies or hooks Teola would not use)")
    return ServerEndpoint(base_url=str(base_url or OPENAI_BASE_URL).rstrip("/"), api_key=_secret(api_key),
                          organization=None if organization is None else str(organization),
                          default_headers=_pairs(default_headers), default_query=_pairs(default_query),
                          timeout=_timeout(timeout), max_retries=int(2 if max_retries is None else max_retries))


# The http clients an ``openai`` SDK client gets when its user brings none (the SDK's own, or
# the shared pool langchain-openai hands it): requests through them are what the engine sends.
_DEFAULT_HTTP_CLIENTS = ("openai._base_client:SyncHttpxClientWrapper",
                         "openai._base_client:AsyncHttpxClientWrapper",
                         "langchain_openai.chat_models._client_utils:_SyncHttpxClientWrapper",
                         "langchain_openai.chat_models._client_utils:_AsyncHttpxClientWrapper")


def _client_timeout(timeout: Any) -> float | None:
    import httpx
    import openai

    if timeout is None or timeout == openai.DEFAULT_TIMEOUT:
        return None
    if isinstance(timeout, httpx.Timeout):
        parts = {timeout.connect, timeout.read, timeout.write, timeout.pool}
        if len(parts) != 1 or None in parts:
            raise UnreproducibleClient(f"its timeout {timeout!r} has several parts")
        return float(parts.pop())
    return _timeout(timeout)


def client_endpoint(client: Any) -> ServerEndpoint:
    """The endpoint an ``openai`` SDK client object (``OpenAI`` / ``AsyncOpenAI``, as a framework
    model built it) talks to; raises :class:`UnreproducibleClient` as :func:`server_endpoint`."""
    own_http_client = type(client._client) not in installed_classes(*_DEFAULT_HTTP_CLIENTS)
    return server_endpoint(base_url=client.base_url, api_key=client.api_key, organization=client.organization,
                           default_headers=client._custom_headers, default_query=client._custom_query,
                           timeout=_client_timeout(client.timeout), max_retries=client.max_retries,
                           http_client=client._client if own_http_client else None)

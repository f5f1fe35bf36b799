"""The ``openai`` SDK's request methods, routed through Teola's served engines in a scope.

Every OpenAI-client model of both frameworks (LlamaIndex ``OpenAI`` / ``OpenAILike``,
LangChain ``ChatOpenAI`` / ``OpenAI`` / ``VLLMOpenAI``) ends in
``client.chat.completions.create(**request)`` or ``client.completions.create(**request)``,
called by the framework's own code with the request it built (tools, structured output,
streaming, stop, ``extra_body``...); structured output with a schema class
(``ChatOpenAI.with_structured_output``) ends in ``client.chat.completions.parse``, which
posts the same body as ``create`` and parses the reply; embedding models (LangChain
``OpenAIEmbeddings``, LlamaIndex ``OpenAIEmbedding`` / ``OpenAILikeEmbedding``) end in
``client.embeddings.create``. :func:`install` wraps those eight methods (sync and async)
once. Outside a routing scope (``scope.py``) they run as they are. Inside one, the request
— the same keyword arguments — is sent by the runtime's served engine for the client's
server (``OpenAICompatibleEngine.relay``, opened through the engine scheduler), and the
caller gets what its own client returns: the completion (or the raw
response ``with_raw_response`` asked for; for ``parse``, the SDK's own parse of the reply),
or for ``stream=True`` a stream of the server's chunks that iterates, closes and works as a
(async) context manager like the SDK's. So the framework's code, callbacks and events are
plain's, and the server sees the same request.

Left to the client itself (run as plain): a client Teola would not reproduce (its own
``http_client``, a timeout with several parts: ``served_models.client_endpoint``), the
engine's own client, ``with_streaming_response`` and raw streams, positional arguments, a
sync call made on the runtime's own loop thread.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

from ..capture.chat_parse import ChatParse
from ..capture.served_models import UnreproducibleClient, client_endpoint
from ..engines.llm_served import ENGINE_CLIENT_MARK
from ..runtime.bridge import engine_stream, iterate_async, iterate_sync
from .scope import ServedCallScope, current_scope

log = logging.getLogger(__name__)

_ORIGINAL = "__teola_original__"
_RAW_HEADER = "X-Stainless-Raw-Response"  # openai._constants.RAW_RESPONSE_HEADER


def _resources() -> tuple[tuple[type, bool], ...]:
    """(resource class, is async) of the request methods routed."""
    from openai.resources.chat.completions import AsyncCompletions as AsyncChat
    from openai.resources.chat.completions import Completions as Chat
    from openai.resources.completions import AsyncCompletions, Completions
    from openai.resources.embeddings import AsyncEmbeddings, Embeddings

    return ((Chat, False), (AsyncChat, True), (Completions, False), (AsyncCompletions, True),
            (Embeddings, False), (AsyncEmbeddings, True))


def _route(resource: Any, args: tuple[Any, ...], request: Mapping[str, Any]) -> tuple[ServedCallScope, str] | None:
    """The scope and engine that send this call, or None: the client sends it itself."""
    scope = current_scope()
    client = getattr(resource, "_client", None)
    if scope is None or args or client is None or getattr(client, ENGINE_CLIENT_MARK, False):
        return None
    raw = (request.get("extra_headers") or {}).get(_RAW_HEADER)
    if raw is not None and (raw != "true" or request.get("stream")):
        return None  # with_streaming_response, or a raw stream: the caller reads the HTTP response itself
    try:
        endpoint = client_endpoint(client)
    except UnreproducibleClient as exc:
        log.debug("a model-server call stays its client's: %s", exc)
        return None
    return scope, scope.runtime.served_engine(endpoint)


def _relayed(scope: ServedCallScope, engine: str, request: Mapping[str, Any]) -> Callable[[], AsyncIterator[Any]]:
    """The engine's deltas for ``request`` (on the runtime loop)."""
    def deltas() -> AsyncIterator[Any]:
        return engine_stream(scope.runtime, engine, "relay", {"request": dict(request)}, scope.priority)

    return deltas


async def _reply(scope: ServedCallScope, engine: str, request: Mapping[str, Any]) -> Any:
    async with contextlib.aclosing(_relayed(scope, engine, request)()) as deltas:  # type: ignore[type-var]
        async for delta in deltas:
            if delta.finished:
                return delta.response
    raise RuntimeError(f"engine {engine!r} closed the request without a reply")  # not reached: relay yields one


def _chunks(deltas: Iterator[Any]) -> Iterator[Any]:
    with contextlib.closing(deltas):  # type: ignore[type-var]  # closing early cancels the request
        for delta in deltas:
            if delta.response is not None:
                yield delta.response


async def _achunks(deltas: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async with contextlib.aclosing(deltas):  # type: ignore[type-var]
        async for delta in deltas:
            if delta.response is not None:
                yield delta.response


class RelayedStream:
    """What ``create(stream=True)`` returns when routed: the server's chunks, as they come.
    The request is sent (and a refusal raised) at ``create``, as the SDK's ``Stream`` does."""

    def __init__(self, chunks: Iterator[Any]) -> None:
        self._chunks = chunks
        self._first: list[Any] = []

    @classmethod
    def open(cls, scope: ServedCallScope, engine: str, request: Mapping[str, Any]) -> RelayedStream:
        stream = cls(_chunks(iterate_sync(scope.runtime, _relayed(scope, engine, request))))
        stream._first.extend(itertools.islice(stream._chunks, 1))
        return stream

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        return self._first.pop() if self._first else next(self._chunks)

    def close(self) -> None:
        self._first.clear()
        self._chunks.close()  # type: ignore[attr-defined]  # cancels the engine request

    @property
    def response(self) -> RelayedStream:
        """What the SDK's stream helpers (``chat.completions.stream``, LangChain's structured
        output stream) close when done: the stream's HTTP response, here the stream itself."""
        return self

    def __enter__(self) -> RelayedStream:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


class RelayedAsyncStream:
    """``await create(stream=True)`` routed: ``AsyncStream``'s iteration, ``close`` and
    ``async with``."""

    def __init__(self, chunks: AsyncIterator[Any]) -> None:
        self._chunks = chunks
        self._first: list[Any] = []

    @classmethod
    async def open(cls, scope: ServedCallScope, engine: str, request: Mapping[str, Any]) -> RelayedAsyncStream:
        stream = cls(_achunks(iterate_async(scope.runtime, _relayed(scope, engine, request))))
        try:
            stream._first.append(await stream._chunks.__anext__())
        except StopAsyncIteration:
            pass
        return stream

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        if self._first:
            return self._first.pop()
        return await self._chunks.__anext__()

    async def close(self) -> None:
        self._first.clear()
        await self._chunks.aclose()  # type: ignore[attr-defined]

    aclose = close  # the HTTP response's name for it (see ``response``)

    @property
    def response(self) -> RelayedAsyncStream:
        """What the SDK's async stream helpers close (``await response.aclose()``)."""
        return self

    async def __aenter__(self) -> RelayedAsyncStream:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()


class SentRequest:
    """``create(**request)``: the request relayed as it is, the reply returned as it is."""

    def __init__(self, request: Mapping[str, Any]) -> None:
        self.create = dict(request)

    @staticmethod
    def relays(request: Mapping[str, Any]) -> bool:
        return True

    def reply(self, reply: Any) -> Any:
        return reply


class ParsedRequest(SentRequest):
    """``chat.completions.parse(**request)`` as the ``create`` request it posts and the SDK's
    own parse of the reply (``capture/chat_parse.py``)."""

    @staticmethod
    def relays(request: Mapping[str, Any]) -> bool:
        return not request.get("stream")  # parse's own refusal of stream=True stays its own

    def __init__(self, request: Mapping[str, Any]) -> None:
        self.parse = ChatParse(request)
        self.raw = (request.get("extra_headers") or {}).get(_RAW_HEADER) == "true"
        self.create = self.parse.create

    def reply(self, reply: Any) -> Any:
        """What ``parse`` returns for the relayed ``create``'s reply (raw: a raw response
        whose ``parse()`` is parse's)."""
        return ParsedRawResponse(reply, self.parse.parsed) if self.raw else self.parse.parsed(reply)


class ParsedRawResponse:
    """``with_raw_response.parse``'s reply: the raw response, ``parse()`` giving parse's result."""

    def __init__(self, raw: Any, parser: Callable[[Any], Any]) -> None:
        self._raw, self._parser = raw, parser

    def parse(self) -> Any:
        return self._parser(self._raw.parse())

    def __getattr__(self, name: str) -> Any:  # headers, http_response...: the raw response's
        return getattr(self._raw, name)


def _wrap_sync(original: Callable[..., Any], request_type: type[SentRequest]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(self: Any, *args: Any, **request: Any) -> Any:
        route = _route(self, args, request)
        if route is None or route[0].runtime.in_loop_thread() or not request_type.relays(request):
            return original(self, *args, **request)
        scope, engine = route
        sent = request_type(request)
        if request.get("stream"):
            return RelayedStream.open(scope, engine, sent.create)
        return sent.reply(scope.run_sync(_reply(scope, engine, sent.create)))

    setattr(call, _ORIGINAL, original)
    return call


def _wrap_async(original: Callable[..., Any], request_type: type[SentRequest]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def call(self: Any, *args: Any, **request: Any) -> Any:
        route = _route(self, args, request)
        if route is None or not request_type.relays(request):
            return await original(self, *args, **request)
        scope, engine = route
        sent = request_type(request)
        if request.get("stream"):
            return await RelayedAsyncStream.open(scope, engine, sent.create)
        return sent.reply(await scope.runtime.run_async(_reply(scope, engine, sent.create)))

    setattr(call, _ORIGINAL, original)
    return call


def _methods() -> list[tuple[type, str, Callable[[Callable[..., Any]], Callable[..., Any]]]]:
    """(resource class, method, wrapper) of every request method routed."""
    methods = []
    for cls, is_async in _resources():
        wrap = _wrap_async if is_async else _wrap_sync
        methods.append((cls, "create", functools.partial(wrap, request_type=SentRequest)))
        if "parse" in cls.__dict__:  # chat completions
            methods.append((cls, "parse", functools.partial(wrap, request_type=ParsedRequest)))
    return methods


def install() -> None:
    """Wrap the SDK's request methods (idempotent); without a scope they run unchanged."""
    for cls, name, wrap in _methods():
        method = cls.__dict__[name]
        if not hasattr(method, _ORIGINAL):
            setattr(cls, name, wrap(method))


def uninstall() -> None:
    for cls, name, _ in _methods():
        original = getattr(cls.__dict__[name], _ORIGINAL, None)
        if original is not None:
            setattr(cls, name, original)

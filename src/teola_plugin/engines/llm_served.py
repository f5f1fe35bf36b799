"""The engine for a model server users already run: any OpenAI-compatible HTTP API
(vLLM's ``vllm.entrypoints.openai.api_server``, SGLang, Ollama, a hosted endpoint).

It offers the operations of the in-process vLLM engine (``generate``, ``stream``,
``prefill``, ``abort`` by closing a stream), so the graph scheduler, the engine scheduler and
timelines treat both alike. What differs is the prompt: here it is the *request body the
framework's own client would send* (``{"model", "messages" | "prompt", "temperature",
...}``), built by the framework's own code at trace time (``capture/served_models.py``), so
a Teola run sends the server exactly what plain LlamaIndex / LangChain send. Per-request
``params`` are overrides only (``prefill`` caps the tokens at one); the framework's own
sampling fields are already in the body.

Requests go through the ``openai`` SDK the frameworks use themselves, configured as the
user's model object configures its client (base URL, key, headers, query, timeout,
retries), so failures reach the caller as the exception types plain raises
(``openai.BadRequestError``, ``APIConnectionError``, ``APITimeoutError``...), with a note
naming the server and the request. The reply object comes back with the text
(``Generation.response``) for the framework to build its own result types from.

The same server's ``/v1/embeddings`` is reached through :meth:`OpenAICompatibleEngine.relay`
too: an embedding model's own code (``OpenAIEmbeddings``, ``OpenAILikeEmbedding``) builds the
request and reads the reply; the engine sends it (``served_calls``), so its requests are
admitted and timed with the other requests to that server.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..errors import EngineInputError
from .generation import Generation, GenerationDelta, LLMEngine, PrefillResult
from .server_features import (PrefixCache, PriorityScheduling, detect_prefix_cache, detect_scheduling,
                              probe_timeout_s)

if TYPE_CHECKING:
    from ..runtime.policies import Priority

# Set on the engine's own SDK client: its requests are the engine's, never routed again
# (``served_calls.openai_sdk`` routes SDK calls made by framework code to this engine).
ENGINE_CLIENT_MARK = "_teola_engine_client"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0"})
FACTORY = "teola_plugin.engines.llm_served:OpenAICompatibleEngine"
GENERATION = frozenset({"messages", "prompt"})  # the request bodies generate / stream / prefill take


@dataclass(frozen=True)
class ServerEndpoint:
    """How a framework model's client reaches its server: one served engine per endpoint.

    Read from the user's model object (``capture/served_models.py``); the same endpoint in
    several model objects (e.g. a chat model and a fusion retriever's LLM) is one engine, so
    their requests share one engine scheduler and one connection pool."""

    base_url: str
    api_key: str = field(default="EMPTY", repr=False)  # a secret: never in logs or names
    organization: str | None = None
    default_headers: tuple[tuple[str, str], ...] = ()
    default_query: tuple[tuple[str, Any], ...] = ()
    timeout: float | None = None  # None: the SDK's default (600 s)
    max_retries: int = 2

    def engine_name(self) -> str:
        """A stable, readable engine name: the server's address plus a digest of the rest."""
        parts = urlsplit(self.base_url)
        digest = hashlib.sha256(json.dumps([self.base_url, self.api_key, self.organization, self.default_headers,
                                            self.default_query, self.timeout, self.max_retries],
                                           default=str).encode()).hexdigest()[:8]
        return f"served:{parts.netloc or self.base_url}{parts.path.rstrip('/')}#{digest}"

    def is_local(self) -> bool:
        """The server runs on this machine (it shares the cores of the local engines)."""
        return (urlsplit(self.base_url).hostname or "") in LOOPBACK_HOSTS

    def engine_spec(self) -> Any:
        """The runtime's spec of this endpoint's engine: hosted in the driver's event loop
        (an HTTP client: nothing for Ray to place), one replica (the server replicates)."""
        from ..runtime.hosting import EngineSpec

        return EngineSpec(self.engine_name(), FACTORY, self.engine_kwargs(), kind="llm", in_process=True)

    def engine_kwargs(self) -> dict[str, Any]:
        """The engine's constructor arguments (plain values: an EngineSpec pickles them)."""
        return {"base_url": self.base_url, "api_key": self.api_key, "organization": self.organization,
                "default_headers": dict(self.default_headers), "default_query": dict(self.default_query),
                "timeout": self.timeout, "max_retries": self.max_retries}


def vllm_priority(priority: Priority) -> int:
    """Teola's priority of a request as vLLM's ``priority`` (lower runs first): the request's
    latest start (epoch milliseconds), the key the engine schedulers order by
    (``runtime/policies.py``), comparable across processes that share the server; vLLM breaks
    ties by arrival."""
    return round(priority.latest_start_s * 1000)


class OpenAICompatibleEngine(LLMEngine):
    """An OpenAI-compatible model server, reached through the ``openai`` SDK's async client."""

    accepts_priority = True  # its streams take the request's Priority (sent where the server schedules by it)

    def __init__(self, base_url: str, name: str | None = None, *, api_key: str = "EMPTY",
                 organization: str | None = None, default_headers: Mapping[str, str] | None = None,
                 default_query: Mapping[str, Any] | None = None, timeout: float | None = None,
                 max_retries: int = 2) -> None:
        super().__init__(name)
        self.base_url = base_url
        self._api_key = api_key
        self.organization = organization
        self.default_headers = dict(default_headers or {})
        self.default_query = dict(default_query or {})
        self.timeout = timeout
        self.max_retries = max_retries
        self._client: Any = None
        self.relayed = 0  # requests relayed for framework code run as is (``relay``)
        # detected when the engine starts (server_features): what prefill splitting may build on
        self.prefix_cache = PrefixCache(None, 0, "not detected yet (the engine has not started)")
        self.scheduling = PriorityScheduling(None, "not detected yet (the engine has not started)")

    # -- lifecycle: a client, not a model (nothing to load; the server may start later) ------
    async def _load(self) -> None:
        import openai

        kwargs: dict[str, Any] = {"api_key": self._api_key, "base_url": self.base_url,
                                  "organization": self.organization, "max_retries": self.max_retries,
                                  "default_headers": self.default_headers or None,
                                  "default_query": self.default_query or None}
        if self.timeout is not None:
            kwargs["timeout"] = self.timeout
        self._client = openai.AsyncOpenAI(**kwargs)
        setattr(self._client, ENGINE_CLIENT_MARK, True)
        headers = {**self.default_headers, "Authorization": f"Bearer {self._api_key}"}
        probe_s = probe_timeout_s(self.timeout)
        self.prefix_cache, self.scheduling = await asyncio.gather(detect_prefix_cache(self.base_url, headers, probe_s),
                                                                  detect_scheduling(self.base_url, headers, probe_s))

    async def _unload(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "base_url": self.base_url, "served": True, "relayed": self.relayed,
                "prefix_cache": {"enabled": self.prefix_cache.enabled, "block_tokens": self.prefix_cache.block_tokens,
                                 "how": self.prefix_cache.how},
                "priority_scheduling": {"enabled": self.scheduling.enabled, "how": self.scheduling.how}}

    # -- requests ----------------------------------------------------------------------------
    def _body(self, prompt: Any, params: Mapping[str, Any] | None,
              kinds: frozenset[str] = GENERATION, priority: Any = None) -> dict[str, Any]:
        if not isinstance(prompt, Mapping) or not (kinds & prompt.keys()):
            raise EngineInputError(
                f"engine {self.name!r} serves OpenAI-compatible requests: the prompt must be a request body "
                f"with {' or '.join(sorted(map(repr, kinds)))}, got {type(prompt).__name__}")
        body = {**prompt, **dict(params or {})}
        if priority is not None and self.scheduling.enabled and "input" not in body:
            # vLLM's own request field; through the SDK's extra_body, beside the framework's
            body["extra_body"] = {**(body.get("extra_body") or {}), "priority": vllm_priority(priority)}
        return body

    async def _create(self, body: dict[str, Any], request_id: str) -> Any:
        self._require_started()
        if "messages" in body:
            api = self._client.chat.completions
        else:  # a completion, or an embedding request (``input``: relayed only)
            api = self._client.completions if "prompt" in body else self._client.embeddings
        try:
            return await api.create(**body)
        except Exception as exc:
            exc.add_note(f"(Teola: model server {self.base_url}, request {request_id})")
            raise

    async def generate(self, prompt: Any, params: Mapping[str, Any] | None = None,
                       request_id: str | None = None) -> Generation:
        """One request, sent as the framework's client sends it; the reply is kept."""
        rid = request_id or self._new_request_id("gen")
        response = await self._create(self._body(prompt, params), rid)
        return _generation(rid, response)

    async def stream(self, prompt: Any, params: Mapping[str, Any] | None = None,
                     request_id: str | None = None, priority: Any = None) -> AsyncIterator[GenerationDelta]:
        """Deltas of one request. A body that does not ask to stream (what ``invoke`` /
        ``predict`` send) is sent unchanged and arrives as one delta with the reply; a
        streaming body yields the server's chunks. Closing the iterator closes the HTTP
        stream, which aborts the request on the server. ``priority`` (Teola's) goes with it
        where the server schedules by priority."""
        rid = request_id or self._new_request_id("gen")
        body = self._body(prompt, params, priority=priority)
        if not body.get("stream"):
            generation = _generation(rid, await self._create(body, rid))
            yield GenerationDelta(rid, generation.text, _completion_tokens(generation.response), True,
                                  generation.finish_reason, generation.response)
            return
        produced, received = 0, []
        async with contextlib.aclosing(_chunk_deltas(rid, await self._create(body, rid))) as deltas:
            async for delta in deltas:  # every chunk, its role-only and usage-only ones too
                received.append(delta.response)
                produced = delta.num_generated_tokens
                yield replace(delta, response=None, chunk=delta.response)
        yield GenerationDelta(rid, "", produced, True, None, tuple(received), stream_end=True)

    async def relay(self, request: Mapping[str, Any], request_id: str | None = None,
                    priority: Any = None) -> AsyncIterator[GenerationDelta]:
        """A request framework code made through its own SDK client (``served_calls``), sent
        as it is: the SDK's reply to ``create(**request)`` (a completion, or the raw response
        ``with_raw_response`` asks for) arrives as one finished delta; a streaming request's
        chunks one delta each (``response`` = the chunk), so the caller rebuilds exactly what
        its client would have returned. An embedding request (``input``) is relayed the same way."""
        rid = request_id or self._new_request_id("relay")
        body = self._body(request, None, GENERATION | {"input"}, priority)
        reply = await self._create(body, rid)
        self.relayed += 1
        if not body.get("stream"):
            yield GenerationDelta(rid, "", _completion_tokens(reply), True, None, reply)
            return
        produced = 0
        async with contextlib.aclosing(_chunk_deltas(rid, reply)) as deltas:
            async for delta in deltas:
                produced = delta.num_generated_tokens
                yield delta
        yield GenerationDelta(rid, "", produced, True)

    async def prefill(self, prompt: Any, request_id: str | None = None) -> PrefillResult:
        """The prompt with one token to generate: the server's prefix cache keeps it (a
        ``min_tokens`` the request asks vLLM for would make one token a bad request)."""
        body = {k: v for k, v in self._body(prompt, None).items() if k not in ("max_completion_tokens", "stream",
                                                                                "stream_options")}
        if isinstance(body.get("extra_body"), Mapping) and "min_tokens" in body["extra_body"]:
            body["extra_body"] = {k: v for k, v in body["extra_body"].items() if k != "min_tokens"}
        rid = request_id or self._new_request_id("prefill")
        generation = _generation(rid, await self._create({**body, "max_tokens": 1}, rid))
        return PrefillResult(rid, generation.num_prompt_tokens, generation.num_cached_tokens)

    async def abort(self, request_id: str) -> None:
        """Requests stop when their HTTP stream closes (the engine server closes it)."""
        return None


async def _chunk_deltas(request_id: str, chunks: Any) -> AsyncIterator[GenerationDelta]:
    """One unfinished delta per chunk of a streamed reply (``response``: the chunk; the count
    of chunks with text so far); the HTTP stream is closed however this ends, which aborts
    the request on the server."""
    produced = 0
    try:
        async for chunk in chunks:
            choice = chunk.choices[0] if chunk.choices else None
            text = _choice_text(choice) if choice is not None else ""
            produced += 1 if text else 0
            reason = getattr(choice, "finish_reason", None) if choice is not None else None
            yield GenerationDelta(request_id, text, produced, False, reason, chunk)
    finally:
        await chunks.close()


def _choice_text(choice: Any) -> str:
    """A choice's text: a chat message's content, a completion's text (or their deltas)."""
    message = getattr(choice, "message", None) or getattr(choice, "delta", None)
    if message is not None:
        return getattr(message, "content", None) or ""
    return getattr(choice, "text", None) or ""


def _completion_tokens(response: Any) -> int:
    return int(getattr(getattr(response, "usage", None), "completion_tokens", 0) or 0)


def _generation(request_id: str, response: Any) -> Generation:
    choice = response.choices[0] if response.choices else None
    usage = getattr(response, "usage", None)
    details = getattr(usage, "prompt_tokens_details", None)
    return Generation(
        request_id=request_id,
        text=_choice_text(choice) if choice is not None else "",
        token_ids=(),
        finish_reason=getattr(choice, "finish_reason", None),
        num_prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        num_cached_tokens=int(getattr(details, "cached_tokens", 0) or 0),
        response=response,
    )

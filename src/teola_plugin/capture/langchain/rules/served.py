"""LangChain ``ChatOpenAI`` on a served engine: the app as LangChain's and vLLM's docs write it.

``ChatOpenAI(model=..., base_url="http://host:8000/v1", api_key=...)`` (directly or from
``init_chat_model``) sends one chat-completions request per call. Lowered, the request body
is built by the model's own ``_get_request_payload`` (its message conversion, defaults,
``stop``, ``extra_body``, ``model_kwargs``), sent by the served engine with the same SDK and
client settings (``capture/served_models.py``), and the reply goes through the model's own
``_create_chat_result``, so the ``AIMessage`` carries the usage, ids and finish reason
``invoke`` returns.

Stays the model's own call (reason in ``explain()``): a subclass, the Responses API,
``streaming=True``, ``n > 1``, response headers, and (as for every model) bound tools or
structured output, which arrive as bound arguments the tracer does not lower.
"""

from __future__ import annotations

from typing import Any

from ...served_models import UnreproducibleClient, server_endpoint
from ..protocols import LLMCallSpec
from ..tracer import CannotLower

DEFAULT_MAX_TOKENS = 256  # the cost model's guess when the model leaves max_tokens to the server


def _chat_openai_class() -> type | None:
    try:
        from langchain_openai import ChatOpenAI
    except ImportError:
        return None
    return ChatOpenAI


def is_served_model(model: Any) -> bool:
    cls = _chat_openai_class()
    return cls is not None and type(model) is cls


def served_call_spec(model: Any, served_engine: Any, stop: list[str] | None) -> LLMCallSpec:
    """The call spec of a ``ChatOpenAI``; ``served_engine(endpoint)`` names its engine."""
    name = type(model).__name__
    if model.streaming:
        raise CannotLower(f"{name}(streaming=True) sends streaming requests (its own code runs)")
    if (model.n or 1) != 1:
        raise CannotLower(f"{name} with n={model.n} (one completion per call is lowered)")
    if model.include_response_headers:
        raise CannotLower(f"{name}(include_response_headers=True): the headers are its client's")
    if model._use_responses_api({}):
        raise CannotLower(f"{name} uses the Responses API")
    try:
        endpoint = server_endpoint(
            base_url=model.openai_api_base, api_key=model.openai_api_key, organization=model.openai_organization,
            default_headers=model.default_headers, default_query=model.default_query, timeout=model.request_timeout,
            max_retries=model.max_retries, http_client=model.http_async_client or model.http_client)
    except UnreproducibleClient as exc:
        raise CannotLower(f"{name}: {exc}") from None

    def to_engine_prompt(input: Any) -> dict[str, Any]:
        return model._get_request_payload(input, stop=stop)  # what invoke(input, stop=stop) sends

    def to_result(response: Any) -> Any:
        if isinstance(response, tuple):  # a streamed call: the chunks, merged as model.stream() merges them
            return _streamed_result(model, response)
        return model._create_chat_result(response, {})

    streamed = {"stream": True}  # what its _stream adds to the same payload
    if model._should_stream_usage():
        streamed["stream_options"] = {"include_usage": True}

    return LLMCallSpec(served_engine(endpoint), to_engine_prompt, {}, returns_message=True, string_prompts=False,
                       to_result=to_result, max_tokens=model.max_tokens or DEFAULT_MAX_TOKENS,
                       raise_error=raise_as_chat_openai, streamed_request=streamed)


def _streamed_result(model: Any, chunks: tuple[Any, ...]) -> Any:
    from langchain_core.messages import AIMessageChunk, message_chunk_to_message
    from langchain_core.outputs import ChatGeneration, ChatResult

    merged = None
    for chunk in chunks:
        piece = model._convert_chunk_to_generation_chunk(chunk.model_dump(), AIMessageChunk, {})
        if piece is not None:
            merged = piece if merged is None else merged + piece
    if merged is None:
        return ChatResult(generations=[ChatGeneration(message=message_chunk_to_message(AIMessageChunk(content="")))])
    return ChatResult(generations=[ChatGeneration(message=message_chunk_to_message(merged.message),
                                                  generation_info=merged.generation_info)])


def raise_as_chat_openai(exc: BaseException) -> None:
    """What ``ChatOpenAI._generate`` raises for its client's ``exc`` (its own handlers)."""
    import openai
    from langchain_openai.chat_models import base

    if isinstance(exc, openai.BadRequestError):
        base._handle_openai_bad_request(exc)
    elif isinstance(exc, openai.APIError):
        base._handle_openai_api_error(exc)

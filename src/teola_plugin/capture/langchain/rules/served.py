"""LangChain's OpenAI-client models on a served engine: the app as LangChain's and vLLM's
docs write it (``ChatOpenAI(base_url=...)``; completion models ``OpenAI`` and the community
``VLLMOpenAI``, vLLM's own LangChain example).

``ChatOpenAI(model=..., base_url="http://host:8000/v1", api_key=...)`` (directly or from
``init_chat_model``) sends one chat-completions request per call. Lowered, the request body
is built by the model's own ``_get_request_payload`` (its message conversion, defaults,
``stop``, ``extra_body``, ``model_kwargs``), sent by the served engine with the same SDK and
client settings (``capture/served_models.py``), and the reply goes through the model's own
``_create_chat_result``, so the ``AIMessage`` carries the usage, ids and finish reason
``invoke`` returns.

Completion models: the body is ``_generate``'s (``_invocation_params``, ``stop`` as
``get_sub_prompts`` adds it, ``prompt`` a one-item list), the result ``create_llm_result``'s;
a call the caller streams is sent non-streaming (their ``_stream`` sends another body) and
arrives as one chunk.

Bound tools and structured output (``model.bind_tools(...)``, ``with_structured_output(...)``
by any method) are arguments of the call: the body is ``_get_request_payload(input,
stop=stop, **kwargs)``, as ``invoke`` builds it; with a ``response_format`` it is what the
client's ``parse`` posts (``capture/chat_parse.py``), and the reply is parsed by the SDK as
``parse`` parses it before ``_create_chat_result`` (the message's ``parsed`` object, tool
calls). vLLM constrains both: a named ``tool_choice`` or ``"required"`` to the tool's JSON
schema (``--enable-auto-tool-choice``), a ``json_schema`` response format to the schema.

Stays the model's own call (reason in ``explain()``): a subclass, the Responses API,
``streaming=True``, ``n > 1`` / ``best_of``, response headers, ``max_tokens=-1`` (a tiktoken
count), and a bound argument other than tools, a response format and sampling arguments.
"""

from __future__ import annotations

from typing import Any

from collections.abc import Mapping

from langchain_core.language_models._utils import _update_message_content_to_blocks  # output_version="v1"

from ...chat_parse import ChatParse
from ...lowerable import DEFAULT_MAX_TOKENS, LLMCallSpec
from ...served_models import UnreproducibleClient, installed_classes, server_endpoint
from ..tracer import NotLowerable


def _completion_classes() -> tuple[type, ...]:
    return installed_classes("langchain_openai:OpenAI", "langchain_community.llms.vllm:VLLMOpenAI")


def is_served_model(model: Any) -> bool:
    if type(model).__name__ not in ("ChatOpenAI", "OpenAI", "VLLMOpenAI"):  # no imports for other models
        return False
    return type(model) in installed_classes("langchain_openai:ChatOpenAI") + _completion_classes()


def _endpoint(model: Any) -> Any:
    try:
        return server_endpoint(
            base_url=model.openai_api_base, api_key=model.openai_api_key, organization=model.openai_organization,
            default_headers=model.default_headers, default_query=model.default_query, timeout=model.request_timeout,
            max_retries=model.max_retries,
            http_client=getattr(model, "http_async_client", None) or model.http_client)
    except UnreproducibleClient as exc:
        raise NotLowerable(f"{type(model).__name__}: {exc}") from None


# A chat model's bound call arguments that are lowered: they only add to the request body
# (``ls_structured_output_format`` only names the call's run for tracing).
LOWERED_CALL_KWARGS = ("tools", "tool_choice", "parallel_tool_calls", "response_format", "ls_structured_output_format")
# Bound sampling arguments (``model.bind(max_tokens=..., logprobs=True)``): ``_get_request_payload``
# merges them into the body and the reply carries what they ask for (``logprobs`` in the
# message's ``response_metadata``), so they change nothing else of the call. Not ``n`` (several
# completions), ``stream`` / ``stream_options`` (the request's kind) or Responses API arguments.
SAMPLING_CALL_KWARGS = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "frequency_penalty",
                        "presence_penalty", "logit_bias", "logprobs", "top_logprobs", "extra_body", "user",
                        "reasoning_effort", "service_tier")


def served_call_spec(model: Any, served_engine: Any, stop: list[str] | None,
                     call_kwargs: Mapping[str, Any] | None = None) -> LLMCallSpec:
    """The call spec of a ``ChatOpenAI`` / ``OpenAI`` / ``VLLMOpenAI`` called with ``stop`` and
    the bound ``call_kwargs``; ``served_engine(endpoint)`` names its engine."""
    name = type(model).__name__
    extra = sorted(set(call_kwargs or {}) - set(LOWERED_CALL_KWARGS) - set(SAMPLING_CALL_KWARGS))
    if extra or (call_kwargs and type(model) in _completion_classes()):
        raise NotLowerable(f"{name} with bound arguments {extra or sorted(call_kwargs or {})} "
                           f"(lowered: stop; a chat model's {', '.join(LOWERED_CALL_KWARGS[:4])} "
                           f"and sampling arguments)")
    if type(model) in _completion_classes():
        return _completion_call_spec(model, served_engine, stop)
    request_kwargs = {k: v for k, v in (call_kwargs or {}).items() if k != "ls_structured_output_format"}
    if model.streaming:
        raise NotLowerable(f"{name}(streaming=True) sends streaming requests (its own code runs)")
    if (model.n or 1) != 1:
        raise NotLowerable(f"{name} with n={model.n} (one completion per call is lowered)")
    if model.include_response_headers:
        raise NotLowerable(f"{name}(include_response_headers=True): the headers are its client's")
    if model._use_responses_api(request_kwargs):
        raise NotLowerable(f"{name} uses the Responses API")
    endpoint = _endpoint(model)

    # A response format: _generate posts the payload through its client's parse, and parses the reply.
    parse = ChatParse(request_kwargs) if "response_format" in request_kwargs else None

    def to_engine_prompt(input: Any) -> dict[str, Any]:
        payload = model._get_request_payload(input, stop=stop, **request_kwargs)  # what invoke(input, stop=stop) sends
        if parse is None:
            return payload
        payload.pop("stream", None)
        return ChatParse(payload).create

    def to_result(response: Any) -> Any:
        if isinstance(response, tuple):  # a streamed call: the chunks, merged as model.stream() merges them
            return _in_output_version(model, _streamed_result(model, response))
        reply = response if parse is None else parse.parsed(response)
        return _in_output_version(model, model._create_chat_result(reply, {}))

    # A streamed ChatOpenAI's chunks are the server's, each converted by its own code: the role
    # chunk, the finish reason, usage, ids, the last chunk's marker. A graph run streams the
    # text's tokens, so a chain whose caller streams it (stream, astream, astream_events) runs
    # as it is, its requests still sent by the served engine; invoke runs the graph. A graph
    # run forced by ``timeout_s`` streams with the request ``_stream`` sends:
    streamed: dict[str, Any] | None = {"stream": True}  # what its _stream adds to the same payload
    if parse is not None:  # its _stream calls the client's parse stream: not reproduced, sent as invoke sends it
        streamed = None
    elif model._should_stream_usage():
        streamed["stream_options"] = {"include_usage": True}

    return LLMCallSpec(served_engine(endpoint), to_engine_prompt, {}, returns_message=True, string_prompts=False,
                       to_result=to_result, max_tokens=_max_tokens(model, request_kwargs),
                       raise_error=raise_as_chat_openai, streamed_request=streamed,
                       streams_text=False)  # its chunks carry the server's (below)


def _max_tokens(model: Any, request_kwargs: Mapping[str, Any]) -> int:
    """The call's token limit (the cost model's decode length): a bound one, else the model's."""
    bound = request_kwargs.get("max_completion_tokens") or request_kwargs.get("max_tokens")
    return int(bound or model.max_tokens or DEFAULT_MAX_TOKENS)


def _in_output_version(model: Any, result: Any) -> Any:
    """``result`` as ``BaseChatModel._generate_with_cache`` leaves ``_generate``'s: with
    ``output_version="v1"`` (the model's, or ``LC_OUTPUT_VERSION``), each message's content
    as its standard content blocks."""
    if getattr(model, "output_version", None) == "v1":
        for generation in result.generations:
            generation.message = _update_message_content_to_blocks(generation.message, "v1")
    return result


def _streamed_result(model: Any, chunks: tuple[Any, ...]) -> Any:
    from langchain_core.messages import AIMessageChunk, message_chunk_to_message
    from langchain_core.outputs import ChatGeneration, ChatResult

    merged, index, index_type = None, -1, ""
    for chunk in chunks:
        piece = model._convert_chunk_to_generation_chunk(chunk.model_dump(), AIMessageChunk, {})
        if piece is not None and getattr(model, "output_version", None) == "v1":
            # as its streamed generate: each chunk's content as blocks, indexed by run of block type
            piece.message = _update_message_content_to_blocks(piece.message, "v1")
            for block in piece.message.content:
                if block["type"] != index_type:
                    index_type, index = block["type"], index + 1
                block.setdefault("index", index)
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


def _completion_call_spec(model: Any, served_engine: Any, stop: list[str] | None) -> LLMCallSpec:
    name = type(model).__name__
    if model.streaming:
        raise NotLowerable(f"{name}(streaming=True) sends streaming requests (its own code runs)")
    if (model.n or 1) != 1 or (model.best_of or 1) != 1:
        raise NotLowerable(f"{name} with n / best_of other than one completion per call")
    if model.max_tokens == -1:
        raise NotLowerable(f"{name}(max_tokens=-1) counts the prompt with tiktoken (its own code runs)")
    endpoint = _endpoint(model)

    def params() -> dict[str, Any]:
        out = dict(model._invocation_params)
        if stop is not None:  # get_sub_prompts' own rule
            if "stop" in out:
                raise ValueError("`stop` found in both the input and default params.")
            out["stop"] = stop
        return out

    def to_engine_prompt(input: Any) -> dict[str, Any]:
        return {"prompt": [model._convert_input(input).to_string()], **params()}  # what _generate sends

    def to_result(response: Any) -> Any:
        body = response.model_dump()
        usage = body.get("usage") or {}
        token_usage = {k: usage[k] for k in ("completion_tokens", "prompt_tokens", "total_tokens") if k in usage}
        return model.create_llm_result(body["choices"], [None], params(), token_usage,
                                       system_fingerprint=body.get("system_fingerprint"))

    # Its stream (GenerationChunks from _stream's own request) is not a graph's token stream either.
    return LLMCallSpec(served_engine(endpoint), to_engine_prompt, {}, returns_message=False, string_prompts=False,
                       to_result=to_result, max_tokens=model.max_tokens or DEFAULT_MAX_TOKENS, streams_text=False)

"""The ``openai`` SDK's ``chat.completions.parse`` as a ``create`` request and its reply's parse.

``parse(**request)`` posts the same chat-completions request as ``create`` (the schema class
turned into its response-format parameter, ``stream`` false, a helper header), then parses
the reply into a ``ParsedChatCompletion`` (the message's ``parsed`` object, typed tool
calls). LangChain's ``ChatOpenAI`` calls it for structured output (a bound
``response_format``), so a lowered call sends :attr:`ChatParse.create` through the served
engine and turns the reply into what ``parse`` returns with :meth:`ChatParse.parsed`; the
relay of code run as it is (``served_calls``) does the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

HELPER_HEADER = "X-Stainless-Helper-Method"  # what parse() adds to the request's headers


class ChatParse:
    """One ``chat.completions.parse(**request)``."""

    def __init__(self, request: Mapping[str, Any]) -> None:
        from openai.lib._parsing import type_to_response_format_param, validate_input_tools

        self.response_format = request.get("response_format")
        self.input_tools = validate_input_tools(request["tools"]) if "tools" in request else None
        headers = {HELPER_HEADER: "chat.completions.parse", **(request.get("extra_headers") or {})}
        self.create: dict[str, Any] = {**request, "stream": False, "extra_headers": headers}
        if "response_format" in request:
            self.create["response_format"] = type_to_response_format_param(self.response_format)

    def parsed(self, completion: Any) -> Any:
        """What ``parse`` returns for the ``create`` request's reply."""
        from openai import omit
        from openai.lib._parsing import parse_chat_completion

        return parse_chat_completion(
            response_format=omit if self.response_format is None else self.response_format,
            chat_completion=completion, input_tools=omit if self.input_tools is None else self.input_tools)

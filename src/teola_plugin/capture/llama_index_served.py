"""LlamaIndex ``OpenAI`` / ``OpenAILike`` LLMs, answered by a served engine on their server.

The request of each lowered call is the body the model's own ``predict`` / ``complete``
would send, built by its own code: ``_get_messages`` / ``_get_prompt`` for the prompt,
``to_openai_message_dicts`` for chat messages, ``_get_model_kwargs`` (and
``_update_max_tokens`` for completions) for everything else, ``stream=False``. The engine
sends it with the same SDK and client settings, so the server sees the same request, and
the answer is the same text ``predict`` returns (after the model's output parser).

Only these exact classes are lowered (a subclass may change how a request is built), and
not when their requests carry what ``predict`` could not return the same way.
"""

from __future__ import annotations

from typing import Any

from ..runtime.engine_needs import EngineNeeds
from .common import NotLowerable
from .lowerable import DEFAULT_MAX_TOKENS, LLMCallSpec
from .served_models import UnreproducibleClient, installed_classes, server_endpoint


def is_served_llm(llm: Any) -> bool:
    return type(llm) in installed_classes("llama_index.llms.openai:OpenAI", "llama_index.llms.openai_like:OpenAILike")


class ServedRequests:
    """The engine requests of one LlamaIndex ``OpenAI`` / ``OpenAILike`` object (prompt,
    sampling parameters, output parsing: its ``LLMCallSpec``)."""

    def __init__(self, llm: Any, engine: str) -> None:
        self.llm = llm
        self.engine = engine

    @classmethod
    def for_model(cls, llm: Any, needs: EngineNeeds) -> ServedRequests:
        """``llm``'s requests, sent by the engine of its server (recorded in ``needs``)."""
        name = type(llm).__name__
        if getattr(llm, "modalities", None) and "audio" in llm.modalities:
            raise NotLowerable(f"{name} with audio modalities")
        try:
            endpoint = server_endpoint(**llm._get_credential_kwargs(is_async=True))
        except UnreproducibleClient as exc:
            raise NotLowerable(f"{name}: {exc}") from None
        return cls(llm, needs.served_engine(endpoint))

    def engine_prompt(self, template: Any, /, **prompt_args: Any) -> dict[str, Any]:
        """The body ``llm.predict(template, **prompt_args)`` sends."""
        llm = self.llm
        if llm.metadata.is_chat_model:
            return self._chat_body(llm._get_messages(template, **prompt_args))
        return self._completion_body(llm._get_prompt(template, **prompt_args))

    def completion_prompt(self, prompt: str) -> dict[str, Any]:
        """The body ``llm.complete(prompt)`` sends."""
        from llama_index.core.base.llms.types import ChatMessage, MessageRole

        llm = self.llm
        if type(llm).__name__ == "OpenAILike":  # its complete() formats an unformatted prompt
            prompt = llm.completion_to_prompt(prompt)
        if llm._use_chat_completions({}):
            return self._chat_body([ChatMessage(role=MessageRole.USER, content=prompt)])
        return self._completion_body(prompt)

    def _chat_body(self, messages: Any) -> dict[str, Any]:
        from llama_index.llms.openai.utils import to_openai_message_dicts

        return {"messages": to_openai_message_dicts(messages, model=self.llm.model), "stream": False,
                **self.llm._get_model_kwargs()}

    def _completion_body(self, prompt: str) -> dict[str, Any]:
        kwargs = self.llm._get_model_kwargs()
        self.llm._update_max_tokens(kwargs, prompt)
        return {"prompt": prompt, "stream": False, **kwargs}

    def _streamed_changes(self) -> dict[str, Any]:
        """What the model's own stream_chat / stream_complete change in the body: ``stream``, and
        the ``stream_options`` of its additional_kwargs (left out of a request that does not stream)."""
        plain, streamed = self.llm._get_model_kwargs(), self.llm._get_model_kwargs(stream=True)
        return {k: v for k, v in streamed.items() if k not in plain or plain[k] != v}

    def parse_output(self, text: str) -> str:
        return self.llm._parse_output(text)

    def call_spec(self) -> LLMCallSpec:
        llm = self.llm
        return LLMCallSpec(self.engine, self.engine_prompt, {}, max_tokens=llm.max_tokens or DEFAULT_MAX_TOKENS,
                           streamed_request=self._streamed_changes(),
                           to_completion_prompt=self.completion_prompt,
                           parse_output=None if llm.output_parser is None else self.parse_output)

"""``TeolaLLM``: a LlamaIndex LLM served by the runtime's vLLM engine pool.

Usable on its own (``Settings.llm = TeolaLLM()``) or under the executor: both paths send
the same request to the same engine, so a plain LlamaIndex app and its Teola run share one
model. The request is built in one place, :meth:`TeolaLLM.engine_prompt`, which the tracer
also calls: a text prompt for completion models, chat messages (rendered by the engine with
the model's chat template) for chat models.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, ClassVar

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.prompts.base import BasePromptTemplate

from ..capture.lowerable import LLMCallSpec
from ..runtime.hosting import ReplicaPool
from ..runtime.app_runs import call_priority
from ..runtime.runtime import Runtime, default_runtime
from ..runtime.bridge import engine_stream, iterate_async, iterate_sync, started_pool

EnginePrompt = str | list[dict[str, str]]  # what the vLLM engine accepts
SAMPLING_KEYS = frozenset({"max_tokens", "temperature", "top_p", "top_k", "stop", "seed"})


class TeolaLLM(CustomLLM):
    """Generation on the Teola runtime's LLM engine (greedy by default)."""

    # What a lowered call replaces (capture/overrides.py): the graph asks the engine directly,
    # so a subclass overriding one of these (changing what plain LlamaIndex computes) keeps
    # its own code. The engine-call hooks (``_engine_generate`` / ``_engine_stream``) are left
    # out on purpose: the graph never calls them, so a subclass overriding them (the tests
    # record plain requests that way) is still lowered, and what they would change is not run.
    teola_lowered_calls: ClassVar[tuple[str, ...]] = (
        "predict", "apredict", "stream", "astream", "complete", "acomplete", "stream_complete",
        "astream_complete", "chat", "achat", "stream_chat", "astream_chat", "_completion_prompt")

    engine: str = Field(default="llm", description="Name of the runtime's LLM engine.")
    max_tokens: int = Field(default=256, gt=0, description="Tokens to generate at most.")
    temperature: float = Field(default=0.0, ge=0.0, description="0 is greedy decoding.")
    chat_model: bool = Field(
        default=True, description="Send chat messages (rendered by the model's chat template) "
        "rather than one text prompt; LlamaIndex then picks its chat prompt templates.")
    context_window: int | None = Field(
        default=None, description="Defaults to the engine's max_model_len.")
    sampling_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="More vLLM SamplingParams fields for every request, e.g. "
        "{'structured_outputs': {'json': schema}} to constrain the output to a JSON schema (the "
        "OpenAI-compatible server's extra_body spelling).")

    _runtime: Runtime | None = PrivateAttr(default=None)

    def __init__(self, runtime: Runtime | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._runtime = runtime

    @classmethod
    def class_name(cls) -> str:
        return "TeolaLLM"

    # -- where requests go ---------------------------------------------------------------
    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            self._runtime = default_runtime()
        return self._runtime

    async def _pool(self) -> ReplicaPool:
        return await started_pool(self.runtime, self.engine)

    @property
    def metadata(self) -> LLMMetadata:
        window = self.context_window
        if window is None:  # ask the engine once; it knows the model's limit
            window = self.context_window = int(self.runtime.run_sync(self._describe())["max_model_len"])
        return LLMMetadata(context_window=window, num_output=self.max_tokens,
                           is_chat_model=self.chat_model, model_name=f"teola:{self.engine}")

    async def _describe(self) -> dict[str, Any]:
        return await (await self._pool()).call("describe")

    # -- the one place a request is built (the tracer calls it too) ------------------------
    def sampling_params(self, **overrides: Any) -> dict[str, Any]:
        """Sampling parameters of a request; per-call keyword overrides that vLLM knows win,
        other keywords LlamaIndex passes along (e.g. ``formatted``) are not sampling params."""
        params = {"temperature": self.temperature, "max_tokens": self.max_tokens, **self.sampling_kwargs}
        params.update((k, v) for k, v in overrides.items() if k in SAMPLING_KEYS)
        return params

    def engine_prompt(self, template: BasePromptTemplate, /, **prompt_args: Any) -> EnginePrompt:
        """Exactly what ``self.predict(template, **prompt_args)`` sends to the engine.
        (Positional-only: Accumulate passes a prompt argument named ``template``.)"""
        if self.metadata.is_chat_model:
            return messages_for_engine(self._get_messages(template, **prompt_args))
        return self._get_prompt(template, **prompt_args)  # predict() completes it formatted=True

    def completion_prompt(self, prompt: str) -> str:
        """Exactly what ``self.complete(prompt)`` sends to the engine."""
        return self._completion_prompt(prompt, formatted=False)

    def parse_output(self, text: str) -> str:
        """What ``predict`` returns for the engine's ``text`` (the output parser, if any)."""
        return self._parse_output(text)

    def teola_call_spec(self) -> LLMCallSpec:
        """How the tracer lowers this model's calls (``capture/lowerable.py``)."""
        return LLMCallSpec(self.engine, self.engine_prompt, self.sampling_params(), max_tokens=self.max_tokens,
                           to_completion_prompt=self.completion_prompt,
                           parse_output=None if self.output_parser is None else self.parse_output)

    # -- engine calls: every path funnels through these two ---------------------------------
    async def _engine_generate(self, prompt: EnginePrompt, params: Mapping[str, Any]) -> str:
        generation, _ = await (await self._pool()).submit("generate", {"prompt": prompt, "params": dict(params)},
                                                          call_priority())
        return generation.text

    async def _engine_stream(self, prompt: EnginePrompt, params: Mapping[str, Any]) -> AsyncIterator[str]:
        async for delta in engine_stream(self.runtime, self.engine, "stream",
                                         {"prompt": prompt, "params": dict(params)}, call_priority()):
            yield delta.text

    def _completion_prompt(self, prompt: str, formatted: bool) -> str:
        return prompt if formatted else self.completion_to_prompt(prompt)

    # -- completion ----------------------------------------------------------------------
    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        request = self._completion_prompt(prompt, formatted)
        text = self.runtime.run_sync(self._engine_generate(request, self.sampling_params(**kwargs)))
        return CompletionResponse(text=text)

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        request = self._completion_prompt(prompt, formatted)
        text = await self.runtime.run_async(self._engine_generate(request, self.sampling_params(**kwargs)))
        return CompletionResponse(text=text)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        request, params = self._completion_prompt(prompt, formatted), self.sampling_params(**kwargs)

        def gen() -> CompletionResponseGen:
            text = ""
            for delta in iterate_sync(self.runtime, lambda: self._engine_stream(request, params)):
                text += delta
                yield CompletionResponse(text=text, delta=delta)

        return gen()

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        request, params = self._completion_prompt(prompt, formatted), self.sampling_params(**kwargs)

        async def gen() -> CompletionResponseAsyncGen:
            text = ""
            async for delta in iterate_async(self.runtime, lambda: self._engine_stream(request, params)):
                text += delta
                yield CompletionResponse(text=text, delta=delta)

        return gen()

    # -- chat: messages go to the engine, which applies the model's chat template ----------
    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        text = self.runtime.run_sync(
            self._engine_generate(messages_for_engine(messages), self.sampling_params(**kwargs)))
        return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text))

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        text = await self.runtime.run_async(
            self._engine_generate(messages_for_engine(messages), self.sampling_params(**kwargs)))
        return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        request, params = messages_for_engine(messages), self.sampling_params(**kwargs)

        def gen() -> ChatResponseGen:
            text = ""
            for delta in iterate_sync(self.runtime, lambda: self._engine_stream(request, params)):
                text += delta
                yield ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text), delta=delta)

        return gen()

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        request, params = messages_for_engine(messages), self.sampling_params(**kwargs)

        async def gen() -> ChatResponseAsyncGen:
            text = ""
            async for delta in iterate_async(self.runtime, lambda: self._engine_stream(request, params)):
                text += delta
                yield ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text), delta=delta)

        return gen()


def messages_for_engine(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
    """LlamaIndex chat messages as the engine's ``[{"role", "content"}]``."""
    return [{"role": MessageRole(m.role).value, "content": m.content or ""} for m in messages]

"""LangChain models served by the Teola runtime's LLM engine (vLLM).

``TeolaLLM`` (completion) and ``TeolaChatModel`` (chat; messages go through the engine's
chat template) work on their own, like any LangChain model, and are what ``TeolaRunnable``
lowers to prefill / decode primitives. Both paths build the engine prompt with the same
method (``engine_prompt``) and the same sampling parameters, and run on the same engine
of the same runtime, so a plain chain and its Teola run send identical requests.
Greedy decoding by default.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, ClassVar

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, BaseLLM
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import (ChatGeneration, ChatGenerationChunk, ChatResult, Generation,
                                    GenerationChunk, LLMResult)
from pydantic import BaseModel, ConfigDict, Field

from ..capture.lowerable import LLMCallSpec
from ..runtime.app_runs import call_priority
from ..runtime.runtime import Runtime, default_runtime
from ..runtime.bridge import engine_stream, iterate_async, iterate_sync, started_pool

_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


def to_engine_messages(messages: Sequence[BaseMessage]) -> list[dict[str, str]]:
    """LangChain messages as the engine's ``[{"role", "content"}]`` chat format."""
    out = []
    for m in messages:
        role = m.role if m.type == "chat" else _ROLES.get(m.type)  # type: ignore[attr-defined]
        if role is None:
            raise ValueError(f"message type {m.type!r} has no chat role on this engine")
        out.append({"role": role, "content": str(m.text)})
    return out


# The plain path of the two model classes, which a lowered call replaces
# (capture/overrides.py): a subclass overriding one of these (changing what ``invoke``
# computes) runs its own code. The engine call hooks (``_complete``, ``_producer``) are
# left out: the graph never calls them, so what an override of them would change is not run.
LOWERED_CALLS = ("invoke", "ainvoke", "stream", "astream", "batch", "abatch", "generate", "agenerate",
                 "generate_prompt", "agenerate_prompt", "_generate", "_agenerate", "_stream", "_astream",
                 "_generate_all", "_convert_input")


class _EngineModel(BaseModel):
    """Fields and engine calls shared by the two model classes."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    runtime: Any = Field(default=None, exclude=True)
    """The Teola ``Runtime`` whose engines serve this model; default: ``default_runtime()``."""
    engine: str = "llm"
    temperature: float = 0.0
    max_tokens: int = 256
    top_p: float = 1.0
    stop: list[str] | None = None

    def teola_runtime(self) -> Runtime:
        return self.runtime if self.runtime is not None else default_runtime()

    def sampling_params(self, stop: list[str] | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_tokens,
                                  "top_p": self.top_p}
        stop = stop if stop is not None else self.stop
        if stop:
            params["stop"] = list(stop)
        return params

    def engine_prompt(self, input: Any) -> Any:
        raise NotImplementedError

    def teola_call_spec(self) -> LLMCallSpec:
        return LLMCallSpec(self.engine, self.engine_prompt, self.sampling_params(),
                           returns_message=isinstance(self, BaseChatModel),
                           string_prompts=not isinstance(self, BaseChatModel))

    async def _complete(self, prompt: Any, params: dict[str, Any]) -> Any:
        pool = await started_pool(self.teola_runtime(), self.engine)
        generation, _ = await pool.submit("generate", {"prompt": prompt, "params": params}, call_priority())
        return generation

    def _texts(self, prompt: Any, params: dict[str, Any]) -> Any:
        """A factory of the engine stream's token texts (what the bridge iterates)."""
        async def texts() -> AsyncIterator[str]:
            async for delta in engine_stream(self.teola_runtime(), self.engine, "stream",
                                             {"prompt": prompt, "params": params}):
                if delta.text:
                    yield delta.text

        return texts

    def _run(self, coro: Any) -> Any:
        return self.teola_runtime().run_sync(coro)

    async def _arun(self, coro: Any) -> Any:
        return await self.teola_runtime().run_async(coro)


class TeolaLLM(_EngineModel, BaseLLM):
    """A completion model on the runtime's LLM engine: the prompt string goes to vLLM as is."""

    teola_lowered_calls: ClassVar[tuple[str, ...]] = LOWERED_CALLS

    @property
    def _llm_type(self) -> str:
        return "teola-vllm"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"engine": self.engine, **self.sampling_params()}

    def engine_prompt(self, input: Any) -> str:
        """What ``invoke`` sends the engine for ``input`` (str, messages or PromptValue)."""
        return self._convert_input(input).to_string()

    async def _generate_all(self, prompts: list[str], stop: list[str] | None) -> LLMResult:
        params = self.sampling_params(stop)
        done = await asyncio.gather(*(self._complete(p, params) for p in prompts))
        return LLMResult(generations=[[Generation(text=g.text, generation_info={"finish_reason": g.finish_reason})]
                                      for g in done])

    def _generate(self, prompts: list[str], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> LLMResult:
        return self._run(self._generate_all(prompts, stop))

    async def _agenerate(self, prompts: list[str], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> LLMResult:
        return await self._arun(self._generate_all(prompts, stop))

    def _stream(self, prompt: str, stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> Iterator[GenerationChunk]:
        for text in iterate_sync(self.teola_runtime(), self._texts(prompt, self.sampling_params(stop))):
            chunk = GenerationChunk(text=text)
            if run_manager:
                run_manager.on_llm_new_token(text, chunk=chunk)
            yield chunk

    async def _astream(self, prompt: str, stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[GenerationChunk]:
        async for text in iterate_async(self.teola_runtime(), self._texts(prompt, self.sampling_params(stop))):
            chunk = GenerationChunk(text=text)
            if run_manager:
                await run_manager.on_llm_new_token(text, chunk=chunk)
            yield chunk


class TeolaChatModel(_EngineModel, BaseChatModel):
    """A chat model on the runtime's LLM engine: messages are rendered with the model's
    own chat template by the engine."""

    teola_lowered_calls: ClassVar[tuple[str, ...]] = LOWERED_CALLS

    @property
    def _llm_type(self) -> str:
        return "teola-vllm-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"engine": self.engine, **self.sampling_params()}

    def engine_prompt(self, input: Any) -> list[dict[str, str]]:
        """What ``invoke`` sends the engine for ``input`` (str, messages or PromptValue)."""
        return to_engine_messages(self._convert_input(input).to_messages())

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        generation = self._run(self._complete(to_engine_messages(messages), self.sampling_params(stop)))
        return self._result(generation)

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        generation = await self._arun(self._complete(to_engine_messages(messages), self.sampling_params(stop)))
        return self._result(generation)

    @staticmethod
    def _result(generation: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(
            message=AIMessage(content=generation.text),
            generation_info={"finish_reason": generation.finish_reason})])

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        texts = self._texts(to_engine_messages(messages), self.sampling_params(stop))
        for text in iterate_sync(self.teola_runtime(), texts):
            yield ChatGenerationChunk(message=AIMessageChunk(content=text))

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        texts = self._texts(to_engine_messages(messages), self.sampling_params(stop))
        async for text in iterate_async(self.teola_runtime(), texts):
            yield ChatGenerationChunk(message=AIMessageChunk(content=text))

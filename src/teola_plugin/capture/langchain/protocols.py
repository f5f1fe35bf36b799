"""What a LangChain component must tell the tracer so it can be lowered onto an engine.

The plugin's own model classes (``teola_plugin.langchain``) implement these; the tracer
never imports them (capture depends on ir only), it asks the object. A third-party model
could implement the same two methods to be lowered too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class LLMCallSpec:
    """How one LLM call runs on an engine, in the model's own terms.

    ``to_engine_prompt`` is the model's own input conversion (what its ``invoke`` does with
    a str / messages / PromptValue before calling the engine), so a lowered call sends the
    engine exactly the prompt the model would. ``string_prompts`` says the engine prompt is
    that text itself (a completion model), so a template's literal text is a literal
    prefix of the prompt; chat prompts go through the engine's chat template instead.
    """

    engine: str
    to_engine_prompt: Callable[[Any], Any]
    sampling_params: Mapping[str, Any] = field(default_factory=dict)
    returns_message: bool = False  # chat model: the result is an AIMessage
    string_prompts: bool = True
    # A served model's own conversion of the server's reply into its ChatResult / LLMResult
    # (usage, ids, finish reason, as its invoke returns them); None: only the text is known.
    to_result: Callable[[Any], Any] | None = None
    max_tokens: int | None = None  # for the cost model when the sampling parameters do not say
    # A served model's request overrides when the caller streams the call (``{"stream": True}``...).
    streamed_request: Mapping[str, Any] | None = None
    # A served model's own translation of its client's errors (raises; called while handling one).
    raise_error: Callable[[BaseException], None] | None = None


@runtime_checkable
class LowerableLanguageModel(Protocol):
    def teola_call_spec(self) -> LLMCallSpec: ...


@runtime_checkable
class LowerableEmbeddings(Protocol):
    def teola_embedder_engine(self) -> str:
        """The engine instance that computes exactly what ``embed_query`` returns."""
        ...

"""What a model tells the tracer so that its calls can be lowered onto an engine.

One vocabulary for both frameworks: a model (the plugin's own classes, or the tracer's
stand-in for a recognised framework model: a served ``OpenAILike`` / ``ChatOpenAI``, an
in-process ``Vllm`` / ``VLLM``) is described by an :class:`LLMCallSpec`, and an embedding
model by the engine that computes its vectors. The plugin's classes implement the two
protocols; capture never imports them (it depends on ir only), it asks the object. A
third-party model could implement the same methods to be lowered too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

DEFAULT_MAX_TOKENS = 256  # a call whose model states no limit (the engines' own default)


@dataclass(frozen=True)
class LLMCallSpec:
    """How one model's calls run on an engine, in the model's own terms.

    ``to_engine_prompt`` is the model's own input conversion, so a lowered call sends the
    engine exactly the prompt the model would: in LangChain what ``invoke`` does with a
    str / messages / PromptValue; in LlamaIndex what ``predict(template, **prompt_args)``
    does (``to_completion_prompt``: what ``complete(text)`` does). ``string_prompts`` says
    the engine prompt is that text itself (a completion model), so a template's literal
    text is a literal prefix of the prompt; chat prompts go through the engine's chat
    template instead.
    """

    engine: str | None  # the engine instance (None: the op's default engine kind)
    to_engine_prompt: Callable[..., Any] | None = None
    # The model's own sampling parameters; {}: they are in its request body (a served model);
    # None: the engine's defaults (greedy, ``max_tokens``).
    sampling_params: Mapping[str, Any] | None = None
    max_tokens: int | None = None  # for the cost model when the sampling parameters do not say
    returns_message: bool = False  # LangChain chat model: the result is an AIMessage
    string_prompts: bool = True
    # A served model's own conversion of the server's reply into its ChatResult / LLMResult
    # (usage, ids, finish reason, as its invoke returns them); None: only the text is known.
    to_result: Callable[[Any], Any] | None = None
    # A served model's request overrides when the caller streams the call (``{"stream": True}``...).
    streamed_request: Mapping[str, Any] | None = None
    # A served model's own translation of its client's errors (raises; called while handling one).
    raise_error: Callable[[BaseException], None] | None = None
    # The model's stream is its text's deltas; False when it carries more (a chat model with
    # bound tools streams tool-call chunks), so a graph's token stream cannot stand in for it.
    streams_text: bool = True
    to_completion_prompt: Callable[[str], Any] | None = None
    # LlamaIndex: the model's output parser applied to the text (what ``predict`` returns);
    # None when it has none.
    parse_output: Callable[[str], Any] | None = None

    @property
    def call_max_tokens(self) -> int:
        """The most tokens one call decodes."""
        return int(self.max_tokens or (self.sampling_params or {}).get("max_tokens", DEFAULT_MAX_TOKENS))


@runtime_checkable
class LowerableLLM(Protocol):
    """A model that describes its own engine call (the plugin's ``TeolaLLM`` /
    ``TeolaChatModel`` in both frameworks)."""

    def teola_call_spec(self) -> LLMCallSpec: ...


@runtime_checkable
class LowerableEmbedding(Protocol):
    """An embedding model computed by one engine instance (``TeolaEmbedding(s)``)."""

    def teola_embedder_engine(self) -> str:
        """The engine instance that computes exactly what the model's query embedding returns."""
        ...

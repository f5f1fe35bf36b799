"""Report lowered model calls to the caller's LangChain callbacks, as the model would.

A lowered call never runs the model's ``invoke``, so the handlers in the caller's config
(LangChain's config context reaches the primitives: the runtime copies the caller's
context) would not hear of it. Two CPU primitives stand in: ``llm_start`` fires
``on_chat_model_start`` / ``on_llm_start`` as soon as the prompt is formatted, with what
plain's model reports (the messages of its own input, ids and metadata kept; its LangSmith
params in the run's metadata); ``llm_end`` fires ``on_llm_end`` with the decoded text (a served
model: its own result, from the server's reply) and passes the text and the reply message on.
Without callbacks both return at once. When a handler streams (``astream_events``,
``astream_log``: where plain's model would stream the call), the call is sent as the model's
streaming request and each decoded delta reaches ``on_llm_new_token`` as the model reports
it (the decode's ``listener``: :class:`CallRun`), in order, before ``on_llm_end``. A call
that fails reports ``on_llm_error`` with the model's own exception instead (the prefill and
the decode hear it through the same listener; the request is sent once the run started).
A lowered retriever reports its run the same way (``retriever_reporters``: start with the
query, end with the documents).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from langchain_core.callbacks import CallbackManager
from langchain_core.language_models.chat_models import (  # generate's run options, invoke's own merge
    _format_for_tracing, _format_ls_structured_output, _gen_info_and_msg_metadata, _generate_response_from_error)
from langchain_core.messages import AIMessage, AIMessageChunk, convert_to_messages
from langchain_core.outputs import (ChatGeneration, ChatGenerationChunk, ChatResult, Generation, GenerationChunk,
                                    LLMResult)
from langchain_core.runnables.config import ensure_config, merge_configs
from langchain_core.tracers._streaming import _StreamingCallbackHandler  # what makes plain's models stream
from langchain_core.utils.utils import LC_ID_PREFIX  # "lc_run-": the prefix invoke gives message ids

from ....runtime.framework_threads import in_framework_thread
from ...lowerable import LLMCallSpec
from ..run_scopes import under_binding
from ..step_runs import tagged

try:  # langchain-core 1.x: the invocation params its models trace (tools, messages left out)
    from langchain_core.language_models._utils import _filter_invocation_params_for_tracing
except ImportError:
    _filter_invocation_params_for_tracing = None


INPUT_PORT = "input:"  # llm_start's ports that carry the model's own input (models.ModelInput)


def _callback_manager(model: Any, stop: list[str] | None, config: Any, call_kwargs: Mapping[str, Any],
                      params: Mapping[str, Any]) -> CallbackManager | None:
    """The manager ``BaseChatModel.invoke`` / ``BaseLLM.invoke`` starts the call's run with:
    the model's LangSmith params (``_get_ls_params_with_defaults``: a chat model's
    ``ls_integration`` too) in the inheritable metadata, its invocation params for tracing."""
    model_callbacks, verbose = getattr(model, "callbacks", None), bool(getattr(model, "verbose", False))
    if not config.get("callbacks") and not model_callbacks and not verbose:
        return None
    metadata = dict(config.get("metadata") or {})
    ls_params = getattr(model, "_get_ls_params_with_defaults", None) or model._get_ls_params
    try:
        metadata.update(ls_params(stop=stop, **call_kwargs))
    except Exception:  # noqa: BLE001 - tracing metadata only
        pass
    extra = {"langsmith_inheritable_metadata": _filter_invocation_params_for_tracing(dict(params))} \
        if _filter_invocation_params_for_tracing is not None else {}
    return CallbackManager.configure(config.get("callbacks"), model_callbacks, verbose, config.get("tags"),
                                     getattr(model, "tags", None), metadata, getattr(model, "metadata", None),
                                     **extra)


def _structured_output_options(ls_format: Any) -> dict[str, Any]:
    """The run options ``BaseChatModel.generate`` adds for a structured-output call."""
    return _format_ls_structured_output(ls_format) if ls_format else {}


def _streaming(manager: CallbackManager) -> bool:
    """One of ``manager``'s handlers streams (``astream_events`` / ``astream_log``): plain's
    models would send streaming requests and report every token."""
    return any(isinstance(h, _StreamingCallbackHandler) for h in manager.handlers)


def streams_llm_calls(config: Any = None) -> bool:
    """A handler of the caller's config (``config``, else the context's) streams (see :func:`_streaming`)."""
    return _streaming(CallbackManager.configure(ensure_config(config).get("callbacks")))


class CallRun:
    """One reported call: its callback run, and (when a handler streams) the decode's
    listener that reports each delta to ``on_llm_new_token`` off the runtime loop, in order."""

    def __init__(self, run: Any, chat: bool, streaming: bool) -> None:
        self.run = run
        self.chat = chat
        self.streaming = streaming
        self._last: asyncio.Future[None] | None = None
        self.ended = False  # on_llm_end or on_llm_error reported: the run is over

    def __call__(self, text: str, chunk: Any = None) -> None:  # on the runtime loop, per decoded delta
        if not self.streaming or not text:
            return
        if self.chat:
            message = AIMessageChunk(content=text, id=f"{LC_ID_PREFIX}-{self.run.run_id}")  # invoke's id
            chunk: Any = ChatGenerationChunk(message=message)
        else:
            chunk = GenerationChunk(text=text)
        previous = self._last

        async def report() -> None:
            if previous is not None:
                await previous
            await in_framework_thread(self.run.on_llm_new_token, text, chunk=chunk)

        self._last = asyncio.ensure_future(report())

    async def reported(self) -> None:
        """Every delta reported (before ``on_llm_end``)."""
        if self._last is not None:
            await self._last

    async def failed(self, error: BaseException) -> None:
        """``on_llm_error`` with the model's own exception, as its generate reports a failed
        call (a chat model: the error's HTTP response in the generation's metadata); also with
        the graph run's error when the run stopped it (once: a run ends once)."""
        if self.ended:
            return
        self.ended = True
        await self.reported()
        generations = [_generate_response_from_error(error)] if self.chat else []
        await in_framework_thread(self.run.on_llm_error, error, response=LLMResult(generations=generations))


def _invoke_message(result: Any, run: Any) -> Any:
    """The message ``invoke`` returns for ``result``: BaseChatModel's own post-processing
    (the result's llm_output and generation info in ``response_metadata``, a run id)."""
    generation = result.generations[0]
    message = generation.message
    message.response_metadata = {**(result.llm_output or {}), **_gen_info_and_msg_metadata(generation)}
    if message.id is None:
        message.id = f"{LC_ID_PREFIX}-{run.run_id if run is not None else uuid.uuid4()}-0"
    return message


def call_reporters(model: Any, spec: LLMCallSpec, stop: list[str] | None,
                   bound: Mapping[str, Any] | None = None, step: str | None = None,
                   call_kwargs: Mapping[str, Any] | None = None,
                   model_input: Callable[..., Any] | None = None) -> tuple[Callable, Callable]:
    """``(report_start(prompt, **input) -> CallRun | None,
    report_end(run, text, response) -> {"text", "message"})``; the message is the model's own
    (from a served model's reply), else None. ``bound``: the tracing config of a
    ``model.with_config(...)`` (run name, tags, metadata, callbacks), merged in as the binding merges it;
    ``step``: the call's seq:step tag (``step_runs.py``); ``call_kwargs``: the call's bound
    arguments (tools), reported as ``BaseChatModel.generate`` reports them; ``model_input``
    rebuilds the model's own input from ``report_start``'s ``input:*`` values, so the start
    reports plain's messages (ids, metadata) rather than the engine prompt's."""
    chat = spec.returns_message
    kwargs = dict(call_kwargs or {})
    structured = _structured_output_options(kwargs.pop("ls_structured_output_format", None))

    async def report_start(prompt: Any, **given: Any) -> Any:
        config = ensure_config()  # the caller's config, from the copied context
        if bound:
            config = merge_configs(config, dict(bound))
        try:
            params = model._get_invocation_params(stop=stop, **kwargs)
        except Exception:  # noqa: BLE001
            params = dict(spec.sampling_params or {})
        manager = _callback_manager(model, stop, tagged(config, step), kwargs, params)
        if manager is None:
            return None
        name = config.get("run_name")
        serialized = getattr(model, "_serialized", {})
        options = {"stop": stop, **{k: params[k] for k in kwargs if k in params}, **structured}

        def start() -> Any:  # user handlers may block (HTTP tracers): never on the runtime loop
            if chat:
                messages = _plain_messages(prompt, given)
                (run,) = manager.on_chat_model_start(serialized, [messages], invocation_params=params,
                                                     options=options, name=name, batch_size=1)
            else:
                text = prompt["prompt"][0] if isinstance(prompt, Mapping) else prompt  # a served body's
                (run,) = manager.on_llm_start(serialized, [text], invocation_params=params,
                                              options=options, name=name, batch_size=1)
            return CallRun(run, chat, _streaming(manager))

        return await in_framework_thread(start)

    def _plain_messages(prompt: Any, given: Mapping[str, Any]) -> list[Any]:
        """The messages plain's invoke reports: its own input's (``_convert_input``), as
        formatted for tracing; without it, the engine prompt's role/content dicts."""
        if model_input is not None:
            try:
                own = model_input(**{k[len(INPUT_PORT):]: v for k, v in given.items()})
                return _format_for_tracing(model._convert_input(own).to_messages())
            except Exception:  # noqa: BLE001 - a report only: the engine prompt's below
                pass
        return convert_to_messages(prompt["messages"] if isinstance(prompt, Mapping) else prompt)

    async def report_end(run: Any, text: str, response: Any = None) -> dict[str, Any]:
        if spec.to_result is not None and response is not None:  # a served model: its own result
            result = spec.to_result(response)
            message = _invoke_message(result, run.run if run is not None else None) if chat else None
            if isinstance(result, ChatResult):  # what BaseChatModel.generate reports it as
                result = LLMResult(generations=[result.generations], llm_output=result.llm_output)
        else:
            generation = ChatGeneration(message=AIMessage(content=text)) if chat else Generation(text=text)
            result, message = LLMResult(generations=[[generation]]), None
        if run is not None:
            run.ended = True
            await run.reported()
            await in_framework_thread(run.run.on_llm_end, result)
        return {"text": text, "message": message}

    return report_start, report_end


def retriever_reporters(retriever: Any, step: str | None = None,
                        bound: Mapping[str, Any] | None = None) -> tuple[Callable, Callable]:
    """``(report_start(query) -> run | None, report_end(run, documents) -> documents)``: what
    ``BaseRetriever.invoke`` reports around a lowered retriever's search (``on_retriever_start``
    with its name, tags, metadata and tracing params; ``on_retriever_end`` with the documents).
    ``bound``: the run_name / tags / metadata of ``retriever.with_config(...)``, merged in as
    the binding merges them."""

    async def report_start(query: str) -> Any:
        config = ensure_config()
        if bound:
            config = under_binding(config, bound)
        manager = retriever_manager(retriever, tagged(config, step))
        if not manager.handlers:
            return None
        name = config.get("run_name") or retriever.get_name()
        return await in_framework_thread(manager.on_retriever_start, None, query, name=name)

    async def report_end(run: Any, documents: list[Any]) -> list[Any]:
        if run is not None:
            await in_framework_thread(run.on_retriever_end, documents)
        return documents

    return report_start, report_end


def retriever_manager(retriever: Any, config: Mapping[str, Any], manager: type = CallbackManager) -> Any:
    """The callback manager ``BaseRetriever.invoke`` (``manager``: an ``AsyncCallbackManager``,
    ``ainvoke``) starts ``retriever``'s run with under ``config``: its tags, metadata and
    tracing params."""
    metadata = {**(config.get("metadata") or {}), **retriever._get_ls_params()}
    return manager.configure(config.get("callbacks"), None, verbose=False, inheritable_tags=config.get("tags"),
                             local_tags=retriever.tags, inheritable_metadata=metadata,
                             local_metadata=retriever.metadata)

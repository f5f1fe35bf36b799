"""A retriever that is the whole chain ``TeolaRunnable`` runs reports a retriever run.

``TeolaRunnable`` opens the run of the chain it runs (``_call_with_config``: a chain run).
Plain LangChain reports a retriever's call as a retriever run (``BaseRetriever.invoke``:
``on_retriever_start`` with its tags, metadata and tracing params, ``on_retriever_end`` with
the documents, ``on_retriever_error``), so when the chain is a retriever whose run Teola
reports (a lowered composite retriever), the graph runs inside such a run instead.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any

from langchain_core.callbacks import AsyncCallbackManager
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableBinding, RunnableConfig
from langchain_core.runnables.config import ensure_config, patch_config, var_child_runnable_config

from ..capture.langchain.rules.callbacks import retriever_manager


def root_retriever(chain: Any) -> BaseRetriever | None:
    """The retriever ``chain`` is (under ``with_config`` bindings), if it is one."""
    while isinstance(chain, RunnableBinding):
        chain = chain.bound
    return chain if isinstance(chain, BaseRetriever) else None


def _child_context(config: RunnableConfig, run: Any) -> contextvars.Context:
    context = contextvars.copy_context()
    context.run(var_child_runnable_config.set, patch_config(config, callbacks=run.get_child()))
    return context


def in_retriever_run(retriever: BaseRetriever, func: Callable[[Any], Any], input: Any,
                     config: RunnableConfig | None) -> Any:
    """``func(input)`` inside ``retriever``'s run, as ``retriever.invoke(input, config)`` reports it."""
    config = ensure_config(config)
    run = retriever_manager(retriever, config).on_retriever_start(
        None, input, name=config.get("run_name") or retriever.get_name())
    try:
        result = _child_context(config, run).run(func, input)
    except BaseException as error:
        run.on_retriever_error(error)
        raise
    run.on_retriever_end(result)
    return result


async def ain_retriever_run(retriever: BaseRetriever, func: Callable[[Any], Awaitable[Any]], input: Any,
                            config: RunnableConfig | None) -> Any:
    """``await func(input)`` inside ``retriever``'s run, as ``retriever.ainvoke`` reports it."""
    config = ensure_config(config)
    run = await retriever_manager(retriever, config, AsyncCallbackManager).on_retriever_start(
        None, input, name=config.get("run_name") or retriever.get_name())
    try:
        result = await asyncio.create_task(func(input), context=_child_context(config, run))
    except BaseException as error:
        await run.on_retriever_error(error)
        raise
    await run.on_retriever_end(result)
    return result

"""The ``seq:step:N`` tag a step's run carries, as ``RunnableSequence`` gives it.

Plain LangChain runs step N of a sequence with ``run_manager.get_child("seq:step:N")``: the
step's run (a prompt's, a model's, a function's) is tagged with its position, and the tag is
not inherited by the runs under it. A graph run reports the steps of the chain's own (root)
sequence from their primitives, under the chain's run: :func:`step_config` is the config those
primitives call or report with.
"""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import BaseCallbackManager
from langchain_core.runnables.config import RunnableConfig, ensure_config, patch_config


def step_tag(index: int) -> str:
    return f"seq:step:{index + 1}"


def with_step_tag(manager: Any, tag: str | None) -> Any:
    """``manager`` (a callback manager, or None) with ``tag`` on its own runs only."""
    if tag is None or not isinstance(manager, BaseCallbackManager):
        return manager
    tagged = manager.copy()
    tagged.add_tags([tag], inherit=False)
    return tagged


def step_config(tag: str | None) -> RunnableConfig | None:
    """The caller's config (from the context the graph's tasks inherit) with the step's tag on
    its callbacks; None without a tag (the component reads the context itself)."""
    if tag is None:
        return None
    config = ensure_config()
    return patch_config(config, callbacks=with_step_tag(config.get("callbacks"), tag))

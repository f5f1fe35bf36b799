"""The tag a component's run carries, as its parent gives it.

Plain LangChain runs step N of a sequence with ``run_manager.get_child("seq:step:N")`` and
branch K of a parallel with ``get_child("map:key:K")``: the component's run (a prompt's, a
model's, a function's) is tagged with its position, and the tag is not inherited by the runs
under it. A graph run reports each component's run from its primitives, under its parent's
run (whose config the run tree puts in the primitive's context: ``langchain/run_tree.py``):
:func:`step_config` is the config those primitives call or report with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.callbacks import BaseCallbackManager
from langchain_core.runnables.config import RunnableConfig, ensure_config, merge_configs, patch_config


def step_tag(index: int) -> str:
    return f"seq:step:{index + 1}"


def with_step_tag(manager: Any, tag: str | None) -> Any:
    """``manager`` (a callback manager, or None) with ``tag`` on its own runs only."""
    if tag is None or not isinstance(manager, BaseCallbackManager):
        return manager
    copy = manager.copy()
    copy.add_tags([tag], inherit=False)
    return copy


def tagged(config: RunnableConfig, tag: str | None) -> RunnableConfig:
    """``config`` with ``tag`` on its callbacks' own runs, before the component configures its
    run's manager from it (as plain's ``get_child(tag)`` does: the tag comes first, the
    config's tags after it); its run_name kept, the run being still the component's."""
    if tag is None:
        return config
    return patch_config(config, callbacks=with_step_tag(config.get("callbacks"), tag), run_name=config.get("run_name"))


def step_config(tag: str | None, bound: Mapping[str, Any] | None = None) -> RunnableConfig | None:
    """The caller's config (from the context the graph's tasks inherit) with the step's tag on
    its callbacks and what ``with_config`` bindings give the component's run (``bound``: its
    run_name, tags, metadata); None when there is neither (the component reads the context)."""
    if tag is None and not bound:
        return None
    config = ensure_config()
    if bound:
        config = merge_configs(config, dict(bound))
    return tagged(config, tag)


def render_unreported(template: Any, variables: Mapping[str, Any]) -> Any:
    """What ``template.invoke(variables)`` returns (the same input checks and errors) without
    reporting its run: Teola reports that one (``langchain/run_tree.py``). Not through a config
    without callbacks: LangChain's configure hooks (``collect_runs``, LangSmith tracing) would
    still hear it, as a run without a parent."""
    render = getattr(template, "_format_prompt_with_error_handling", None)  # what invoke runs in its run
    if render is None:  # a langchain-core without it: its own invoke
        return template.invoke(dict(variables))
    return render(dict(variables))

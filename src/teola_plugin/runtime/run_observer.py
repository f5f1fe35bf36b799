"""What a graph run tells someone who watches it node by node (``GraphRun(observer=...)``).

A framework integration uses it to report the run as the framework would (LangChain's
callback run tree: ``langchain/run_tree.py``). The observer may make a node wait before its
handler runs (``entering``: a callback run its node reports under must be started first) and
may set context variables there: the node runs in its own task, so they stay its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from ..ir.node import Primitive


class RunObserver(Protocol):
    def start(self, inputs: Mapping[str, Any]) -> None:
        """The run begins (on the runtime loop) with these graph inputs."""

    async def entering(self, prim: Primitive) -> None:
        """``prim``'s inputs are ready; its handler runs when this returns (in the node's task)."""

    def produced(self, prim: Primitive, outputs: Mapping[str, Any]) -> None:
        """``prim`` is done with these outputs (a pipelined node: once, its items gathered)."""

    async def finish(self, error: BaseException | None) -> None:
        """The run ended (``error``: why it failed, None when it succeeded); before the caller hears."""

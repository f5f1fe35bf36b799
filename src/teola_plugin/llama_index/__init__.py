"""LlamaIndex integration: ``Settings.executor = TeolaExecutor()`` and the plugin's own
``TeolaLLM`` / ``TeolaEmbedding`` (usable without the executor, on the same engines).

Importing this module installs the ``Settings.executor`` hook (once; see ``hooks``).
"""

from __future__ import annotations

from . import hooks
from .embedding import TeolaEmbedding
from .executor import TeolaExecutor
from .llm import TeolaLLM

hooks.install()

__all__ = ["TeolaEmbedding", "TeolaExecutor", "TeolaLLM"]

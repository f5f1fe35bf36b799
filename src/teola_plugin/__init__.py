"""teola_plugin: primitive-level dataflow scheduling for LlamaIndex and LangChain apps."""

from __future__ import annotations

import logging
from typing import Any

__version__ = "0.1.0"

# The library logs to the "teola_plugin" logger and never configures logging itself: an
# application (or `teola -v`) decides where messages go; without one they are dropped.
logging.getLogger(__name__).addHandler(logging.NullHandler())

# Framework integrations load on first use: `import teola_plugin` stays light (no LlamaIndex,
# no LangChain). `TeolaLLM` is LlamaIndex's; LangChain's is `teola_plugin.langchain.TeolaLLM`.
_LAZY = {
    "TeolaExecutor": "teola_plugin.llama_index",
    "TeolaLLM": "teola_plugin.llama_index",
    "TeolaEmbedding": "teola_plugin.llama_index",
    "TeolaRunnable": "teola_plugin.langchain",
    "TeolaChatModel": "teola_plugin.langchain",
    "TeolaEmbeddings": "teola_plugin.langchain",
    "TeolaReranker": "teola_plugin.langchain",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'teola_plugin' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])

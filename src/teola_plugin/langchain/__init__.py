"""LangChain integration: ``TeolaRunnable(chain)`` and models served by Teola engines.

    from teola_plugin.langchain import TeolaChatModel, TeolaEmbeddings, TeolaRunnable
    chain = prompt | TeolaChatModel() | StrOutputParser()
    fast = TeolaRunnable(chain)
    fast.invoke({"question": "..."})     # same output as chain.invoke

Importing it routes the model-server calls of code a TeolaRunnable runs as it is (a LangGraph
graph's nodes, an opaque step) through Teola's served engines (``served_calls``), and runs
the LCEL chains that code calls as their own graphs (``called_chains``).
"""

from .. import served_calls
from . import called_chains
from .embeddings import TeolaEmbeddings
from .models import TeolaChatModel, TeolaLLM
from .reranker import TeolaReranker
from .runnable import TeolaRunnable
from ..engines.langchain_store import FrameworkVectorStoreEngine

served_calls.install()
called_chains.install()

__all__ = ["FrameworkVectorStoreEngine", "TeolaChatModel", "TeolaEmbeddings", "TeolaLLM", "TeolaReranker",
           "TeolaRunnable"]

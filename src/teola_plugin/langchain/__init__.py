"""LangChain integration: ``TeolaRunnable(chain)`` and models served by Teola engines.

    from teola_plugin.langchain import TeolaChatModel, TeolaEmbeddings, TeolaRunnable
    chain = prompt | TeolaChatModel() | StrOutputParser()
    fast = TeolaRunnable(chain)
    fast.invoke({"question": "..."})     # same output as chain.invoke
"""

from .embeddings import TeolaEmbeddings
from .models import TeolaChatModel, TeolaLLM
from .reranker import TeolaReranker
from .runnable import TeolaRunnable
from .vector_store import FrameworkVectorStoreEngine

__all__ = ["FrameworkVectorStoreEngine", "TeolaChatModel", "TeolaEmbeddings", "TeolaLLM", "TeolaReranker",
           "TeolaRunnable"]

"""Embedding models that call an OpenAI-compatible server's ``/v1/embeddings``.

vLLM's own RAG examples embed with a second vLLM server (``--runner pooling``) reached
through LangChain ``OpenAIEmbeddings(base_url=...)`` or LlamaIndex ``OpenAILikeEmbedding``
(``OpenAIEmbedding`` against OpenAI itself). Both end in the ``openai`` SDK's
``client.embeddings.create``. A lowered query embedding of such a model is an ``embed``
primitive on the served engine of its server: the primitive runs the model's own code for
each text (``attrs["embed_text"]``: LangChain ``embed_query``, LlamaIndex
``get_query_embedding``, with their text preparation, chunking, retries and events), and
the request that code makes is sent by the served engine (``served_calls``). So the server
sees plain's requests and the caller gets plain's vectors, while the engine scheduler admits
and times them with every other request to that server.

A client Teola would not reproduce (its own ``http_client``, a timeout with several parts)
keeps the model's own call, as an opaque step, with the reason.
"""

from __future__ import annotations

from typing import Any

from ..engines.llm_served import ServerEndpoint
from .common import NotLowerable
from .served_models import UnreproducibleClient, client_endpoint, installed_classes

LANGCHAIN_CLASSES = ("langchain_openai:OpenAIEmbeddings",)
LLAMA_INDEX_CLASSES = ("llama_index.embeddings.openai:OpenAIEmbedding",
                       "llama_index.embeddings.openai_like:OpenAILikeEmbedding")
_NAMES = frozenset({"OpenAIEmbeddings", "OpenAIEmbedding", "OpenAILikeEmbedding"})


def is_served_embedding(model: Any) -> bool:
    """A framework embedding class whose requests go to ``/v1/embeddings`` through the SDK."""
    if type(model).__name__ not in _NAMES:  # no imports for other models
        return False
    return type(model) in installed_classes(*LANGCHAIN_CLASSES, *LLAMA_INDEX_CLASSES)


def embedding_endpoint(model: Any) -> ServerEndpoint:
    """The server ``model``'s SDK client talks to; NotLowerable when Teola's engine would not
    send its requests alike."""
    try:
        if type(model) in installed_classes(*LANGCHAIN_CLASSES):
            return client_endpoint(model.client._client)  # its ``openai.OpenAI(...).embeddings``
        return client_endpoint(model._get_client())  # LlamaIndex: the client its calls use
    except UnreproducibleClient as exc:
        raise NotLowerable(f"{type(model).__name__}: {exc}") from None

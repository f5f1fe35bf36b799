"""Engines: one long-lived object per expensive resource (a model, a store), async, batched.

Importing this package is cheap: each engine imports its heavy library (torch,
sentence-transformers, chromadb, bm25s) only when it starts.
"""

from .base import Engine, Hit, check_texts, split_back
from .embedder import SentenceTransformerEmbedder
from .reranker import Reranker
from .search import BM25SearchEngine
from .vector_store import ChromaVectorStore

# The vLLM engine (llm_vllm.py) is added here by its owner.

__all__ = [
    "Engine",
    "Hit",
    "check_texts",
    "split_back",
    "SentenceTransformerEmbedder",
    "ChromaVectorStore",
    "Reranker",
    "BM25SearchEngine",
]

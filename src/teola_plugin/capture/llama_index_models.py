"""Framework models and retrievers Teola recognises beyond its own TeolaLLM / TeolaEmbedding.

* ``HuggingFaceEmbedding`` (llama-index-embeddings-huggingface) is served by the runtime's
  embedder engine when both compute the same vectors: the same sentence-transformers
  directory as the engine's (``model_path``, else the bundled all-MiniLM-L6-v2), normalized,
  no query instruction, the directory's own ``max_seq_length``. Then the query embedding
  becomes an ``embed`` primitive (batched with other queries); else it stays the model's
  own call, and the reason is noted.
* ``SummaryIndexRetriever`` (``SummaryIndex.as_query_engine()``) returns every node of its
  index, ``KeywordTableSimpleRetriever`` / ``KeywordTableRAKERetriever`` (a keyword table's
  retrievers that extract keywords without an LLM) look them up in their table: a CPU step
  calling its own ``retrieve``, not reported as opaque.
* ``DocumentSummaryIndexEmbeddingRetriever`` (``DocumentSummaryIndex.as_query_engine()``):
  the query embedding on the embedder engine (as a vector retriever's), then its own
  ``_retrieve`` with that embedding (the summaries' search, each summary's document nodes).
* ``BM25Retriever`` (llama-index-retrievers-bm25) keeps its own index and tokenizer (stemmer,
  stopwords), which Teola's ``search`` engine (its own BM25 over its own corpus) does not
  reproduce, so it is a pure CPU step calling its own ``retrieve``: it still runs
  concurrently with the graph's other work, and is not reported as opaque.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from llama_index.core.indices.document_summary.retrievers import DocumentSummaryIndexEmbeddingRetriever
from llama_index.core.indices.keyword_table.retrievers import KeywordTableRAKERetriever, KeywordTableSimpleRetriever
from llama_index.core.indices.list.retrievers import SummaryIndexRetriever
from llama_index.core.schema import QueryBundle

from ..ir.node import Ref
from ..runtime.engine_needs import EngineNeeds
from .llama_index import RETRIEVER_RULES, LlamaIndexTracer, NotLowerable, lowering_rule
from .embedder_identity import embedder_serving
from .llama_index_served import ServedRequests, is_served_llm
from .llama_index_spans import unspanned
from .lowerable import LLMCallSpec, LowerableEmbedding, LowerableLLM
from .overrides import overridden_lowered_calls
from .vllm_identity import engine_serving, served_models


def embedder_engine_for(runtime: Any, embed_model: Any) -> tuple[str | None, str]:
    """(engine name, "") when ``runtime``'s engine computes ``embed_model``'s vectors, else (None, why)."""
    if isinstance(embed_model, LowerableEmbedding):
        if getattr(embed_model, "runtime", None) is not runtime:
            return None, f"{type(embed_model).__name__} is bound to another runtime"
        changed = overridden_lowered_calls(embed_model)
        if changed:
            return None, f"{type(embed_model).__name__} overrides {', '.join(changed)}: its own code runs"
        return embed_model.teola_embedder_engine(), ""
    if type(embed_model).__name__ == "HuggingFaceEmbedding":
        return _huggingface_engine(runtime, embed_model)
    return None, f"{type(embed_model).__name__} is not served by a Teola engine (use TeolaEmbedding)"


def _huggingface_engine(runtime: Any, model: Any) -> tuple[str | None, str]:
    st_model = getattr(model, "_model", None)
    return embedder_serving(getattr(runtime, "specs", {}), "HuggingFaceEmbedding", model.model_name,
                            normalize=model.normalize, prompts=getattr(st_model, "prompts", None),
                            truncate_dim=getattr(st_model, "truncate_dim", None), max_length=model.max_length,
                            cache_folders=_huggingface_cache_folders(model))


def _huggingface_cache_folders(model: Any) -> list[str | None]:
    """Where ``HuggingFaceEmbedding`` found a hub id: the cache folder it was given (its field
    stays unset, so the next best guess follows), else LlamaIndex's own cache directory."""
    from llama_index.core.utils import get_cache_dir

    return [folder for folder in (getattr(model, "cache_folder", None), get_cache_dir()) if folder]


def _register_bm25() -> None:
    try:
        from llama_index.retrievers.bm25 import BM25Retriever
    except ImportError:  # optional package
        return

    @lowering_rule(RETRIEVER_RULES, BM25Retriever)
    def lower_bm25(tr: LlamaIndexTracer, retriever: BM25Retriever) -> Ref:
        return tr.cpu_step("bm25_retrieve", own_retrieve(retriever), {"query": tr.query}, type(retriever).__name__)


_register_bm25()


@lowering_rule(RETRIEVER_RULES, SummaryIndexRetriever, KeywordTableSimpleRetriever, KeywordTableRAKERetriever)
def lower_cpu_index_retriever(tr: LlamaIndexTracer, retriever: Any) -> Ref:
    """Retrievers that read their own index without a model (every node of a summary index,
    a keyword table's lookup of regex / RAKE keywords): no engine work, so a CPU step calling
    its own ``retrieve`` (the synthesis after it is lowered as any query engine's)."""
    return tr.cpu_step("index_retrieve", own_retrieve(retriever), {"query": tr.query}, type(retriever).__name__,
                       pure=False)


def own_retrieve(retriever: Any) -> Callable[[QueryBundle], list[Any]]:
    """``retriever.retrieve`` without its instrumentation: the graph reports its spans and
    events (``llama_index_spans.py``)."""
    def retrieve(query: QueryBundle) -> list[Any]:
        return retriever._handle_recursive_retrieval(query, unspanned(retriever, "_retrieve")(query))

    return retrieve


@lowering_rule(RETRIEVER_RULES, DocumentSummaryIndexEmbeddingRetriever)
def lower_document_summary_retriever(tr: LlamaIndexTracer, retriever: DocumentSummaryIndexEmbeddingRetriever) -> Ref:
    origin = type(retriever).__name__
    if not retriever._vector_store.is_embedding_query:
        raise NotLowerable(f"its vector store {type(retriever._vector_store).__name__} does not search by embedding")
    vector = tr.lower_query_vector(retriever._embed_model, origin)

    def retrieve(query: QueryBundle, vector: list[Any]) -> list[Any]:
        # plain sets the embedding on the query; a query with no text is searched without one
        with_embedding = dataclasses.replace(query, embedding=vector[0]) if vector else query
        return retriever._handle_recursive_retrieval(query, unspanned(retriever, "_retrieve")(with_embedding))

    return tr.cpu_step("summary_retrieve", retrieve, {"query": tr.query, "vector": vector}, origin, pure=False)


# -- LLMs --------------------------------------------------------------------------------------
def llm_call_spec(runtime: Any, llm: Any, needs: EngineNeeds) -> LLMCallSpec:
    """How ``llm``'s calls run on one of ``runtime``'s engines, or raise ``NotLowerable``
    saying why they cannot; a model server's engine is recorded in ``needs``."""
    from llama_index.core.llms.structured_llm import StructuredLLM

    if isinstance(llm, LowerableLLM) and not isinstance(llm, StructuredLLM):
        if getattr(llm, "runtime", None) is not runtime:
            raise NotLowerable(f"its LLM {type(llm).__name__} is bound to another runtime")
        changed = overridden_lowered_calls(llm)
        if changed:
            raise NotLowerable(f"its LLM {type(llm).__name__} overrides {', '.join(changed)} (its own code runs)")
        return llm.teola_call_spec()
    if type(llm).__name__ == "Vllm" and type(llm).__module__.startswith("llama_index.llms.vllm"):
        return VllmRequests.for_runtime(runtime, llm).call_spec()
    if is_served_llm(llm):
        return ServedRequests.for_model(llm, needs).call_spec()
    raise NotLowerable(f"its LLM {type(llm).__name__} is not served by a Teola engine (TeolaLLM, Vllm, "
                       "OpenAI / OpenAILike are)")


# Vllm fields that must keep vLLM's defaults: the Teola engine request carries only the rest.
_VLLM_DEFAULTS = {"n": 1, "best_of": None, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                  "ignore_eos": False, "logprobs": None}


class VllmRequests:
    """LlamaIndex's in-process ``Vllm`` LLM, answered by the runtime's vLLM engine instead of
    a second copy of the model: allowed only when an engine loads the same model the same way
    (``capture/vllm_identity.py``: directory, dtype, engine arguments; read from the runtime's
    engine specs, so recognising it costs no engine call) and the sampling parameters are
    ones the engine request carries. The request is what
    ``Vllm`` itself would generate from: ``predict`` formats the prompt (``_get_prompt``; a
    completion model) and ``complete`` sends it unchanged with ``_model_kwargs``."""

    def __init__(self, llm: Any, engine: str) -> None:
        self.llm = llm
        self.engine = engine

    @classmethod
    def for_runtime(cls, runtime: Any, llm: Any) -> VllmRequests:
        if llm.is_chat_model:
            raise NotLowerable("Vllm with is_chat_model=True is not lowered")
        changed = sorted(k for k, v in _VLLM_DEFAULTS.items() if getattr(llm, k, v) != v)
        if changed:
            raise NotLowerable(f"Vllm sampling settings {changed} are not carried by the engine request")
        name, why = engine_serving(served_models(runtime), "Vllm", llm.model, llm.dtype,
                                   getattr(llm, "vllm_kwargs", None))
        if name is None:
            raise NotLowerable(why)
        return cls(llm, name)

    def sampling_params(self, **overrides: Any) -> dict[str, Any]:
        llm = self.llm
        params = {"temperature": llm.temperature, "max_tokens": llm.max_new_tokens, "top_p": llm.top_p,
                  "top_k": llm.top_k, "stop": llm.stop}
        return {k: v for k, v in params.items() if v is not None}

    def engine_prompt(self, template: Any, /, **prompt_args: Any) -> str:
        return self.llm._get_prompt(template, **prompt_args)

    def completion_prompt(self, prompt: str) -> str:
        return prompt  # Vllm.complete sends the prompt as given

    def parse_output(self, text: str) -> str:
        return self.llm._parse_output(text)

    def call_spec(self) -> LLMCallSpec:
        return LLMCallSpec(self.engine, self.engine_prompt, self.sampling_params(), max_tokens=self.llm.max_new_tokens,
                           to_completion_prompt=self.completion_prompt,
                           parse_output=None if self.llm.output_parser is None else self.parse_output)

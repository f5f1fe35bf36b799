"""The LlamaIndex apps: document QA (naive and advanced RAG) and tree summarization.

Each query brings its own documents, which the app indexes as a user would
(``VectorStoreIndex.from_documents``: chunk -> embed -> insert) before asking. Teola systems
set ``Settings.executor = TeolaExecutor(...)``; nothing else in the app changes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from llama_index.core import Document, Settings, SummaryIndex, VectorStoreIndex
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.retrievers import QueryFusionRetriever

from ... import datasets
from ...llama_index import TeolaEmbedding, TeolaExecutor, TeolaLLM
from ..workloads import upload_for
from .base import Answer, BenchApp, Query, System
from .components import EngineRerank

UPLOAD_DOCS = 100  # passages uploaded with each document-QA question
SUMMARY_DOCS = 20  # chunks the summarization app summarizes
SUMMARY_WINDOW = 1024  # tokens: the 20 chunks then need a tree of LLM calls (a small-context model)
SERVER_CONTEXT = 2048  # the benchmark server's --max-model-len (bench/model_server.py)


class LlamaIndexApp(BenchApp):
    framework = "llama_index"
    dataset = "hotpotqa-dev-500"
    n_docs = UPLOAD_DOCS

    context_window: int | None = None  # None: the engine's (TeolaLLM) / the server's (OpenAILike)

    def __init__(self, runtime: Any, max_tokens: int = 32, timeout_s: float = 600) -> None:
        super().__init__(runtime, max_tokens)
        self.engine_models = (TeolaLLM(runtime, max_tokens=max_tokens, context_window=self.context_window),
                              TeolaEmbedding(runtime))
        self._app_models: tuple[Any, Any] | None = None
        self.llm, self.embed_model = self.engine_models
        self.timeout_s = timeout_s
        self._executors: dict[str, TeolaExecutor] = {}

    def app_models(self) -> tuple[Any, Any]:
        """The models as LlamaIndex's docs write them: ``OpenAILike`` on the benchmark's vLLM
        server and ``HuggingFaceEmbedding`` of the bundled MiniLM (built once)."""
        if self._app_models is None:
            from llama_index.embeddings.huggingface import HuggingFaceEmbedding
            from llama_index.llms.openai_like import OpenAILike

            from ...engines.embedder import default_model_path

            assert self.server_url, "the app systems need the runner's model server"
            llm = OpenAILike(model=self.server_model, api_base=self.server_url, api_key="none", is_chat_model=True,
                             temperature=0.0, max_tokens=self.max_tokens, timeout=self.timeout_s,
                             context_window=self.context_window or SERVER_CONTEXT)
            self._app_models = (llm, HuggingFaceEmbedding(model_name=str(default_model_path()), device="cpu"))
        return self._app_models

    def setup(self, queries: list[Query]) -> None:
        self.use_models(False)

    def use_models(self, served: bool) -> None:
        self.llm, self.embed_model = self.app_models() if served else self.engine_models
        Settings.llm = self.llm  # components that fall back to Settings get the same models
        Settings.embed_model = self.embed_model

    def queries(self, n: int, seed: int = 0) -> list[Query]:
        out = []
        for q in datasets.load_questions(self.dataset, limit=n, seed=seed):
            docs = [Document(text=d.text, id_=d.id, metadata=dict(d.metadata)) for d in upload_for(q, self.n_docs)]
            out.append(Query(q.id, q.question, q.answers, {"docs": docs}))
        return out

    def use(self, system: System) -> None:
        """Plain LlamaIndex, or the same app on Teola: the one line a user changes."""
        self.use_models(system.served)
        if system.teola:
            if system.name not in self._executors:
                self._executors[system.name] = TeolaExecutor(self.runtime, timeout_s=self.timeout_s,
                                                             **system.pass_kwargs)
            Settings.executor = self._executors[system.name]
        else:
            Settings.executor = None

    # -- the app, written once, sync and async ------------------------------------------------
    def query_engine(self, docs: list[Document], use_async: bool, streaming: bool = False) -> Any:
        raise NotImplementedError

    def question_text(self, query: Query) -> str:
        return query.question

    def sources(self, response: Any) -> list[str]:
        """The ids an answer reports as its sources."""
        return _sources(response)

    def answer(self, response: Any) -> Answer:
        return Answer(str(response.response or "").strip(), self.sources(response))

    def run(self, query: Query, system: System, callbacks: list[Any] | None = None) -> Answer:
        self.use(system)
        engine = self.query_engine(query.data["docs"], use_async=system.concurrent)
        return self.answer(engine.query(self.question_text(query)))

    async def arun(self, query: Query, system: System, stream: bool = False) -> Answer:
        self.use(system)
        start = time.perf_counter()
        # Building an index is synchronous in LlamaIndex: off the event loop, as users do.
        engine = await asyncio.to_thread(self.query_engine, query.data["docs"], True, stream)
        response = await engine.aquery(self.question_text(query))
        return await streamed_answer(response, start, self.sources(response)) if stream else self.answer(response)


async def streamed_answer(response: Any, start: float, sources: list[str]) -> Answer:
    """A streamed response (``AsyncStreamingResponse``, a chat engine's streaming response)
    read to its end, with the time from ``start`` to its first token."""
    first, parts = None, []
    async for token in response.async_response_gen():
        if first is None and token:
            first = time.perf_counter() - start
        parts.append(token)
    return Answer("".join(parts).strip(), sources, ttft_s=first)


def _sources(response: Any) -> list[str]:
    return [n.node.ref_doc_id or n.node.node_id for n in response.source_nodes]


class NaiveDocQA(LlamaIndexApp):
    name = "doc_qa_naive"
    title = "1 Document QA, naive RAG (LlamaIndex)"
    workload = (f"HotpotQA question + {UPLOAD_DOCS} uploaded passages (its 10 context paragraphs + "
                f"{UPLOAD_DOCS - 10} corpus distractors): chunk -> embed -> insert, top-3 retrieval, compact synthesis")

    def query_engine(self, docs: list[Document], use_async: bool, streaming: bool = False) -> Any:
        index = VectorStoreIndex.from_documents(docs, embed_model=self.embed_model, use_async=use_async)
        return index.as_query_engine(llm=self.llm, similarity_top_k=3, use_async=use_async, streaming=streaming)


class AdvancedDocQA(LlamaIndexApp):
    name = "doc_qa_advanced"
    title = "2 Document QA, advanced RAG (LlamaIndex)"
    workload = (f"as app 1 ({UPLOAD_DOCS} uploaded passages), plus QueryFusionRetriever (3 generated queries + "
                "the original, top 5 each, reciprocal-rank fusion) and reranking to the top 3 before synthesis")

    def query_engine(self, docs: list[Document], use_async: bool, streaming: bool = False) -> Any:
        index = VectorStoreIndex.from_documents(docs, embed_model=self.embed_model, use_async=use_async)
        fusion = QueryFusionRetriever([index.as_retriever(similarity_top_k=5)], llm=self.llm, similarity_top_k=5,
                                      num_queries=4, mode="reciprocal_rerank")  # use_async: framework default
        return RetrieverQueryEngine.from_args(fusion, llm=self.llm, use_async=use_async, streaming=streaming,
                                              node_postprocessors=[EngineRerank(self.runtime, top_n=3)])


class TreeSummarize(LlamaIndexApp):
    name = "summarize"
    title = "5 Summarize many chunks (LlamaIndex tree_summarize)"
    n_docs = SUMMARY_DOCS
    workload = (f"{SUMMARY_DOCS} passages (a HotpotQA question's 10 context paragraphs + 10 distractors) -> "
                f"SummaryIndex, tree_summarize with a {SUMMARY_WINDOW}-token window (several leaf summaries, "
                "then their summary)")

    context_window = SUMMARY_WINDOW

    def question_text(self, query: Query) -> str:
        return f"Summarize what the passages say that helps answer: {query.question}"

    def query_engine(self, docs: list[Document], use_async: bool, streaming: bool = False) -> Any:
        index = SummaryIndex.from_documents(docs)
        return index.as_query_engine(llm=self.llm, response_mode="tree_summarize", use_async=use_async,
                                     streaming=streaming)

"""The LangChain apps: search-augmented generation, multi-hop QA by decomposition, and
advanced RAG (multi-query retrieval + reranking). Plain LCEL; Teola systems wrap the very
same chain in ``TeolaRunnable(chain, passes=...)``.
"""

from __future__ import annotations

import random
import time
from operator import itemgetter
from typing import Any

from langchain_classic.retrievers.contextual_compression import ContextualCompressionRetriever
from langchain_classic.retrievers.multi_query import LineListOutputParser, MultiQueryRetriever
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnableLambda, RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore

from ... import datasets
from ...langchain import TeolaChatModel, TeolaEmbeddings, TeolaReranker, TeolaRunnable
from .base import Answer, BenchApp, Query, System
from .components import SearchEngineRetriever

MULTIHOP_DISTRACTORS = 100  # corpus passages added to the benchmark questions' own contexts
MAX_SUBQUESTIONS = 3


def format_docs(docs: list[Any]) -> str:
    return "\n\n".join(d.page_content for d in docs)


ANSWER = ChatPromptTemplate.from_template(
    "Answer the question using only the context below, in a few words.\n\nContext:\n{context}\n\n"
    "Question: {question}")

DECOMPOSE = ChatPromptTemplate.from_template(
    "Break this question into at most 3 simpler questions that can each be answered on their own. "
    "Write one question per line, nothing else.\n\nQuestion: {question}")
COMBINE_FINDINGS = ChatPromptTemplate.from_template(
    "Answer the question in a few words, using these answers to its sub-questions.\n\n{findings}\n\n"
    "Question: {question}")


class LangChainApp(BenchApp):
    framework = "langchain"

    def __init__(self, runtime: Any, max_tokens: int = 32, timeout_s: float = 600) -> None:
        super().__init__(runtime, max_tokens)
        self.timeout_s = timeout_s
        self.chains: dict[bool, Runnable] = {}  # served (the app systems) or not -> the app's chain
        self._wrapped: dict[str, TeolaRunnable] = {}

    def build_chain(self, llm: Any, embeddings: Any) -> Runnable:
        raise NotImplementedError

    def models(self, served: bool) -> tuple[Any, Any]:
        """(chat model, embeddings): the plugin's, or as LangChain's docs write them
        (``ChatOpenAI`` on the benchmark's vLLM server, ``HuggingFaceEmbeddings`` of MiniLM)."""
        if not served:
            return (TeolaChatModel(runtime=self.runtime, max_tokens=self.max_tokens),
                    TeolaEmbeddings(runtime=self.runtime))
        from langchain_huggingface import HuggingFaceEmbeddings
        from langchain_openai import ChatOpenAI

        from ...engines.embedder import default_model_path

        assert self.server_url, "the app systems need the runner's model server"
        llm = ChatOpenAI(model=self.server_model, base_url=self.server_url, api_key="none", temperature=0,
                         max_tokens=self.max_tokens, timeout=self.timeout_s)
        return llm, HuggingFaceEmbeddings(model_name=str(default_model_path()))

    def setup(self, queries: list[Query]) -> None:
        self.chains[False] = self.build_chain(*self.models(False))

    def chain_input(self, query: Query) -> Any:
        return query.question

    def runnable(self, system: System) -> Runnable:
        """The chain itself, or the same chain wrapped for Teola: the one line a user changes."""
        assert self.chains, "setup() first"
        if system.served not in self.chains:
            self.chains[system.served] = self.build_chain(*self.models(system.served))
        chain = self.chains[system.served]
        if not system.teola:
            return chain
        if system.name not in self._wrapped:
            self._wrapped[system.name] = TeolaRunnable(chain, runtime=self.runtime, timeout_s=self.timeout_s,
                                                       **system.pass_kwargs)
        return self._wrapped[system.name]

    def run(self, query: Query, system: System, callbacks: list[Any] | None = None) -> Answer:
        config = {"callbacks": callbacks} if callbacks else None
        return Answer(str(self.runnable(system).invoke(self.chain_input(query), config=config)).strip())

    async def arun(self, query: Query, system: System, stream: bool = False) -> Answer:
        runnable = self.runnable(system)
        if not stream:
            return Answer(str(await runnable.ainvoke(self.chain_input(query))).strip())
        start, first, parts = time.perf_counter(), None, []
        async for chunk in runnable.astream(self.chain_input(query)):
            if first is None and chunk:
                first = time.perf_counter() - start
            parts.append(str(chunk))
        return Answer("".join(parts).strip(), ttft_s=first)


class SearchAugmented(LangChainApp):
    name = "search_gen"
    title = "3 Search-augmented generation (LangChain)"
    workload = "SQuAD question -> BM25 search over the combined bundled corpus (5,098 passages), top 3 -> answer"

    def queries(self, n: int, seed: int = 0) -> list[Query]:
        return [Query(q.id, q.question, q.answers) for q in datasets.load_questions("squad-xquad-en", limit=n, seed=seed)]

    def build_chain(self, llm: Any, embeddings: Any) -> Runnable:
        search = SearchEngineRetriever(runtime=self.runtime, k=3)
        return ({"context": search | format_docs, "question": RunnablePassthrough()}
                | ANSWER | llm | StrOutputParser())


class MultiHopQA(LangChainApp):
    name = "multihop"
    title = "4 Multi-hop QA by decomposition (LangChain)"
    workload = (f"HotpotQA question -> up to {MAX_SUBQUESTIONS} generated sub-questions (line list) -> each answered "
                "independently over a vector store (top 3) -> combined answer; store: the questions' context "
                f"paragraphs + {MULTIHOP_DISTRACTORS} distractors")

    def queries(self, n: int, seed: int = 0) -> list[Query]:
        self._questions = datasets.load_questions("hotpotqa-dev-500", limit=n, seed=seed)
        return [Query(q.id, q.question, q.answers) for q in self._questions]

    def chain_input(self, query: Query) -> Any:
        return {"question": query.question}

    def retriever(self, embeddings: Any) -> Any:
        """A vector store of the questions' context paragraphs and the distractors, top 3."""
        corpus = datasets.load_corpus("hotpotqa-dev-500")
        own = {i for q in self._questions for i in q.context_ids}
        others = [p for p in corpus if p.id not in own]
        passages = [p for p in corpus if p.id in own] + random.Random(0).sample(others, MULTIHOP_DISTRACTORS)
        store = InMemoryVectorStore(embeddings)
        store.add_texts([f"{p.title}: {p.text}" for p in passages], ids=[p.id for p in passages])
        return store.as_retriever(search_kwargs={"k": 3})

    def build_chain(self, llm: Any, embeddings: Any) -> Runnable:
        retriever, decompose, combine = self.retriever(embeddings), DECOMPOSE, COMBINE_FINDINGS
        sub_chain = {"context": retriever | format_docs, "question": RunnablePassthrough()} | ANSWER | llm \
            | StrOutputParser()
        sub_questions = decompose | llm | StrOutputParser() | LineListOutputParser() \
            | RunnableLambda(lambda qs: [q.strip() for q in qs if q.strip()][:MAX_SUBQUESTIONS])

        def findings(x: dict[str, Any]) -> str:
            return "\n".join(f"Q: {q}\nA: {a.strip()}" for q, a in zip(x["subs"], x["answers"]))

        return (RunnablePassthrough.assign(subs=sub_questions)
                | RunnablePassthrough.assign(answers=itemgetter("subs") | sub_chain.map())
                | {"findings": RunnableLambda(findings), "question": itemgetter("question")}
                | combine | llm | StrOutputParser())


class AdvancedRAGLangChain(LangChainApp):
    name = "lc_advanced_rag"
    title = "6 Advanced RAG (LangChain: MultiQueryRetriever + reranking)"
    workload = ("SQuAD question -> MultiQueryRetriever (3 generated queries, top 4 each from an InMemoryVectorStore "
                "of the 240 SQuAD/XQuAD paragraphs) -> rerank to top 3 -> prompt | LLM | parser")

    def queries(self, n: int, seed: int = 0) -> list[Query]:
        return [Query(q.id, q.question, q.answers)
                for q in datasets.load_questions("squad-xquad-en", limit=n, seed=seed + 1)]

    def build_chain(self, llm: Any, embeddings: Any) -> Runnable:
        passages = datasets.load_corpus("squad-xquad-en")
        store = InMemoryVectorStore(embeddings)
        store.add_texts([p.text for p in passages], ids=[p.id for p in passages])
        multi = MultiQueryRetriever.from_llm(retriever=store.as_retriever(search_kwargs={"k": 4}), llm=llm)
        reranked = ContextualCompressionRetriever(base_compressor=TeolaReranker(runtime=self.runtime, top_n=3),
                                                  base_retriever=multi)
        return ({"context": reranked | format_docs, "question": RunnablePassthrough()}
                | ANSWER | llm | StrOutputParser())

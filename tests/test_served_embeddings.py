"""Embeddings from a model server's ``/v1/embeddings``, as vLLM's RAG examples write apps.

LangChain ``OpenAIEmbeddings(base_url=...)`` and LlamaIndex ``OpenAILikeEmbedding`` against a
real vLLM pooling server (the bundled MiniLM), the LLM on the session's vLLM model server;
loopback proxies record what reaches each server. Plain vs Teola: the same requests to both
servers, the same answers and sources; the query embedding is an ``embed`` primitive on the
served engine of the embedding server (whose ``relayed`` count shows it sent them), and
nothing is opaque but the app's own functions. Code run as it is (a LangGraph node) has its
embedding requests sent by the engine too; a failing embedding server raises what plain
raises. The embedding proxy replays plain's reply to an identical request, so both sides
search with the same vectors whatever batch the server computed them in.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import TypedDict

import openai
import pytest
from langchain_core.vectorstores import InMemoryVectorStore

from teola_plugin import datasets
from teola_plugin.langchain import TeolaRunnable
from teola_plugin.runtime.runtime import Runtime
from tests.fixtures_served import EMBEDDING_NAME, SERVED_NAME, docs_rag_chain, free_port

# A second vLLM server (an embedding model), besides the session's: `make test-all`.
pytestmark = [pytest.mark.slow, pytest.mark.extended]

QUESTIONS = [q.question for q in datasets.load_questions("squad-xquad-en", limit=40)[::13]]


@pytest.fixture(scope="module")
def served_runtime():
    """Served engines and the user's stores live in the driver's loop: no Ray needed here."""
    rt = Runtime({}, hosting="local")
    yield rt
    rt.shutdown()


@pytest.fixture(scope="module")
def passages():
    # chunks as the apps split them: the server's model takes at most 256 tokens (it refuses
    # a longer input, where sentence-transformers would truncate it)
    return [p.text[:700] for p in datasets.load_corpus("squad-xquad-en")[:16]]


def bodies(requests: list[tuple[str, dict]]) -> list[str]:
    return sorted(json.dumps([path, body], sort_keys=True) for path, body in requests)


def openai_embeddings(base_url: str, **kwargs):
    from langchain_openai import OpenAIEmbeddings

    # vLLM's example's settings: no tiktoken pre-tokenization (the server tokenizes)
    return OpenAIEmbeddings(model=EMBEDDING_NAME, base_url=base_url, api_key="EMPTY",
                            check_embedding_ctx_length=False, **kwargs)


def embed_nodes(graph) -> list:
    return [p for p in graph.nodes if p.op.value == "embed"]


def relayed(runtime: Runtime, engine: str) -> int:
    return runtime.local_engines()[engine].describe()["relayed"]


def test_vllms_langchain_rag_example_is_lowered_and_sends_plains_requests(
        embedding_proxy, recording_proxy, served_runtime, passages, tmp_path):
    """vLLM's ``retrieval_augmented_generation_with_langchain.py``: Milvus (Lite) filled through
    ``OpenAIEmbeddings`` on an embedding server, an LCEL chain with ``ChatOpenAI``."""
    from langchain_milvus import Milvus

    embedding_proxy.replay = True
    store = Milvus.from_texts(passages, openai_embeddings(embedding_proxy.base_url),
                              connection_args={"uri": str(tmp_path / "milvus.db")}, collection_name="rag")
    chain = docs_rag_chain(store.as_retriever(search_kwargs={"k": 2}), recording_proxy.base_url)
    teola = TeolaRunnable(chain, runtime=served_runtime)
    (embed,) = embed_nodes(teola.trace(QUESTIONS[0]))
    assert embed.engine.startswith("served:127.0.0.1:") and "embed_text" in embed.attrs
    assert [o.component for o in teola._plan(QUESTIONS[0]).trace.opaque] == ["format_docs"]
    embedding_proxy.take(), recording_proxy.take()
    for question in QUESTIONS[:2]:
        plain = chain.invoke(question)
        plain_sent = embedding_proxy.take(), recording_proxy.take()
        before = relayed(served_runtime, embed.engine) if embed.engine in served_runtime.local_engines() else 0
        assert teola.invoke(question) == plain and plain
        sent = embedding_proxy.take(), recording_proxy.take()
        assert [path for path, _ in plain_sent[0]] == ["/v1/embeddings"]
        assert bodies(sent[0]) == bodies(plain_sent[0]) and bodies(sent[1]) == bodies(plain_sent[1])
        assert relayed(served_runtime, embed.engine) == before + 1  # the served engine sent it
    assert asyncio.run(teola.ainvoke(QUESTIONS[0])) == chain.invoke(QUESTIONS[0])


def test_llama_index_query_engine_with_served_embeddings_is_lowered_and_answers_alike(
        embedding_proxy, recording_proxy, served_runtime, passages):
    from llama_index.core import Document, Settings, VectorStoreIndex
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding
    from llama_index.llms.openai_like import OpenAILike

    from teola_plugin.llama_index import TeolaExecutor

    embedding_proxy.replay = True
    embed_model = OpenAILikeEmbedding(model_name=EMBEDDING_NAME, api_base=embedding_proxy.base_url, api_key="EMPTY")
    index = VectorStoreIndex.from_documents([Document(text=t, id_=str(i)) for i, t in enumerate(passages)],
                                            embed_model=embed_model)
    llm = OpenAILike(model=SERVED_NAME, api_base=recording_proxy.base_url, api_key="none", temperature=0.0,
                     max_tokens=24, is_chat_model=True, context_window=2048)
    engine = index.as_query_engine(llm=llm, similarity_top_k=2)
    executor = TeolaExecutor(runtime=served_runtime)
    app = executor.traced(engine)
    assert app.opaque == [], [str(n) for n in app.opaque]
    (embed,) = embed_nodes(app.graph)
    assert embed.engine.startswith("served:127.0.0.1:") and "embed_text" in embed.attrs
    embedding_proxy.take(), recording_proxy.take()
    for question in QUESTIONS[:2]:
        plain = engine.query(question)
        plain_sent = embedding_proxy.take(), recording_proxy.take()
        teola = executor.query(engine, question)
        sent = embedding_proxy.take(), recording_proxy.take()
        assert str(teola) == str(plain) and str(plain)
        assert [(n.node.node_id, n.score) for n in teola.source_nodes] == \
            [(n.node.node_id, n.score) for n in plain.source_nodes]
        assert [path for path, _ in plain_sent[0]] == ["/v1/embeddings"]
        assert bodies(sent[0]) == bodies(plain_sent[0]) and bodies(sent[1]) == bodies(plain_sent[1])
    assert relayed(served_runtime, embed.engine) >= 2
    teola = asyncio.run(executor.aquery(engine, QUESTIONS[0]))
    assert str(teola) == str(engine.query(QUESTIONS[0]))

    # Ingestion under Settings.executor: LlamaIndex's own batches (embed_batch_size 10), sent by the engine.
    Settings.executor = executor
    try:
        before = relayed(served_runtime, embed.engine)
        embedding_proxy.take()
        again = VectorStoreIndex.from_documents([Document(text=t, id_=str(i)) for i, t in enumerate(passages)],
                                                embed_model=embed_model)
        assert [len(body["input"]) for _, body in embedding_proxy.take()] == [10, 6]
        assert relayed(served_runtime, embed.engine) == before + 2
        def vectors(ix):  # node ids are new per build
            return sorted(map(tuple, ix.vector_store.data.embedding_dict.values()))

        assert vectors(again) == vectors(index)
        assert "its own batched requests, sent by the served engine" in executor.explain(again.as_retriever())
    finally:
        Settings.executor = None


def test_a_langgraph_nodes_served_embeddings_are_sent_by_the_engine(embedding_proxy, served_runtime, passages):
    """A node is user code: it runs as it is, and its store's ``OpenAIEmbeddings`` requests go
    through the served engine (same requests, same documents)."""
    from langgraph.graph import END, START, StateGraph

    embedding_proxy.replay = True
    store = InMemoryVectorStore.from_texts(passages, openai_embeddings(embedding_proxy.base_url))

    class State(TypedDict):
        question: str
        docs: list[str]

    def retrieve(state: State) -> dict:
        return {"docs": [d.page_content for d in store.similarity_search(state["question"], k=2)]}

    graph = StateGraph(State).add_node("retrieve", retrieve).add_edge(START, "retrieve") \
        .add_edge("retrieve", END).compile()
    embedding_proxy.take()
    plain = graph.invoke({"question": QUESTIONS[1]})
    plain_sent = embedding_proxy.take()
    teola = TeolaRunnable(graph, runtime=served_runtime).invoke({"question": QUESTIONS[1]})
    assert teola == plain and len(plain["docs"]) == 2
    assert bodies(embedding_proxy.take()) == bodies(plain_sent)
    engines = [e for e in served_runtime.local_engines().values()
               if getattr(e, "base_url", None) == embedding_proxy.base_url]
    assert engines and engines[0].describe()["relayed"] >= 1


def test_v1_rag_agents_retrieve_through_the_engine_with_plains_requests(embedding_proxy, recording_proxy,
                                                                        served_runtime, passages):
    """LangChain's v1 RAG tutorial, both forms: a ``@dynamic_prompt`` middleware that searches
    the store and puts the documents in the system prompt, and an agent whose model must call
    a retrieval tool (``tool_choice="required"`` on its first turn, by a ``wrap_model_call``
    middleware: valid by construction). The agent runs as plain; its searches' embedding
    requests and its model requests are sent by Teola's served engines, with plain's bodies."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import ModelRequest, dynamic_prompt, wrap_model_call
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    embedding_proxy.replay = True
    store = InMemoryVectorStore.from_texts(passages, openai_embeddings(embedding_proxy.base_url))
    def model(max_tokens: int) -> ChatOpenAI:
        return ChatOpenAI(model=SERVED_NAME, base_url=recording_proxy.base_url, api_key="EMPTY", temperature=0,
                          max_tokens=max_tokens)

    @dynamic_prompt
    def prompt_with_context(request: ModelRequest) -> str:
        docs = store.similarity_search(request.state["messages"][-1].text, k=2)
        return "Use the following context in your response:\n\n" + "\n\n".join(d.page_content for d in docs)

    @tool(response_format="content_and_artifact")
    def retrieve_context(query: str):
        """Retrieve information to help answer a query."""
        docs = store.similarity_search(query, k=2)
        return "\n\n".join(d.page_content for d in docs), docs

    @wrap_model_call
    def search_first(request: ModelRequest, handler):
        if not any(m.type == "tool" for m in request.messages):
            request = request.override(tool_choice="required")
        return handler(request)

    def messages(state: dict) -> list:  # tool call ids are the server's random ones
        return [(m.type, m.content, [(c["name"], c["args"]) for c in getattr(m, "tool_calls", [])])
                for m in state["messages"]]

    def without_ids(body: dict) -> str:  # a request body, less the tool call ids the server drew
        return re.sub(r'"(id|tool_call_id)": "chatcmpl-tool-[0-9a-f]+"', "ID", json.dumps(body, sort_keys=True))

    def all_relayed() -> int:
        return sum(engine.describe()["relayed"] for name, engine in served_runtime.local_engines().items()
                   if name.startswith("served:"))

    runs = []
    # (the bundled model writes a short query's tool call in 80 tokens; a long one's loops on)
    for agent, asked in ((create_agent(model(48), tools=[], middleware=[prompt_with_context]), QUESTIONS[1]),
                         (create_agent(model(80), tools=[retrieve_context], middleware=[search_first]),
                          "Who is Josh Norman?")):
        question = {"messages": [("user", asked)]}
        embedding_proxy.take(), recording_proxy.take()
        plain = agent.invoke(question)
        plain_embedded, plain_sent = embedding_proxy.take(), recording_proxy.take()
        before = all_relayed()
        teola = TeolaRunnable(agent, runtime=served_runtime).invoke(question)
        assert messages(teola) == messages(plain)
        assert bodies(embedding_proxy.take()) == bodies(plain_embedded) and plain_embedded
        sent = recording_proxy.take()
        assert [without_ids(body) for _, body in sent] == [without_ids(body) for _, body in plain_sent] and plain_sent
        assert all_relayed() - before == len(sent) + len(plain_embedded)
        runs.append((plain, plain_sent))
    (_, with_context), (with_tool, _) = runs
    assert with_context[0][1]["messages"][0]["content"].startswith("Use the following context")
    assert [m.type for m in with_tool["messages"]][:3] == ["human", "ai", "tool"]  # the tool was called


@pytest.mark.parametrize("failure", ["500", "refused"])
def test_a_failing_embedding_server_raises_what_plain_raises(failure, embedding_proxy, served_runtime, passages):
    base_url = f"http://127.0.0.1:{free_port()}/v1" if failure == "refused" else embedding_proxy.base_url
    embeddings = openai_embeddings(base_url, max_retries=0)
    store = InMemoryVectorStore(embeddings)
    store.add_texts(passages[:2]) if failure == "500" else None
    retriever = store.as_retriever(search_kwargs={"k": 1})
    raised = []
    for run in (retriever.invoke, TeolaRunnable(retriever, runtime=served_runtime).invoke):
        embedding_proxy.fault = "500" if failure == "500" else None
        with pytest.raises(openai.APIError) as info:
            run(QUESTIONS[0])
        raised.append(type(info.value))
    assert raised[0] is raised[1], raised
    assert raised[0] is (openai.InternalServerError if failure == "500" else openai.APIConnectionError)
    if failure == "500":  # the next query is answered
        assert TeolaRunnable(retriever, runtime=served_runtime).invoke(QUESTIONS[0]) == retriever.invoke(QUESTIONS[0])


def test_an_embeddings_class_without_an_engine_keeps_the_search_lowered(recording_proxy, served_runtime, passages):
    """Any other embeddings class (here HuggingFaceEmbeddings computing other vectors than the
    embedder engine: not normalized) runs its own ``embed_query`` as an opaque step; in a chain
    that runs as a graph (its model is lowered) the search on the user's store stays a lowered
    primitive, with plain's documents. A retriever alone gains nothing: it runs as it is."""
    from langchain_huggingface import HuggingFaceEmbeddings

    from teola_plugin.engines.embedder import default_model_path

    embeddings = HuggingFaceEmbeddings(model_name=str(default_model_path()),
                                       encode_kwargs={"normalize_embeddings": False})
    retriever = InMemoryVectorStore.from_texts(passages, embeddings).as_retriever(search_kwargs={"k": 2})
    chain = docs_rag_chain(retriever, recording_proxy.base_url, max_tokens=16)
    teola = TeolaRunnable(chain, runtime=served_runtime)
    plan = teola._plan(QUESTIONS[0])
    ops = [p.op.value for p in plan.graph.nodes]
    assert plan.uses_engines and "vector_search" in ops and "embed" not in ops
    assert sorted(n.component for n in plan.trace.opaque) == ["HuggingFaceEmbeddings", "format_docs"]
    for question in QUESTIONS[:2]:
        assert teola.invoke(question) == chain.invoke(question)
    assert not TeolaRunnable(retriever, runtime=served_runtime)._plan(QUESTIONS[0]).uses_engines

"""TeolaRunnable on composite retrievers and other stores / models, on real engines.

Ensemble (weighted reciprocal rank fusion by the retriever's own code), merger (LOTR), contextual
compression with the plugin's ``TeolaReranker`` (lowered to ``rerank``) or another
compressor (opaque), a Chroma store searched in place, and LangChain's ``VLLM`` mapped
onto the session's vLLM engine. Same documents, same prompts, same outputs as LangChain.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from langchain_classic.retrievers import ContextualCompressionRetriever, EnsembleRetriever
from langchain_classic.retrievers.document_compressors import EmbeddingsFilter
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnablePassthrough

from teola_plugin import datasets
from teola_plugin.capture.langchain import InputLayout
from teola_plugin.langchain import TeolaEmbeddings, TeolaLLM, TeolaReranker, TeolaRunnable
from teola_plugin.runtime.policies import Priority
from tests.test_langchain import QA_TEMPLATE, QUESTIONS, engine_prompts, format_docs, retriever  # noqa: F401


class TitleRetriever(BaseRetriever):
    """A keyword retriever the tracer does not know (runs opaque): passages whose title
    shares a word with the query, in corpus order."""

    passages: list
    k: int = 3

    def _get_relevant_documents(self, query, *, run_manager):
        from langchain_core.documents import Document

        words = {w.strip("?,.").lower() for w in query.split()}
        hits = [p for p in self.passages if words & {w.lower() for w in p.title.replace("_", " ").split()}]
        return [Document(page_content=p.text, metadata={"title": p.title}, id=p.id) for p in hits[:self.k]]


@pytest.fixture(scope="module")
def passages():
    return datasets.load_corpus("squad-xquad-en")[:30]


def ops_of(fast, x):
    return [p.op.value for p in fast.trace(x)]


def test_ensemble_fuses_the_same_lists_the_same_way(runtime, retriever, passages):
    keyword = TitleRetriever(passages=passages)
    ensemble = EnsembleRetriever(retrievers=[retriever, keyword], weights=[0.6, 0.4])
    fast = TeolaRunnable(ensemble, runtime=runtime)
    for q in QUESTIONS:
        expected = ensemble.invoke(q)
        assert fast.invoke(q) == expected and expected
    ops = ops_of(fast, QUESTIONS[0])
    assert {"embed", "vector_search"} <= set(ops)
    opaque = fast.explain(QUESTIONS[0]).split("Opaque components")[1]
    assert "TitleRetriever" in opaque and "rank_fusion" not in opaque and "Ensemble" not in opaque


def test_a_merger_retriever_interleaves_the_same_lists_and_reports_its_runs(runtime, retriever, passages):
    """``MergerRetriever`` (LOTR): each retriever a parallel branch (the vector one lowered),
    merged by its own interleaving; the same documents and callback runs as plain's."""
    from langchain_classic.retrievers.merger_retriever import MergerRetriever

    from tests.run_trees import RunTreeRecorder

    wide = retriever.vectorstore.as_retriever(search_kwargs={"k": 4})
    lotr = MergerRetriever(retrievers=[retriever, TitleRetriever(passages=passages, k=2), wide])
    fast = TeolaRunnable(lotr, runtime=runtime)
    for q in QUESTIONS:
        plain_runs, teola_runs = RunTreeRecorder(), RunTreeRecorder()
        expected = lotr.invoke(q, {"callbacks": [plain_runs]})
        assert fast.invoke(q, {"callbacks": [teola_runs]}) == expected and len(expected) >= 6
        assert teola_runs.tree() == plain_runs.tree()
    assert ops_of(fast, QUESTIONS[0]).count("vector_search") == 2
    opaque = fast.explain(QUESTIONS[0]).split("Opaque components")[1]
    assert "TitleRetriever" in opaque and "Merger" not in opaque


def test_reranker_compression_is_lowered_and_equals_the_compressor(runtime, retriever):
    wide = retriever.vectorstore.as_retriever(search_kwargs={"k": 6})
    reranker = TeolaReranker(runtime=runtime, top_n=2)
    compression = ContextualCompressionRetriever(base_compressor=reranker, base_retriever=wide)
    prompt = PromptTemplate.from_template(QA_TEMPLATE)
    chain = ({"context": compression | format_docs, "question": RunnablePassthrough()}
             | prompt | TeolaLLM(runtime=runtime, max_tokens=10) | StrOutputParser())
    fast_retriever = TeolaRunnable(compression, runtime=runtime)
    for q in QUESTIONS:
        expected = compression.invoke(q)
        got = fast_retriever.invoke(q)
        assert got == expected and len(got) == 2
        assert all("relevance_score" in d.metadata for d in got)
        assert got[0].metadata["relevance_score"] >= got[1].metadata["relevance_score"]
        docs = wide.invoke(q)  # the compressor on its own: the same documents
        assert list(reranker.compress_documents(docs, q)) == expected
        assert all("relevance_score" not in d.metadata for d in docs)  # the caller's docs unchanged
    assert "rerank" in ops_of(fast_retriever, QUESTIONS[0])
    assert "Opaque components: none" in fast_retriever.explain(QUESTIONS[0])
    assert TeolaRunnable(chain, runtime=runtime).invoke(QUESTIONS[1]) == chain.invoke(QUESTIONS[1])


def test_an_embeddings_filter_embeds_on_the_engine_and_filters_as_plain(runtime, retriever):
    """``EmbeddingsFilter`` (LangChain's contextual-compression docs): the documents' and the
    query's embeddings on the embedder engine, then its own filtering; the same documents,
    in the same order, with the same similarity states, by ``k`` and by threshold (one between
    the scores: it keeps some and drops others)."""
    wide = retriever.vectorstore.as_retriever(search_kwargs={"k": 6})
    embeddings = TeolaEmbeddings(runtime=runtime)
    scores = [d.state["query_similarity_score"] for d in
              EmbeddingsFilter(embeddings=embeddings, k=6).compress_documents(wide.invoke(QUESTIONS[0]), QUESTIONS[0])]
    for compressor in (EmbeddingsFilter(embeddings=embeddings, similarity_threshold=float(scores[0] + scores[-1]) / 2),
                       EmbeddingsFilter(embeddings=embeddings, k=2)):
        compression = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=wide)
        fast = TeolaRunnable(compression, runtime=runtime)
        assert fast._plan(QUESTIONS[0]).trace.opaque == []
        assert ops_of(fast, QUESTIONS[0]).count("embed") == 3  # the search's query, the documents, the query
        for q in QUESTIONS[:2]:
            expected = compression.invoke(q)
            got = fast.invoke(q)
            assert got == expected and [d.state["query_similarity_score"] for d in got] == pytest.approx(
                [d.state["query_similarity_score"] for d in expected], abs=1e-5)
        assert 0 < len(compression.invoke(QUESTIONS[0])) < 6
    # HuggingFaceEmbeddings of the embedder's model, as the docs write it: the engine batches
    # the texts its own way, so the vectors (kept in each document's state) agree to 1e-5
    from langchain_huggingface import HuggingFaceEmbeddings

    from teola_plugin.engines.embedder import default_model_path

    compressor = EmbeddingsFilter(embeddings=HuggingFaceEmbeddings(model_name=str(default_model_path())), k=3)
    compression = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=wide)
    fast = TeolaRunnable(compression, runtime=runtime)
    assert fast._plan(QUESTIONS[0]).trace.opaque == []
    for q in QUESTIONS[:2]:
        expected, got = compression.invoke(q), fast.invoke(q)
        assert [(d.page_content, d.metadata) for d in got] == [(d.page_content, d.metadata) for d in expected]
        for mine, theirs in zip(got, expected):
            assert mine.state["query_similarity_score"] == pytest.approx(theirs.state["query_similarity_score"], abs=1e-5)
            assert mine.state["embedded_doc"] == pytest.approx(theirs.state["embedded_doc"], abs=1e-5)


def test_other_compressors_run_unchanged_with_a_reason(runtime, retriever):
    from langchain_core.documents.compressor import BaseDocumentCompressor

    class FirstTwo(BaseDocumentCompressor):
        def compress_documents(self, documents, query, callbacks=None):
            return list(documents)[:2]

    compression = ContextualCompressionRetriever(base_compressor=FirstTwo(), base_retriever=retriever)
    fast = TeolaRunnable(compression, runtime=runtime)
    for q in QUESTIONS[:2]:
        assert fast.invoke(q) == compression.invoke(q)
    explanation = fast.explain(QUESTIONS[0])
    assert "FirstTwo" in explanation and "is not a TeolaReranker" in explanation
    assert "vector_search" in ops_of(fast, QUESTIONS[0])  # the base retriever is still lowered


def test_chroma_store_is_searched_in_place(runtime, passages):
    from langchain_chroma import Chroma

    store = Chroma(collection_name="teola_lc_test", embedding_function=TeolaEmbeddings(runtime=runtime))
    try:
        store.add_texts([p.text for p in passages], metadatas=[{"title": p.title} for p in passages],
                        ids=[p.id for p in passages])
        chroma = store.as_retriever(search_kwargs={"k": 3})
        fast = TeolaRunnable(chroma, runtime=runtime)
        for q in QUESTIONS:
            expected = chroma.invoke(q)
            assert fast.invoke(q) == expected and len(expected) == 3
        assert ops_of(fast, QUESTIONS[0]) == ["opaque", "aggregate", "embed", "vector_search", "aggregate", "opaque"]
        # the store's own filter and MMR, as its text searches pass them on to its search by vector
        title = passages[0].title
        for search in (store.as_retriever(search_kwargs={"k": 2, "filter": {"title": title}}),
                       store.as_retriever(search_type="mmr", search_kwargs={"k": 3, "fetch_k": 8})):
            fast = TeolaRunnable(search, runtime=runtime)
            assert fast.invoke(QUESTIONS[0]) == search.invoke(QUESTIONS[0]) != []
            assert "vector_search" in ops_of(fast, QUESTIONS[0]) and fast._plan(QUESTIONS[0]).trace.opaque == []
        # the relevance-score search: Chroma's relevance function on its scored search by
        # vector, then the threshold (one between the top scores: it drops some documents)
        scores = [s for _, s in store.similarity_search_with_relevance_scores(QUESTIONS[0], k=3)]
        for score_threshold in ((scores[0] + scores[-1]) / 2, 1.5):
            search = store.as_retriever(search_type="similarity_score_threshold",
                                        search_kwargs={"k": 3, "score_threshold": score_threshold})
            fast = TeolaRunnable(search, runtime=runtime)
            assert fast._plan(QUESTIONS[0]).trace.opaque == [] and "vector_search" in ops_of(fast, QUESTIONS[0])
            expected = search.invoke(QUESTIONS[0])
            assert fast.invoke(QUESTIONS[0]) == expected
            assert (0 < len(expected) < 3) if score_threshold < 1 else expected == []
    finally:
        store.delete_collection()


def test_in_memory_mmr_and_filtered_searches_are_lowered_with_the_stores_own_search(runtime, retriever):
    """The retriever-configuration patterns of LangChain's docs (``search_type="mmr"``, a
    ``filter`` in ``search_kwargs``): the query embedding on the engine, then the store's own
    MMR / filtered search by vector; same documents as the retriever gives."""
    store = retriever.vectorstore
    wanted = {d.metadata["title"] for d in retriever.invoke(QUESTIONS[0])}
    searches = [store.as_retriever(search_type="mmr", search_kwargs={"k": 3, "fetch_k": 10, "lambda_mult": 0.3}),
                store.as_retriever(search_kwargs={"k": 2, "filter": lambda doc: doc.metadata["title"] in wanted}),
                store.as_retriever(search_kwargs={"k": 2, "filter": lambda doc: doc.metadata["title"] not in wanted})]
    for search in searches:
        fast = TeolaRunnable(search, runtime=runtime)
        assert fast._plan(QUESTIONS[0]).trace.opaque == []
        for q in QUESTIONS:
            assert fast.invoke(q) == search.invoke(q) != []
    assert {d.metadata["title"] for d in TeolaRunnable(searches[2], runtime=runtime).invoke(QUESTIONS[0])} \
        .isdisjoint(wanted)  # the filter ran
    # InMemoryVectorStore has no relevance function: plain's relevance-score search raises
    threshold = store.as_retriever(search_type="similarity_score_threshold", search_kwargs={"score_threshold": 0.1})
    with pytest.raises(NotImplementedError):
        threshold.invoke(QUESTIONS[0])
    with pytest.raises(NotImplementedError):
        TeolaRunnable(threshold, runtime=runtime).invoke(QUESTIONS[0])


class EngineClient:
    """Stands in for the ``vllm.LLM`` that ``VLLM`` would load in-process (a second copy of
    the model does not fit this test machine): the same generation on the session's vLLM
    engine, with the ``SamplingParams`` that ``VLLM._generate`` built."""

    def __init__(self, runtime):
        self.runtime = runtime

    def generate(self, prompts, sampling_params):
        pool = self.runtime.engines("llm")

        async def one(prompt):
            generation, _ = await pool.submit("generate", {"prompt": prompt, "params": sampling_params},
                                              Priority())
            return SimpleNamespace(outputs=[SimpleNamespace(text=generation.text)])

        return [self.runtime.run_sync(one(p)) for p in prompts]


def test_langchain_vllm_is_mapped_onto_the_engine_serving_its_model(runtime, engine_prompts):
    from langchain_community.llms import VLLM

    from teola_plugin.capture.vllm_identity import served_models

    served = served_models(runtime)["llm"]  # its model, loaded as the engine loads it (float32 on a CPU without bf16)
    # model_construct skips VLLM's validator, which would load the model in this process.
    vllm = VLLM.model_construct(model=served.model, dtype=served.dtype, temperature=0.0, max_new_tokens=12,
                                client=EngineClient(runtime))
    prompt = PromptTemplate.from_template("Q: {question}\nA:")
    chain = prompt | vllm.bind(stop=["\n"]) | StrOutputParser()
    fast = TeolaRunnable(chain, runtime=runtime)
    for q in QUESTIONS[:2]:
        engine_prompts.clear()
        expected = chain.invoke({"question": q})
        plain_prompts = list(engine_prompts)
        engine_prompts.clear()
        assert fast.invoke({"question": q}) == expected
        assert engine_prompts == plain_prompts == [prompt.invoke({"question": q}).to_string()]
    (prefill,) = [p for p in fast.trace({"question": "x"}) if p.op.value == "llm_prefill"]
    assert prefill.engine == "llm" and prefill.attrs["sampling_params"]["stop"] == ["\n"]
    assert "Opaque components: none" in fast.explain({"question": "x"})
    other = VLLM.model_construct(model="some/other-model", max_new_tokens=12)
    explanation = TeolaRunnable(prompt | other, runtime=runtime).explain({"question": "x"})
    assert "VLLM" in explanation and "is not the model of a Teola LLM engine" in explanation


def test_a_store_built_per_request_is_not_kept_alive_by_the_runtime(runtime, passages):
    """A LangChain app that indexes each request's documents in a fresh store: when the app
    lets the store (and its chain) go, the runtime drops the engine serving it."""
    import gc
    import weakref

    from langchain_core.vectorstores import InMemoryVectorStore

    def one_request() -> tuple[weakref.ref, str]:
        store = InMemoryVectorStore(TeolaEmbeddings(runtime=runtime))
        store.add_texts([p.text for p in passages[:6]], ids=[p.id for p in passages[:6]])
        retriever = store.as_retriever(search_kwargs={"k": 2})
        got = TeolaRunnable(retriever, runtime=runtime).invoke(QUESTIONS[0])
        assert got == retriever.invoke(QUESTIONS[0]) and len(got) == 2
        (name,) = [n for n in runtime.local_engines() if n == f"langchain_store_{id(store):x}"]
        return weakref.ref(store), name

    store, name = one_request()
    gc.collect()
    assert store() is None, "the runtime kept the per-request store alive"
    assert name not in runtime.local_engines()


def test_a_lowered_retriever_reports_its_run_as_plain(runtime, retriever):
    """``on_retriever_start`` / ``on_retriever_end`` of a lowered retriever: the name, tags
    (the caller's, the retriever's and its sequence step's), tracing metadata and documents
    ``BaseRetriever.invoke`` reports; ``astream_events`` lists the same retriever events."""
    import asyncio

    from langchain_core.callbacks import BaseCallbackHandler

    class Heard(BaseCallbackHandler):
        def __init__(self) -> None:
            self.runs: list = []

        def on_retriever_start(self, serialized, query, **kwargs) -> None:
            self.runs.append(("start", query, kwargs["name"], sorted(kwargs["tags"]), kwargs["metadata"]))

        def on_retriever_end(self, documents, **kwargs) -> None:
            self.runs.append(("end", [d.page_content for d in documents]))

    chain = RunnablePassthrough() | retriever
    fast = TeolaRunnable(chain, runtime=runtime)
    assert "vector_search" in ops_of(fast, QUESTIONS[0])
    heard = []
    for run in (chain.invoke, fast.invoke):
        handler = Heard()
        run(QUESTIONS[0], config={"callbacks": [handler], "tags": ["mine"], "metadata": {"user": "u"}})
        heard.append(handler.runs)
    assert heard[1] == heard[0] and [r[0] for r in heard[0]] == ["start", "end"], heard
    assert "seq:step:2" in heard[0][0][3] and heard[0][0][4]["ls_vector_store_provider"]

    async def retriever_events(runnable) -> list:
        return [(e["event"], e["name"]) async for e in runnable.astream_events(QUESTIONS[0], version="v2")
                if "retriever" in e["event"]]

    assert asyncio.run(retriever_events(fast)) == asyncio.run(retriever_events(chain)) != []


def test_a_parent_document_retriever_searches_its_chunks_lowered_and_returns_their_parents(runtime, passages):
    """``ParentDocumentRetriever`` as LangChain's how-to builds it (small chunks in a vector
    store, the whole documents in an ``InMemoryStore``): the chunks' search is lowered
    (similarity and MMR), the parents come from its docstore by its own rule; the same
    documents as plain under invoke and ainvoke. A subclass that redefines its search runs
    as it is, and ``explain()`` says why."""
    import asyncio

    from langchain_classic.retrievers import ParentDocumentRetriever
    from langchain_classic.retrievers.multi_vector import SearchType
    from langchain_core.documents import Document
    from langchain_core.stores import InMemoryStore
    from langchain_core.vectorstores import InMemoryVectorStore
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    parents = ParentDocumentRetriever(vectorstore=InMemoryVectorStore(TeolaEmbeddings(runtime=runtime)),
                                      docstore=InMemoryStore(),
                                      child_splitter=RecursiveCharacterTextSplitter(chunk_size=200))
    parents.add_documents([Document(page_content=p.text, metadata={"title": p.title}) for p in passages[:12]],
                          ids=[p.id for p in passages[:12]])
    mmr = ParentDocumentRetriever(vectorstore=parents.vectorstore, docstore=parents.docstore,
                                  child_splitter=parents.child_splitter, search_type=SearchType.mmr,
                                  search_kwargs={"k": 6, "fetch_k": 12})
    for retriever in (parents, mmr):
        fast = TeolaRunnable(retriever, runtime=runtime)
        assert fast._plan(QUESTIONS[0]).trace.opaque == [] and {"embed", "vector_search"} <= set(ops_of(fast, QUESTIONS[0]))
        for q in QUESTIONS:
            expected = retriever.invoke(q)
            assert fast.invoke(q) == expected and asyncio.run(fast.ainvoke(q)) == expected
            assert expected and all(d.page_content in {p.text for p in passages} for d in expected)  # whole parents
    # a relevance-score search of the chunks: lowered, and plain's error from this store (it has no
    # relevance function)
    scored = ParentDocumentRetriever(vectorstore=parents.vectorstore, docstore=parents.docstore,
                                     child_splitter=parents.child_splitter,
                                     search_type=SearchType.similarity_score_threshold,
                                     search_kwargs={"score_threshold": 0.1})
    fast = TeolaRunnable(scored, runtime=runtime)
    assert fast._plan(QUESTIONS[0]).trace.opaque == []
    for run in (scored, fast):
        with pytest.raises(NotImplementedError):
            run.invoke(QUESTIONS[0])

    class FirstOnly(ParentDocumentRetriever):
        def _get_relevant_documents(self, query, *, run_manager):
            return super()._get_relevant_documents(query, run_manager=run_manager)[:1]

    mine = FirstOnly(vectorstore=parents.vectorstore, docstore=parents.docstore, child_splitter=parents.child_splitter)
    fast = TeolaRunnable(mine, runtime=runtime)
    assert fast.invoke(QUESTIONS[0]) == mine.invoke(QUESTIONS[0])
    assert "redefines _get_relevant_documents" in fast.explain(QUESTIONS[0])


def test_a_retrievers_settings_changed_between_calls_take_effect_as_in_plain(runtime, retriever):
    """A plan is kept per input layout, but a retriever changed after the first call (its
    ``k``, its search type) searches as plain does from the next call on; unchanged, the
    kept plan is reused, not traced again."""
    own = retriever.vectorstore.as_retriever(search_kwargs={"k": 2})
    fast = TeolaRunnable(own, runtime=runtime)
    q = QUESTIONS[0]
    assert fast.invoke(q) == own.invoke(q) and len(own.invoke(q)) == 2
    kept = fast._known_plan(InputLayout.of(q))
    fast.invoke(q)
    assert fast._known_plan(InputLayout.of(q)) is kept
    own.search_kwargs["k"] = 1
    assert fast.invoke(q) == own.invoke(q) and len(own.invoke(q)) == 1
    own.search_kwargs.update(k=2, fetch_k=8, lambda_mult=0.0)
    similar = own.invoke(q)
    own.search_type = "mmr"
    diverse = own.invoke(q)
    assert diverse != similar  # the change shows in plain, so the comparison below means something
    assert fast.invoke(q) == diverse
    assert "vector_search" in {p.op.value for p in fast.trace(q)}

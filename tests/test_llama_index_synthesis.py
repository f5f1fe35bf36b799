"""Tree summarize and accumulate under TeolaExecutor vs plain LlamaIndex, on the real engines.

A small ``PromptHelper`` context window makes tree summarize pack the retrieved passages
into several chunks, so it really runs two levels (independent first-level calls, then a
summary of their summaries). Independent calls reach vLLM concurrently under Teola, in
an order that is not fixed, so prompts are compared as multisets.

vLLM batching alone changes greedy tokens (observed: one of three tree-summarize
first-level answers differs with the batch it is decoded in, even between two
concurrent runs). So the requests that do not depend on an earlier answer (every
accumulate call, the first tree level) are compared exactly, with the node ids and the
number of calls; the answer text only where every call of the query is its own batch
(accumulate here, asserted when the answers match call by call).
"""

from __future__ import annotations

import pytest
from llama_index.core import Settings
from llama_index.core.indices.prompt_helper import PromptHelper
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.response_synthesizers import get_response_synthesizer
from llama_index.core.schema import QueryBundle

from tests.test_llama_index import (  # noqa: F401  (module fixtures reused)
    MAX_TOKENS,
    QUESTIONS,
    executor,
    ids,
    index,
    llm,
    plain_prompts,
    plain_settings,
    teola_prompts,
)

pytestmark = pytest.mark.slow
SMALL_WINDOW = 420  # tokens: four SQuAD passages need two or more packed chunks


def engine(index, llm, mode: str, use_async: bool, top_k: int = 4, **kwargs):
    synthesizer = get_response_synthesizer(
        llm=llm, response_mode=mode, use_async=use_async,
        prompt_helper=PromptHelper(context_window=SMALL_WINDOW, num_output=MAX_TOKENS), **kwargs)
    return RetrieverQueryEngine(index.as_retriever(similarity_top_k=top_k), response_synthesizer=synthesizer)


def multiset(prompts):
    return sorted(map(repr, prompts))


@pytest.mark.parametrize("mode,use_async", [("tree_summarize", False), ("accumulate", True),
                                            ("compact_accumulate", False)])
def test_same_calls_nodes_and_answer_as_plain_llamaindex(runtime, index, llm, executor, mode, use_async, capsys):
    query_engine = engine(index, llm, mode, use_async, verbose=True)
    question = QUESTIONS[0]
    capsys.readouterr()
    with plain_prompts() as sent_plain:
        plain = query_engine.query(question)
    printed = capsys.readouterr().out
    with teola_prompts(runtime) as sent_teola:
        teola = executor.query(query_engine, question)
    assert capsys.readouterr().out == printed  # verbose: a tree summarize's line per level
    if mode == "tree_summarize":
        assert printed.count("text chunks after repacking") == 2
        assert len(sent_plain) >= 3 and len(sent_teola) == len(sent_plain)  # >= two first-level calls + final
        first_level = slice(0, len(sent_plain) - 1)
        assert multiset(sent_teola[first_level]) == multiset(sent_plain[first_level])
    elif mode == "accumulate":
        assert len(sent_plain) == 4  # one call per node (each fits the window)
        assert multiset(sent_teola) == multiset(sent_plain)
    else:  # the nodes packed into fewer texts first, one call per packed text
        assert 2 <= len(sent_plain) < 4 and multiset(sent_teola) == multiset(sent_plain)
    assert not executor.traced(query_engine).opaque
    assert ids(teola.source_nodes) == ids(plain.source_nodes) and teola.metadata == plain.metadata
    if mode != "tree_summarize":  # Accumulate's own format: one numbered answer per call, in node order
        assert teola.response.count("Response ") == len(sent_plain) == plain.response.count("Response ")
        assert teola.response.startswith("Response 1: ")


def test_first_level_calls_are_independent(index, llm, executor):
    """The synthesize step's expansion: every first-level prefill depends on no other call."""
    query_engine = engine(index, llm, "tree_summarize", False)
    nodes = index.as_retriever(similarity_top_k=4).retrieve(QUESTIONS[0])
    graph = query_engine_planner(executor, query_engine).build_graph(QueryBundle(QUESTIONS[0]), nodes)
    prefills = [p.name for p in graph.nodes if p.op.value == "llm_prefill"]
    assert len(prefills) >= 2
    for name in prefills:
        assert not (set(ancestors(graph, name)) & set(prefills))
    assert any(p.name.startswith("summarize_next") for p in graph.nodes)  # the next level expands later
    text = executor.explain(query_engine)
    assert "synthesize (TreeSummarize)" in text and "Opaque components: none" in text


def query_engine_planner(executor, query_engine):
    from teola_plugin.capture.llama_index_synthesis import SynthesisPlanner

    llm = query_engine._response_synthesizer._llm
    return SynthesisPlanner(query_engine._response_synthesizer, llm, llm.teola_call_spec(), executor._prepare)


def ancestors(graph, name):
    seen, todo = set(), [name]
    while todo:
        for pred in graph.predecessors(todo.pop()):
            if pred not in seen:
                seen.add(pred)
                todo.append(pred)
    return seen


def test_streaming_tree_summarize_streams_the_final_call(runtime, index, llm, executor):
    query_engine = engine(index, llm, "tree_summarize", True, streaming=True)
    question = QUESTIONS[1]
    with plain_prompts() as sent_plain:
        plain_text = "".join(query_engine.query(question).response_gen)
    with teola_prompts(runtime) as sent_teola:
        tokens = list(executor.query(query_engine, question).response_gen)
    first_level = slice(0, len(sent_plain) - 1)
    assert len(sent_teola) == len(sent_plain) >= 3
    assert multiset(sent_teola[first_level]) == multiset(sent_plain[first_level])
    assert len(tokens) > 1 and plain_text  # the final call streamed, token by token


def test_generation_answers_from_the_query_alone_as_plain(runtime, index, llm, executor):
    """``response_mode="generation"``: one call of the query alone (the nodes only its
    sources), lowered, streaming too."""
    question = QUESTIONS[2]
    for streaming in (False, True):
        query_engine = engine(index, llm, "generation", False, streaming=streaming)
        assert not executor.traced(query_engine).opaque
        with plain_prompts() as sent_plain:
            plain = query_engine.query(question)
            plain_text = "".join(plain.response_gen) if streaming else plain.response
        with teola_prompts(runtime) as sent_teola:
            teola = executor.query(query_engine, question)
            tokens = list(teola.response_gen) if streaming else [teola.response]
        assert len(sent_plain) == 1 and sent_teola == sent_plain and question in repr(sent_plain[0])
        assert type(teola) is type(plain) and "".join(tokens) == plain_text and plain_text
        assert ids(teola.source_nodes) == ids(plain.source_nodes)


def test_streaming_accumulate_fails_as_in_llamaindex(index, llm, executor):
    query_engine = engine(index, llm, "accumulate", False, streaming=True)
    assert [n.component for n in executor.traced(query_engine).opaque] == ["Accumulate"]
    Settings.executor = executor
    with pytest.raises(ValueError, match="Unable to stream in Accumulate"):
        query_engine.query(QUESTIONS[0])


def test_streaming_with_an_output_parser_fails_as_in_llamaindex(runtime, index, executor):
    from llama_index.core.types import BaseOutputParser

    from teola_plugin.llama_index import TeolaLLM

    class Upper(BaseOutputParser):
        def parse(self, output: str) -> str:
            return output.upper()

        def format(self, query: str) -> str:
            return query

    parsed = TeolaLLM(runtime=runtime, max_tokens=8, output_parser=Upper())
    query_engine = RetrieverQueryEngine(index.as_retriever(similarity_top_k=2), response_synthesizer=(
        get_response_synthesizer(llm=parsed, response_mode="compact", streaming=True)))
    (note,) = executor.traced(query_engine).opaque
    assert "output parser" in note.reason

    def outcome() -> tuple[object, str]:  # LlamaIndex raises when the stream is read
        try:
            return "answered", "".join(query_engine.query(QUESTIONS[0]).response_gen)
        except Exception as exc:  # noqa: BLE001 - compared below
            return type(exc), str(exc)

    plain = outcome()
    Settings.executor = executor
    assert outcome() == plain
    assert plain[0] is NotImplementedError and "Output parser is not supported for streaming" in plain[1]


def test_streaming_refine_streams_its_last_call(runtime, index, llm, executor):
    """Two nodes, two sequential refine calls: the second one (in a later expansion) streams."""
    query_engine = index.as_query_engine(llm=llm, similarity_top_k=2, response_mode="refine", streaming=True)
    question = QUESTIONS[2]
    with plain_prompts() as sent_plain:
        plain_text = "".join(query_engine.query(question).response_gen)
    with teola_prompts(runtime) as sent_teola:
        tokens = list(executor.query(query_engine, question).response_gen)
    assert sent_teola == sent_plain and len(sent_plain) == 2  # one call at a time: same requests
    assert len(tokens) > 1 and "".join(tokens) == plain_text

"""``SubQuestionQueryEngine`` as LlamaIndex's docs build it, on the session's vLLM server.

Two indexes (Super Bowl and BSkyB passages, ``HuggingFaceEmbedding``), one
``QueryEngineTool`` each, ``LLMQuestionGenerator`` over ``OpenAILike``. The question
generator's requests carry vLLM structured outputs (a JSON schema of the sub-question list),
as an app asks for valid JSON from a small model, so its sub-questions parse by construction
in plain and Teola runs alike. Plain and Teola must send the same request bodies (as
multisets), answer alike from the same replies (the proxy replays plain's replies to Teola's
identical requests: vLLM's numerics vary with the batch), and the Teola run must run the
sub-queries at the same time.
"""

from __future__ import annotations

import pytest
from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.callbacks import CallbackManager, CBEventType, EventPayload, LlamaDebugHandler
from llama_index.core.query_engine import CustomQueryEngine, SubQuestionQueryEngine
from llama_index.core.question_gen import LLMQuestionGenerator
from llama_index.core.question_gen.types import BaseQuestionGenerator, SubQuestion
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.tools import QueryEngineTool, ToolMetadata

from teola_plugin import datasets
from tests.test_llama_index import executor, plain_settings  # noqa: F401
from tests.test_served_models import bodies, embed_model, openai_like  # noqa: F401

pytestmark = pytest.mark.slow

QUESTION = "Who won Super Bowl 50, and what did BSkyB launch in 1998?"
SUB_QUESTIONS = ["Who won Super Bowl 50?", "What did BSkyB launch in 1998?"]


def sub_question_schema(tools: list[str]) -> dict:
    item = {"type": "object", "additionalProperties": False, "required": ["sub_question", "tool_name"],
            "properties": {"sub_question": {"enum": SUB_QUESTIONS}, "tool_name": {"enum": tools}}}
    return {"type": "array", "minItems": 2, "maxItems": 2, "items": item}


def question_gen(base_url: str, tools: list[str]) -> LLMQuestionGenerator:
    llm = openai_like(base_url, is_chat_model=True, context_window=2048, max_tokens=96,
                      additional_kwargs={"extra_body": {"structured_outputs": {"json": sub_question_schema(tools)}}})
    return LLMQuestionGenerator.from_defaults(llm=llm)


@pytest.fixture(scope="module")
def indexes(embed_model):
    corpus = datasets.load_corpus("squad-xquad-en")
    return {name: VectorStoreIndex.from_documents([Document(text=p.text, id_=p.id) for p in passages],
                                                  embed_model=embed_model)
            for name, passages in (("football", corpus[:8]), ("television", corpus[40:48]))}


def tools_of(indexes, llm) -> list[QueryEngineTool]:
    return [QueryEngineTool(query_engine=index.as_query_engine(llm=llm, similarity_top_k=2),
                            metadata=ToolMetadata(name=name, description=f"paragraphs about {name}"))
            for name, index in indexes.items()]


def answer_texts(response) -> list[str]:
    return [n.node.get_content() for n in response.source_nodes]


def test_sub_question_engine_is_lowered_and_answers_as_plain(recording_proxy, indexes, executor):
    """... and reports plain's callback events: the engine's docs read each sub-question's
    answer from ``LlamaDebugHandler.get_event_pairs(CBEventType.SUB_QUESTION)``; the tools'
    and the final synthesis' ``SYNTHESIZE`` events too."""
    llm = openai_like(recording_proxy.base_url, is_chat_model=True, context_window=2048, max_tokens=16)
    debug = LlamaDebugHandler()
    previous, Settings.callback_manager = Settings._callback_manager, CallbackManager([debug])  # as the docs set it
    try:
        engine = SubQuestionQueryEngine.from_defaults(
            query_engine_tools=tools_of(indexes, llm), llm=llm, use_async=False, verbose=False,
            question_gen=question_gen(recording_proxy.base_url, list(indexes)))
    finally:
        Settings._callback_manager = previous
    app = executor.traced(engine)
    assert app.opaque == [], [str(n) for n in app.opaque]
    explained = executor.explain(engine)
    assert "one sub-graph per generated sub-question" in explained and "tool football/" in explained

    def sub_answers() -> tuple[list[tuple[str, str, list[str]]], int]:
        pairs = [end.payload[EventPayload.SUB_QUESTION] for _, end in debug.get_event_pairs(CBEventType.SUB_QUESTION)]
        answers = sorted((p.sub_q.sub_question, p.answer, [n.node.node_id for n in p.sources]) for p in pairs)
        synthesized = len(debug.get_event_pairs(CBEventType.SYNTHESIZE))
        debug.flush_event_logs()
        return answers, synthesized

    debug.flush_event_logs()
    plain = engine.query(QUESTION)
    sent_plain = recording_proxy.take()
    plain_events = sub_answers()
    recording_proxy.replay = True  # Teola overlaps the sub-answers: same requests, plain's replies
    teola = executor.query(engine, QUESTION)
    sent_teola = recording_proxy.take()
    assert sub_answers() == plain_events and len(plain_events[0]) == 2
    assert all(q in SUB_QUESTIONS and answer for q, answer, _ in plain_events[0])
    assert plain_events[1] == 3  # each tool's answer and the final one
    assert type(teola) is type(plain) and str(teola) == str(plain) and str(plain)
    # 2 answer nodes ("Sub question: ...\nResponse: ...") then each sub-query's sources
    assert answer_texts(teola) == answer_texts(plain) and answer_texts(plain)[0].startswith("Sub question: ")
    assert len(sent_plain) >= 4 and bodies(sent_teola) == bodies(sent_plain)  # generation, 2 answers, synthesis

    # The two sub-queries overlapped: the second one's work (its query embedding) was ready to
    # run before the first one's answer was decoded; run one after the other, as plain runs
    # them, it would wait for that answer. (Not start times: those depend on the engines' queues.)
    spans = executor.runtime.timeline.spans([executor.last_query_id])
    embeds = sorted((s for s in spans if s.op == "embed"), key=lambda s: s.ready)
    answers = [s for s in spans if s.op == "llm_decode" and s.start > embeds[0].ready]
    assert len(embeds) == 2 and embeds[-1].ready < min(s.end for s in answers), (embeds, answers)


class Failing(CustomQueryEngine):
    """A tool whose query raises ValueError (user code Teola cannot see into)."""

    def custom_query(self, query_str: str):
        raise ValueError(f"no answer for {query_str!r}")


def test_failed_sub_queries_are_logged_and_left_out_as_plain(model_server, indexes, executor, caplog):
    llm = openai_like(model_server.base_url, is_chat_model=True, context_window=2048, max_tokens=16)
    tools = [tools_of(indexes, llm)[0], QueryEngineTool(query_engine=Failing(),
                                                        metadata=ToolMetadata(name="television", description="tv"))]
    for tool_names in (["television"], ["radio"]):  # a tool that raises; a tool that does not exist
        engine = SubQuestionQueryEngine.from_defaults(query_engine_tools=tools, llm=llm, verbose=False,
                                                      question_gen=question_gen(model_server.base_url, tool_names))
        caplog.clear()
        plain = engine.query(QUESTION)
        logged_plain = [r.getMessage() for r in caplog.records if "Failed to run" in r.getMessage()]
        caplog.clear()
        teola = executor.query(engine, QUESTION)
        logged_teola = [r.getMessage() for r in caplog.records if "Failed to run" in r.getMessage()]
        assert str(teola) == str(plain) == "Empty Response" and teola.source_nodes == plain.source_nodes == []
        assert sorted(logged_teola) == sorted(logged_plain) and len(logged_plain) == 2


class FixedQuestions(BaseQuestionGenerator):
    """A custom generator: its own code runs (opaque); the sub-queries are still Teola's."""

    def generate(self, tools, query):
        return [SubQuestion(sub_question=q, tool_name=t.name) for q, t in zip(SUB_QUESTIONS, tools)]

    async def agenerate(self, tools, query):
        return self.generate(tools, query)

    def _get_prompts(self):
        return {}

    def _update_prompts(self, prompts) -> None:
        pass


def test_custom_question_generator_runs_its_own_code(model_server, indexes, executor):
    llm = openai_like(model_server.base_url, is_chat_model=True, context_window=2048, max_tokens=16)
    engine = SubQuestionQueryEngine.from_defaults(query_engine_tools=tools_of(indexes, llm), llm=llm,
                                                  question_gen=FixedQuestions(), verbose=False)
    (note,) = executor.traced(engine).opaque
    assert note.component == "FixedQuestions" and "not lowered" in note.reason
    plain, teola = engine.query(QUESTION), executor.query(engine, QUESTION)
    assert str(teola) == str(plain) and answer_texts(teola) == answer_texts(plain)


@pytest.mark.parametrize("use_async", [False, True])
def test_a_verbose_engine_prints_plains_lines(use_async, recording_proxy, indexes, executor, capsys):
    """``verbose=True``: the sub-questions and answers printed as plain prints them: Q, A, Q, A
    one after the other; under ``use_async`` every question first, then the answers (in the
    order they finish in plain: compared as a set)."""
    llm = openai_like(recording_proxy.base_url, is_chat_model=True, context_window=2048, max_tokens=16)
    recording_proxy.replay = True  # concurrent answers: the same requests get plain's replies
    engine = SubQuestionQueryEngine.from_defaults(query_engine_tools=tools_of(indexes, llm), llm=llm,
                                                  question_gen=FixedQuestions(), verbose=True, use_async=use_async)
    printed = []
    for run in (engine.query, lambda q: executor.query(engine, q)):
        capsys.readouterr()
        run(QUESTION)
        printed.append([line for line in capsys.readouterr().out.splitlines() if "] Q: " in line or "] A: " in line])
    plain, teola = printed
    assert len(plain) == 4 and [line for line in teola if "Q: " in line] == [line for line in plain if "Q: " in line]
    if use_async:
        assert teola[:2] == plain[:2] and sorted(teola[2:]) == sorted(plain[2:])  # questions, then answers
    else:
        assert teola == plain and "Q: " in plain[0] and "A: " in plain[1]


class InnerRetrieval(CustomQueryEngine):
    """User code calling a retriever: the retriever still runs on Teola, lowered."""

    retriever: BaseRetriever

    def custom_query(self, query_str: str) -> str:
        return " | ".join(n.node.node_id for n in self.retriever.retrieve(query_str))


def test_an_opaque_engines_own_retriever_call_runs_lowered(indexes, executor):
    engine = InnerRetrieval(retriever=indexes["football"].as_retriever(similarity_top_k=2))
    (note,) = executor.traced(engine).opaque
    assert note.component == "InnerRetrieval"
    plain = engine.query(SUB_QUESTIONS[0])
    teola = executor.query(engine, SUB_QUESTIONS[0])
    assert str(teola) == str(plain) and str(plain).count(" | ") == 1
    inner = executor.runtime.timeline.spans([executor.last_query_id])  # the nested run: the latest started
    assert {"embed", "vector_search"} <= {s.op for s in inner}

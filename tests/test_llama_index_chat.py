"""Chat engines as ``index.as_chat_engine(...)`` builds them, on the session's vLLM server.

The chat engine runs its own code (memory, condensing, prompts) and the calls it makes run
on Teola: the retrieval graph, and the synthesizer's LLM calls (``get_response`` is
routed to ``TeolaExecutor.answer``). Plain and Teola turns must send the same request bodies,
answer alike, stream alike and leave the same memory after every turn, through
``executor.chat`` / ``achat`` / ``stream_chat`` / ``astream_chat`` and through the engine's
own methods under ``Settings.executor``. An agent over a query-engine tool runs as LlamaIndex runs
it, the tool's query on Teola.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from llama_index.core import Settings
from llama_index.core.chat_engine.types import AgentChatResponse, StreamingAgentChatResponse

from tests.test_llama_index import executor, plain_settings  # noqa: F401
from tests.test_served_models import bodies, embed_model, openai_like, squad_index  # noqa: F401

pytestmark = pytest.mark.slow

TURNS = ["How many points did the Panthers defense surrender?", "And who won the game?"]


def history(engine) -> list[tuple[str, str]]:
    return [(m.role.value, m.content) for m in engine.chat_history]


def stream_text(response: StreamingAgentChatResponse) -> list[str]:
    return list(response.response_gen)  # ends once the engine's own thread wrote the memory


async def astream_text(response: StreamingAgentChatResponse) -> list[str]:
    return [t async for t in response.async_response_gen()]  # ends once the memory is written


def turns(engine, chat, stream_chat, achat) -> list:
    """Two turns, a streamed turn and an async turn, as an app makes them."""
    answers = [chat(engine, t) for t in TURNS]
    streamed = stream_text(stream_chat(engine, "Where was it played?"))
    last = asyncio.run(achat(engine, "Who was the most valuable player?"))
    assert all(type(a) is AgentChatResponse for a in answers + [last])
    return [a.response for a in answers] + [streamed, last.response]


# ContextChatEngine answers as CondensePlusContextChatEngine does (a synthesizer over retrieved
# nodes, without the condense call): the two below cover both call paths.
@pytest.mark.parametrize("mode", ["condense_plus_context",
                                  pytest.param("condense_question", marks=pytest.mark.extended)])  # `make test-all`
def test_chat_engine_turns_send_plain_requests_and_leave_plain_memory(mode, recording_proxy, squad_index,
                                                                      executor):
    llm = openai_like(recording_proxy.base_url, is_chat_model=True, context_window=2048, max_tokens=12)
    plain_engine = squad_index.as_chat_engine(chat_mode=mode, llm=llm, similarity_top_k=2)
    teola_engine = squad_index.as_chat_engine(chat_mode=mode, llm=llm, similarity_top_k=2)
    plain = turns(plain_engine, lambda e, m: e.chat(m), lambda e, m: e.stream_chat(m), lambda e, m: e.achat(m))
    sent_plain = recording_proxy.take()
    teola = turns(teola_engine, executor.chat, executor.stream_chat, executor.achat)
    sent_teola = recording_proxy.take()
    assert teola == plain and all(plain)
    assert history(teola_engine) == history(plain_engine) and len(history(plain_engine)) == 8
    assert bodies(sent_teola) == bodies(sent_plain)
    answered = {s.op for s in executor.runtime.timeline.spans([executor.last_query_id])}
    assert {"llm_prefill", "llm_decode"} <= answered  # the last answer's calls ran on Teola


def test_chat_engine_under_settings_executor_and_async_streaming(recording_proxy, squad_index, executor):
    llm = openai_like(recording_proxy.base_url, is_chat_model=True, context_window=2048)
    plain_engine = squad_index.as_chat_engine(llm=llm, similarity_top_k=2)  # CondensePlusContextChatEngine
    teola_engine = squad_index.as_chat_engine(llm=llm, similarity_top_k=2)

    async def conversation(engine) -> list:
        first = (await engine.achat(TURNS[0])).response
        streamed = await astream_text(await engine.astream_chat(TURNS[1]))
        return [first, streamed]

    plain = asyncio.run(conversation(plain_engine))
    sent_plain = recording_proxy.take()
    Settings.executor = executor
    teola = asyncio.run(conversation(teola_engine))
    sent_teola = recording_proxy.take()
    assert teola == plain and len(plain[1]) > 1
    assert history(teola_engine) == history(plain_engine)
    assert bodies(sent_teola) == bodies(sent_plain)


def test_chat_engine_explain_and_bad_input(squad_index, executor, model_server):
    llm = openai_like(model_server.base_url, is_chat_model=True, context_window=2048)
    engine = squad_index.as_chat_engine(llm=llm)
    explained = executor.explain(engine)
    assert "retrieval (VectorIndexRetriever): lowered" in explained
    assert "the answer's LLM calls (OpenAILike): lowered" in explained
    assert ("the condense call (an LLM call on the history): LlamaIndex's own call; sent by Teola's engine "
            "for the model" in explained)
    with pytest.raises(TypeError, match="executor.chat"):
        executor.query(engine, TURNS[0])
    with pytest.raises(TypeError, match="has no graph of its own to trace: .* executor.explain"):
        executor.trace(engine)
    with pytest.raises(TypeError, match="chat takes a BaseChatEngine"):
        executor.chat(squad_index.as_query_engine(llm=llm), TURNS[0])


def test_an_agents_query_engine_tool_runs_the_engines_lowered_graph_with_plains_results(recording_proxy, squad_index,
                                                                                     executor):
    """A FunctionAgent over a QueryEngineTool, as LlamaIndex's starter writes it: under
    ``Settings.executor`` the tool's query is the executor's (retrieval and synthesis as a
    lowered graph on Teola's engines), the agent's turns, tool calls, tool results and sources
    are plain's, and past ``max_iterations`` it raises plain's error. The model must call the
    tool every turn (``tool_choice="required"``: vLLM constrains the call, so it is valid by
    construction)."""
    from llama_index.core.agent.workflow import AgentOutput, FunctionAgent, ToolCallResult
    from llama_index.core.tools import QueryEngineTool
    from workflows.errors import WorkflowRuntimeError

    answerer = openai_like(recording_proxy.base_url, is_chat_model=True, context_window=2048, max_tokens=12)
    caller = openai_like(recording_proxy.base_url, is_chat_model=True, max_tokens=80, is_function_calling_model=True,
                         additional_kwargs={"tool_choice": "required"})  # room for the constrained JSON

    async def run() -> list:
        tool = QueryEngineTool.from_defaults(squad_index.as_query_engine(llm=answerer, similarity_top_k=2),
                                             name="super_bowl", description="Answers questions about Super Bowl 50.")
        handler = FunctionAgent(tools=[tool], llm=caller, system_prompt="Answer briefly.").run(
            user_msg=TURNS[0], max_iterations=2)
        seen: list = []
        async for event in handler.stream_events():
            if isinstance(event, ToolCallResult):
                answer = event.tool_output.raw_output
                seen.append((event.tool_name, event.tool_kwargs, event.tool_output.content,
                             [(n.node.node_id, round(n.score, 4)) for n in answer.source_nodes]))
            elif isinstance(event, AgentOutput):
                seen.append([call.tool_name for call in event.tool_calls])
        with pytest.raises(WorkflowRuntimeError, match="Max iterations of 2 reached"):
            await handler
        return seen

    plain = asyncio.run(run())
    sent_plain = recording_proxy.take()
    Settings.executor = executor
    before = executor.last_query_id
    teola = asyncio.run(run())
    sent_teola = recording_proxy.take()
    assert teola == plain and [e for e in plain if isinstance(e, tuple)]  # the tool answered, with sources
    assert len(sent_teola) == len(sent_plain)
    # the same requests, but for the later turns' tool-call ids, which the server draws at random
    assert bodies([r for r in sent_teola if "tool_call" not in json.dumps(r)]) == \
        bodies([r for r in sent_plain if "tool_call" not in json.dumps(r)])
    assert executor.last_query_id != before
    ran = {s.op for s in executor.runtime.timeline.spans([executor.last_query_id])}
    assert {"embed", "vector_search", "llm_prefill", "llm_decode"} <= ran  # the tool's query, lowered


def test_explain_of_a_workflow_says_how_it_runs():
    """An agent or Workflow runs as LlamaIndex runs it (its steps are user code); explain says
    so instead of refusing the object."""
    from llama_index.core.workflow import StartEvent, StopEvent, Workflow, step

    from teola_plugin.llama_index import TeolaExecutor
    from teola_plugin.runtime.runtime import Runtime

    class Echo(Workflow):
        @step
        async def echo(self, ev: StartEvent) -> StopEvent:
            return StopEvent(result=ev.get("query"))

    runtime = Runtime({}, hosting="local")
    try:
        executor = TeolaExecutor(runtime, start_engines=False)
        text = executor.explain(Echo())
        with pytest.raises(TypeError, match="Echo has no graph of its own to trace"):
            executor.trace(Echo())
    finally:
        runtime.shutdown()
    assert text.startswith("TeolaExecutor plan for Echo") and "runs its steps as LlamaIndex does" in text
    assert "ordered by the steps left to the answer, a StopEvent: echo 1)" in text

"""``RouterQueryEngine`` as LlamaIndex's docs build it, on the session's vLLM server.

Two ``QueryEngineTool``s (Super Bowl and BSkyB indexes), an ``LLMSingleSelector`` /
``LLMMultiSelector`` over ``OpenAILike`` whose requests carry vLLM structured outputs (a
JSON schema of the selection list), so the selection parses by construction in plain and
Teola runs alike. Plain and Teola must send the same request bodies, answer alike and
report the same selection; a selection of nothing raises plain's ``ValueError``.
"""

from __future__ import annotations

import pytest
from llama_index.core.query_engine import RouterQueryEngine
from llama_index.core.selectors import LLMMultiSelector, LLMSingleSelector
from llama_index.core.base.base_selector import BaseSelector, SelectorResult, SingleSelection

from tests.test_llama_index import executor, plain_settings  # noqa: F401
from tests.test_llama_index_sub_question import answer_texts, indexes, tools_of  # noqa: F401
from tests.test_served_models import bodies, embed_model, openai_like  # noqa: F401

pytestmark = pytest.mark.slow

QUESTION = "Who won Super Bowl 50?"


def selector_llm(base_url: str, picks: int):
    item = {"type": "object", "additionalProperties": False, "required": ["choice", "reason"],
            "properties": {"choice": {"enum": [1, 2]}, "reason": {"type": "string", "maxLength": 40}}}
    schema = {"type": "array", "minItems": picks, "maxItems": picks, "items": item}
    return openai_like(base_url, is_chat_model=True, context_window=2048, max_tokens=80,
                       additional_kwargs={"extra_body": {"structured_outputs": {"json": schema}}})


@pytest.mark.parametrize("picks", [1, 2])
def test_router_is_lowered_and_answers_as_plain(picks, recording_proxy, indexes, executor):
    llm = openai_like(recording_proxy.base_url, is_chat_model=True, context_window=2048, max_tokens=16)
    selector_cls = LLMSingleSelector if picks == 1 else LLMMultiSelector
    router = RouterQueryEngine(selector=selector_cls.from_defaults(llm=selector_llm(recording_proxy.base_url, picks)),
                               query_engine_tools=tools_of(indexes, llm), llm=llm)
    assert executor.traced(router).opaque == []
    recording_proxy.replay = True  # several choices answer at once under Teola: plain's replies
    plain = router.query(QUESTION)
    sent_plain = recording_proxy.take()
    teola = executor.query(router, QUESTION)
    sent_teola = recording_proxy.take()
    assert type(teola) is type(plain) and str(teola) == str(plain) and str(plain)
    assert answer_texts(teola) == answer_texts(plain) and len(plain.source_nodes) == 2 * picks
    assert teola.metadata["selector_result"] == plain.metadata["selector_result"]
    assert len(plain.metadata["selector_result"].selections) == picks
    assert bodies(sent_teola) == bodies(sent_plain)
    assert len(sent_plain) == 1 + picks + (picks > 1)  # the selection, one answer per choice, the summary


def test_a_selection_of_nothing_raises_plains_value_error(model_server, indexes, executor):
    llm = openai_like(model_server.base_url, is_chat_model=True, context_window=2048, max_tokens=16)
    router = RouterQueryEngine(selector=LLMSingleSelector.from_defaults(llm=selector_llm(model_server.base_url, 0)),
                               query_engine_tools=tools_of(indexes, llm), llm=llm)
    for run in (router.query, lambda q: executor.query(router, q)):
        with pytest.raises(ValueError, match="Failed to select query engine"):
            run(QUESTION)


class Second(BaseSelector):
    """A custom selector (its own code runs, opaque); the chosen engine still runs lowered."""

    def _select(self, choices, query) -> SelectorResult:
        return SelectorResult(selections=[SingleSelection(index=1, reason="always the second")])

    async def _aselect(self, choices, query) -> SelectorResult:
        return self._select(choices, query)

    def _get_prompts(self):
        return {}

    def _update_prompts(self, prompts) -> None:
        pass


def test_a_custom_selector_runs_its_own_code_and_the_choice_runs_lowered(model_server, indexes, executor):
    llm = openai_like(model_server.base_url, is_chat_model=True, context_window=2048, max_tokens=16)
    router = RouterQueryEngine(selector=Second(), query_engine_tools=tools_of(indexes, llm), llm=llm)
    (note,) = executor.traced(router).opaque
    assert note.component == "Second"
    plain, teola = router.query(QUESTION), executor.query(router, QUESTION)
    assert str(teola) == str(plain) and answer_texts(teola) == answer_texts(plain)
    assert {"embed", "vector_search", "llm_decode"} <= {s.op for s in executor.runtime.timeline.spans(
        [executor.last_query_id])}


class BothAsyncOnly(BaseSelector):
    """Selects both engines; async only (its sync ``_select`` raises)."""

    def _select(self, choices, query) -> SelectorResult:
        raise RuntimeError("async only")

    async def _aselect(self, choices, query) -> SelectorResult:
        return SelectorResult(selections=[SingleSelection(index=0, reason="first"),
                                          SingleSelection(index=1, reason="second")])

    def _get_prompts(self):
        return {}

    def _update_prompts(self, prompts) -> None:
        pass


def test_an_async_query_runs_the_routers_own_async_selector_and_summarizer(model_server, indexes, executor):
    """Under ``aquery`` a custom selector's ``aselect`` and an unlowered summarizer's
    ``aget_response`` (``acombine_responses``) run, as plain's ``aquery`` runs them; the
    chosen engines still run lowered."""
    import asyncio

    from llama_index.core.response_synthesizers import TreeSummarize

    class JoinAsyncOnly(TreeSummarize):  # a subclass: its own code runs (not lowered)
        def get_response(self, *args, **kwargs):
            raise RuntimeError("async only")

        async def aget_response(self, query_str, text_chunks, **kwargs):
            return " | ".join(text_chunks)

    llm = openai_like(model_server.base_url, is_chat_model=True, context_window=2048, max_tokens=16)
    router = RouterQueryEngine(selector=BothAsyncOnly(), query_engine_tools=tools_of(indexes, llm), llm=llm,
                               summarizer=JoinAsyncOnly(llm=llm))
    plain = asyncio.run(router.aquery(QUESTION))
    teola = asyncio.run(executor.aquery(router, QUESTION))
    assert str(teola) == str(plain) and str(plain).count(" | ") == 1
    assert answer_texts(teola) == answer_texts(plain) and len(plain.source_nodes) == 4
    assert teola.metadata["selector_result"] == plain.metadata["selector_result"]
    for sync_query in (router.query, lambda q: executor.query(router, q)):
        with pytest.raises(RuntimeError, match="async only"):
            sync_query(QUESTION)

"""LlamaIndex's documented multi-step patterns as benchmark apps: a ``SubQuestionQueryEngine``
over two query-engine tools, and a two-turn ``condense_plus_context`` chat engine.

Both are written as LlamaIndex's docs write them. The sub-question generator asks the model
for JSON, so its calls carry vLLM's structured outputs (a JSON schema of the sub-question
list), as an app does to get valid JSON from a small model: ``extra_body`` on ``OpenAILike``,
``sampling_kwargs`` on ``TeolaLLM`` — the same constraint on every system.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from llama_index.core import Document, VectorStoreIndex, get_response_synthesizer
from llama_index.core.query_engine import SubQuestionQueryEngine
from llama_index.core.question_gen import LLMQuestionGenerator
from llama_index.core.tools import QueryEngineTool, ToolMetadata

from ...llama_index import TeolaLLM
from .base import Answer, Query, System
from .llama_apps import LlamaIndexApp, streamed_answer

HALVES = ("first_half", "second_half")  # the two tools: each searches half of the uploaded passages
QUESTION_TOKENS = 160  # the sub-question JSON: two items of at most SUB_QUESTION_CHARS each
SUB_QUESTION_CHARS = 120
FOLLOW_UP = "Which passage says so? Give its title."


def sub_question_schema() -> dict[str, Any]:
    """Two sub-questions, each for one of the tools: what ``SubQuestionOutputParser`` parses."""
    item = {"type": "object", "additionalProperties": False, "required": ["sub_question", "tool_name"],
            "properties": {"sub_question": {"type": "string", "minLength": 8, "maxLength": SUB_QUESTION_CHARS},
                           "tool_name": {"enum": list(HALVES)}}}
    return {"type": "array", "minItems": 2, "maxItems": 2, "items": item}


def _ref_doc_sources(response: Any) -> list[str]:
    """The uploaded passages an answer drew on (a sub-question engine's sub-answer nodes are
    made per run, with fresh ids, and are left out)."""
    return [n.node.ref_doc_id for n in response.source_nodes if n.node.ref_doc_id]


class SubQuestionDocQA(LlamaIndexApp):
    name = "li_sub_question"
    title = "9 Multi-hop QA by sub-questions (LlamaIndex SubQuestionQueryEngine)"
    n_docs = 40
    workload = ("HotpotQA question + 40 uploaded passages, split into two VectorStoreIndexes, one QueryEngineTool "
                "each (top 2, compact) -> LLMQuestionGenerator writes two sub-questions (JSON, constrained by a "
                "schema) -> each answered by its tool -> one synthesis over the sub-answers")

    def __init__(self, runtime: Any, max_tokens: int = 32, timeout_s: float = 600) -> None:
        super().__init__(runtime, max_tokens, timeout_s)
        self._question_llms: dict[bool, Any] = {}

    def question_llm(self) -> Any:
        """The question generator's model: the app's model, asked for the schema's JSON."""
        served = self.llm is not self.engine_models[0]
        if served not in self._question_llms:
            schema = {"json": sub_question_schema()}
            if served:
                self._question_llms[served] = self.llm.model_copy(update={
                    "max_tokens": QUESTION_TOKENS, "additional_kwargs": {"extra_body": {"structured_outputs": schema}}})
            else:
                self._question_llms[served] = TeolaLLM(self.runtime, max_tokens=QUESTION_TOKENS,
                                                       sampling_kwargs={"structured_outputs": schema})
        return self._question_llms[served]

    def query_engine(self, docs: list[Document], use_async: bool, streaming: bool = False) -> Any:
        half = len(docs) // 2
        tools = []
        for name, part in zip(HALVES, (docs[:half], docs[half:])):
            index = VectorStoreIndex.from_documents(part, embed_model=self.embed_model, use_async=use_async)
            titles = "; ".join(d.metadata["title"] for d in part)
            tools.append(QueryEngineTool(query_engine=index.as_query_engine(llm=self.llm, similarity_top_k=2),
                                         metadata=ToolMetadata(name=name, description=f"Passages about: {titles}")))
        synthesizer = get_response_synthesizer(llm=self.llm, use_async=use_async, streaming=True) if streaming else None
        return SubQuestionQueryEngine.from_defaults(
            query_engine_tools=tools, llm=self.llm, use_async=use_async, verbose=False, response_synthesizer=synthesizer,
            question_gen=LLMQuestionGenerator.from_defaults(llm=self.question_llm()))

    def sources(self, response: Any) -> list[str]:
        return _ref_doc_sources(response)


class ChatDocQA(LlamaIndexApp):
    name = "li_chat"
    title = "10 Two-turn document chat (LlamaIndex condense_plus_context chat engine)"
    n_docs = 40
    workload = (f"HotpotQA question + 40 uploaded passages -> index.as_chat_engine(chat_mode='condense_plus_context', "
                f"top 3): turn 1 the question, turn 2 '{FOLLOW_UP}' (condensed with the history, retrieved, answered); "
                "the answer is turn 2's")

    def chat_engine(self, docs: list[Document], use_async: bool) -> Any:
        index = VectorStoreIndex.from_documents(docs, embed_model=self.embed_model, use_async=use_async)
        return index.as_chat_engine(chat_mode="condense_plus_context", llm=self.llm, similarity_top_k=3)

    def run(self, query: Query, system: System, callbacks: list[Any] | None = None) -> Answer:
        self.use(system)
        engine = self.chat_engine(query.data["docs"], use_async=system.concurrent)
        engine.chat(query.question)
        return self.answer(engine.chat(FOLLOW_UP))

    async def arun(self, query: Query, system: System, stream: bool = False) -> Answer:
        self.use(system)
        start = time.perf_counter()
        engine = await asyncio.to_thread(self.chat_engine, query.data["docs"], True)
        await engine.achat(query.question)
        if not stream:
            return self.answer(await engine.achat(FOLLOW_UP))
        response = await engine.astream_chat(FOLLOW_UP)
        return await streamed_answer(response, start, self.sources(response))

"""Apps whose parallel work is the framework's own composition, not a chain Teola lowers:
a LlamaIndex ``Workflow`` that fans a question out to two query engines with
``ctx.send_event`` and joins them with ``ctx.collect_events``, and a LangGraph ``StateGraph``
that answers generated sub-questions in ``Send`` branches. Both are written as the
frameworks' docs write them; under Teola the workflow's ``aquery`` calls are lowered graphs and
every model call (a node's, a step's) goes through Teola's engines, while the workflow and the
graph themselves run as they are.
"""

from __future__ import annotations

import asyncio
import operator
import time
from typing import Annotated, Any, TypedDict

from langchain_core.output_parsers import StrOutputParser
from langchain_core.runnables import Runnable, RunnablePassthrough
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send  # noqa: TC002 - LangGraph reads the nodes' type hints
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.workflow import Context, Event, StartEvent, StopEvent, Workflow, step

from .base import Answer, Query, System
from .langchain_apps import ANSWER, COMBINE_FINDINGS, DECOMPOSE, MAX_SUBQUESTIONS, MultiHopQA, format_docs
from .llama_apps import LlamaIndexApp, _sources

WORKFLOW_COMBINE = ("Two assistants answered a question from different halves of the documents.\n\n"
           "Answer 1: {first}\nAnswer 2: {second}\n\nQuestion: {question}\n"
           "Give the best short answer to the question.")


class PartQuery(Event):
    question: str
    part: int


class PartAnswer(Event):
    part: int
    response: Any


class FanOutWorkflow(Workflow):
    """StartEvent(question) -> one PartQuery per query engine (``send_event``) -> each answered
    by its engine (``aquery``, two workers) -> both collected -> one combining LLM call."""

    def __init__(self, engines: list[Any], llm: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.engines, self.llm = engines, llm

    @step
    async def dispatch(self, ctx: Context, ev: StartEvent) -> PartQuery | None:
        await ctx.store.set("question", ev.question)
        for part in range(len(self.engines)):
            ctx.send_event(PartQuery(question=ev.question, part=part))
        return None

    @step(num_workers=2)
    async def answer(self, ev: PartQuery) -> PartAnswer:
        return PartAnswer(part=ev.part, response=await self.engines[ev.part].aquery(ev.question))

    @step
    async def combine(self, ctx: Context, ev: PartAnswer) -> StopEvent | None:
        answers = ctx.collect_events(ev, [PartAnswer] * len(self.engines))
        if answers is None:
            return None
        first, second = (str(a.response) for a in sorted(answers, key=lambda a: a.part))
        question = await ctx.store.get("question")
        text = await self.llm.acomplete(WORKFLOW_COMBINE.format(first=first, second=second, question=question))
        sources = [s for a in sorted(answers, key=lambda a: a.part) for s in _sources(a.response)]
        return StopEvent(result=Answer(str(text).strip(), sources))


class WorkflowFanOut(LlamaIndexApp):
    name = "li_workflow"
    title = "7 Workflow fan-out (LlamaIndex Workflow, send_event / collect_events)"
    n_docs = 40
    workload = ("HotpotQA question + 40 uploaded passages, split into two VectorStoreIndexes -> a Workflow sends the "
                "question to both query engines (top 3, compact) in parallel steps, collects both answers, and "
                "combines them with one LLM call")

    def workflow(self, docs: list[Document]) -> FanOutWorkflow:
        half = len(docs) // 2
        engines = [VectorStoreIndex.from_documents(part, embed_model=self.embed_model)
                   .as_query_engine(llm=self.llm, similarity_top_k=3) for part in (docs[:half], docs[half:])]
        return FanOutWorkflow(engines, self.llm, timeout=self.timeout_s)

    def run(self, query: Query, system: System, callbacks: list[Any] | None = None) -> Answer:
        return asyncio.run(self.arun(query, system))

    async def arun(self, query: Query, system: System, stream: bool = False) -> Answer:
        self.use(system)
        workflow = await asyncio.to_thread(self.workflow, query.data["docs"])  # indexing is synchronous
        return await workflow.run(question=query.question)


class SubQuestionState(TypedDict):
    question: str
    subs: list[str]
    findings: Annotated[list[str], operator.add]  # each Send branch adds its own
    answer: str


class BranchState(TypedDict):
    sub: str


class MultiHopLangGraph(MultiHopQA):
    name = "lg_multihop"
    title = "8 Multi-hop QA as a LangGraph graph (Send fan-out)"
    workload = ("as app 4, written as a LangGraph StateGraph: a decompose node, one Send branch per sub-question "
                "(retrieve top 3 + answer), then a combine node")

    def build_chain(self, llm: Any, embeddings: Any) -> Runnable:
        answer_chain = {"context": self.retriever(embeddings) | format_docs, "question": RunnablePassthrough()} \
            | ANSWER | llm | StrOutputParser()

        def plan(state: SubQuestionState) -> dict[str, Any]:
            lines = (DECOMPOSE | llm | StrOutputParser()).invoke({"question": state["question"]}).splitlines()
            return {"subs": [q.strip() for q in lines if q.strip()][:MAX_SUBQUESTIONS]}

        def fan_out(state: SubQuestionState) -> list[Send]:
            return [Send("answer_sub", {"sub": sub}) for sub in state["subs"]] or [Send("answer_sub", {"sub": state["question"]})]

        def answer_sub(state: BranchState) -> dict[str, Any]:
            return {"findings": [f"Q: {state['sub']}\nA: {answer_chain.invoke(state['sub']).strip()}"]}

        def combine_node(state: SubQuestionState) -> dict[str, Any]:
            text = (COMBINE_FINDINGS | llm | StrOutputParser()).invoke({"findings": "\n".join(state["findings"]),
                                                                "question": state["question"]})
            return {"answer": text}

        builder = StateGraph(SubQuestionState)
        builder.add_node("plan", plan)
        builder.add_node("answer_sub", answer_sub)
        builder.add_node("combine", combine_node)
        builder.add_edge(START, "plan")
        builder.add_conditional_edges("plan", fan_out, ["answer_sub"])
        builder.add_edge("answer_sub", "combine")
        builder.add_edge("combine", END)
        return builder.compile()

    def run(self, query: Query, system: System, callbacks: list[Any] | None = None) -> Answer:
        config = {"callbacks": callbacks} if callbacks else None
        return Answer(str(self.runnable(system).invoke(self.chain_input(query), config=config)["answer"]).strip())

    async def arun(self, query: Query, system: System, stream: bool = False) -> Answer:
        start = time.perf_counter()
        state = await self.runnable(system).ainvoke(self.chain_input(query))
        return Answer(str(state["answer"]).strip(), ttft_s=(time.perf_counter() - start) if stream else None)

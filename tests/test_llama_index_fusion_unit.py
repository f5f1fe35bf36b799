"""The ``fuse`` step of the QueryFusionRetriever lowering, as pure logic (no engines).

``FusionReplay`` must return exactly what ``QueryFusionRetriever.retrieve`` returns for the
same LLM answer and the same sub-retrieval results, in every fusion mode, including the
parsing corners where the decoded lines differ from LlamaIndex's parse (backticks, extra
lines beyond the cap, duplicates). Fakes: an LLM with a fixed answer and retrievers with
fixed, query-dependent results.
"""

from __future__ import annotations

import pytest
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.llms.types import CompletionResponse, LLMMetadata
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.retrievers import QueryFusionRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from teola_plugin.capture.llama_index_fusion import FusionReplay
from teola_plugin.ir import semantics

NODES = [TextNode(text=f"passage {i}", id_=f"n{i}") for i in range(8)]


class FixedLLM(CustomLLM):
    answer: str = ""

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata()

    def complete(self, prompt, formatted=False, **kwargs):
        return CompletionResponse(text=self.answer)

    def stream_complete(self, prompt, formatted=False, **kwargs):
        raise NotImplementedError


class ScoredRetriever(BaseRetriever):
    """Three nodes and scores that depend on the query string and the retriever's seed."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed

    def _retrieve(self, query_bundle):
        h = sum(map(ord, query_bundle.query_str)) + self.seed
        return [NodeWithScore(node=NODES[(h + k) % len(NODES)], score=((h * (k + 3)) % 97) / 97) for k in range(3)]


ANSWERS = [
    "first query\nsecond query\nthird beyond the cap",
    "```\nfenced query\nanother one\n```",
    "same\nsame",
    "  padded  \n\n\nlast",
    "",
]


@pytest.mark.parametrize("mode", ["reciprocal_rerank", "relative_score", "dist_based_score", "simple"])
@pytest.mark.parametrize("answer", ANSWERS)
def test_replay_returns_what_the_retriever_returns(mode, answer):
    retrievers = [ScoredRetriever(0), ScoredRetriever(5)]
    fusion = QueryFusionRetriever(retrievers, llm=FixedLLM(answer=answer), mode=mode, num_queries=3,
                                  similarity_top_k=5, use_async=False)
    query = QueryBundle("the question")
    expected = fusion.retrieve(query)

    # What the graph hands the fuse step: the original query's results per retriever, the
    # decoded text, and (for the "streamed" retriever 0) one result list per decoded line.
    lines = semantics.parse_items(answer, "lines")
    graph_results = {"original0": retrievers[0].retrieve(query), "original1": retrievers[1].retrieve(query),
                     "generated0": [[NodeWithScore(node=n.node, score=n.score)
                                     for n in retrievers[0]._retrieve(QueryBundle(line))] for line in lines]}
    got = FusionReplay(fusion, streamed={0})(query, text=answer, **graph_results)
    assert [n.node.node_id for n in got] == [n.node.node_id for n in expected]
    assert [n.score for n in got] == pytest.approx([n.score for n in expected])

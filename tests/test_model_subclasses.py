"""A subclass of the plugin's own model classes that overrides what a lowered call replaces
(its completion / chat / embedding code) keeps its own code: the tracer declines to lower
it and says why. One that overrides nothing of the kind is still lowered. (Tracing only:
no engine runs.)"""

from __future__ import annotations

import pytest
from langchain_core.prompts import PromptTemplate

from teola_plugin.capture.langchain import InputLayout, trace_runnable
from teola_plugin.capture.llama_index import NotLowerable
from teola_plugin.capture.llama_index_models import embedder_engine_for, llm_call_spec
from teola_plugin.runtime.engine_needs import EngineNeeds
from teola_plugin.langchain import TeolaChatModel as LangChainChat
from teola_plugin.langchain import TeolaLLM as LangChainLLM
from teola_plugin.llama_index import TeolaEmbedding, TeolaLLM

RUNTIME = object()  # never called: identity is all the checks compare


def test_llama_index_llm_subclass_overriding_complete_is_not_lowered():
    class Shouting(TeolaLLM):
        def complete(self, prompt, formatted=False, **kwargs):
            return super().complete(prompt.upper(), formatted, **kwargs)

    class Renamed(TeolaLLM):  # overrides nothing a lowered call replaces
        @classmethod
        def class_name(cls) -> str:
            return "Renamed"

    with pytest.raises(NotLowerable, match="overrides complete"):
        llm_call_spec(RUNTIME, Shouting(runtime=RUNTIME), EngineNeeds())
    assert llm_call_spec(RUNTIME, Renamed(runtime=RUNTIME), EngineNeeds()).engine == "llm"


def test_llama_index_embedding_subclass_overriding_the_query_embedding_is_not_lowered():
    class Prefixed(TeolaEmbedding):
        def _get_query_embedding(self, query):
            return super()._get_query_embedding("query: " + query)

    engine, why = embedder_engine_for(RUNTIME, Prefixed(runtime=RUNTIME))
    assert engine is None and "overrides _get_query_embedding" in why
    assert embedder_engine_for(RUNTIME, TeolaEmbedding(runtime=RUNTIME)) == ("embedder", "")


@pytest.mark.parametrize("base", [LangChainLLM, LangChainChat])
def test_langchain_model_subclass_overriding_generate_runs_unchanged(base):
    class Edited(base):
        def _generate(self, *args, **kwargs):
            return super()._generate(*args, **kwargs)

    layout = InputLayout.of({"q": "x"})
    prompt = PromptTemplate.from_template("Q: {q}\nA:")
    edited = trace_runnable(prompt | Edited(runtime=RUNTIME, max_tokens=8), layout)
    assert [o.component for o in edited.opaque] == ["Edited"]
    assert "overrides _generate" in edited.opaque[0].reason
    assert not trace_runnable(prompt | base(runtime=RUNTIME, max_tokens=8), layout).opaque

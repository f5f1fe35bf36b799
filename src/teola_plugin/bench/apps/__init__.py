"""The paper's apps, written with plain LlamaIndex / LangChain APIs (see ``base`` for the
interface the benchmark runner uses)."""

from __future__ import annotations

from .base import (PASS_NAMES, PLAIN_APP, PLAIN_CONCURRENT, PLAIN_SEQUENTIAL, TEOLA_APP, TEOLA_FULL, TEOLA_NOPASSES,
                   Answer, BenchApp, Query, System, ablation, all_systems, reference_of)
from .fan_out_apps import MultiHopLangGraph, WorkflowFanOut
from .langchain_apps import AdvancedRAGLangChain, MultiHopQA, SearchAugmented
from .llama_apps import AdvancedDocQA, NaiveDocQA, TreeSummarize
from .multi_step_apps import ChatDocQA, SubQuestionDocQA

APPS: dict[str, type[BenchApp]] = {cls.name: cls for cls in (
    NaiveDocQA, AdvancedDocQA, SearchAugmented, MultiHopQA, TreeSummarize, AdvancedRAGLangChain,
    WorkflowFanOut, MultiHopLangGraph, SubQuestionDocQA, ChatDocQA)}

__all__ = ["APPS", "PASS_NAMES", "PLAIN_APP", "PLAIN_CONCURRENT", "PLAIN_SEQUENTIAL", "TEOLA_APP", "TEOLA_FULL",
           "TEOLA_NOPASSES", "Answer", "BenchApp", "Query", "System", "ablation", "all_systems", "reference_of"]

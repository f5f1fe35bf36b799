"""Tracing LangChain runnables into primitive graphs (lowering rules keyed by runnable type).

    from teola_plugin.capture.langchain import InputLayout, trace_runnable
    trace = trace_runnable(chain, InputLayout.of({"question": "..."}))
    trace.graph        # the PGraph, module order kept as control dependencies
    trace.opaque       # components that run unchanged, and why

Add a rule with ``@lowering(MyRunnable)``; see ``tracer.py`` for the contract.
"""

from .tracer import InputLayout, LangChainTrace, LangChainTracer, OutputShape, lowering, rule_for, trace_runnable

__all__ = [
    "InputLayout", "LangChainTrace", "LangChainTracer", "OutputShape", "lowering", "rule_for", "trace_runnable",
]

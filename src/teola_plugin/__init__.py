"""teola_plugin: primitive-level dataflow scheduling for LlamaIndex and LangChain apps."""

__version__ = "0.1.0"

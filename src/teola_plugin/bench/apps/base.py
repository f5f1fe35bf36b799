"""What every benchmark app provides, and the systems it runs under.

An app is ordinary LlamaIndex or LangChain code, written with the frameworks' public
APIs as a user writes it. The harness only chooses *how* it runs (a :class:`System`):
plain framework calls, sync or async, or the same objects under Teola
(``Settings.executor = TeolaExecutor(...)`` for LlamaIndex, ``TeolaRunnable(chain, ...)``
for LangChain). The same-engine systems use the plugin's model classes on one shared
runtime, so every system sends its requests to the same engines (the optimizer's ablation).
The *app* systems (``plain-app``, ``teola-app``) run the app as users write it: the LLM is a
vLLM OpenAI-compatible server the benchmark starts, reached through the framework's own
classes (``OpenAILike``, ``ChatOpenAI``), and the embeddings are the framework's own
sentence-transformers classes; ``teola-app`` is the very same objects under Teola.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...runtime.runtime import Runtime

PASS_NAMES = ("prune_dependencies", "eliminate_common", "decompose_stages", "split_prefill",
              "pipeline_decode", "eliminate_dead")


@dataclass(frozen=True)
class System:
    """One way of running an app. ``teola`` systems carry the optimizer passes they run."""

    name: str
    teola: bool = False
    concurrent: bool = False  # plain: aquery / ainvoke (use_async=True where offered)
    passes: tuple[str, ...] | None = None  # None: all passes (teola only)
    disabled: tuple[str, ...] = ()
    served: bool = False  # the app as users write it: a model server and the frameworks' own classes

    @property
    def pass_kwargs(self) -> dict[str, Any]:
        return {"passes": None if self.passes is None else list(self.passes), "disabled": list(self.disabled)}


PLAIN_SEQUENTIAL = System("plain-sequential")
PLAIN_CONCURRENT = System("plain-concurrent", concurrent=True)
TEOLA_NOPASSES = System("teola-nopasses", teola=True, passes=())
TEOLA_FULL = System("teola-full", teola=True)
PLAIN_APP = System("plain-app", served=True)
TEOLA_APP = System("teola-app", teola=True, served=True)


def ablation(pass_name: str) -> System:
    return System(f"teola-no-{pass_name}", teola=True, disabled=(pass_name,))


def all_systems(ablations: bool = True) -> list[System]:
    out = [PLAIN_SEQUENTIAL, PLAIN_CONCURRENT, TEOLA_NOPASSES]
    if ablations:
        out += [ablation(p) for p in PASS_NAMES]
    return out + [TEOLA_FULL, PLAIN_APP, TEOLA_APP]


def reference_of(system: System) -> System:
    """The plain system whose answers ``system`` must reproduce (its fidelity reference)."""
    return PLAIN_APP if system.served else PLAIN_SEQUENTIAL


@dataclass
class Query:
    """One benchmark question: what the app is asked, gold answers, and per-query data
    (e.g. the documents uploaded with it)."""

    id: str
    question: str
    answers: tuple[str, ...]
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Answer:
    text: str
    sources: list[str] = field(default_factory=list)
    ttft_s: float | None = None  # seconds to the first streamed token (streamed runs only)


class BenchApp:
    """Subclasses set the class attributes and implement ``setup``, ``queries``, ``run``, ``arun``."""

    name: str = ""
    title: str = ""
    framework: str = ""  # "llama_index" | "langchain"
    workload: str = ""  # one line: what a query does, sizes included

    def __init__(self, runtime: Runtime, max_tokens: int = 32) -> None:
        self.runtime = runtime
        self.max_tokens = max_tokens
        self.server_url: str | None = None  # the model server of the app systems (set by the runner)
        self.server_model: str = ""

    def setup(self, queries: list[Query]) -> None:
        """Build what the queries share (stores, chains); not timed."""

    def queries(self, n: int, seed: int = 0) -> list[Query]:
        raise NotImplementedError

    def run(self, query: Query, system: System, callbacks: list[Any] | None = None) -> Answer:
        """One query, synchronously (plain-sequential and the Teola systems). ``callbacks``:
        LangChain callback handlers (LlamaIndex reports to its global dispatcher instead)."""
        raise NotImplementedError

    async def arun(self, query: Query, system: System, stream: bool = False) -> Answer:
        """One query from an event loop (plain-concurrent, and every system under Poisson load);
        ``stream``: stream the answer where the app can, measuring the time to its first token."""
        raise NotImplementedError

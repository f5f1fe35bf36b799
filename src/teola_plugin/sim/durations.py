"""How long simulated work takes: recorded alone-durations, an engine profile, or both.

* ``measured``: each primitive costs what it took alone in the recorded run (the bound
  run), and a batch of requests costs their sum scaled by the batching gain the profile
  measured for that size (``latency(sum of items) / sum of latency(items)``).
* ``profile``: each primitive costs what the profile says for its work items, so a trace
  of graphs without timings can be simulated; the work items are the lowering's estimates.
* ``transfer`` (``Durations(..., target=other_profile)``): measured durations moved to
  other hardware, each engine primitive scaled by ``target / source`` latency for the same
  items. CPU steps (framework code, formatting) are the host's and keep their time.

A decode's sequences share decode steps with the others in flight on its engine: with
``n`` sequences a step takes :meth:`decode_slowdown` ``(n)`` times as long as alone, from
the profile's ``llm_decode_concurrent`` curve (tokens of ``n`` sequences of 64) when it has
one, else no gain from batching. Moved to other hardware, a decode costs its recorded
tokens times the target's step (or, tokens unknown, its time scaled by the two profiles'
single-sequence steps).

Activities that share a CPU group get ``cpu_sharing`` of the cores' work done between them
(measured by ``scripts/bench_engines.py --sharing``: two engines' thread pools on the same
cores cost each other more than an equal split), applied whenever two or more run.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Sequence

from ..errors import ConfigError
from ..optimizer.cost import CostModel
from .trace import NodeTrace, QueryTrace

MODES = ("measured", "profile")
DECODE = "llm_decode"
PREFILL_STALL = "llm_prefill_stall"
CONCURRENT_DECODE = "llm_decode_concurrent"
CONCURRENT_SEQ_TOKENS = 64  # what bench_engines' llm_decode_concurrent curve holds per sequence


class Durations:
    def __init__(self, mode: str, source: CostModel, target: CostModel | None = None,
                 decode_step_s: float | None = None, cpu_sharing: float = 1.0) -> None:
        if mode not in MODES:
            raise ConfigError(f"unknown duration mode {mode!r}; known: {', '.join(MODES)}")
        if target is not None and mode != "measured":
            raise ConfigError("a target profile scales measured durations: use mode 'measured'")
        self.mode = mode
        self.source = source  # the profile of the hardware the trace was recorded on
        self.target = target or source  # the hardware simulated
        # One decode step as recorded on the source (see recorded_decode_step): a floor under
        # a recorded decode's time, which can miss the tokens made while other steps were timed.
        self.decode_step_s = decode_step_s
        # The work activities sharing CPU cores get done together, as a share of one alone's
        # (the profile's measured ``sharing``; 1.0: an equal, loss-free split).
        if not 0.0 < cpu_sharing <= 1.0:
            raise ConfigError(f"cpu_sharing must be in (0, 1], got {cpu_sharing!r}")
        self.cpu_sharing = cpu_sharing

    def _profiled(self, model: CostModel, node: NodeTrace, items: float) -> float:
        return model.latency(node.engine, node.op, items, node.kind)

    def alone(self, node: NodeTrace) -> float:
        """Seconds ``node`` takes with nothing else running."""
        if node.op == DECODE:
            return self._decode_alone(node)
        if self.mode == "profile" or node.measured_s is None:
            return self._profiled(self.target, node, node.items)
        if self.target is self.source or node.kind == "cpu":
            return node.measured_s
        before = self._profiled(self.source, node, node.items)
        return node.measured_s * (self._profiled(self.target, node, node.items) / before if before > 0 else 1.0)

    def _decode_alone(self, node: NodeTrace) -> float:
        step = _step(self.target, node, 1)
        if self.mode == "profile" or node.measured_s is None:
            return (node.tokens or max(1.0, node.items)) * step
        if self.target is self.source:
            return max(node.measured_s, decode_floor_s(node, self.decode_step_s))
        if node.tokens:
            return node.tokens * step
        before = _step(self.source, node, 1)
        return node.measured_s * (step / before if before > 0 else 1.0)

    def batch(self, nodes: Sequence[NodeTrace]) -> float:
        """Seconds one engine call serving all ``nodes`` (same engine and op) takes."""
        if len(nodes) == 1:
            return self.alone(nodes[0])
        first = nodes[0]
        together = self._profiled(self.target, first, sum(n.items for n in nodes))
        if self.mode == "profile":
            return together
        apart = sum(self._profiled(self.target, n, n.items) for n in nodes)
        gain = together / apart if apart > 0 else 1.0
        return sum(self.alone(n) for n in nodes) * min(1.0, gain)

    def prefill_stall(self, nodes: Sequence[NodeTrace]) -> float:
        """Seconds the decodes under way on an LLM engine lose to one prefill batch of
        ``nodes``: the profile's ``llm_prefill_stall`` for their prompt tokens where measured,
        else the prefill's whole time by the profile (a recorded prefill's time also holds the
        request's way to the engine and back)."""
        first, tokens = nodes[0], sum(n.items for n in nodes)
        if self.target.profiled(first.engine, PREFILL_STALL, first.kind):
            return self.target.latency(first.engine, PREFILL_STALL, tokens, first.kind)
        return self._profiled(self.target, first, tokens)

    def decode_slowdown(self, node: NodeTrace, sequences: int) -> float:
        """How much longer a decode step of ``node``'s engine takes with ``sequences`` in
        flight than with one."""
        one = _step(self.target, node, 1)
        return _step(self.target, node, sequences) / one if one > 0 else 1.0


def _step(model: CostModel, node: NodeTrace, sequences: int) -> float:
    """Seconds of one decode step with ``sequences`` in flight on ``node``'s engine."""
    n = max(1, sequences)
    if model.profiled(node.engine, CONCURRENT_DECODE, node.kind):
        return model.latency(node.engine, CONCURRENT_DECODE, CONCURRENT_SEQ_TOKENS * n, node.kind) / CONCURRENT_SEQ_TOKENS
    return model.latency(node.engine, DECODE, CONCURRENT_SEQ_TOKENS, node.kind) / CONCURRENT_SEQ_TOKENS


def recorded_decode_step(traces: Iterable[QueryTrace], min_tokens: int = 8, min_step_s: float = 0.005) -> float | None:
    """Seconds per token of the recorded decodes that were timed whole: the median over
    decodes of at least ``min_tokens`` whose time per token is at least ``min_step_s``
    (a decode whose tokens were mostly made while other primitives were being timed, as
    a stream runs on in vLLM, shows a fraction of a millisecond per token)."""
    steps = [n.measured_s / n.tokens for t in traces for g in t.graphs for n in g.all_nodes()
             if n.op == DECODE and n.tokens and n.tokens >= min_tokens and n.measured_s
             and n.measured_s / n.tokens >= min_step_s]
    return statistics.median(steps) if steps else None


def decode_floor_s(node: NodeTrace, step_s: float | None) -> float:
    """The least a recorded decode took: its tokens after the first (which came with the
    prefill) at ``step_s``; 0 when either is unknown."""
    return (node.tokens - 1) * step_s if node.tokens and step_s else 0.0

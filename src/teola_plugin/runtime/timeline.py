"""The execution timeline: one span per primitive run, kept for the last N queries.

A span records when the primitive's inputs were ready, when its engine started it, when
it ended, and the engine batch it shared with other queries. Exports: Chrome trace JSON
(open in https://ui.perfetto.dev or chrome://tracing) and a PNG Gantt chart.
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError


@dataclass(frozen=True)
class Span:
    query_id: str
    node: str
    op: str
    engine: str
    ready: float  # inputs available (time.time())
    start: float  # engine started it (after queueing / batching)
    end: float
    batch_id: int = -1
    batch_size: int = 1
    status: str = "ok"  # ok | error | cancelled
    origin: str = ""

    @property
    def queue_s(self) -> float:
        return max(0.0, self.start - self.ready)

    @property
    def run_s(self) -> float:
        return max(0.0, self.end - self.start)


class Timeline:
    """Thread-safe span store with a retention limit in queries (oldest dropped first)."""

    def __init__(self, max_queries: int = 1000) -> None:
        if isinstance(max_queries, bool) or not isinstance(max_queries, int) or max_queries < 1:
            raise ConfigError(f"timeline retention (max_queries / timeline_queries) must be a positive int, "
                              f"got {max_queries!r}")
        self.max_queries = max_queries
        self._spans: collections.OrderedDict[str, list[Span]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def record(self, span: Span) -> None:
        with self._lock:
            spans = self._spans.get(span.query_id)
            if spans is None:
                spans = self._spans[span.query_id] = []
                while len(self._spans) > self.max_queries:
                    self._spans.popitem(last=False)
            spans.append(span)

    def spans(self, query_ids: Iterable[str] | None = None) -> list[Span]:
        with self._lock:
            ids = list(self._spans) if query_ids is None else [q for q in query_ids if q in self._spans]
            return sorted((s for q in ids for s in self._spans[q]), key=lambda s: s.start)

    def query_ids(self) -> list[str]:
        with self._lock:
            return list(self._spans)

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._spans.values())

    # -- analyses ------------------------------------------------------------------------
    def batch_sizes(self, engine: str | None = None) -> collections.Counter[int]:
        """Histogram of engine batch sizes (each batch counted once)."""
        seen: dict[tuple[str, int], int] = {}
        for s in self.spans():
            if s.batch_id >= 0 and (engine is None or s.engine == engine):
                seen[(s.engine, s.batch_id)] = s.batch_size
        return collections.Counter(seen.values())

    # -- exports -------------------------------------------------------------------------
    def to_chrome_trace(self, path: str | Path | None = None, query_ids: Iterable[str] | None = None) -> dict[str, Any]:
        """Chrome trace events: one process per query, one thread per engine."""
        spans = self.spans(query_ids)
        t0 = min((s.ready for s in spans), default=0.0)
        events: list[dict[str, Any]] = []
        pids = {q: i + 1 for i, q in enumerate(dict.fromkeys(s.query_id for s in spans))}
        for q, pid in pids.items():
            events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"query {q}"}})
        for s in spans:
            args = {k: v for k, v in asdict(s).items() if k not in ("ready", "start", "end")}
            args["queue_ms"] = round(s.queue_s * 1e3, 3)
            events.append({"ph": "X", "name": f"{s.op}:{s.node}", "cat": s.op, "pid": pids[s.query_id],
                           "tid": s.engine, "ts": (s.start - t0) * 1e6, "dur": s.run_s * 1e6, "args": args})
        trace = {"traceEvents": events, "displayTimeUnit": "ms"}
        if path is not None:
            Path(path).write_text(json.dumps(trace))
        return trace

    def to_png(self, path: str | Path, query_ids: Iterable[str] | None = None, title: str = "") -> Path:
        """Gantt chart: a row per (query, primitive), bars coloured by engine; queue time hatched."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        spans = self.spans(query_ids)
        if not spans:
            raise ValueError("no spans to draw")
        t0 = min(s.ready for s in spans)
        engines = sorted({s.engine for s in spans})
        colors = {e: plt.cm.tab10(i % 10) for i, e in enumerate(engines)}
        fig, ax = plt.subplots(figsize=(11, max(2.5, 0.28 * len(spans) + 1)))
        for row, s in enumerate(spans):
            if s.queue_s > 0:
                ax.barh(row, s.queue_s, left=s.ready - t0, color="none", edgecolor="grey", hatch="//", linewidth=0.3)
            ax.barh(row, max(s.run_s, 1e-4), left=s.start - t0, color=colors[s.engine],
                    edgecolor="black" if s.status == "ok" else "red", linewidth=0.4)
        labels = [f"{s.query_id[:8]} {s.node}" + (f" [b{s.batch_size}]" if s.batch_size > 1 else "") for s in spans]
        ax.set_yticks(range(len(spans)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("seconds since first primitive was ready")
        handles = [plt.Rectangle((0, 0), 1, 1, color=colors[e]) for e in engines]
        ax.legend(handles + [plt.Rectangle((0, 0), 1, 1, facecolor="none", hatch="//", edgecolor="grey")],
                  engines + ["queued"], loc="lower right", fontsize=7)
        ax.set_title(title or "Teola execution timeline")
        fig.tight_layout()
        out = Path(path)
        fig.savefig(out, dpi=110)
        plt.close(fig)
        return out

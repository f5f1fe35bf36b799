"""What-ifs under load: scheduling rules the runtime could adopt, simulated on recorded traces
before anyone builds them.

For each app of a benchmark run, Poisson arrivals (drawn as the benchmark draws them) at
multiples of plain-concurrent's single-query rate, under plain-concurrent, teola-full and
variants of teola-full: first-come-first-served engine queues instead of the topology
rule, the rule it replaced (longest remaining path first, then the older query), and an
admission cap (at most ``k`` queries in flight, the rest waiting in arrival
order, so a shared CPU finishes queries one by one instead of slowing all of them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..bench.metrics import latency_stats
from .calibration import bench_sweep
from .durations import Durations
from .simulator import SYSTEMS, SystemModel, simulate
from .trace import QueryTrace

VARIANTS = (
    SYSTEMS["plain-concurrent"],
    SYSTEMS["teola-full"],
    SystemModel("teola, FIFO engine queues", overlap=True, batching=True, priority="fifo"),
    SystemModel("teola, longest remaining path first", overlap=True, batching=True, priority="remaining_path"),
    SystemModel("teola, 1 query in flight", overlap=True, batching=True, max_queries=1),
    SystemModel("teola, 2 queries in flight", overlap=True, batching=True, max_queries=2),
)


def load_what_if(results: Mapping[str, Any], traces: Mapping[str, list[QueryTrace]], durations: Durations,
                 rate_multiples: Sequence[float] = (1.0, 2.0, 3.0), queries: int = 24,
                 seed: int = 0) -> dict[str, Any]:
    """APP -> one row per rate: each variant's mean and p99, and its p99 gain over plain-concurrent
    (``traces``: :func:`~teola_plugin.sim.calibration.recorded_traces`)."""
    out: dict[str, Any] = {}
    for name, app in results["apps"].items():
        recorded = traces.get(name, [])
        capacity = app.get("systems", {}).get("plain-concurrent", {}).get("mean_s")
        if not recorded or not capacity:
            continue
        rows = []
        for mult in rate_multiples:
            rate = mult / capacity
            order, arrivals = bench_sweep(recorded, rate, queries, seed)
            stats = {v.name: latency_stats([r.latency_s for r in simulate(order, durations, v, arrivals)])
                     for v in VARIANTS}
            base = stats["plain-concurrent"]["p99_s"]
            rows.append({"rate_multiple": mult, "rate_qps": round(rate, 4),
                         "systems": {k: {"mean_s": s["mean_s"], "p99_s": s["p99_s"],
                                         "p99_gain": round(base / s["p99_s"], 3) if s["p99_s"] else None}
                                     for k, s in stats.items()}})
        out[name] = rows
    return out


def table(what_if: Mapping[str, Any]) -> list[str]:
    names = [v.name for v in VARIANTS]
    out = ["| app | rate | " + " | ".join(f"{n}: mean / p99 s (p99 gain)" for n in names) + " |",
           "|---|---|" + "---|" * len(names)]
    for app, rows in what_if.items():
        for row in rows:
            cells = [f"{s['mean_s']:.1f} / {s['p99_s']:.1f} ({s['p99_gain']:.2f}x)"
                     for s in (row["systems"][n] for n in names)]
            out.append(f"| {app} | {row['rate_multiple']:g}x ({row['rate_qps']} q/s) | " + " | ".join(cells) + " |")
    return out


def best_rules(what_if: Mapping[str, Any]) -> list[str]:
    """Per app, the variant with the largest p99 gain over plain-concurrent at each rate."""
    out = []
    for app, rows in what_if.items():
        cells = []
        for row in rows:
            name, best = max(row["systems"].items(), key=lambda kv: kv[1]["p99_gain"] or 0.0)
            gain = best["p99_gain"] or 0.0
            cells.append(f"{row['rate_multiple']:g}x: " + (f"{name} {gain:.2f}x" if gain > 1.0 else "none better"))
        out.append(f"* {app}: " + "; ".join(cells))
    return out

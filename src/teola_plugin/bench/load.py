"""What the open-loop Poisson sweeps say: where plain-concurrent saturates, both systems' p99
and goodput there, and the offered rate at which each system's goodput peaks; and when each
sweep's queries arrived (the runner's seeded draw, one definition for the runner, the load
bound and the simulator's calibration).

One sweep row per (system, offered rate), as ``BenchRunner.poisson_sweep`` writes it. The
page reads this from the rows themselves, so results written before a field existed get it.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any, Mapping

# The systems' names as the sweep rows carry them (bench.apps names them too, but importing it
# loads both frameworks, which the page and its tests need not)
PLAIN = "plain-concurrent"
TEOLA = "teola-full"


def poisson_arrivals(rate_qps: float, n: int, seed: int) -> list[float]:
    """A sweep's open-loop arrival times (seconds from its start), seeded per rate."""
    rng, t, out = random.Random(f"{seed}-{rate_qps}"), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate_qps)
        out.append(t)
    return out


@dataclass(frozen=True)
class SweepArrivals:
    """Which question arrived when (seconds from the sweep's start), in arrival order."""

    arrivals_s: list[float]
    queries: list[str]


def sweep_arrivals(app: Mapping[str, Any], row: Mapping[str, Any], seed: int, n: int) -> SweepArrivals | None:
    """The arrivals of one of ``app``'s sweep rows (results.json's shapes): recorded, or for rows
    written before they were, the runner's draw redone: the measured questions in turn at
    ``rate_multiple`` x 1 / plain-concurrent's mean, checked against the recorded rate."""
    if "arrivals_s" in row:
        return SweepArrivals(list(row["arrivals_s"]), list(row["arrival_queries"]))
    unloaded = app.get("systems", {}).get("plain-concurrent", {}).get("mean_s")
    measured = list(dict.fromkeys(r["query"] for r in app.get("runs", [])))
    if not unloaded or not measured:
        return None
    rate = row["rate_multiple"] * (1.0 / unloaded)  # as BenchRunner.run_app offers it
    if round(rate, 4) != row["rate_qps"]:
        return None
    return SweepArrivals(poisson_arrivals(rate, n, seed), [measured[i % len(measured)] for i in range(n)])


@dataclass(frozen=True)
class GoodputPeak:
    """A system's highest goodput over the rates it ran, and the offered rate it came at."""

    rate_qps: float
    goodput_qps: float
    at_highest_rate: bool  # the highest rate run: goodput may peak higher still


def goodput_peaks(rows: list[dict[str, Any]]) -> dict[str, GoodputPeak]:
    """system -> its goodput peak (the lower rate on a tie: the same goodput with less offered)."""
    out: dict[str, GoodputPeak] = {}
    for system in sorted({r["system"] for r in rows}):
        mine = sorted((r for r in rows if r["system"] == system and r.get("goodput_qps") is not None),
                      key=lambda r: r["rate_qps"])
        if mine:
            best = max(mine, key=lambda r: (r["goodput_qps"], -r["rate_qps"]))
            out[system] = GoodputPeak(best["rate_qps"], best["goodput_qps"], best is mine[-1])
    return out


def saturated(row: dict[str, Any], unloaded_s: float | None) -> bool:
    """Throughput below 80% of the offered rate, or mean latency over twice the unloaded one."""
    slow = unloaded_s is not None and row["mean_s"] is not None and row["mean_s"] > 2 * unloaded_s
    return row["throughput_qps"] < 0.8 * row["rate_qps"] or slow


def _ratio(plain: float | None, teola: float | None) -> float | None:
    return round(plain / teola, 3) if plain and teola else None


def poisson_summary(rows: list[dict[str, Any]], unloaded_s: float | None = None) -> dict[str, Any]:
    """plain-concurrent's saturation rate (the lowest rate at which it is :func:`saturated`, else
    the highest run), both systems' p99 and goodput there, and each system's goodput peak."""
    pc = sorted((r for r in rows if r["system"] == PLAIN and r["n"]), key=lambda r: r["rate_qps"])
    sat = next((r for r in pc if saturated(r, unloaded_s)), pc[-1] if pc else None)
    if sat is None:
        return {}
    teola = next((r for r in rows if r["system"] == TEOLA and r["rate_qps"] == sat["rate_qps"]), None)
    out: dict[str, Any] = {"saturation_rate_qps": sat["rate_qps"], "saturated": saturated(sat, unloaded_s),
                           "plain_concurrent_p99_s": sat["p99_s"], "teola_p99_s": teola["p99_s"] if teola else None,
                           "plain_concurrent_goodput_qps": sat.get("goodput_qps"),
                           "teola_goodput_qps": teola.get("goodput_qps") if teola else None,
                           "goodput_peaks": {s: asdict(p) for s, p in goodput_peaks(rows).items()}}
    p99 = _ratio(sat["p99_s"], out["teola_p99_s"])
    if p99 is not None:
        out["p99_ratio"] = p99
    good_pc, good_teola = out["plain_concurrent_goodput_qps"], out["teola_goodput_qps"]
    if good_pc and good_teola is not None:  # higher is better; none of plain's in the SLO: no ratio
        out["goodput_ratio"] = round(good_teola / good_pc, 3)
    return out

"""What the hardware allows under open-loop load: the lowest p99 and the highest goodput any
scheduler could reach on one sweep's arrivals.

A sweep row offers ``n`` queries at recorded (or, for rows written before they were recorded,
re-drawn) Poisson arrival times. Each query carries what its isolated bound run measured
(``bench.bound``): its hardware-aware bound (no schedule answers it sooner, however idle the
machine) and its work per compute group at the engines' best profiled batched throughput
(no schedule does that work faster, however it batches). Relaxing everything else, each
group is one machine doing its queries' work with preemption:

* **p99 floor.** First come, first served minimises the largest latency on one machine
  (preemptive earliest-due-date with each query due at its arrival), so that schedule's
  largest latency per group, and every query's own bound, floor any schedule's largest
  latency; a latency vector that is elementwise at least the bounds has order statistics at
  least theirs. The p99 (numpy's linear interpolation, as ``metrics.latency_stats``) of those
  floors is a floor for the measured p99.
* **Goodput ceiling.** A query within the SLO has its group's work done between its arrival
  and arrival + SLO. With one SLO the windows are ordered as the arrivals, where earliest
  deadline first (= first come, first served) meets every deadline a set can meet, so the
  largest on-time set follows from a dynamic programme over arrivals (kept count -> earliest
  completion). Goodput is on-time answers over first arrival -> last completion, and every
  query completes no sooner than the first-come-first-served backlog of all of them.

Both hold for any scheduler on this hardware as far as their inputs do: decode steps shared
across queries and the framework's own Python are not counted as group work, so they are
optimistic, but each question's bound is one isolated run, and a question repeated within a
sweep finds its prompts in vLLM's prefix cache. :func:`checked` keeps them only where no
measured run beat them; the goodput ceiling then falls back to the one that needs no
measurement: n answers over the arrivals' own span.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .load import sweep_arrivals

PERCENTILE = 99


@dataclass(frozen=True)
class QueryWork:
    """One arrival's floor on its own latency and its work per compute group (seconds)."""

    hw_bound_s: float
    group_work_s: Mapping[str, float]


@dataclass(frozen=True)
class LoadBound:
    """The best any scheduler could do on one sweep's arrivals (see module doc)."""

    p99_floor_s: float
    on_time_max: int  # answers that could be within the SLO, of n
    n: int
    min_duration_s: float  # first arrival -> last completion, at the least
    arrival_span_s: float  # first arrival -> last arrival, as offered

    @property
    def goodput_ceiling_qps(self) -> float:
        return self.on_time_max / self.min_duration_s if self.min_duration_s > 0 else math.inf

    @property
    def arrivals_ceiling_qps(self) -> float:
        """n answers over the arrivals' span: no measurement in it."""
        return self.n / self.arrival_span_s if self.arrival_span_s > 0 else math.inf


@dataclass(frozen=True)
class CheckedBound:
    """What a sweep's measurements leave of a :class:`LoadBound`: the p99 floor if no system's
    measured p99 was below it, and the goodput ceiling (estimated, else from the arrivals alone)."""

    bound: LoadBound
    p99_floor_s: float | None
    goodput_ceiling_qps: float
    estimated_ceiling: bool  # False: the arrivals' own ceiling (a measured goodput beat the estimate)


def checked(bound: LoadBound, measured: Sequence[Mapping[str, Any]]) -> CheckedBound:
    """``bound`` against the sweep rows measured on its arrivals (``p99_s``, ``goodput_qps``)."""
    p99s = [r["p99_s"] for r in measured if r.get("p99_s") is not None]
    goods = [r["goodput_qps"] for r in measured if r.get("goodput_qps") is not None]
    floor = bound.p99_floor_s if all(p >= bound.p99_floor_s for p in p99s) else None
    estimated = all(g <= bound.goodput_ceiling_qps for g in goods)
    return CheckedBound(bound, floor, bound.goodput_ceiling_qps if estimated else bound.arrivals_ceiling_qps,
                        estimated)


def _percentile_floor(floors: Sequence[float], largest: float) -> float:
    """numpy's linear-interpolation percentile of a vector whose order statistics are at least
    ``sorted(floors)`` and whose largest is at least ``largest``."""
    xs = sorted(floors)
    xs[-1] = max(xs[-1], largest)
    pos = (len(xs) - 1) * PERCENTILE / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (pos - lo) * (xs[hi] - xs[lo])


def _fcfs_completions(arrivals: Sequence[float], work: Sequence[float]) -> list[float]:
    """Completion times on one machine serving arrivals in order, never idle while work waits."""
    done, out = 0.0, []
    for t, w in zip(arrivals, work):
        done = max(t, done) + w
        out.append(done)
    return out


def _most_on_time(arrivals: Sequence[float], work: Sequence[float], deadlines: Sequence[float],
                  eligible: Sequence[bool]) -> int:
    """The largest set of queries one machine can finish by their deadlines (ordered as the
    arrivals): kept count -> the earliest the kept ones can all be done."""
    best: dict[int, float] = {0: 0.0}
    for t, w, due, ok in zip(arrivals, work, deadlines, eligible):
        if not ok:
            continue
        grown = dict(best)
        for kept, done in best.items():
            finish = max(t, done) + w
            if finish <= due and finish < grown.get(kept + 1, math.inf):
                grown[kept + 1] = finish
        best = grown
    return max(best)


def load_bound(arrivals: Sequence[float], queries: Sequence[QueryWork], slo_s: float) -> LoadBound:
    """The p99 floor and goodput ceiling of ``queries`` arriving at ``arrivals`` (same order)."""
    if not arrivals or len(arrivals) != len(queries):
        raise ValueError(f"{len(arrivals)} arrivals for {len(queries)} queries")
    own = [q.hw_bound_s for q in queries]
    largest, last_done = max(own), max(t + h for t, h in zip(arrivals, own))
    on_time = sum(h <= slo_s for h in own)
    deadlines = [t + slo_s for t in arrivals]
    for group in sorted({g for q in queries for g in q.group_work_s}):
        work = [q.group_work_s.get(group, 0.0) for q in queries]
        done = _fcfs_completions(arrivals, work)
        largest = max(largest, max(d - t for d, t in zip(done, arrivals)))
        last_done = max(last_done, done[-1])
        on_time = min(on_time, _most_on_time(arrivals, work, deadlines, [h <= slo_s for h in own]))
    return LoadBound(_percentile_floor(own, largest), on_time, len(queries), last_done - arrivals[0],
                     arrivals[-1] - arrivals[0])


def sweep_bound(app: Mapping[str, Any], row: Mapping[str, Any], seed: int, n: int) -> LoadBound | None:
    """The load bound of one of ``app``'s sweep rows (results.json's shapes) on its arrivals
    (:func:`bench.load.sweep_arrivals`); None without them or the questions' bounds."""
    works = {b["query"]: QueryWork(b["hw_bound_s"], b.get("group_work_s") or {})
             for b in app.get("bounds", []) if b.get("hw_bound_s") is not None}
    sweep = sweep_arrivals(app, row, seed, n)
    if sweep is None or not sweep.arrivals_s or any(q not in works for q in sweep.queries):
        return None
    return load_bound(sweep.arrivals_s, [works[q] for q in sweep.queries], row["slo_s"])

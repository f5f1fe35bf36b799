"""Recompute a finished benchmark's bounds from its recorded query traces.

A run keeps every bound run's trace (``traces.json`` beside ``results.json``), so a better
bound (``bench.bound``) can be applied to the measurements already made instead of
rerunning the benchmark for hours: each app's bound rows, their means and the ratios the
page judges are recomputed, the measured latencies stay as they were.
"""

from __future__ import annotations

import datetime
from typing import Any, Mapping

from ..optimizer.cost import CostModel
from ..sim.trace import QueryTrace
from .bound import trace_bound
from .runner import summarize_bounds


def rebound(results: dict[str, Any], traces: Mapping[str, list[Mapping[str, Any]]],
            command: str = "teola bench --report-only --rebound") -> list[str]:
    """Recompute, in ``results``, the bounds of every app whose every measured bound has its
    trace (``traces.json``'s ``apps``) and note it (``bounds_recomputed``, which the page
    shows); returns those apps. An app with a bound row but no trace for it keeps its bounds
    as they were. The cost model is the one a run uses for its bounds: the default profiles
    (the compute groups are in the traces). The traces are what the run recorded: a change to
    how a run records them needs a new run, not this."""
    cost = CostModel.default()
    done = []
    for name, app in results.get("apps", {}).items():
        by_query = {t["query"]: QueryTrace.from_dict(t) for t in traces.get(name, ())}
        measured = [b for b in app.get("bounds", []) if "bound_s" in b]
        if not measured or any(b.get("query") not in by_query for b in measured):
            continue
        bounds = [{"query": b["query"], **trace_bound(by_query[b["query"]], cost)} if "bound_s" in b else b
                  for b in app["bounds"]]
        summarize_bounds(app, bounds)
        done.append(name)
    if done:
        now = datetime.datetime.now(datetime.timezone.utc)
        results["bounds_recomputed"] = {"date": now.strftime("%Y-%m-%d %H:%M UTC"), "command": command, "apps": done}
    return done

"""Predicted against measured: the simulator on a benchmark run's own traces and arrivals.

``teola bench`` writes results.json (each system's latencies per question, the Poisson
sweeps) and traces.json (each question's graphs, run one primitive at a time, with each
primitive's time alone). :func:`calibrate` simulates every system the run measured on
those traces (closed loop for the per-question runs; the sweep's own arrival times,
recorded or drawn again as the benchmark drew them, for the load runs) and sets each prediction
beside its measurement. :func:`predict` moves the same traces to a :class:`Deployment`
(GPU profiles, engines regrouped) and reports the speedup the simulator expects there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..bench.load import poisson_arrivals, sweep_arrivals
from ..bench.metrics import latency_stats
from ..capture import app_graphs
from ..optimizer.cost import CostModel
from ..optimizer.manager import PassManager
from .durations import Durations
from .hardware import Deployment
from .simulator import SYSTEMS, simulate
from .trace import QueryTrace, graph_trace

# Framework code runs in the host process, on the cores the host's engines use.
HOST_GROUP = "cpu:host"


def bench_sweep(recorded: Sequence[QueryTrace], rate_qps: float, n: int,
                seed: int) -> tuple[list[QueryTrace], list[float]]:
    """A Poisson sweep as the benchmark offers one: the questions in turn, at its arrival times."""
    return [recorded[i % len(recorded)] for i in range(n)], poisson_arrivals(rate_qps, n, seed)


def host_traces(traces: Sequence[QueryTrace], compute_groups: Mapping[str, str]) -> list[QueryTrace]:
    """Traces as the recorded machine ran them: CPU steps share the host's cores when the
    run put its engines on them."""
    if HOST_GROUP in compute_groups.values():
        return [t.regrouped({"cpu": HOST_GROUP}) for t in traces]
    return list(traces)


def recorded_traces(results: Mapping[str, Any], traces: Mapping[str, list[Mapping[str, Any]]]
                    ) -> dict[str, list[QueryTrace]]:
    """traces.json's apps, read once: APP -> its questions' traces as the recorded machine ran them."""
    groups = results.get("compute_groups", {})
    return {name: host_traces([QueryTrace.from_dict(t) for t in rows], groups) for name, rows in traces.items()}


def _error(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or not measured:
        return None
    return round(predicted / measured - 1.0, 4)


def _row(predicted: list[float], measured: list[float]) -> dict[str, Any]:
    p, m = latency_stats(predicted), latency_stats(measured)
    return {"predicted_mean_s": p["mean_s"], "measured_mean_s": m["mean_s"],
            "predicted_p99_s": p["p99_s"], "measured_p99_s": m["p99_s"],
            "error_mean": _error(p["mean_s"], m["mean_s"]), "error_p99": _error(p["p99_s"], m["p99_s"]), "n": m["n"]}


def calibrate(results: Mapping[str, Any], traces: Mapping[str, list[QueryTrace]],
              durations: Durations) -> dict[str, Any]:
    """APP -> SYSTEM -> prediction beside measurement (closed loop), and APP ->
    ``poisson`` -> one row per sweep; systems the simulator does not model are skipped.
    ``traces``: :func:`recorded_traces`."""
    config = results.get("config", {})
    out: dict[str, Any] = {}
    for name, app in results["apps"].items():
        recorded = traces.get(name, [])
        if not recorded:
            continue
        by_id = {t.query: t for t in recorded}
        rows: dict[str, Any] = {}
        for system in SYSTEMS:
            runs = [r for r in app.get("runs", []) if r.get("system") == system and r.get("query") in by_id
                    and "latency_s" in r]
            if not runs:
                continue
            predicted = simulate([by_id[r["query"]] for r in runs], durations, SYSTEMS[system])
            rows[system] = _row([p.latency_s for p in predicted], [r["latency_s"] for r in runs])
        sweeps = []
        for sweep in app.get("poisson") or []:
            arrived = sweep_arrivals(app, sweep, int(config.get("seed", 0)),
                                     int(config.get("poisson_queries", sweep["n"])))
            if (sweep["system"] not in SYSTEMS or sweep.get("errors") or arrived is None
                    or any(q not in by_id for q in arrived.queries)):
                continue
            predicted = simulate([by_id[q] for q in arrived.queries], durations, SYSTEMS[sweep["system"]],
                                 arrived.arrivals_s)
            lat = latency_stats([p.latency_s for p in predicted])
            sweeps.append({"system": sweep["system"], "rate_multiple": sweep["rate_multiple"],
                           "rate_qps": sweep["rate_qps"], "predicted_mean_s": lat["mean_s"],
                           "measured_mean_s": sweep["mean_s"], "predicted_p99_s": lat["p99_s"],
                           "measured_p99_s": sweep["p99_s"], "error_mean": _error(lat["mean_s"], sweep["mean_s"]),
                           "error_p99": _error(lat["p99_s"], sweep["p99_s"])})
        if sweeps:
            rows["poisson"] = sweeps
        out[name] = rows
    return out


def deployment_cost_model(host: CostModel, deployment: Deployment | None = None) -> CostModel:
    """The host's measured profiles with the deployment's engines replaced, and its compute
    groups (the rest on the host's cores); no deployment: everything on the host's cores."""
    profiles = host.to_dict()["profiles"]
    if deployment is not None:
        profiles.update(deployment.profile())
    groups = deployment.compute_groups() if deployment is not None else {}
    return CostModel(profiles, source=deployment.name if deployment else host.source,
                     compute_groups=groups, default_group=HOST_GROUP)


def predict_paper_apps(host: CostModel, deployment: Deployment | None, cpu_sharing: float = 1.0) -> dict[str, Any]:
    """The paper's apps as the tracer lowers them (``capture/app_graphs``), planned by the
    optimizer for ``deployment``'s hardware and simulated with the profile's costs:
    plain-sequential on the module-order graph, teola-full on the optimized one. Unlike the
    recorded traces (optimized for the machine they ran on), the passes here decide for
    the target: on GPUs they may split stages and prefill prefixes that a CPU declines."""
    cost = deployment_cost_model(host, deployment)
    durations = Durations("profile", cost, cpu_sharing=cpu_sharing)
    out: dict[str, Any] = {}
    for name, build in app_graphs.APPS.items():
        plain = QueryTrace(name, name, (graph_trace(build(), cost),))
        optimized = PassManager().run(build(), cost)
        teola = QueryTrace(name, name, (graph_trace(optimized, cost),))
        p = simulate([plain], durations, SYSTEMS["plain-sequential"])[0].latency_s
        t = simulate([teola], durations, SYSTEMS["teola-full"])[0].latency_s
        out[name] = {"plain_sequential_s": round(p, 4), "teola_full_s": round(t, 4), "speedup": round(p / t, 3),
                     "passes_that_changed": [r.pass_name for r in optimized.history if r.changed]}
    return out


def predict(traces: Mapping[str, list[QueryTrace]], host: CostModel, deployment: Deployment,
            cpu_sharing: float = 1.0) -> dict[str, Any]:
    """APP -> mean latency of plain-sequential and teola-full on ``deployment`` and the speedup
    (``traces``: :func:`recorded_traces`; ``cpu_sharing``: the host's, see ``Durations``)."""
    target = deployment_cost_model(host, deployment)
    durations = Durations("measured", host, target=target, cpu_sharing=cpu_sharing)
    groups = {**{"cpu": HOST_GROUP}, **deployment.compute_groups()}
    out: dict[str, Any] = {}
    for name, recorded in traces.items():
        moved = [t.regrouped(groups) for t in recorded]
        if not moved:
            continue
        means = {s: latency_stats([r.latency_s for r in simulate(moved, durations, SYSTEMS[s])])["mean_s"]
                 for s in ("plain-sequential", "teola-full")}
        out[name] = {"plain_sequential_mean_s": means["plain-sequential"], "teola_full_mean_s": means["teola-full"],
                     "speedup": round(means["plain-sequential"] / means["teola-full"], 3) if means["teola-full"] else None,
                     "queries": len(moved)}
    return out

"""The end-to-end benchmark: every app under every system, in one run, on one set of engines.

Per app: seeded questions; each question runs under each system (the order rotates per
question, so no system always goes first); then each question once more under teola-full
with one primitive at a time, for its bound (``bench.bound``); then, for the Poisson apps,
open-loop arrivals at several rates for plain-concurrent and teola-full. Failures are
recorded with the question and system, never dropped. With a ``Checkpoint`` the progress is
saved after every question, bound and sweep, and a resumed run skips what is done.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import platform
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..runtime.runtime import Runtime, default_engine_specs
from . import metrics
from .apps import (APPS, PLAIN_APP, PLAIN_CONCURRENT, PLAIN_SEQUENTIAL, TEOLA_APP, TEOLA_FULL, BenchApp, Query, System,
                   all_systems, reference_of)
from ..sim.trace import recorded_query
from .bound import IsolatingHandlers, trace_bound
from .checkpoint import Checkpoint
from .framework_events import EventRecorder
from .load import poisson_arrivals, poisson_summary
from .model_server import ModelServer, start_model_server


@dataclass
class BenchConfig:
    apps: list[str] = field(default_factory=lambda: list(APPS))
    questions: int = 50  # measured per app (plus one warm-up question)
    ablations: bool = True
    systems: list[str] | None = None  # None: all (ablations per the flag)
    poisson_apps: list[str] = field(default_factory=lambda: ["search_gen", "doc_qa_naive", "doc_qa_advanced"])
    poisson_rates: list[float] = field(default_factory=lambda: [0.5, 1.0, 2.0, 4.0])  # x the plain-concurrent capacity
    poisson_queries: int = 24  # arrivals per rate and system
    slo_factor: float = 3.0  # SLO = this x plain-sequential p50 of the app
    bound: bool = True
    max_tokens: int = 32
    seed: int = 0
    timeout_s: float = 600.0
    mode: str = "full"
    command: str = "teola bench"

    def chosen_systems(self) -> list[System]:
        systems = all_systems(self.ablations)
        if self.systems is not None:
            known = {s.name for s in all_systems(True)}
            unknown = sorted(set(self.systems) - known)
            if unknown:
                raise ValueError(f"unknown systems {unknown}; choose from {sorted(known)}")
            systems = [s for s in all_systems(True) if s.name in self.systems]
        return systems


def quick_config(**overrides: Any) -> BenchConfig:
    """Every app, a few questions, no ablations, one short Poisson sweep: minutes, not hours."""
    base = dict(questions=1, ablations=False, poisson_apps=["search_gen"], poisson_rates=[1.0, 3.0],
                poisson_queries=6, mode="quick", command="teola bench --quick")
    base.update(overrides)
    return BenchConfig(**base)


def machine() -> str:
    import torch

    from ..engines.cpu_dtype import describe_cpu

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{platform.machine()}, {os.cpu_count()} CPU cores ({describe_cpu()}), {gpu}, "
            f"python {sys.version.split()[0]}, "
            f"{platform.system()} {platform.release()}")


def log(msg: str) -> None:
    # tqdm.write: a log line above the progress bar instead of through it
    tqdm.write(f"[bench {time.strftime('%H:%M:%S')}] {msg}")


class Bench:
    def __init__(self, config: BenchConfig, runtime: Runtime | None = None,
                 checkpoint: Checkpoint | None = None) -> None:
        self.config = config
        self.checkpoint = checkpoint
        self.handlers = IsolatingHandlers()
        self.owns_runtime = runtime is None
        self.runtime = runtime or Runtime(default_engine_specs(), handlers=self.handlers, timeline_queries=5000)
        if runtime is not None:  # a caller's runtime: measure bounds only if it uses our handlers
            self.handlers = runtime.handlers if isinstance(runtime.handlers, IsolatingHandlers) else None
        self.recorder = EventRecorder()
        self.server: ModelServer | None = None  # the app systems' vLLM server, while the run needs it

    def start_server(self) -> None:
        """The model server of the app systems (started once, if any is chosen)."""
        if self.server is None and any(s.served for s in self.config.chosen_systems()):
            log("starting the vLLM OpenAI-compatible server of the app systems (~60 s)")
            self.server = start_model_server(Path(tempfile.gettempdir()) / f"teola-bench-server-{os.getpid()}.log")

    # -- single queries ----------------------------------------------------------------------
    def cold_prefix_cache(self) -> None:
        """Every system asks the same questions: without this, whichever runs second finds the
        prompt in vLLM's prefix cache. (Within a query, prefill splitting still uses it.)"""
        if self.server is not None:
            self.server.reset_prefix_cache()
        try:
            self.runtime.run_sync(self.runtime.engines("llm").call("reset_prefix_cache"), timeout=60)
        except Exception as exc:  # an engine without the method: say so once, measure anyway
            if not getattr(self, "_warned_cache", False):
                log(f"cannot reset the LLM prefix cache ({type(exc).__name__}: {exc}); later runs may hit it")
                self._warned_cache = True

    def run_one(self, app: BenchApp, query: Query, system: System, record_events: bool = False) -> dict[str, Any]:
        self.cold_prefix_cache()
        before = set(self.runtime.timeline.query_ids())
        if record_events:
            self.recorder.reset()
            self.recorder.active = True
        start = time.perf_counter()
        t0_wall = time.time()
        try:
            if system.concurrent:
                answer = asyncio.run(app.arun(query, system))
            else:
                answer = app.run(query, system, callbacks=[self.recorder.langchain] if record_events else None)
            latency = time.perf_counter() - start
        except Exception as exc:  # recorded with the question, not dropped
            return {"system": system.name, "query": query.id, "error": f"{type(exc).__name__}: {exc}",
                    "trace": traceback.format_exc(limit=6)}
        finally:
            self.recorder.active = False
        out: dict[str, Any] = {"system": system.name, "query": query.id, "latency_s": latency, "answer": answer.text,
                               "sources": answer.sources, "em": metrics.exact_match(answer.text, query.answers),
                               "f1": metrics.f1(answer.text, query.answers)}
        if system is TEOLA_FULL:  # the Gantt's Teola side, kept with the run (a checkpoint outlives the timeline)
            ids = [q for q in self.runtime.timeline.query_ids() if q not in before]
            out["spans"] = [(s.node, s.engine, s.op, s.ready - t0_wall, s.start - t0_wall, s.end - t0_wall)
                            for s in self.runtime.timeline.spans(ids)]
        if record_events:
            out["llm_s"] = self.recorder.busy_s("llm")
            out["events"] = [(i.kind, i.start - t0_wall, i.end - t0_wall) for i in self.recorder.intervals]
        return out

    def measure_bound(self, app: BenchApp, query: Query) -> dict[str, Any] | None:
        if self.handlers is None:
            return None
        self.cold_prefix_cache()
        self.handlers.reset()
        self.handlers.measuring = True
        try:
            start = time.perf_counter()
            app.run(query, TEOLA_FULL)
            wall = time.perf_counter() - start
            cost = self.runtime.cost_model()
            trace = recorded_query(self.handlers, wall, cost, app.name, query.id)
            # the trace is also what `teola simulate` replays (written to traces.json, not results.json)
            return {"query": query.id, **trace_bound(trace, cost), "trace": trace.to_dict()}
        except Exception as exc:
            return {"query": query.id, "error": f"{type(exc).__name__}: {exc}"}
        finally:
            self.handlers.measuring = False
            self.handlers.reset()

    # -- open loop -------------------------------------------------------------------------
    async def _poisson(self, app: BenchApp, queries: list[Query], system: System, rate: float,
                       n: int, seed: int, slo_s: float) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=max(32, 2 * n)))
        lat: list[float] = []
        ttft: list[float] = []
        errors: list[str] = []

        async def one(q: Query) -> None:
            t0 = time.perf_counter()
            try:
                ans = await asyncio.wait_for(app.arun(q, system, stream=True), self.config.timeout_s)
                lat.append(time.perf_counter() - t0)
                if ans.ttft_s is not None:
                    ttft.append(ans.ttft_s)
            except Exception as exc:
                errors.append(f"{q.id}: {type(exc).__name__}: {exc}")

        start = time.perf_counter()
        tasks, first_arrival = [], None
        arrivals = poisson_arrivals(rate, n, seed)
        offered = [queries[i % len(queries)] for i in range(n)]
        for t, query in zip(arrivals, offered):
            await asyncio.sleep(max(0.0, start + t - time.perf_counter()))
            first_arrival = first_arrival or time.perf_counter()
            tasks.append(asyncio.create_task(one(query)))
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - (first_arrival or start)  # first arrival -> last completion
        good = sum(1 for x in lat if x <= slo_s)
        return {"system": system.name, "rate_qps": round(rate, 4), **metrics.latency_stats(lat),
                "ttft": metrics.latency_stats(ttft) if ttft else None,
                "throughput_qps": round(len(lat) / duration, 4), "goodput_qps": round(good / duration, 4),
                "slo_s": round(slo_s, 3), "errors": errors,
                # what bench.load_bound needs to say what any scheduler could do on these arrivals
                "arrivals_s": [round(t, 4) for t in arrivals], "arrival_queries": [q.id for q in offered]}

    def poisson(self, app: BenchApp, queries: list[Query], capacity_qps: float, slo_s: float,
                done: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """One sweep per rate and system, appended to ``done`` (sweeps already in it are skipped)."""
        out = done if done is not None else []
        for mult in self.config.poisson_rates:
            for system in (PLAIN_CONCURRENT, TEOLA_FULL):
                if any(r["rate_multiple"] == mult and r["system"] == system.name for r in out):
                    continue
                out.append(self.poisson_sweep(app, queries, system, mult, capacity_qps, slo_s))
                self._save()
        return out

    def poisson_sweep(self, app: BenchApp, queries: list[Query], system: System, rate_multiple: float,
                      capacity_qps: float, slo_s: float) -> dict[str, Any]:
        """One sweep: the config's Poisson arrivals at ``rate_multiple`` x ``capacity_qps``."""
        rate = rate_multiple * capacity_qps
        self.cold_prefix_cache()
        log(f"  poisson {app.name} {system.name} at {rate:.3f} q/s ({rate_multiple}x)")
        res = asyncio.run(self._poisson(app, queries, system, rate, self.config.poisson_queries,
                                        self.config.seed, slo_s))
        res["rate_multiple"] = rate_multiple
        return res

    def _save(self) -> None:
        if self.checkpoint is not None:
            self.checkpoint.save()

    # -- one app -----------------------------------------------------------------------------
    def run_app(self, name: str) -> dict[str, Any]:
        cfg = self.config
        # progress so far (a resumed run's, from its checkpoint): questions, bounds, sweeps done
        state = self.checkpoint.app_state(name) if self.checkpoint else {"questions_done": 0, "runs": [],
                                                                         "bounds": [], "poisson": []}
        app = APPS[name](self.runtime, max_tokens=cfg.max_tokens, timeout_s=cfg.timeout_s)
        if self.server is not None:
            app.server_url, app.server_model = self.server.base_url, self.server.name
        all_queries = app.queries(cfg.questions + 1, seed=cfg.seed)
        log(f"{app.title}: setup")
        t0 = time.perf_counter()
        app.setup(all_queries)
        setup_s = time.perf_counter() - t0
        warm, queries = all_queries[0], all_queries[1:]
        systems = cfg.chosen_systems()
        warm_up = [PLAIN_SEQUENTIAL, TEOLA_FULL] + [s for s in (PLAIN_APP, TEOLA_APP) if s in systems]
        for system in warm_up:  # first calls pay one-time costs (tracing, caches, model loads)
            self.run_one(app, warm, system)
        runs: list[dict[str, Any]] = state["runs"]
        first = state["questions_done"]
        if first:
            log(f"  resuming after question {first}/{len(queries)}")
        # disable=None: a bar on a terminal, none in CI logs (the log lines say the same)
        with tqdm(total=len(queries) * len(systems), initial=first * len(systems), desc=name, unit="run",
                  disable=None) as bar:
            for i, q in enumerate(queries[first:], start=first):
                order = systems[i % len(systems):] + systems[: i % len(systems)]
                question: list[dict[str, Any]] = []  # saved whole: a resumed run redoes a cut-off question
                for system in order:
                    r = self.run_one(app, q, system, record_events=system is PLAIN_SEQUENTIAL)
                    question.append(r)
                    status = f"{r['latency_s']:.2f} s" if "latency_s" in r else f"ERROR {r['error'][:120]}"
                    log(f"  {name} q{i + 1}/{len(queries)} {system.name}: {status}")
                    bar.update(1)
                # one update: an interrupt cannot leave the runs in with the count not yet raised
                state.update(runs=runs + question, questions_done=i + 1)
                runs = state["runs"]
                self._save()
        bounds: list[dict[str, Any]] = state["bounds"]
        for q in queries[len(bounds):] if cfg.bound and self.handlers is not None else ():
            bounds.append(self.measure_bound(app, q))
            self._save()
        result = summarize_app(app, systems, runs, bounds, setup_s)
        if name in cfg.poisson_apps and queries:
            pc = result["systems"].get("plain-concurrent", {}).get("mean_s")
            ps = result["systems"].get("plain-sequential", {}).get("p50_s")
            if pc and ps:
                result["poisson"] = self.poisson(app, queries, 1.0 / pc, cfg.slo_factor * ps, done=state["poisson"])
                result["poisson_summary"] = poisson_summary(result["poisson"], unloaded_s=pc)
        return result

    def run(self) -> dict[str, Any]:
        cfg = self.config
        started = time.perf_counter()
        ckpt = self.checkpoint
        results: dict[str, Any] = {"machine": machine(), "command": cfg.command, "mode": cfg.mode,
                                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                   "config": {k: v for k, v in vars(cfg).items()}, "apps": {},
                                   # which engines the optimizer planned as sharing hardware
                                   "compute_groups": dict(self.runtime.cost_model().compute_groups),
                                   # other processes on the machine skew every number: say how busy it was
                                   "load_avg_1_5_15": {"start": [round(x, 2) for x in os.getloadavg()]}}
        engines_started = False
        try:
            if ckpt is not None:
                ckpt.begin_segment(results["machine"])
            for name in cfg.apps:
                done = ckpt.finished_app(name) if ckpt is not None else None
                if done is not None:
                    log(f"{done['title']}: done in an earlier segment of this run")
                    results["apps"][name] = done
                    continue
                if not engines_started:  # not for a resumed run whose apps are all done
                    log("starting engines (vLLM loads in ~30-60 s on a 2-core CPU)")
                    self.runtime.run_sync(self.runtime.start_engines(), timeout=900)
                    self.start_server()
                    engines_started = True
                results["apps"][name] = self.run_app(name)
                if ckpt is not None:
                    ckpt.finish_app(name, results["apps"][name])
        finally:
            if ckpt is not None:
                try:  # a failing save must not hide the error that ended the run, nor skip shutdown
                    ckpt.end_segment()
                except Exception as exc:
                    log(f"could not save the checkpoint {ckpt.path}: {type(exc).__name__}: {exc}")
            try:
                from llama_index.core import Settings

                Settings.executor = None
            except Exception:
                pass
            if self.server is not None:
                self.server.stop()
                self.server = None
            if self.owns_runtime:
                self.runtime.shutdown()
        results["wall_s"] = round(time.perf_counter() - started, 1)
        results["load_avg_1_5_15"]["end"] = [round(x, 2) for x in os.getloadavg()]
        if ckpt is not None:
            segments = ckpt.data["segments"]
            results["segments"] = segments
            results["code"] = ckpt.data["code"]
            results["code_identity"] = ckpt.data.get("code_identity")
            if len(segments) > 1:  # a resumed run: its whole span, not just this process's
                results["date"] = segments[0]["started"]
                results["wall_s"] = round(sum(s["wall_s"] for s in segments), 1)
                results["load_avg_1_5_15"]["start"] = [round(x, 2) for x in segments[0]["load_avg_start"]]
        # the caller marks the checkpoint finished once the results are written (Checkpoint.finish)
        return results


def _mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None


def summarize_bounds(app: dict[str, Any], bounds: list[dict[str, Any]]) -> None:
    """Set ``app``'s bound rows and what the page judges by them (its ``systems`` summarized)."""
    good = [b for b in bounds if "bound_s" in b]
    for key in ("teola_over_bound", "teola_over_hw_bound", "ideal_speedup", "achieved_speedup", "share_of_ideal"):
        app.pop(key, None)  # what the bounds judged before, if they no longer do
    app["bounds"] = bounds
    app["bound_mean_s"] = _mean([b["bound_s"] for b in good])
    app["hw_bound_mean_s"] = _mean([b["hw_bound_s"] for b in good if "hw_bound_s" in b])
    full, seq = app["systems"].get(TEOLA_FULL.name, {}), app["systems"].get(PLAIN_SEQUENTIAL.name, {})
    if app["bound_mean_s"] and full.get("mean_s") and seq.get("mean_s"):
        app["teola_over_bound"] = round(full["mean_s"] / app["bound_mean_s"], 3)
        if app["hw_bound_mean_s"]:
            app["teola_over_hw_bound"] = round(full["mean_s"] / app["hw_bound_mean_s"], 3)
        app["ideal_speedup"] = round(seq["mean_s"] / app["bound_mean_s"], 3)
        app["achieved_speedup"] = round(seq["mean_s"] / full["mean_s"], 3)
        app["share_of_ideal"] = round((app["achieved_speedup"] - 1) / (app["ideal_speedup"] - 1), 3) \
            if app["ideal_speedup"] > 1.0 else None


def summarize_app(app: BenchApp, systems: list[System], runs: list[dict[str, Any]],
                  bounds: list[dict[str, Any]], setup_s: float) -> dict[str, Any]:
    ok = [r for r in runs if "latency_s" in r]
    answers = {(r["system"], r["query"]): r["answer"] for r in ok}
    out: dict[str, Any] = {"title": app.title, "framework": app.framework, "workload": app.workload,
                           "setup_s": round(setup_s, 2), "systems": {}, "errors": [
                               {k: r[k] for k in ("system", "query", "error")} for r in runs if "error" in r]}
    for system in systems:
        mine = [r for r in ok if r["system"] == system.name]
        stats = metrics.latency_stats([r["latency_s"] for r in mine])
        reference = reference_of(system).name
        same = [r["answer"] == answers[reference, r["query"]] for r in mine if (reference, r["query"]) in answers]
        stats.update({
            "em": _mean([r["em"] for r in mine]), "f1": _mean([r["f1"] for r in mine]),
            # share of answers identical to its plain reference's (plain-sequential; the app systems: plain-app)
            "fidelity": _mean([float(x) for x in same]),
            "errors": sum(1 for r in runs if r["system"] == system.name and "error" in r),
        })
        out["systems"][system.name] = stats
    plain_runs = [r for r in ok if r["system"] == PLAIN_SEQUENTIAL.name and "llm_s" in r]
    if plain_runs:
        out["plain_outside_llm_share"] = _mean([max(0.0, 1 - r["llm_s"] / r["latency_s"]) for r in plain_runs])
    summarize_bounds(out, bounds)
    app_plain, app_teola = out["systems"].get(PLAIN_APP.name, {}), out["systems"].get(TEOLA_APP.name, {})
    if app_plain.get("mean_s") and app_teola.get("mean_s"):  # the headline: the app as users write it
        out["app_speedup"] = round(app_plain["mean_s"] / app_teola["mean_s"], 3)
        if app_plain.get("p99_s") and app_teola.get("p99_s"):
            out["app_speedup_p99"] = round(app_plain["p99_s"] / app_teola["p99_s"], 3)
    out["gantt"] = _gantt(ok)
    out["runs"] = [{k: v for k, v in r.items() if k not in ("events", "spans")} for r in runs]
    return out


def _gantt(ok: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The last question answered by both plain-sequential and teola-full: the plain run's
    framework events and the Teola run's timeline spans (seconds from each run's start)."""
    plain = {r["query"]: r for r in ok if r["system"] == PLAIN_SEQUENTIAL.name}
    teola = {r["query"]: r for r in ok if r["system"] == TEOLA_FULL.name}
    both = [q for q in plain if q in teola]
    if not both:
        return None
    q = both[-1]
    return {"query": q, "plain_latency_s": plain[q]["latency_s"], "teola_latency_s": teola[q]["latency_s"],
            "plain_events": plain[q].get("events", []), "teola_spans": teola[q].get("spans", [])}

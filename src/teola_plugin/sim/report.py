"""``teola simulate``: calibration and predictions -> simulation.json and a markdown page."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..optimizer.cost import CostModel
from .calibration import calibrate, predict, predict_paper_apps, recorded_traces
from .durations import Durations, recorded_decode_step
from .hardware import Deployment
from .what_if import best_rules, load_what_if, table

# What the Ayo README reports measured (4x RTX 3090): plain LlamaIndex -> Ayo, mean latency in s.
AYO_MEASURED = {"doc_qa_naive": ("naive RAG", 3.72, 1.97), "doc_qa_advanced": ("advanced RAG", 7.40, 3.17)}
CALIBRATION_TARGET = {"mean": 0.15, "p99": 0.25}


def parse_deployment(text: str) -> Deployment:
    """``GPU:MODEL`` or ``GPU:MODEL:host`` (the embedder and reranker on the host's CPU)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "host"):
        raise ConfigError(f"a deployment is GPU:MODEL or GPU:MODEL:host, got {text!r}")
    return Deployment.named(parts[0], parts[1], encoders_on_gpu=len(parts) == 2)


def _load(path: Path, what: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc} (written by `teola bench`)") from exc


def run(results_path: Path, profile_path: Path, deployments: Sequence[str], command: str,
        traces_path: Path | None = None) -> dict[str, Any]:
    """The calibration on a benchmark run and the predictions for ``deployments``."""
    results = _load(results_path, "benchmark results")
    traces_file = _load(traces_path or results_path.with_name("traces.json"), "query traces")
    traces = traces_file.get("apps", {})
    if not traces:
        raise ConfigError(f"{traces_path or results_path.with_name('traces.json')} holds no query traces: run "
                          "`teola bench` with the bound runs (not --no-bound)")
    host = CostModel.from_file(profile_path)
    sharing = _load(profile_path, "engine profiles").get("sharing", {}).get("cpu", {})
    share = float(sharing.get("efficiency", 1.0))
    parsed = recorded_traces(results, traces)
    step = recorded_decode_step(t for rows in parsed.values() for t in rows)
    recorded = Durations("measured", host, decode_step_s=step, cpu_sharing=share)
    return {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "source": {"results": str(results_path), "results_command": results.get("command"),
                   "results_date": results.get("date"), "machine": results.get("machine"),
                   "profile": str(profile_path)},
        "target": CALIBRATION_TARGET,
        "recorded_decode_step_s": step,
        "cpu_sharing": sharing or None,
        "calibration": calibrate(results, parsed, recorded),
        "calibration_profile_only": calibrate(results, parsed, Durations("profile", host, cpu_sharing=share)),
        "load_what_if": load_what_if(results, parsed, recorded),
        "predictions": {
            d.name: {"deployment": text, "assumptions": d.assumptions(), "apps": predict(parsed, host, d, share),
                     "paper_apps": predict_paper_apps(host, d, share)}
            for text, d in ((t, parse_deployment(t)) for t in deployments)},
        "paper_apps_here": predict_paper_apps(host, None, share),
        "ayo_measured": {app: {"name": n, "plain_s": p, "ayo_s": a, "speedup": round(p / a, 3)}
                         for app, (n, p, a) in AYO_MEASURED.items()},
    }


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:+.0f}%"


def _share(values: list[float], x: float | None) -> str:
    return "—" if not values or x is None else f"{x:.0%}"


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1e3:.1f} ms"


def _s(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def _within(row: dict[str, Any]) -> str:
    ok = [abs(row[f"error_{k}"]) <= t for k, t in CALIBRATION_TARGET.items() if row.get(f"error_{k}") is not None]
    return "yes" if ok and all(ok) else "no"


def calibration_table(calibration: dict[str, Any]) -> list[str]:
    out = ["| app | system | predicted mean s | measured mean s | error | predicted p99 s | measured p99 s "
           "| error | within target |", "|---|---|---|---|---|---|---|---|---|"]
    for app, systems in calibration.items():
        for system, row in systems.items():
            if system == "poisson":
                continue
            out.append(f"| {app} | {system} | {_s(row['predicted_mean_s'])} | {_s(row['measured_mean_s'])} | "
                       f"{_pct(row['error_mean'])} | {_s(row['predicted_p99_s'])} | {_s(row['measured_p99_s'])} | "
                       f"{_pct(row['error_p99'])} | {_within(row)} |")
        for row in systems.get("poisson", []):
            out.append(f"| {app} | {row['system']}, Poisson {row['rate_multiple']:g}x ({row['rate_qps']} q/s) | "
                       f"{_s(row['predicted_mean_s'])} | {_s(row['measured_mean_s'])} | {_pct(row['error_mean'])} | "
                       f"{_s(row['predicted_p99_s'])} | {_s(row['measured_p99_s'])} | {_pct(row['error_p99'])} | "
                       f"{_within(row)} |")
    return out


def _errors(calibration: dict[str, Any], key: str) -> list[float]:
    rows = [r for systems in calibration.values() for s, r in systems.items() if s != "poisson"]
    rows += [r for systems in calibration.values() for r in systems.get("poisson", [])]
    return [abs(r[key]) for r in rows if r.get(key) is not None]


def _sharing_text(sharing: dict[str, Any] | None) -> str:
    """How the page says the model splits the cores between what runs on them."""
    if not sharing:
        return ("Whatever runs on the two cores shares them equally and without loss (the profile has no "
                "`sharing` measurement: `scripts/bench_engines.py --sharing`), where two thread pools on "
                "two cores cost each other more than an equal share, so the load rows come out low.")
    shares = sharing.get("shares", {})
    return (f"Whatever runs on the two cores shares them, together getting {sharing['efficiency']:.0%} of one "
            f"alone's work done: what the profile measured two engines doing side by side (the embedder "
            f"{shares.get('embedder', 0):.0%} and a vLLM decode {shares.get('llm', 0):.0%} of their work alone; "
            f"`python scripts/bench_engines.py --only --sharing`, {str(sharing.get('date', ''))[:10]}). "
            "Under Poisson load that split is the model's coarsest part: the OS, vLLM's bound threads, the "
            "embedder's thread pool and the framework's threads are not two equal activities.")


def render(sim: dict[str, Any]) -> str:
    src = sim["source"]
    cal = sim["calibration"]
    means, p99s = _errors(cal, "error_mean"), _errors(cal, "error_p99")
    lines = [
        "# Simulated schedules: calibration here, predictions for GPUs",
        "",
        "Generated by `teola simulate` from `simulation.json`; do not edit by hand.",
        "",
        f"* command: `{sim['command']}`",
        f"* benchmark run simulated: `{src['results_command']}` ({src['results_date']}; {src['machine']}), "
        f"`{src['results']}` and the query traces beside it; host profile `{src['profile']}`",
        "",
        "The simulator (`src/teola_plugin/sim/`) replays each question's recorded graphs: the graph "
        "scheduler dispatches ready primitives, the engine schedulers batch them by the runtime's own "
        "policies, vLLM's sequences share decode steps, and engines on one compute group share its "
        "hardware. Each primitive costs what it took alone in the benchmark's bound run (a batch: their "
        "sum scaled by the profile's batching gain; a decode at least its tokens at the recorded step).",
        "",
        "## Calibration on this machine",
        "",
        f"Target: within {CALIBRATION_TARGET['mean']:.0%} on means and {CALIBRATION_TARGET['p99']:.0%} on p99. "
        f"Mean absolute error: {_share(means, sum(means) / len(means) if means else None)} on means "
        f"(largest {_share(means, max(means, default=None))}), "
        f"{_share(p99s, sum(p99s) / len(p99s) if p99s else None)} on p99 "
        f"(largest {_share(p99s, max(p99s, default=None))}).",
        "",
        *calibration_table(cal),
        "",
        "Why predictions and measurements differ: a question's bound run and its measured runs are "
        "separate runs on a shared 2-core machine, and one isolated run per question carries that run's "
        "noise into every system's prediction; the framework's own code in the plain systems is "
        "replayed as the traced graph's primitives, one after another. The isolated run "
        "under-records some decodes: vLLM keeps generating a stream its prefill opened while the run "
        "times the query's other primitives (summarize's leaf decodes are recorded at 0.0-0.1 s for 24-32 "
        f"tokens), so a decode costs at least its tokens after the first at the recorded step "
        f"({_ms(sim.get('recorded_decode_step_s'))} per token: the median of the decodes timed whole, "
        "in the same run as the measurements). A prefill holds the LLM's decodes for what the profile measured a "
        "prefill costing a decode beside it (`llm_prefill_stall`), not for its whole recorded time, which "
        "also holds the request's way into the engine and back (search_gen's 192-token prefills: "
        "0.2-0.34 s recorded; a decode beside one loses about 12 ms). " + _sharing_text(sim.get("cpu_sharing")),
        "",
        "With costs from the profile file alone (each primitive's work items as the lowering estimates "
        "them, a decode's as its recorded tokens; no recorded times), the errors are:",
        "",
        *calibration_table(sim["calibration_profile_only"]),
        "",
        "## Under load: the runtime's rule and others (simulated)",
        "",
        "Poisson arrivals (24 per rate, the benchmark's seed) at multiples of plain-concurrent's "
        "single-query rate, on this machine's recorded traces. The variants keep teola-full's graphs "
        "and change one rule: first-come-first-served engine queues instead of the topology rule (least "
        "laxity first: `runtime/policies.py`), the rule it replaced (longest remaining path first, then "
        "the older query), or an admission cap (later arrivals wait in arrival order, so the shared cores "
        "finish queries one by one instead of slowing all of them).",
        "",
        *table(sim["load_what_if"]),
        "",
        "The largest p99 gain over plain-concurrent per app and rate:",
        "",
        *best_rules(sim["load_what_if"]),
        "",
        "The old rule starved: an older query's short question embedding waited behind the uploads of "
        "every query that arrived after it (doc_qa_naive), which the measured runs showed too "
        "(docs/scheduling.md). An admission cap of two queries helps doc_qa_naive, whose uploads "
        "otherwise share the embedder and the cores with every query in flight, and hurts where one "
        "query cannot use the whole machine (search, summarize, LangChain RAG); with every engine on the "
        "same two cores, the queries' total work sets the tail more than their order.",
        "",
        "## Predictions for GPU deployments",
        "",
        "The same recorded traces, each engine primitive's time scaled from the host profile to the "
        "deployment's (same work items), engines regrouped onto the deployment's hardware; framework code, "
        "the vector store and BM25 stay on the host CPU as measured.",
        "",
        "| deployment | app | plain-sequential mean s | teola-full mean s | speedup |",
        "|---|---|---|---|---|",
    ]
    for name, pred in sim["predictions"].items():
        for app, row in pred["apps"].items():
            lines.append(f"| {name} | {app} | {_s(row['plain_sequential_mean_s'])} | {_s(row['teola_full_mean_s'])} | "
                         f"{row['speedup']:.2f}x |")
    lines += ["", "The recorded graphs were planned for this CPU, where the passes that only overlap engines "
              "declined. Planned for the deployment instead, the paper's apps as the tracer lowers them "
              "(`capture/app_graphs.py`, 100 documents uploaded per question, costs from the profiles alone; "
              "a decode's streamed items cost one item after it, as the optimizer's cost model counts them):", "",
              "| deployment | app | plain-sequential s | teola-full s | speedup | passes that changed the graph |",
              "|---|---|---|---|---|---|"]
    here = sim.get("paper_apps_here", {})
    for name, pred in [("this machine (host profile, one CPU group)", {"paper_apps": here}),
                       *sim["predictions"].items()]:
        for app, row in pred.get("paper_apps", {}).items():
            lines.append(f"| {name} | {app} | {_s(row['plain_sequential_s'])} | {_s(row['teola_full_s'])} | "
                         f"{row['speedup']:.2f}x | {', '.join(row['passes_that_changed']) or '—'} |")
    lines += ["", "Not modelled, so not in these predictions: vLLM's prefix cache (a prefix warmed by "
              "`split_prefill` counts only as fewer prompt tokens), items of a decode streamed into the next "
              "step before it ends (they wait for the decode, costing one item after it), and the runtime's "
              "per-call overhead (~1 ms a dependent step through Ray, docs/scheduling.md).", ""]
    lines += ["For comparison, the Ayo README's measured results on 4x RTX 3090 (its own apps and models):", ""]
    lines += ["| app | plain s | Ayo s | speedup |", "|---|---|---|---|"]
    lines += [f"| {r['name']} (ours: {app}) | {r['plain_s']:.2f} | {r['ayo_s']:.2f} | {r['speedup']:.2f}x |"
              for app, r in sim["ayo_measured"].items()]
    lines += ["", "### Assumptions", ""]
    for name, pred in sim["predictions"].items():
        lines.append(f"**{name}**")
        lines.append("")
        lines += [f"* {a}" for a in pred["assumptions"]]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write(sim: dict[str, Any], out: Path, page: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(sim, indent=1) + "\n")
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(render(sim))

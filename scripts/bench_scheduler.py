"""Runtime overhead with no-op engines: in-process, through Ray actors over their direct
channel (the default), and through Ray actor calls only (``direct_channel=False``).

    .venv/bin/python scripts/bench_scheduler.py      (writes docs/benchmarks/scheduler.json)

* engine_chain: N engine primitives one after another -> per-primitive latency the runtime adds;
* wide: N independent primitives of one query -> how fast a big graph is dispatched;
* concurrent: Q queries of one primitive each at once -> the batch-size histogram.
"""

from __future__ import annotations

import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path

from teola_plugin.ir.graph import PGraph
from teola_plugin.ir.ports import PortType as T
from teola_plugin.runtime.hosting import EngineSpec
from teola_plugin.runtime.runtime import Runtime

NOOP = {"embedder": EngineSpec("embedder", "teola_plugin.bench.noop_engine:NoopEmbedder", kind="embedder")}


def engine_chain(n: int) -> PGraph:
    """n embed primitives, each waiting for the previous one (pure engine round trips)."""
    g = PGraph(f"engine_chain{n}")
    texts = g.input("texts", T.TEXTS)
    last = None
    for _ in range(n):
        last = g.add("embed", inputs={"texts": texts}, after=[last.name] if last else [])
    g.output("out", last.out())
    return g


def wide(n: int) -> PGraph:
    g = PGraph(f"wide{n}")
    texts = g.input("texts", T.TEXTS)
    outs = [g.add("embed", inputs={"texts": texts}).out() for _ in range(n)]
    g.output("out", g.add("aggregate", inputs={f"in{i}": r for i, r in enumerate(outs)}, attrs={"mode": "concat"}).out())
    return g


def measure(hosting: str, direct_channel: bool = True) -> dict:
    rt = Runtime(NOOP, hosting=hosting, direct_channel=direct_channel)
    rt.run_sync(rt.start_engines())
    res: dict = {}
    try:
        for n in (10, 100):
            g = engine_chain(n)
            rt.run_sync(rt.execute(g, {"texts": ["x"]}))  # warm
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                rt.run_sync(rt.execute(g, {"texts": ["x"]}))
                times.append(time.perf_counter() - t0)
            res[f"chain_{n}_per_primitive_ms"] = round(statistics.median(times) / n * 1e3, 3)
        for n in (100, 1000):
            g = wide(n)
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                rt.run_sync(rt.execute(g, {"texts": ["x"]}))
                times.append(time.perf_counter() - t0)
            res[f"wide_{n}_total_s"] = round(statistics.median(times), 4)
            res[f"wide_{n}_per_primitive_ms"] = round(statistics.median(times) / n * 1e3, 4)
        g = engine_chain(1)
        rt.timeline.clear()

        async def burst(q: int):
            return await asyncio.gather(*(rt.execute(g, {"texts": ["x"]}) for _ in range(q)))

        rt.run_sync(burst(64))
        res["burst_64_batch_sizes"] = dict(sorted(rt.timeline.batch_sizes("embedder").items()))
        if hosting == "ray":
            res["transport"] = rt.engines("embedder").handles[0].transport
            res["ray_round_trip_ms"] = ray_round_trip_ms()
    finally:
        rt.shutdown()
    return res


def ray_round_trip_ms(n: int = 300) -> float:
    """The floor under any per-primitive cost through Ray: one bare async actor call awaited
    from a loop (no Teola code), median per call over ``n`` calls on the same Ray node."""
    import ray

    @ray.remote
    class Echo:
        async def echo(self, x):
            return x

    actor = Echo.options(max_concurrency=1000).remote()

    async def calls() -> float:
        for _ in range(20):  # warm
            await actor.echo.remote({"texts": ["x"]})
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            await actor.echo.remote({"texts": ["x"]})
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    try:
        return round(asyncio.run(calls()) * 1e3, 3)
    finally:
        ray.kill(actor)


def main() -> int:
    report = {"machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, python {sys.version.split()[0]}",
              "command": "python scripts/bench_scheduler.py",
              "local": measure("local"), "ray": measure("ray"), "ray_calls": measure("ray", direct_channel=False)}
    out = Path("docs/benchmarks/scheduler.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

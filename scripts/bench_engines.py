"""Latency-vs-batch profiles of the engines, written as the cost model's profile JSON.

    .venv/bin/python scripts/bench_engines.py [--out docs/benchmarks/engine_profiles.json]
                                              [--repeats 3] [--only embedder search ...]

Covers every engine: embedder, vector_store, reranker, search and the vLLM llm; see
teola_plugin.bench.engine_profiles for what each curve measures. Throughput at batch 1
and batch N is each curve's ``throughput_per_s``. ``--sharing`` also measures how much work
the embedder and vLLM get done side by side on the same cores (the file's ``sharing``,
which the simulator's processor sharing reads); ``--only`` with no engines runs just that.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import asyncio

from teola_plugin.bench.engine_profiles import bench_cpu_sharing, machine_meta, profile_engines

ENGINES = ("embedder", "vector_store", "reranker", "search", "llm")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/benchmarks/engine_profiles.json")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=list(ENGINES), choices=ENGINES)
    ap.add_argument("--sharing", action="store_true", help="also measure two engines sharing the CPU cores")
    args = ap.parse_args(argv)

    result = profile_engines(repeats=args.repeats, which=args.only) if args.only else {"profiles": {}}
    if args.sharing:
        result["sharing"] = {"cpu": {**asyncio.run(bench_cpu_sharing(args.repeats)), **machine_meta(args.repeats)}}
    result["meta"] = machine_meta(args.repeats)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.is_file():  # a partial run keeps what it did not measure again
        kept = json.loads(out.read_text())
        if set(args.only) != set(ENGINES):
            result["profiles"] = {**kept.get("profiles", {}), **result["profiles"]}
        if not args.only:  # the curves are the earlier run's
            result["meta"] = kept.get("meta", result["meta"])
        if not args.sharing and "sharing" in kept:
            result["sharing"] = kept["sharing"]
    out.write_text(json.dumps(result, indent=2) + "\n")
    for kind, ops in result["profiles"].items():
        for op, c in ops.items():
            pts = ", ".join(f"b={b}: {l * 1000:.1f} ms ({t}/s)" for b, l, t in zip(c["batch"], c["latency_s"], c["throughput_per_s"]))
            print(f"{kind}.{op}: {pts}")
    if "sharing" in result:
        print(f"cpu sharing: {result['sharing']['cpu']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

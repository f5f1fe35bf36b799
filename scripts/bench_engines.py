"""Latency-vs-batch profiles of the engines, written as the cost model's profile JSON.

    .venv/bin/python scripts/bench_engines.py [--out docs/benchmarks/engine_profiles.json]
                                              [--repeats 3] [--only embedder search ...]

Covers every engine: embedder, vector_store, reranker, search and the vLLM llm; see
teola_plugin.bench.engine_profiles for what each curve measures. Throughput at batch 1
and batch N is each curve's ``throughput_per_s``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from teola_plugin.bench.engine_profiles import machine_meta, profile_engines

ENGINES = ("embedder", "vector_store", "reranker", "search", "llm")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/benchmarks/engine_profiles.json")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=list(ENGINES), choices=ENGINES)
    args = ap.parse_args(argv)

    result = profile_engines(repeats=args.repeats, which=args.only)
    result["meta"] = machine_meta(args.repeats)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if set(args.only) != set(ENGINES) and out.is_file():  # a partial run keeps the other engines' curves
        kept = json.loads(out.read_text()).get("profiles", {})
        result["profiles"] = {**kept, **result["profiles"]}
    out.write_text(json.dumps(result, indent=2) + "\n")
    for kind, ops in result["profiles"].items():
        for op, c in ops.items():
            pts = ", ".join(f"b={b}: {l * 1000:.1f} ms ({t}/s)" for b, l, t in zip(c["batch"], c["latency_s"], c["throughput_per_s"]))
            print(f"{kind}.{op}: {pts}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

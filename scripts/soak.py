"""The full soak of docs/reliability.md: the advanced RAG app (LangChain multi-query RAG on
Teola, real engines) under open-loop Poisson load at 2x its saturation throughput.

    python scripts/soak.py                     # 500 queries, then 500 more for memory (1,000)
    python scripts/soak.py --queries 100 --rounds 1 --json out.json

Prints each round's report (counts, correctness checks, latency, memory per checkpoint)
and exits non-zero if a query was lost, mixed up or failed with anything but a timeout,
or if memory grew. `make test` runs a 60-query version (tests/test_reliability_soak.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.reliability


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=500, help="queries per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (memory is compared across all)")
    parser.add_argument("--rate-factor", type=float, default=2.0, help="offered load / saturation")
    parser.add_argument("--timeout", type=float, default=180.0, help="per-query timeout, seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the reports here")
    args = parser.parse_args()

    from teola_plugin.runtime.runtime import Runtime, default_engine_specs
    from tests.reliability import mib, run_soak
    from tests.test_reliability_soak import assert_flat, assert_sound

    runtime = Runtime(default_engine_specs(), hosting="ray")
    runtime.run_sync(runtime.start_engines("llm", "embedder"), timeout=900)
    reports, failures = [], []
    try:
        for r in range(args.rounds):
            report = run_soak(runtime, args.queries, rate_factor=args.rate_factor, seed=args.seed + r,
                              timeout_s=args.timeout)
            reports.append(report)
            short = {k: v for k, v in report.items() if k != "memory"}
            print(json.dumps(short, default=str))
            for m in report["memory"]:
                print(f"  after {m['after_queries']:4d}: driver {mib(m['driver_rss'])} MiB, actors "
                      f"{ {k: mib(v) for k, v in m['actors_rss'].items()} } MiB, object store "
                      f"{m['object_store_used']} B, timeline {m['timeline_queries']} queries")
            try:
                assert_sound(report, args.queries)
            except AssertionError as exc:
                failures.append(f"round {r + 1}: {exc}")
        memory = reports[0]["memory"][-1:] + [m for rep in reports[1:] for m in rep["memory"]]
        try:
            assert_flat(memory if len(reports) > 1 else reports[0]["memory"], runtime.timeline.max_queries)
        except AssertionError as exc:
            failures.append(f"memory: {exc}")
    finally:
        if args.json:
            args.json.write_text(json.dumps(reports, indent=1, default=str))
        runtime.shutdown()
    print("FAILED:\n  " + "\n  ".join(failures) if failures else "soak passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

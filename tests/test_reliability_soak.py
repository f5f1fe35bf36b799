"""Load: the advanced RAG app (LangChain multi-query RAG on Teola, real engines) under an
open-loop Poisson stream at about twice its measured saturation throughput.

Every query must complete with its own correct answer (see ``check_results``: question,
answer/prompt and documents of each query are its own) or fail with ``QueryTimeoutError``;
none lost, none duplicated; afterwards the engines hold nothing (queues, slots, streams,
vLLM requests) and memory has not grown beyond a generous margin.

`make test` runs a short stream (60 queries); the full one (500 queries, then memory over
1,000) is ``pytest -m soak tests/test_reliability_soak.py`` or ``python scripts/soak.py``.
"""

from __future__ import annotations

import pytest

from tests.reliability import mib, run_soak

MIB = 2**20


def assert_sound(report: dict, n: int) -> None:
    assert report["ok"] + report["timeouts"] + len(report["errors"]) == n  # none lost
    assert report["errors"] == [], report["errors"]  # ok, or a clear timeout: nothing else
    assert report["ok"] >= n // 2, f"only {report['ok']} of {n} completed"
    assert report["checks"] == {"question": [], "answer": [], "documents": [], "duplicates": []}, report["checks"]
    assert report["left_busy"] == {}, report["left_busy"]  # nothing left queued or generating


def assert_flat(memory: list[dict], timeline_limit: int) -> None:
    """Growth from the first to the last checkpoint within a generous margin: a leak of a
    few KiB per query over hundreds of queries would pass, one per-query model copy,
    stream or result buffer would not."""
    first, last = memory[0], memory[-1]
    assert last["driver_rss"] - first["driver_rss"] < max(300 * MIB, 0.25 * first["driver_rss"]), \
        (mib(first["driver_rss"]), mib(last["driver_rss"]))
    for actor, rss in last["actors_rss"].items():
        before = first["actors_rss"].get(actor, rss)
        assert rss - before < max(300 * MIB, 0.25 * before), (actor, mib(before), mib(rss))
    if first["object_store_used"] is not None:
        assert last["object_store_used"] - first["object_store_used"] < 32 * MIB, \
            (first["object_store_used"], last["object_store_used"])
    assert last["timeline_queries"] <= timeline_limit


@pytest.mark.slow
@pytest.mark.extended  # a minute of open-loop load plus its saturation probe (~5 min on 2 slow cores): `make test-all`
def test_short_poisson_soak_at_twice_saturation(runtime):
    report = run_soak(runtime, 60, rate_factor=2.0, seed=0, timeout_s=120, saturation_probe=8, checkpoints=2)
    print({k: v for k, v in report.items() if k != "memory"})
    for m in report["memory"]:
        print(m)
    assert_sound(report, 60)
    assert_flat(report["memory"], runtime.timeline.max_queries)


@pytest.mark.soak
def test_full_soak_500_queries_then_memory_over_1000(runtime):
    report = run_soak(runtime, 500, rate_factor=2.0, seed=1, timeout_s=180)
    assert_sound(report, 500)
    more = run_soak(runtime, 500, rate_factor=2.0, seed=2, timeout_s=180)
    assert_sound(more, 500)
    assert_flat(report["memory"][-1:] + more["memory"], runtime.timeline.max_queries)

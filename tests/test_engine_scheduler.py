"""Engine scheduler policy: batching, priority, isolation of failures, cancellation.

Pure scheduling logic, so the engine here is a recording function (allowed for policy
unit tests); the real engines are exercised through the same scheduler in test_runtime.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from teola_plugin.runtime.engine_scheduler import EngineScheduler
from teola_plugin.runtime.policies import BatchPolicy, Priority


class Recorder:
    def __init__(self, delay: float = 0.0, fail_on: set[int] | None = None) -> None:
        self.batches: list[list[int]] = []
        self.delay = delay
        self.fail_on = fail_on or set()

    async def __call__(self, op: str, payloads: list[int]) -> list[int]:
        self.batches.append(list(payloads))
        await asyncio.sleep(self.delay)
        if self.fail_on & set(payloads):
            raise ValueError(f"bad request in {payloads}")
        return [p * 10 for p in payloads]


def run(coro):
    return asyncio.run(coro)


def test_concurrent_requests_share_batches_up_to_the_max_size():
    async def main():
        rec = Recorder(delay=0.01)
        sched = EngineScheduler("e", rec, BatchPolicy(max_batch_size=4, max_wait_s=0.01, max_concurrent=1))
        results = await asyncio.gather(*(sched.submit("op", i, Priority()) for i in range(10)))
        await sched.close()
        return rec, results

    rec, results = run(main())
    assert [r for r, _ in results] == [i * 10 for i in range(10)]  # each gets its own result
    assert sorted(x for b in rec.batches for x in b) == list(range(10))  # nothing lost or duplicated
    assert max(len(b) for b in rec.batches) == 4
    assert len(rec.batches) == 3
    sizes = {info.batch_id: info.size for _, info in results}
    assert sorted(sizes.values()) == [2, 4, 4]


def test_topology_priority_runs_each_request_by_its_latest_start():
    """Within a query the longest remaining path goes first; across queries a newer query's
    critical work goes before an older one's only by the older request's slack, so a newer
    query's long work cannot hold back an older query's short critical step."""
    async def main():
        rec = Recorder(delay=0.01)
        sched = EngineScheduler("e", rec, BatchPolicy(max_batch_size=1, max_wait_s=0.0, max_concurrent=1))
        blocker = asyncio.create_task(sched.submit("op", 0, Priority()))  # occupies the slot
        await asyncio.sleep(0)
        old = dict(query_arrival_s=100.0, critical_path_s=3.0)  # a query whose whole path is 3 s
        reqs = [
            sched.submit("op", 1, Priority(remaining_s=0.5, **old)),  # 2.5 s of slack: latest start 102.5
            sched.submit("op", 2, Priority(remaining_s=3.0, **old)),  # its critical path: 100
            sched.submit("op", 3, Priority(remaining_s=3.0, query_arrival_s=101.0, critical_path_s=3.0)),  # 101
            sched.submit("op", 4, Priority(remaining_s=3.0, query_arrival_s=104.0, critical_path_s=3.0)),  # 104
            sched.submit("op", 5, Priority(remaining_s=0.1, query_arrival_s=101.0, critical_path_s=0.1)),  # 101, later
        ]
        await asyncio.gather(blocker, *reqs)
        await sched.close()
        return rec

    rec = run(main())
    assert [b[0] for b in rec.batches] == [0, 2, 3, 5, 1, 4]


def test_a_request_of_its_own_arrives_now_on_its_critical_path():
    before = time.time()
    p = Priority()
    assert before <= p.query_arrival_s <= time.time() and p.latest_start_s == p.query_arrival_s
    assert Priority(2.0, 10.0).latest_start_s == 10.0  # no critical path given: on it
    assert Priority(0.5, 10.0, critical_path_s=2.0).latest_start_s == 11.5


def test_fifo_policy_ignores_the_critical_path():
    async def main():
        rec = Recorder(delay=0.01)
        sched = EngineScheduler("e", rec, BatchPolicy(max_batch_size=1, max_wait_s=0.0, priority="fifo"))
        blocker = asyncio.create_task(sched.submit("op", 0, Priority()))
        await asyncio.sleep(0)
        reqs = [sched.submit("op", i, Priority(remaining_s=float(i))) for i in (1, 2, 3)]
        await asyncio.gather(blocker, *reqs)
        await sched.close()
        return rec

    assert [b[0] for b in run(main()).batches] == [0, 1, 2, 3]


def test_a_failing_request_fails_only_itself_not_its_batch_mates():
    async def main():
        rec = Recorder(fail_on={3})
        sched = EngineScheduler("e", rec, BatchPolicy(max_batch_size=8, max_wait_s=0.01))
        results = await asyncio.gather(*(sched.submit("op", i, Priority()) for i in range(6)), return_exceptions=True)
        await sched.close()
        return results

    results = run(main())
    assert isinstance(results[3], ValueError) and "bad request" in str(results[3])
    assert [r[0] for i, r in enumerate(results) if i != 3] == [0, 10, 20, 40, 50]


def test_cancelled_requests_are_not_run():
    async def main():
        rec = Recorder(delay=0.05)
        sched = EngineScheduler("e", rec, BatchPolicy(max_batch_size=1, max_wait_s=0.0))
        first = asyncio.create_task(sched.submit("op", 1, Priority()))
        await asyncio.sleep(0)
        doomed = asyncio.create_task(sched.submit("op", 2, Priority()))
        await asyncio.sleep(0.01)
        doomed.cancel()
        third = await sched.submit("op", 3, Priority())
        await first
        await sched.close()
        return rec, third, sched.queued

    rec, third, queued = run(main())
    assert [b for b in rec.batches] == [[1], [3]]
    assert third[0] == 30 and queued == 0


def test_max_wait_lets_a_batch_fill_but_bounds_the_wait():
    async def main():
        rec = Recorder()
        sched = EngineScheduler("e", rec, BatchPolicy(max_batch_size=8, max_wait_s=0.05))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        a = asyncio.create_task(sched.submit("op", 1, Priority()))
        await asyncio.sleep(0.01)
        b = asyncio.create_task(sched.submit("op", 2, Priority()))
        await asyncio.gather(a, b)
        waited = loop.time() - t0
        await sched.close()
        return rec, waited

    rec, waited = run(main())
    assert rec.batches == [[1, 2]]  # the late request joined the batch
    assert 0.04 <= waited < 1.0  # ...which waited for max_wait, not forever


def test_stream_admission_respects_the_concurrency_limit():
    async def main():
        sched = EngineScheduler("e", Recorder(), BatchPolicy(max_batch_size=1, max_wait_s=0, max_concurrent=2))
        r1 = await sched.admit(Priority())
        r2 = await sched.admit(Priority())
        third = asyncio.create_task(sched.admit(Priority()))
        await asyncio.sleep(0.02)
        blocked = not third.done()
        r1()
        r3 = await asyncio.wait_for(third, 1)
        r2(), r3()
        await sched.close()
        return blocked

    assert run(main()) is True


def test_invalid_policy_is_rejected():
    with pytest.raises(ValueError, match="unknown priority rule"):
        BatchPolicy(priority="random")
    with pytest.raises(ValueError):
        BatchPolicy(max_batch_size=0)


def test_an_item_cap_splits_requests_into_batches_in_priority_order():
    async def main():
        rec = Recorder()
        sched = EngineScheduler("e", rec, BatchPolicy(max_batch_size=8, max_batch_items=10, max_concurrent=1),
                                size_of=lambda op, payload: payload)  # a request's payload is its item count
        blocker = asyncio.create_task(sched.submit("op", 1, Priority()))
        await asyncio.sleep(0)
        sizes = [6, 3, 4, 20, 1]
        reqs = [sched.submit("op", n, Priority(remaining_s=10 - i)) for i, n in enumerate(sizes)]
        await asyncio.gather(blocker, *reqs)
        await sched.close()
        return rec

    rec = run(main())
    # after the blocker: 6+3 fit (10 max), 4 starts the next batch, 20 runs alone (oversized
    # requests still run), 1 last; nothing lost
    assert rec.batches == [[1], [6, 3], [4], [20], [1]]

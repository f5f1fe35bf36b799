"""bench.load_bound: the best p99 and goodput any scheduler could reach on a sweep's arrivals,
on schedules small enough to work out by hand."""

from __future__ import annotations

import math

import pytest

from teola_plugin.bench.load import poisson_arrivals
from teola_plugin.bench.load_bound import QueryWork, checked, load_bound, sweep_bound


def _work(*seconds: float, own: float = 0.5) -> list[QueryWork]:
    return [QueryWork(own, {"cpu:host": s}) for s in seconds]


def test_first_come_first_served_backlog_floors_the_largest_latency_and_the_p99():
    # 2 s of work every second: done at 2, 4, 6 -> latencies 2, 3, 4 at the least
    bound = load_bound([0.0, 1.0, 2.0], _work(2.0, 2.0, 2.0, own=2.5), slo_s=4.0)
    # numpy's p99 of three: 2.5 + 0.98 x (4 - 2.5), the two smaller floored by each query's own bound
    assert bound.p99_floor_s == pytest.approx(2.5 + 0.98 * 1.5)
    assert (bound.on_time_max, bound.n) == (3, 3)
    assert bound.min_duration_s == pytest.approx(6.0) and bound.arrival_span_s == pytest.approx(2.0)
    assert bound.goodput_ceiling_qps == pytest.approx(0.5) and bound.arrivals_ceiling_qps == pytest.approx(1.5)


def test_the_most_answers_within_the_slo_may_drop_an_early_long_query():
    # first come first served keeps only the 5 s query on time; dropping it keeps the other two
    bound = load_bound([0.0, 0.1, 0.2], _work(5.0, 1.0, 1.0), slo_s=5.5)
    assert bound.on_time_max == 2
    # a query whose own bound exceeds the SLO is never on time, whatever the machine does
    assert load_bound([0.0, 0.1, 0.2], [QueryWork(6.0, {"g": 0.1})] + _work(1.0, 1.0), 5.5).on_time_max == 2
    # each group must fit on its own: the busier one decides
    two = [QueryWork(0.5, {"a": 1.0, "b": 3.0}), QueryWork(0.5, {"a": 1.0, "b": 3.0})]
    assert load_bound([0.0, 0.0], two, slo_s=4.0).on_time_max == 1
    assert load_bound([0.0, 0.0], two, slo_s=6.0).on_time_max == 2


def test_a_bound_a_measurement_beat_is_not_kept():
    bound = load_bound([0.0, 1.0, 2.0], _work(2.0, 2.0, 2.0, own=2.5), slo_s=4.0)
    kept = checked(bound, [{"p99_s": 5.0, "goodput_qps": 0.4}, {"p99_s": 4.5, "goodput_qps": 0.3}])
    assert kept.p99_floor_s == bound.p99_floor_s and kept.estimated_ceiling
    assert kept.goodput_ceiling_qps == pytest.approx(0.5)
    beaten = checked(bound, [{"p99_s": 3.0, "goodput_qps": 0.6}])
    assert beaten.p99_floor_s is None and not beaten.estimated_ceiling
    assert beaten.goodput_ceiling_qps == pytest.approx(1.5)  # 3 answers over the 2 s the arrivals span


def test_arrivals_are_seeded_per_rate_and_a_sweep_without_recorded_ones_is_redrawn():
    assert poisson_arrivals(0.5, 4, 0) == poisson_arrivals(0.5, 4, 0) != poisson_arrivals(0.25, 4, 0)
    assert all(b > a for a, b in zip(poisson_arrivals(0.5, 8, 0), poisson_arrivals(0.5, 8, 0)[1:]))
    app = {"systems": {"plain-concurrent": {"mean_s": 4.0}},
           "runs": [{"query": "q1"}, {"query": "q1"}, {"query": "q2"}],
           "bounds": [{"query": "q1", "hw_bound_s": 1.0, "group_work_s": {"cpu:host": 0.5}},
                      {"query": "q2", "hw_bound_s": 3.0, "group_work_s": {"cpu:host": 2.0}}]}
    row = {"rate_multiple": 2.0, "rate_qps": 0.5, "slo_s": 10.0}
    redrawn = sweep_bound(app, row, seed=0, n=4)
    arrivals = poisson_arrivals(2.0 * (1.0 / 4.0), 4, 0)  # q1, q2, q1, q2: the runner's cycle
    expected = load_bound(arrivals, [QueryWork(1.0, {"cpu:host": 0.5}), QueryWork(3.0, {"cpu:host": 2.0})] * 2, 10.0)
    assert redrawn == expected
    recorded = {**row, "arrivals_s": [0.0, 0.1], "arrival_queries": ["q2", "q2"]}
    assert sweep_bound(app, recorded, seed=0, n=4).min_duration_s == pytest.approx(4.0)  # 2 + 2 of work back to back
    assert sweep_bound(app, {**row, "rate_qps": 0.3}, seed=0, n=4) is None  # not the rate the runner drew at
    assert sweep_bound({**app, "bounds": []}, row, seed=0, n=4) is None
    assert math.isinf(load_bound([1.0], _work(0.0, own=0.0), 1.0).goodput_ceiling_qps)

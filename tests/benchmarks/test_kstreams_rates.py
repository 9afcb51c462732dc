"""The Kafka Streams peer's sustained rate (benchmarks.e2e.kstreams_run.drain_rates): pure logic."""

import pytest

from benchmarks.e2e.kstreams_run import drain_rates


def probes(rows: list[int], deliveries: list[int]) -> list[dict]:
    return [{"rows": r, "deliveries": d, "seconds": 1.0, "end": float(i)}
            for i, (r, d) in enumerate(zip(rows, deliveries))]


def test_idle_seconds_before_and_after_the_drain_do_not_count():
    p = probes([0, 0, 1000, 1000, 1000, 1000, 0], [0, 0, 8000, 8000, 8000, 8000, 0])
    # 5% of 4,000 is reached at the probe ending at t=2, 95% at t=5.
    assert drain_rates(p) == (3000 / 3, 24000 / 3)


def test_a_slow_second_inside_the_drain_counts():
    p = probes([1000, 100, 1000, 1000], [8000, 800, 8000, 8000])
    publishes, deliveries = drain_rates(p)
    assert publishes == pytest.approx((100 + 1000 + 1000) / 3)
    assert deliveries == pytest.approx((800 + 8000 + 8000) / 3)


def test_a_drain_within_one_probe():
    assert drain_rates(probes([0, 500, 0], [0, 4000, 0])) == (500.0, 4000.0)


def test_no_publishes():
    assert drain_rates(probes([0, 0], [0, 0])) == (0.0, 0.0)

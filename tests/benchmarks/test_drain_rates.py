"""Sustained rates over a backlog's drain (benchmarks.e2e.drain): the Kafka Streams peer's
probes and the delivery consumer's arrivals per second. Pure logic."""

import pytest

from benchmarks.e2e.drain import arrival_probes, arrival_rates, drain_rates


def probes(rows: list[int], deliveries: list[int]) -> list[dict]:
    return [{"rows": r, "deliveries": d, "seconds": 1.0, "end": float(i)}
            for i, (r, d) in enumerate(zip(rows, deliveries, strict=True))]


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


def test_arrivals_count_the_seconds_without_one_between_the_first_and_the_last():
    probes = arrival_probes({"102": 5, "100": 1})  # JSON keys are strings
    assert [(p["end"], p["deliveries"]) for p in probes] == [(101.0, 1), (102.0, 0), (103.0, 5)]


def test_the_delivery_side_rate_skips_the_ramp_and_the_tail():
    # A slow first second (the consumer's first fetch), a steady 10,000/s drain with one
    # stalled second (a micro-batch boundary), a short tail.
    arrivals = {100: 200, 101: 10_000, 102: 10_000, 103: 0, 104: 10_000, 105: 10_000, 106: 10_000,
                107: 10_000, 108: 10_000, 109: 10_000, 110: 10_000, 111: 10_000, 112: 300}
    publishes, deliveries = arrival_rates(arrivals, publishes=10_050)
    total = sum(arrivals.values())
    # 5% of the arrivals are in by 101, 95% by 111: 10 seconds, the stalled one counted.
    assert deliveries == pytest.approx(90_000 / 10)
    assert publishes == pytest.approx(deliveries * 10_050 / total)
    assert deliveries < 10_000  # the stall lowers the rate: it is not dropped


def test_no_arrivals_is_no_rate():
    assert arrival_rates({}, publishes=1000) == (0.0, 0.0)
    assert arrival_rates({100: 50}, publishes=0) == (0.0, 0.0)

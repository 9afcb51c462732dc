"""Sustained rates over the drain of a backlog: pure arithmetic on per-second counts.

A saturation phase produces a backlog as fast as the load driver can and lets the
system under test drain it. Its sustained rate is what it processed per second of
wall time between the moments ``lo`` and ``hi`` of the backlog had been processed,
every second in between counted (a slow second is not dropped), so that neither the
start (the first batch, the consumer's assignment) nor the tail counts.

Two sources feed it: the system's own progress reports (the Kafka Streams peer's
per-second probes, :func:`drain_rates`) and the delivery consumer's arrivals by the
second they arrived in (:func:`arrival_rates`), which measures any router, in any
mode, from the outside: the rate at which deliveries reached a subscriber while a
backlog drained, which is the rate at which consumer lag stops growing.
"""

from __future__ import annotations

from collections.abc import Mapping


def drain_rates(probes: list[dict], lo: float = 0.05, hi: float = 0.95) -> tuple[float, float]:
    """(publishes/s, deliveries/s) over the drain of a backlog, from per-second probes
    (``rows``, ``deliveries``, ``end``, ``seconds``): between the probe at which ``lo`` of
    the phase's publishes had been processed and the one at which ``hi`` had, every second
    in between counted (a slow second is not dropped)."""
    total = sum(p["rows"] for p in probes)
    if not total:
        return 0.0, 0.0
    rows = dels = 0
    first = last = None
    for p in probes:
        rows += p["rows"]
        if first is None and rows >= lo * total:
            first, rows0, dels0 = p, rows, dels + p["deliveries"]
        dels += p["deliveries"]
        if rows >= hi * total:
            last = p
            break
    if first is None or last is None:  # rows reach hi * total by the last probe at the latest
        raise ValueError("the probes do not cover the drain")
    span = last["end"] - first["end"]
    if span <= 0:  # the whole drain within a probe interval
        return total / last["seconds"], dels / last["seconds"]
    return (rows - rows0) / span, (dels - dels0) / span


def arrival_probes(per_second: Mapping[int, int] | Mapping[str, int]) -> list[dict]:
    """The delivery consumer's arrivals by Unix second as :func:`drain_rates` probes, one per
    second from the first arrival's to the last's, the seconds without an arrival as 0."""
    seconds = {int(k): v for k, v in per_second.items()}
    if not seconds:
        return []
    return [{"rows": seconds.get(s, 0), "deliveries": seconds.get(s, 0), "end": s + 1.0,
             "seconds": 1.0} for s in range(min(seconds), max(seconds) + 1)]


def arrival_rates(per_second: dict[int, int], publishes: int) -> tuple[float, float]:
    """(publishes/s, deliveries/s) at the delivery side over the drain of a backlog of
    ``publishes``: deliveries arrived per second between the seconds at which 5% and 95% of
    them had arrived (:func:`drain_rates`), and publishes/s at the backlog's deliveries per
    publish (all arrivals over ``publishes``)."""
    total = sum(per_second.values())
    if not total or not publishes:
        return 0.0, 0.0
    _, deliveries_per_s = drain_rates(arrival_probes(per_second))
    return deliveries_per_s * publishes / total, deliveries_per_s

"""The e2e table (benchmarks.e2e.__main__.table) with both bitroute modes beside a peer: pure
formatting of a results dict, no broker."""

from dataclasses import asdict

import pytest

from benchmarks.e2e.__main__ import cpu_per_delivery, table
from benchmarks.e2e.bitroute_run import BitrouteResult, Phase
from benchmarks.e2e.compare import RunResult, SystemResult

MB = 1 << 20


def batch(rows: int, end: float) -> dict:
    return {"rows": rows, "deliveries": 8 * rows, "seconds": 1.0, "end": end,
            "catch_up": 0.1, "route": 0.7, "audit": 0.2}


def saturation(deliveries_per_s: float, source: str, cpu_s: float, delivered: int) -> Phase:
    return Phase(deliveries_per_s / 8, deliveries_per_s,
                 batches=[batch(10_000, float(t)) for t in range(4)],
                 cores={"router: Spark JVM": 1.2}, max_core={"router: Spark JVM": 0.9},
                 peak_rss={"router: Spark JVM": 900 * MB, "Kafka broker": 700 * MB},
                 cpu_s={"router: Python driver": cpu_s / 4, "router: Spark JVM": 3 * cpu_s / 4,
                        "Kafka broker": 100.0, "delivery consumer": 50.0},
                 delivered=delivered, delivery_side=(deliveries_per_s / 8, 0.97 * deliveries_per_s),
                 rate_source=source)


def paced(p99_ms: float) -> Phase:
    return Phase(5000, 40_000, 20.0, p99_ms, 300.0, 1.0, [batch(5000, 1.0)])


def bitroute(deliveries_per_s: float, source: str, cpu_s: float) -> dict:
    return asdict(BitrouteResult(3.0, 40.0, saturation(deliveries_per_s, source, cpu_s, 2_400_000),
                                 paced(250.0), paced(400.0), []))


def results() -> dict:
    run = RunResult(0, 9000, 72_000, 1.0, 5.0, 9.0, 1, 1, {"broker": 1.0}, {"broker": 1.0},
                    {"broker": 50 * MB})
    return {"profile": "devices", "size": "100k", "n": 100_000, "seed": 1,
            "deliveries_per_publish": 8.0, "machine": "2 cores", "sets": [],
            "loadavg": {"start": [20.0, 0, 0], "end": [22.0, 0, 0]},
            "bitroute": bitroute(110_000, "router", 24.0),
            "bitroute-realtime": bitroute(60_000, "delivery", 48.0),
            "mosquitto": asdict(SystemResult("mosquitto", run, run, run, 9000, 72_000, 0.0))}


def test_cpu_per_delivery_counts_the_router_processes_alone():
    sat = results()["bitroute"]["saturation"]
    assert cpu_per_delivery(sat) == pytest.approx(24.0 / 2_400_000)
    assert cpu_per_delivery({**sat, "delivered": 0}) != cpu_per_delivery(sat)  # NaN


def test_the_table_has_both_modes_beside_the_peer():
    text = table(results())
    header = next(line for line in text.splitlines() if "bitroute-realtime" in line)
    assert header.split() == ["bitroute", "bitroute-realtime", "mosquitto"]
    cpu = next(line for line in text.splitlines() if line.startswith("router CPU us per delivery"))
    assert cpu.split()[-3:] == ["10.0", "20.0", "-"]
    side = next(line for line in text.splitlines() if line.strip().startswith("measured at"))
    assert side.split()[-3:] == ["router", "delivery", "client"]
    assert "bitroute-realtime/bitroute deliveries/s" in text
    assert "realtime saturated deliveries/s >= half of micro-batch's: 60,000 vs 55,000 -> met" in text
    # Realtime mode's batches are its audit query's: no per-batch routing split for it.
    assert "bitroute per-batch split" in text and "bitroute-realtime per-batch split" not in text
    assert "bitroute-realtime at 50%: 5,000 publishes/s, all audited" in text

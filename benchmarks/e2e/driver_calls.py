"""A batch routed in the driver: one routing call per Kafka partition, or one for the batch.

    python -m benchmarks.e2e.driver_calls [--size 100k] [--publishes 2000,4000] [--rounds 6]

``DataFrame.toArrow`` hands the driver a record batch per partition of the
publishes topic (2 by default); each routing call ends with a flush, which
sends a Produce request to every delivery partition the call wrote to. This
routes the same publishes both ways against an embedded broker of its own
(the devices workload, 1,000 delivery topics, no Spark): ``split`` = two
``route_batch`` calls on the two halves (as the driver did), ``one`` = one call
on the whole batch (``Router._route_in_driver`` now). The two alternate, the
order swapped every round, after one warm-up round of each. Prints, per batch
size, the medians of wall time, this process's CPU (librdkafka's threads
included) and the broker's CPU (``/proc``), and the ratios one/split; the load
average beside them. Bound it with ``timeout``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from benchmarks.e2e import procstat, workload
from benchmarks.e2e.route_task import source_batch
from compiler import Matcher, RoutingIndex, Subscription
from streaming import kafka
from streaming.config import KafkaConfig
from streaming.kafka.broker import EmbeddedBroker, free_port
from streaming.router.delivery import DeliveryProducer, ProducerSettings
from streaming.router.routing import RouteSettings, route_batch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="driver_calls")
    ap.add_argument("--size", choices=sorted(workload.SIZES), default="100k")
    ap.add_argument("--publishes", default="2000,4000")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.publishes.split(",")]
    w = workload.generate("devices", workload.SIZES[args.size], 1, 2 * max(sizes))
    index = RoutingIndex({workload.EXCHANGE: "mqtt"})
    for sub_id, subscriber, filt in w.subs:
        index.upsert(Subscription.from_changelog(
            sub_id, workload.changelog_value(workload.EXCHANGE, subscriber, filt)))
    matcher = Matcher(index.snapshot(1, {}))
    with tempfile.TemporaryDirectory() as folder:
        broker = EmbeddedBroker(Path(folder), port=free_port(), controller_port=free_port())
        broker.start()
        try:
            from confluent_kafka.admin import NewTopic

            admin = kafka.admin(kafka.ClientSettings.of(broker.bootstrap))
            layout = KafkaConfig().layout
            topics = [NewTopic(t, 1, 1) for t in sorted({layout.topic(s) for s in w.subscribers})]
            for future in admin.create_topics([*topics, NewTopic("bitroute.rejected", 1, 1)]).values():
                future.result(120)
            producer = DeliveryProducer(ProducerSettings(broker.bootstrap, 1_048_576,
                                                         message_timeout_ms=600_000))
            settings = RouteSettings(workload.EXCHANGE, layout, "bitroute.rejected", 1, False,
                                     producer.settings)
            broker_pid = broker.pid()
            results: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
            offset = 0
            for r in range(args.rounds + 1):
                for n in sizes:
                    batch = source_batch(w.publishes[:n], offset)
                    offset += n
                    half = n // 2
                    ways = {"split": [batch.slice(0, half), batch.slice(half)], "one": [batch]}
                    order = ["split", "one"] if r % 2 else ["one", "split"]
                    for way in order:
                        wall, cpu = time.perf_counter(), time.process_time()
                        broker_cpu = procstat.cpu_seconds(broker_pid)
                        for part in ways[way]:
                            route_batch(matcher, producer, part, settings)
                        sample = (time.perf_counter() - wall, time.process_time() - cpu,
                                  procstat.cpu_seconds(broker_pid) - broker_cpu)
                        if r:  # round 0 warms up (metadata of every topic, connections)
                            results.setdefault((n, way), []).append(sample)
                print(f"round {r} done, load {os.getloadavg()[0]:.1f}", flush=True)
            print(f"\nmedians of {args.rounds} rounds; load average "
                  f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())}")
            print("| publishes | calls | wall ms | task CPU ms | broker CPU ms |")
            print("| ---: | --- | ---: | ---: | ---: |")
            for n in sizes:
                med = {way: [statistics.median(s[i] for s in results[(n, way)]) for i in range(3)]
                       for way in ("split", "one")}
                for way, label in (("split", "2 (per partition)"), ("one", "1 (whole batch)")):
                    print(f"| {n:,} | {label} | " + " | ".join(
                        f"{1000 * v:,.0f}" for v in med[way]) + " |")
                ratios = [med["one"][i] / med["split"][i] for i in range(3)]
                print(f"| {n:,} | one/split | " + " | ".join(f"{x:.2f}x" for x in ratios) + " |")
        finally:
            broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

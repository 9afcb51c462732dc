"""How long a routing task's flush waits, against the producer's shards (connections).

    python -m benchmarks.e2e.flush_probe [--topics 1000] [--per-topic 1,8] [--shards 8,32]
                                         [--rounds 5]

A routing call queues its deliveries (``kafka.delivery_linger_ms`` 1,000: nothing
is sent yet) and flushes: librdkafka then sends one Produce request per
partition, at most 5 in flight per connection for an idempotent producer, one
connection per shard of :class:`streaming.router.delivery.DeliveryProducer`. So a
batch's flush should take about (partitions / (shards x 5)) request round trips
however few records each partition gets: the part of a small batch's route
stage that does not shrink with the batch.

It starts an embedded broker of its own, creates ``--topics`` single-partition
topics, then for each round and each shard count (order rotated each round,
one warm-up round not counted) queues ``per-topic`` 100-byte records to every
topic and times the produce calls and the flush. Prints the medians (ms), the
load average beside them. Bound it with ``timeout``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from confluent_kafka.admin import NewTopic

from streaming import kafka
from streaming.kafka.broker import EmbeddedBroker, free_port
from streaming.router.delivery import DeliveryProducer, ProducerSettings


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flush_probe")
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--per-topic", default="1,8")
    ap.add_argument("--shards", default="8,32")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    per_topic = [int(x) for x in args.per_topic.split(",")]
    shards = [int(x) for x in args.shards.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        broker = EmbeddedBroker(Path(folder), port=free_port(), controller_port=free_port())
        broker.start()
        try:
            admin = kafka.admin(kafka.ClientSettings.of(broker.bootstrap))
            names = [f"flush.probe.{i:05d}" for i in range(args.topics)]
            for future in admin.create_topics([NewTopic(t, 1, 1) for t in names]).values():
                future.result(120)
            producers = {s: DeliveryProducer(ProducerSettings(broker.bootstrap, 1_048_576,
                                                              message_timeout_ms=600_000, shards=s))
                         for s in shards}
            value = b"x" * 100
            times: dict[tuple[int, int], list[tuple[float, float]]] = {}
            for r in range(args.rounds + 1):
                for k in per_topic:
                    order = shards[r % len(shards):] + shards[:r % len(shards)]
                    for s in order:
                        producer = producers[s]
                        topics = [t for t in names for _ in range(k)]
                        t0 = time.perf_counter()
                        producer.produce_many(topics, [None] * len(topics), [value] * len(topics),
                                              [[]] * len(topics), range(len(topics)))
                        t1 = time.perf_counter()
                        failed = producer.flush()
                        t2 = time.perf_counter()
                        assert not failed, failed[:3]
                        if r:  # round 0 warms up: metadata, connections
                            times.setdefault((k, s), []).append((t1 - t0, t2 - t1))
                print(f"round {r} done, load {os.getloadavg()[0]:.1f}", flush=True)
            print(f"\n{args.topics} topics; medians of {args.rounds} rounds (ms); "
                  f"load average {'/'.join(f'{x:.1f}' for x in os.getloadavg())}")
            print("| records per topic | shards | produce ms | flush ms | flush range ms |")
            print("| ---: | ---: | ---: | ---: | --- |")
            for (k, s), v in sorted(times.items()):
                flushes = [f for _, f in v]
                print(f"| {k} | {s} | {1000 * statistics.median(p for p, _ in v):,.1f} | "
                      f"{1000 * statistics.median(flushes):,.1f} | "
                      f"{1000 * min(flushes):,.0f}-{1000 * max(flushes):,.0f} |")
        finally:
            broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

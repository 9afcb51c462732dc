"""One routing task alone: ``streaming.router.batch.routing.route_batch`` on a batch of the e2e workload,
producing to a real broker, without Spark. Prints deliveries/s and the CPU split.

    python -m benchmarks route-task [--size 100k] [--publishes 50000] [--profile devices]
                                    [--layout shared] [--cprofile FILE] [--smoke]

It starts the embedded broker (:func:`benchmarks.harness.start_broker`), creates the
delivery topics, builds the snapshot from the workload's subscriptions, then times
``route_batch`` on Arrow batches shaped like the Spark Kafka source's rows (wall and
CPU seconds of this process; the broker runs beside it): what one routing task of
the router costs, to compare with the router's ``route`` stage (``batch-cycle``).
Pin it with ``taskset`` (the broker it starts inherits the pinning).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from benchmarks import harness, workload
from compiler import RoutingIndex, Subscription
from streaming.config import KafkaConfig
from streaming.router.batch.delivery import DeliveryProducer, ProducerSettings
from streaming.router.batch.routing import RouteSettings, route_batch

HEADERS = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


def source_batch(topics: list[str], first_offset: int) -> pa.RecordBatch:
    n = len(topics)
    now = datetime.now(UTC)
    headers = [[{"key": "exchange", "value": b"mqtt"},
                {"key": "bench.published_ns", "value": str(time.time_ns()).encode()}]] * n
    return pa.RecordBatch.from_arrays([
        pa.array(["bitroute.publishes"] * n), pa.array([0] * n, pa.int32()),
        pa.array(range(first_offset, first_offset + n), pa.int64()),
        pa.array([t.encode() for t in topics], pa.binary()), pa.array([b"x" * 64] * n, pa.binary()),
        pa.array(headers, HEADERS), pa.array([now] * n, pa.timestamp("us", tz="UTC")),
    ], names=["topic", "partition", "offset", "key", "value", "headers", "timestamp"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="route_task")
    ap.add_argument("--size", choices=sorted(workload.SIZES), default="100k")
    ap.add_argument("--profile", choices=sorted(workload.PROFILES), default="devices")
    ap.add_argument("--publishes", type=int, default=50_000)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--cprofile", type=Path)
    ap.add_argument("--partitions", type=int, default=1,
                    help="partitions per delivery topic (per-subscriber layout)")
    ap.add_argument("--layout", choices=("topic-per-subscriber", "shared"),
                    default="topic-per-subscriber", help="kafka.delivery_layout")
    ap.add_argument("--shared-partitions", type=int, default=16,
                    help="partitions of the shared delivery topic (shared layout)")
    ap.add_argument("--smoke", action="store_true", help="toy size: 500 subscriptions, 2 x 500 publishes")
    args = ap.parse_args(argv)
    n = 500 if args.smoke else workload.SIZES[args.size]
    if args.smoke:
        args.publishes, args.batches = 500, 2

    w = workload.generate(args.profile, n, 1, args.publishes * args.batches)
    index = RoutingIndex({workload.EXCHANGE: "mqtt"})
    for sub_id, subscriber, filt in w.subs:
        index.upsert(Subscription.from_changelog(
            sub_id, workload.changelog_value(workload.EXCHANGE, subscriber, filt)))
    from compiler import Matcher

    matcher = Matcher(index.snapshot(1, {}))
    with tempfile.TemporaryDirectory() as folder:
        broker = harness.start_broker(Path(folder))
        try:
            from confluent_kafka.admin import NewTopic

            from streaming import kafka

            admin = kafka.admin(kafka.ClientSettings.of(broker.bootstrap))
            prefix = harness.topic_prefix()
            layout = KafkaConfig(delivery_layout=args.layout, delivery_partitions=args.partitions,
                                 shared_delivery_partitions=args.shared_partitions,
                                 deliveries_topic_prefix=f"{prefix}.deliveries.",
                                 shared_deliveries_topic=f"{prefix}.deliveries").layout
            rejected = f"{prefix}.rejected"
            topics = [NewTopic(t, layout.partitions, 1)
                      for t in sorted({layout.topic(s) for s in w.subscribers})]
            for future in admin.create_topics([*topics, NewTopic(rejected, 1, 1)]).values():
                future.result(60)
            # A long delivery timeout: on a loaded machine the broker beside the task
            # may take minutes over the first records to 1,000 new topics.
            producer = DeliveryProducer(ProducerSettings(broker.bootstrap, 1_048_576,
                                                         message_timeout_ms=600_000,
                                                         keyed_partitions=layout.shared))
            settings = RouteSettings(workload.EXCHANGE, layout, rejected, 1, False,
                                     producer.settings)
            # Warm-up: the producer learns every topic's metadata.
            route_batch(matcher, producer, source_batch(w.publishes[:2000], 0), settings)
            profile = cProfile.Profile() if args.cprofile else None
            results = []
            for b in range(args.batches):
                keys = w.publishes[b * args.publishes:(b + 1) * args.publishes]
                batch = source_batch(keys, (b + 1) * args.publishes)
                wall, cpu, main = time.perf_counter(), time.process_time(), time.thread_time()
                if profile:
                    profile.enable()
                rows = route_batch(matcher, producer, batch, settings)
                if profile:
                    profile.disable()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                main = time.thread_time() - main
                deliveries = sum(len(d) for d in rows.column("deliveries").to_pylist())
                results.append({"batch": b, "publishes": len(topics),
                                "deliveries": deliveries, "wall_s": wall, "cpu_s": cpu,
                                "python_thread_cpu_s": main, "deliveries_per_s": deliveries / wall})
                print(json.dumps(results[-1]), flush=True)
            if profile:
                profile.dump_stats(args.cprofile)
        finally:
            broker.stop()
    best = max(r["deliveries_per_s"] for r in results)
    print(f"route_task {args.profile} {'500' if args.smoke else args.size} {args.layout}: best {best:,.0f} "
          "deliveries/s "
          f"({results[-1]['deliveries'] / results[-1]['publishes']:.2f} per publish)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One routing task alone: ``streaming.router.routing.route_batch`` on a batch of the e2e workload,
producing to a real broker, without Spark. Prints records/s and the CPU split.

    python -m benchmarks.e2e.route_task [--size 100k] [--publishes 50000] [--profile devices]
                                       [--cprofile FILE] [--handover arrow|pandas|ab]
                                       [--write native|python|ab]

It starts an embedded broker of its own on free ports, creates the delivery
topics, builds the snapshot from the workload's subscriptions, then times
``route_batch`` on Arrow batches shaped like the Spark Kafka source's rows
(wall and CPU seconds of this process; the broker runs beside it). This is
the delivery producer "alone" of issue 10: compare its deliveries/s with the
router's ``route`` stage in ``benchmarks/e2e/run.sh``.

``--handover pandas`` times the task as ``mapInPandas`` would run it, with the
column layout of issue 20 (:mod:`benchmarks.e2e.pandas_handover`); ``ab`` routes
every batch both ways in one run, alternating which goes first, and prints the
pandas path's cost against the Arrow path's (median and spread of the per-batch
ratios). Pin it with ``taskset`` (the broker it starts inherits the pinning).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa

from benchmarks.e2e import workload
from compiler import RoutingIndex, Subscription
from streaming.config import KafkaConfig
from streaming.kafka.broker import EmbeddedBroker, free_port
from streaming.router.delivery import DeliveryProducer, ProducerSettings
from streaming.router.routing import RouteSettings, route_batch

HEADERS = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


def source_batch(topics: list[str], first_offset: int) -> pa.RecordBatch:
    n = len(topics)
    now = datetime.now(timezone.utc)
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
    ap.add_argument("--handover", choices=("arrow", "pandas", "ab"), default="arrow",
                    help="mapInArrow's hand-over (today's), mapInPandas's with issue 20's layout, "
                         "or both on every batch (A/B)")
    ap.add_argument("--write", choices=("native", "python", "ab"), default="native",
                    help="the deliveries produced by the kernel's writer (today's), by a "
                         "Producer.produce call each (before issue 22, direction 3), or both")
    args = ap.parse_args(argv)
    if args.write != "native" and args.handover != "arrow":
        ap.error("--write python|ab runs with --handover arrow")

    w = workload.generate(args.profile, workload.SIZES[args.size], 1, args.publishes * args.batches)
    index = RoutingIndex({workload.EXCHANGE: "mqtt"})
    for sub_id, subscriber, filt in w.subs:
        index.upsert(Subscription.from_changelog(
            sub_id, workload.changelog_value(workload.EXCHANGE, subscriber, filt)))
    from compiler import Matcher

    matcher = Matcher(index.snapshot(1, {}))
    with tempfile.TemporaryDirectory() as folder:
        broker = EmbeddedBroker(Path(folder), port=free_port(), controller_port=free_port())
        broker.start()
        try:
            from confluent_kafka.admin import NewTopic

            from streaming import kafka

            admin = kafka.admin(kafka.ClientSettings.of(broker.bootstrap))
            layout = KafkaConfig(delivery_layout=args.layout, delivery_partitions=args.partitions,
                                 shared_delivery_partitions=args.shared_partitions).layout
            topics = [NewTopic(t, layout.partitions, 1)
                      for t in sorted({layout.topic(s) for s in w.subscribers})]
            for future in admin.create_topics([*topics, NewTopic("bitroute.rejected", 1, 1)]).values():
                future.result(60)
            # A long delivery timeout: on a loaded machine the broker beside the task
            # may take minutes over the first records to 1,000 new topics.
            producer = DeliveryProducer(ProducerSettings(broker.bootstrap, 1_048_576,
                                                         message_timeout_ms=600_000,
                                                         keyed_partitions=layout.shared))
            settings = RouteSettings(workload.EXCHANGE, layout, "bitroute.rejected", 1, False,
                                     producer.settings)
            # Warm-up: the producer learns every topic's metadata.
            route_batch(matcher, producer, source_batch(w.publishes[:2000], 0), settings)
            if args.write != "native":
                from benchmarks.e2e import python_produce

                old = python_produce.PythonProducer(producer.settings)
                python_produce.route_batch_python(matcher, old, source_batch(w.publishes[:2000], 0),
                                                  settings)
            if args.handover != "arrow":
                from benchmarks.e2e import pandas_handover
            profile = cProfile.Profile() if args.cprofile else None
            results = []
            paths = {"arrow": ["arrow"], "pandas": ["pandas"], "ab": ["arrow", "pandas"]}[args.handover]
            paths = {"native": paths, "python": ["python"], "ab": ["arrow", "python"]}[args.write]
            for b in range(args.batches):
                topics = w.publishes[b * args.publishes:(b + 1) * args.publishes]
                batch = source_batch(topics, (b + 1) * args.publishes)
                for path in (paths if b % 2 == 0 else paths[::-1]):
                    task_input = batch
                    if path == "pandas":  # the plan's binary headers column, built untimed
                        task_input = batch.drop_columns(["headers"]).append_column(
                            "headers_bin", pandas_handover.encode_headers(batch.column("headers")))
                    wall, cpu, main = time.perf_counter(), time.process_time(), time.thread_time()
                    if profile:
                        profile.enable()
                    if path == "arrow":
                        rows = route_batch(matcher, producer, task_input, settings)
                    elif path == "python":
                        rows = python_produce.route_batch_python(matcher, old, task_input, settings)
                    else:
                        rows = pandas_handover.route_pandas(matcher, producer, task_input, settings)
                    if profile:
                        profile.disable()
                    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                    main = time.thread_time() - main
                    deliveries = _deliveries(rows)
                    results.append({"batch": b, "path": path, "publishes": len(topics),
                                    "deliveries": deliveries, "wall_s": wall, "cpu_s": cpu,
                                    "python_thread_cpu_s": main, "deliveries_per_s": deliveries / wall})
                    print(json.dumps(results[-1]), flush=True)
            if profile:
                profile.dump_stats(args.cprofile)
        finally:
            broker.stop()
    if args.handover == "ab":
        _print_ab(results, "pandas", "arrow")
    if args.write == "ab":
        _print_ab(results, "arrow", "python")
    results = [r for r in results if r["path"] == "arrow"] or results
    best = max(r["deliveries_per_s"] for r in results)
    print(f"route_task {args.profile} {args.size} {args.layout}: best {best:,.0f} deliveries/s "
          f"({results[-1]['deliveries'] / results[-1]['publishes']:.2f} per publish)")
    return 0


def _deliveries(rows: pa.RecordBatch) -> int:
    if "deliveries" in rows.schema.names:
        return sum(len(d) for d in rows.column("deliveries").to_pylist())
    flat = rows.column(0)  # mapInPandas's output: one struct column, deliveries as JSON
    return sum(len(json.loads(text)) for text in flat.field("deliveries_json").to_pylist())


def _print_ab(results: list[dict], path: str, baseline: str) -> None:
    """Per batch, ``path``'s cost over ``baseline``'s (1.00 = equal; "arrow" is today's task)."""
    import statistics

    by_batch: dict[int, dict[str, dict]] = {}
    for r in results:
        by_batch.setdefault(r["batch"], {})[r["path"]] = r
    pairs = [v for v in by_batch.values() if len(v) == 2]
    for measure in ("wall_s", "cpu_s", "python_thread_cpu_s"):
        ratios = [p[path][measure] / p[baseline][measure] for p in pairs]
        per_delivery = {k: statistics.median(p[k][measure] / p[k]["deliveries"] * 1e6 for p in pairs)
                        for k in (path, baseline)}
        print(f"A/B {measure}: {path}/{baseline} median {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f}, {len(ratios)} batches; "
              f"{per_delivery[path]:.2f} vs {per_delivery[baseline]:.2f} us per delivery)")
    assert all(p[path]["deliveries"] == p[baseline]["deliveries"] for p in pairs), \
        "the two paths delivered differently"


if __name__ == "__main__":
    raise SystemExit(main())

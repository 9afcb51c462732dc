"""Subscriber scale: what one topic per subscriber costs, and 100k subscribers on the shared layout.

    python -m benchmarks subscriber-scale topics [--sizes 1000,10000]
    python -m benchmarks subscriber-scale route [--subscribers 100000]

Run by hand (never in CI), each on an embedded broker of its own on free
loopback ports in a temporary folder; figures in docs/benchmarks.md
("Subscriber scale").

``topics``: for N subscribers, the per-subscriber layout's N delivery topics
(one partition each) against the shared layout's one topic
(``kafka.shared_delivery_partitions`` partitions): seconds to create them
as the router does (until the broker serves them),
to fetch the cluster's metadata from a fresh client, and for a fresh
delivery producer (:class:`streaming.router.batch.delivery.DeliveryProducer`, as a routing
task has) to write one delivery to each subscriber (first write: it learns
every topic's metadata) and then one more each (second write).

``route``: the router (``bitroute run``) with ``kafka.delivery_layout =
"shared"``: N subscribers, each with its own subscription ``fleet/<i>/#`` and
one to ``broadcast/#``, written to the changelog; then one publish per
subscriber and two broadcasts. Prints the time from the changelog's ack to
the router's query running, the route time, the deliveries counted in the
shared topic, and what ``bitroute tail`` reads back for one subscriber.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from confluent_kafka import TopicPartition

from benchmarks import harness
from benchmarks.e2e import kafka_load
from benchmarks.e2e.bitroute_run import Env
from benchmarks.workload import Workload
from schemas.records import EXCHANGE_HEADER
from streaming import kafka
from streaming.config import Config, load
from streaming.kafka import client_verbs as client
from streaming.kafka.topics import ensure_topics
from streaming.router.batch.delivery import DeliveryColumns, DeliveryProducer, ProducerSettings

SHARED_PARTITIONS = 16
CREATE_CHUNK = 500
EXCHANGE = "mqtt"


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _create(config: Config, admin: kafka.clients.BitrouteAdmin, names: list[str], partitions: int) -> float:
    """Seconds to create ``names`` as the router does, until the broker serves them."""
    started = time.perf_counter()
    for k in range(0, len(names), CREATE_CHUNK):
        ensure_topics(config, names[k:k + CREATE_CHUNK], admin=admin, partitions=partitions)
    return time.perf_counter() - started


def _metadata(bootstrap: str) -> tuple[float, int]:
    consumer = kafka.consumer(kafka.ClientSettings.coerce(bootstrap), "scale")
    try:
        started = time.perf_counter()
        topics = consumer.list_topics(timeout=120).topics
        return time.perf_counter() - started, len(topics)
    finally:
        consumer.close()


def _write(producer: DeliveryProducer, topics: list[str], keys: list[bytes]) -> float:
    started = time.perf_counter()
    values: list[bytes | None] = [b"x" * 64] * len(topics)
    producer.produce_deliveries(DeliveryColumns.of_records(topics, list(keys), values))
    failed = producer.flush()
    if failed:
        raise RuntimeError(f"{len(failed)} records refused: {failed[0]}")
    return time.perf_counter() - started


def topics(sizes: list[int]) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory() as folder:
        broker = harness.start_broker(Path(folder))
        try:
            admin = kafka.admin(kafka.ClientSettings.of(broker.bootstrap))
            config = load(overrides={"kafka.bootstrap": broker.bootstrap}, environ={})
            for n in sizes:
                subscribers = [f"n{n}-s{i:06d}" for i in range(n)]
                prefix = harness.topic_prefix()
                own = [f"{prefix}.deliveries.{s}" for s in subscribers]
                shared = f"{prefix}.deliveries-n{n}"
                row: dict = {"subscribers": n}
                row["create_per_subscriber_s"] = _create(config, admin, own, 1)
                row["create_shared_s"] = _create(config, admin, [shared], SHARED_PARTITIONS)
                row["metadata_s"], row["topics_in_cluster"] = _metadata(broker.bootstrap)
                per_topic = DeliveryProducer(ProducerSettings(broker.bootstrap, 1_048_576))
                keys = [s.encode() for s in subscribers]
                row["first_write_per_subscriber_s"] = _write(per_topic, own, keys)
                row["second_write_per_subscriber_s"] = _write(per_topic, own, keys)
                keyed = DeliveryProducer(ProducerSettings(broker.bootstrap, 1_048_576,
                                                          keyed_partitions=True))
                row["first_write_shared_s"] = _write(keyed, [shared] * n, keys)
                row["second_write_shared_s"] = _write(keyed, [shared] * n, keys)
                _log(json.dumps(row))
                results.append(row)
        finally:
            broker.stop()
    print("\n| subscribers | layout | create topics | first write (1 delivery each) | second write |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r['subscribers']:,} | one topic each | {r['create_per_subscriber_s']:.1f} s | "
              f"{r['first_write_per_subscriber_s']:.2f} s | {r['second_write_per_subscriber_s']:.2f} s |")
        print(f"| {r['subscribers']:,} | shared ({SHARED_PARTITIONS} partitions) | "
              f"{r['create_shared_s']:.2f} s | {r['first_write_shared_s']:.2f} s | "
              f"{r['second_write_shared_s']:.2f} s |")
    for r in results:
        print(f"metadata of {r['topics_in_cluster']:,} topics from a fresh client: {r['metadata_s']:.2f} s")
    return results


def route(subscribers: int) -> dict:
    names = [f"fleet{i:06d}" for i in range(subscribers)]
    subs = [(f"own-{i}", name, f"fleet/{i}/#") for i, name in enumerate(names)]
    subs += [(f"all-{i}", name, "broadcast/#") for i, name in enumerate(names)]
    publishes = [f"fleet/{i}/status" for i in range(subscribers)] + ["broadcast/a", "broadcast/b"]
    w = Workload("fleet", len(subs), 0, subs, publishes, f"{subscribers} subscribers")
    with tempfile.TemporaryDirectory() as folder:
        env = Env(Path(folder), ["kafka.delivery_layout=shared",
                                 f"kafka.shared_delivery_partitions={SHARED_PARTITIONS}"])
        try:
            env.start_broker()
            bootstrap = env.config.kafka.client_settings
            t0, acked = kafka_load.load_changelog(bootstrap, env.config.kafka.subscriptions_topic, w,
                                                  EXCHANGE)
            _log(f"{len(subs):,} subscriptions of {subscribers:,} subscribers written in {acked - t0:.1f}s")
            started = env.start_router()
            up = time.time()
            _log(f"router up {up - acked:.1f}s after the changelog's ack (open {started['open_s']:.1f}s, "
                 f"{started['subscriptions']:,} subscriptions)")
            producer = kafka.producer(env.config.kafka.client_settings, {"linger.ms": 20})
            sent = time.time()
            for topic in publishes:
                kafka.produce_when_room(producer, env.config.kafka.publishes_topic, b"payload",
                                        topic.encode(), [(EXCHANGE_HEADER, EXCHANGE.encode())])
            producer.flush(120)
            if not env.router.wait_routed(len(publishes), timeout=1800):
                raise RuntimeError("the publishes were not routed in time")
            done = time.time()
            deliveries = sum(p["deliveries"] for p in env.router.batches)
            topic = env.config.kafka.shared_deliveries_topic
            consumer = kafka.consumer(env.config.kafka.client_settings, "scale")
            in_topic = sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                           for p in range(SHARED_PARTITIONS))
            consumer.close()
            tailed = list(client.tail(env.config, names[-1], from_beginning=True, max_records=3,
                                      timeout_s=30))
            result = {
                "subscribers": subscribers, "subscriptions": len(subs),
                "router_up_after_ack_s": up - acked, "open_s": started["open_s"],
                "publishes": len(publishes), "route_s": done - sent, "deliveries": deliveries,
                "records_in_shared_topic": in_topic,
                "deliveries_per_s": deliveries / (done - sent),
                "tail_of_last_subscriber": sorted(d.routing_key or "" for d in tailed),
            }
            _log(json.dumps(result))
            return result
        finally:
            env.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks subscriber-scale",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="toy size: topics at 100 subscribers")
    verbs = ap.add_subparsers(dest="verb")
    t = verbs.add_parser("topics", help="per-subscriber topics against the shared topic")
    t.add_argument("--sizes", default="1000,10000", help="subscriber counts, comma-separated")
    r = verbs.add_parser("route", help="the router with N subscribers on the shared layout")
    r.add_argument("--subscribers", type=int, default=100_000)
    args = ap.parse_args(argv)
    if args.smoke:
        args.verb, args.sizes = "topics", "100"
    if args.verb is None:
        ap.error("choose topics or route (or --smoke)")
    if args.verb == "topics":
        topics([int(s) for s in args.sizes.split(",")])
    else:
        route(args.subscribers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How soon a new subscription applies: a subscription Kafka acknowledged, then at once a
publish it matches, timed to that publish's delivery, per mode.

    python -m benchmarks subscribe-latency [--modes realtime,microbatch] [--size 100k]
                                           [--changes 50] [--rate 0] [--smoke]

The embedded broker, ``bitroute run`` per mode with the devices workload's ``--size``
subscriptions in the changelog; then ``--changes`` times: a new subscriber's subscription
written and acknowledged, a publish matching it written at once, and the time from the
subscription's acknowledgement to the publish's delivery read back. Happens-before makes
the publish wait for the subscription, so this is how long a change takes to reach the
matchers plus one publish's routing (issue 36: realtime p99 within 100 ms without
traffic, one second under load). ``--rate R``: the devices workload's publishes at R/s
meanwhile ("under load"). Also the same publish's latency with no change before it, as
the baseline measured in the same run. ``--smoke``: 100 subscriptions, 3 changes, realtime.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from benchmarks import harness, workload
from benchmarks.e2e import kafka_load

MODES = ("realtime", "microbatch")
SMOKE_SUBSCRIPTIONS = 100
SUBSCRIBER_PREFIX = "late-"


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def _delivered_at(bootstrap: str, topic: str, timeout: float, offset: int = 0) -> float | None:
    """Wall-clock time at which the record at ``offset`` of ``topic`` is read."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 5,
                         "topic.metadata.refresh.interval.ms": 100})
    try:
        consumer.assign([TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = consumer.poll(0.05)
            if message is not None and message.error() is None:
                return time.time()
        return None
    finally:
        consumer.close()


def run_mode(mode: str, folder: Path, bootstrap: str, size: str, changes: int, rate: float,
             producer: Producer) -> dict:
    tag = f"{harness.topic_prefix()}.sl{uuid.uuid4().hex[:4]}"
    topics = {"publishes": f"{tag}.publishes", "subscriptions": f"{tag}.subscriptions",
              "prefix": f"{tag}.d."}  # kafka.deliveries_topic_prefix: 40 characters at most
    sets = [f"kafka.bootstrap={bootstrap}", "broker.embedded=false",
            f"kafka.publishes_topic={topics['publishes']}",
            f"kafka.subscriptions_topic={topics['subscriptions']}",
            f"kafka.deliveries_topic_prefix={topics['prefix']}",
            f"kafka.rejected_topic={tag}.rejected", f"kafka.retained_topic={tag}.retained",
            f"kafka.routing_view_topic={tag}.view", f"kafka.routed_topic={tag}.routed",
            f"streaming.checkpoint_dir={folder / 'checkpoints'}",
            f"delta.warehouse={folder / 'delta'}", f"streaming.mode={mode}",
            "kafka.partitions=1"]
    n = SMOKE_SUBSCRIPTIONS if size == "smoke" else workload.SIZES[size]
    w = workload.devices(n, 1, 10_000)
    kafka_load.load_changelog(bootstrap, topics["subscriptions"], w, workload.EXCHANGE)
    folder.mkdir(parents=True, exist_ok=True)
    router = harness.RouterRun(sets, folder / "router.log").start()
    try:
        router.wait_started()
        background = (_Background(Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}),
                                  topics["publishes"], w, rate) if rate else None)
        time.sleep(5)  # the routing query's first task running
        base, after_change = [], []
        for i in range(changes + 2):
            subscriber = f"{SUBSCRIBER_PREFIX}{i}"
            key = f"sl.{i}.{uuid.uuid4().hex[:6]}"
            # As `bitroute subscribe` does: the delivery topic first, then the change.
            _create_topic(bootstrap, topics["prefix"] + subscriber)
            _acked(producer, topics["subscriptions"], subscriber.encode(), json.dumps(
                {"exchange": "amq.topic", "subscriber": subscriber, "filter": key}).encode())
            subscribed = time.time()
            _acked(producer, topics["publishes"], key.encode(), b"x",
                   [("exchange", b"amq.topic")])
            delivered = _delivered_at(bootstrap, topics["prefix"] + subscriber, 60)
            if delivered is None:
                raise RuntimeError(f"{mode}: no delivery to {subscriber} within 60 s")
            if i >= 2:  # the first two warm the path
                after_change.append((delivered - subscribed) * 1000)
            published = time.time()
            _acked(producer, topics["publishes"], key.encode(), b"y", [("exchange", b"amq.topic")])
            again = _delivered_at(bootstrap, topics["prefix"] + subscriber, 60, offset=1)
            if again is not None and i >= 2:
                base.append((again - published) * 1000)
        if background is not None:
            background.stop()
        return {"mode": mode, "changes": len(after_change),
                "after_change_ms": {"p50": statistics.median(after_change),
                                    "p99": _percentile(after_change, 0.99),
                                    "max": max(after_change)},
                "no_change_ms": ({"p50": statistics.median(base), "p99": _percentile(base, 0.99)}
                                 if base else None)}
    finally:
        router.stop()


def _create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    deadline = time.monotonic() + 30
    while admin.list_topics(topic, timeout=10).topics[topic].error is not None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{topic} is not served 30 s after its creation")
        time.sleep(0.05)


def _acked(producer: Producer, topic: str, key: bytes, value: bytes, headers=None) -> None:
    failures = []
    producer.produce(topic, key=key, value=value, headers=headers or [],
                     on_delivery=lambda err, _m: failures.append(err) if err else None)
    producer.flush(30)
    if failures:
        raise RuntimeError(f"{topic}: {failures[0]}")


class _Background:
    """The workload's publishes at ``rate``/s until stopped."""

    def __init__(self, producer: Producer, topic: str, w, rate: float) -> None:
        self._stop = threading.Event()
        self._producer = producer
        self._thread = threading.Thread(target=self._run, args=(producer, topic, w, rate),
                                        daemon=True)
        self._thread.start()

    def _run(self, producer: Producer, topic: str, w, rate: float) -> None:
        keys = [t.encode() for t in w.publishes]
        started, n = time.monotonic(), 0
        while not self._stop.is_set():
            due = started + n / rate
            if due > time.monotonic():
                time.sleep(due - time.monotonic())
            producer.produce(topic, key=keys[n % len(keys)], value=b"bg",
                             headers=[("exchange", workload.EXCHANGE.encode())])
            producer.poll(0)
            n += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._producer.flush(30)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks subscribe-latency",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--size", default="100k")
    ap.add_argument("--changes", type=int, default=50)
    ap.add_argument("--rate", type=float, default=0.0)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    if args.smoke:
        args.modes, args.size, args.changes = "realtime", "smoke", 3
    root = Path(tempfile.mkdtemp(prefix="bitroute-subscribe-latency-"))
    broker = harness.start_broker(root / "kafka")
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    try:
        for mode in args.modes.split(","):
            _log(f"{mode}: {args.size} subscriptions, {args.changes} changes, "
                 f"background {args.rate:,.0f} publishes/s")
            r = run_mode(mode, root / mode, broker.bootstrap, args.size, args.changes,
                         args.rate, producer)
            a, b = r["after_change_ms"], r["no_change_ms"]
            print(f"{mode}: subscribe-ack to delivery of a publish right after it: "
                  f"p50 {a['p50']:.0f} ms, p99 {a['p99']:.0f} ms, max {a['max']:.0f} ms "
                  f"({r['changes']} changes)"
                  + (f"; the same publish with no change before it: p50 {b['p50']:.0f} ms, "
                     f"p99 {b['p99']:.0f} ms" if b else ""), flush=True)
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

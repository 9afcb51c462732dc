"""Check the Kafka Streams peer's deliveries against bitroute's own matching.

    python -m benchmarks.e2e.kstreams_check [--size 10k] [--publishes 2000] [--workdir DIR]

On an embedded broker of its own: the devices workload's subscriptions plus a few
edge cases of each dialect (MQTT ``$`` topics, empty levels, ``a/#`` matching
``a``; AMQP ``#`` anywhere, the empty key) go to the changelog, the peer starts
(``benchmarks/e2e/setup.sh`` builds it), ``--publishes`` publishes are produced
with headers, and every delivery topic is read back. Expected: bitroute's matcher
(:func:`compiler.offline.match_files`, the kernel) on the same subscriptions and
topics. The check passes when the sets of (message id, subscriber, matched
subscription ids) are equal and every delivery carries the contract of
schemas/records.py: key = routing key, value = payload, the publish's headers
(a forged router header removed), the message id, subscription ids and version.
Prints one JSON summary on stdout; exit status 0 when it passes, 1 when not.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from confluent_kafka import TopicPartition

from benchmarks import workload
from benchmarks.e2e import kstreams_run
from compiler.offline import match_files
from schemas.records import (
    EXCHANGE_HEADER,
    MESSAGE_ID_HEADER,
    SNAPSHOT_VERSION_HEADER,
    SUBSCRIPTION_IDS_HEADER,
)
from streaming import kafka

MQTT, AMQP = "mqtt", "amq.topic"
#: (id, subscriber, filter) per exchange, beside the workload's (all MQTT).
EDGE_SUBS = {
    MQTT: [("e0", "edge-mqtt1", "$SYS/#"), ("e1", "edge-mqtt1", "a/#"),
           ("e2", "edge-mqtt2", "a//b"), ("e3", "edge-mqtt2", "+/+/b"),
           ("e4", "edge-mqtt3", "+/x"), ("e5", "edge-mqtt3", "$SYS/+")],
    AMQP: [("x0", "edge-amqp1", "#"), ("x1", "edge-amqp1", "a.*"), ("x2", "edge-amqp2", "a.#.b"),
           ("x3", "edge-amqp2", "*"), ("x4", "edge-amqp3", "#.#"), ("x5", "edge-amqp3", ""),
           ("x6", "edge-amqp4", "*.*.#")],
}
EDGE_TOPICS = {
    MQTT: ["$SYS/x", "$SYS/x/y", "a", "a/b", "a//b", "/x", "x/x", "a/x/b"],
    AMQP: ["", "a", "a.b", "a.x.y.b", "a..b", "b.c"],
}
PAYLOAD = b"payload-"
FORGED = (MESSAGE_ID_HEADER, b"forged")


def expected(subs: dict[str, list[tuple[str, str, str]]], publishes: list[tuple[str, str, str]],
             folder: Path) -> set[tuple[str, str, tuple[str, ...]]]:
    """(message id, subscriber, sorted subscription ids) per delivery bitroute would make."""
    out = set()
    for exchange, dialect in ((MQTT, "mqtt"), (AMQP, "amqp")):
        sub_path, topic_path = folder / f"{dialect}-subs.jsonl", folder / f"{dialect}-topics.jsonl"
        sub_path.write_text("".join(json.dumps({"id": i, "subscriber": s, "filter": f}) + "\n"
                                    for i, s, f in subs[exchange]))
        mine = [(mid, topic) for mid, ex, topic in publishes if ex == exchange]
        topic_path.write_text("".join(json.dumps({"topic": t}) + "\n" for _, t in mine))
        result = match_files(dialect, str(sub_path), str(topic_path))
        subscriber_of = {i: s for i, s, _ in subs[exchange]}
        lines = "".join(result.lines()).splitlines()
        assert len(lines) == len(mine), "bitroute match: one line per topic"
        for (mid, _), line in zip(mine, lines, strict=True):
            ids = json.loads(line).get("subscriptions", [])
            by_subscriber: dict[str, list[str]] = defaultdict(list)
            for i in ids:
                by_subscriber[subscriber_of[i]].append(i)
            out |= {(mid, s, tuple(sorted(i))) for s, i in by_subscriber.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.e2e.kstreams_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(workload.SIZES), default="10k")
    ap.add_argument("--publishes", type=int, default=2000)
    ap.add_argument("--timeout", type=float, default=300.0, help="for the deliveries to arrive")
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args(argv)
    folder = args.workdir or Path(tempfile.mkdtemp(prefix="bitroute-kstreams-check-"))
    w = workload.devices(workload.SIZES[args.size], 1, args.publishes)
    subs = {MQTT: list(w.subs) + EDGE_SUBS[MQTT], AMQP: EDGE_SUBS[AMQP]}
    env = kstreams_run.KStreamsEnv(folder, [kstreams_run.LAYOUT], name="kstreams")
    try:
        env.start_broker()
        k = env.config.kafka
        producer = kafka.producer(k.client_settings, {"linger.ms": 5})
        for exchange, rows in subs.items():
            for i, s, f in rows:
                producer.produce(k.subscriptions_topic, workload.changelog_value(exchange, s, f),
                                 i.encode())
        producer.flush(60)
        started = env.start_router()
        print(f"kstreams_check: peer running with {started['subscriptions']:,} subscriptions",
              file=sys.stderr)

        publishes: list[tuple[str, str, str]] = []  # (message id, exchange, topic)
        ordered = ([(MQTT, t) for t in w.publishes] + [(MQTT, t) for t in EDGE_TOPICS[MQTT]]
                   + [(AMQP, t) for t in EDGE_TOPICS[AMQP]])

        def acked(err, msg, exchange_topic):
            if err is None:
                publishes.append((f"{msg.topic()}/{msg.partition()}/{msg.offset()}", *exchange_topic))

        for n, (exchange, topic) in enumerate(ordered):
            producer.produce(k.publishes_topic, PAYLOAD + str(n).encode(), topic.encode(),
                             headers=[(EXCHANGE_HEADER, exchange.encode()), ("custom", b"kept"),
                                      FORGED],
                             on_delivery=lambda err, msg, et=(exchange, topic): acked(err, msg, et))
        if producer.flush(60) or len(publishes) != len(ordered):
            raise RuntimeError("not every publish was acknowledged")
        want = expected(subs, publishes, folder)
        topic_of = {mid: topic for mid, _, topic in publishes}

        subscribers = sorted({s for rows in subs.values() for _, s, _ in rows})
        consumer = kafka.consumer(k.client_settings, f"check-{time.time_ns()}")
        consumer.assign([TopicPartition(k.layout.topic(s), p, 0)
                         for s in subscribers for p in range(k.layout.partitions)])
        got: set[tuple[str, str, tuple[str, ...]]] = set()
        problems: list[str] = []
        deliveries = 0
        deadline = time.time() + args.timeout
        quiet_since = time.time()
        while time.time() < deadline and (deliveries < len(want) or time.time() - quiet_since < 5):
            msgs = consumer.consume(10_000, 0.5)
            if msgs:
                quiet_since = time.time()
            for m in msgs:
                if m.error() is not None:
                    continue
                deliveries += 1
                headers: dict[str, list[bytes]] = defaultdict(list)
                for name, value in m.headers() or []:
                    headers[name].append(value)
                mid = headers[MESSAGE_ID_HEADER][-1].decode() if headers[MESSAGE_ID_HEADER] else "?"
                subscriber = m.topic()[len(k.deliveries_topic_prefix):]
                ids = tuple(sorted(json.loads(headers[SUBSCRIPTION_IDS_HEADER][0])))
                got.add((mid, subscriber, ids))
                if len(problems) < 10:
                    if headers[MESSAGE_ID_HEADER] != [mid.encode()]:
                        problems.append(f"{mid}: message id headers {headers[MESSAGE_ID_HEADER]}")
                    if m.key() != topic_of.get(mid, "?").encode():
                        problems.append(f"{mid}: key {m.key()!r}, routing key {topic_of.get(mid)!r}")
                    if not m.value().startswith(PAYLOAD):
                        problems.append(f"{mid}: value {m.value()!r}")
                    if headers["custom"] != [b"kept"] or len(headers[EXCHANGE_HEADER]) != 1:
                        problems.append(f"{mid}: the publish's headers not copied: {m.headers()}")
                    if not headers[SNAPSHOT_VERSION_HEADER][0].decode().isdigit():
                        problems.append(f"{mid}: version {headers[SNAPSHOT_VERSION_HEADER]}")
        consumer.close()
    finally:
        env.stop()
    missing, extra = want - got, got - want
    summary = {"publishes": len(publishes), "expected_deliveries": len(want),
               "edge_case_deliveries": sum(1 for _, s, _ in want if s.startswith("edge-")),
               "deliveries_read": deliveries, "distinct_deliveries": len(got),
               "missing": len(missing), "unexpected": len(extra),
               "missing_sample": sorted(missing)[:5], "unexpected_sample": sorted(extra)[:5],
               "header_problems": problems, "passed": not missing and not extra and not problems}
    print(json.dumps(summary, indent=1))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

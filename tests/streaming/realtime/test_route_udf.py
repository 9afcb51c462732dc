"""RouteUdf end to end on the JVM side of realtime mode (realtime contract, sections 3-6).

A Spark Real-Time Mode query in a JVM of its own (a JVM holds one routing view per
settings, and a test's view is written by hand):
Kafka source -> ``inline(bitroute_route(...))`` -> Kafka sink, with ``bitroute-realtime.jar``
(:func:`streaming.realtime.jar.realtime_jar`). The test writes the routing view topic by hand
as the driver's view publisher would (section 3), publishes with confluent-kafka, and reads
what the query wrote: deliveries byte for byte as the micro-batch path writes them
(expected values computed with ``streaming/kafka/records.py``), the routed records, rejected
copies (one rejected by the kernel, one over ``max_delivery_bytes``), and a publish written
after its subscription's changelog record but before the view's mark, held by the
happens-before gate until the mark arrives (section 4).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_io import read_topic
from schemas.records import (
    ALTERNATE_EXCHANGE_HEADER,
    MESSAGE_ID_HEADER,
    REASON_HEADER,
    ROUTING_KEY_HEADER,
    SNAPSHOT_VERSION_HEADER,
    SOURCE_HEADER,
    SOURCE_PUBLISH,
    SUBSCRIPTION_IDS_HEADER,
)
from short_jvm import short_jvm_options
from streaming import jvm
from streaming.kafka.records import header_size, kept_headers, record_size, rejected_copy
from streaming.realtime.jar import realtime_jar
from waiting import wait_until

MAX_DELIVERY_BYTES = 4096
EXCHANGES = [{"name": "amq.topic", "dialect": "amqp", "share_prefix": None,
              "alternate": "unrouted"},
             {"name": "mqtt", "dialect": "mqtt", "share_prefix": "$share/"},
             {"name": "unrouted", "dialect": "amqp", "share_prefix": None}]
ROUTE_TYPE = ("array<struct<topic:string, key:binary, value:binary, "
              "headers:array<struct<key:string, value:binary>>>>")

# The query's JVM: the settings come as JSON in argv[1]; it runs until stdin closes.
_QUERY = """
import json, sys
from pyspark.sql import SparkSession
from pyspark.sql.types import _parse_datatype_string
args = json.loads(sys.argv[1])
builder = SparkSession.builder.master("local[2]")
for key, value in args["conf"].items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
spark.sparkContext.setLogLevel("WARN")
# As streaming/realtime/query.py registers it: the UDF object carries its settings.
udf = spark.sparkContext._jvm.io.bitroute.realtime.RouteUdf(json.dumps(args["settings"]))
spark._jsparkSession.udf().register(
    "bitroute_route", udf,
    spark._jsparkSession.parseDataType(_parse_datatype_string(args["type"]).json()))
source = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", args["bootstrap"])
          .option("subscribe", args["publishes"]).option("startingOffsets", "earliest")
          .option("includeHeaders", "true").load())
query = (source.selectExpr("inline(bitroute_route(partition, offset, key, value, headers, timestamp))")
         .writeStream.format("kafka").option("kafka.bootstrap.servers", args["bootstrap"])
         .option("checkpointLocation", args["checkpoint"]).outputMode("update")
         .trigger(realTime="5 seconds").start())
print("started", flush=True)
sys.stdin.read()
query.stop()
spark.stop()
"""


def _create(bootstrap: str, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(n, 1, 1) for n in names]).values():
        future.result(timeout=30)


def _produce(producer: Producer, topic: str, key, value, headers=None) -> None:
    producer.produce(topic, key=key, value=value, headers=headers)
    producer.flush(30)


def _sub(id_: str, exchange: str, subscriber: str, filter_: str, headers=None) -> dict:
    return {"id": id_, "exchange": exchange, "subscriber": subscriber, "filter": filter_,
            "headers": headers}


def _mark(version: int, changelog_next: int) -> bytes:
    return json.dumps({"version": version, "changelog": {"0": changelog_next},
                       "default_exchange": "amq.topic", "exchanges": EXCHANGES}).encode()


def _router_headers_size() -> int:
    return sum(header_size(n) for n in (MESSAGE_ID_HEADER, SUBSCRIPTION_IDS_HEADER,
                                        SNAPSHOT_VERSION_HEADER))


def _delivery_headers(headers, message_id: str, ids: list[str], version: int):
    return kept_headers(headers) + [
        (MESSAGE_ID_HEADER, message_id.encode()),
        (SUBSCRIPTION_IDS_HEADER, json.dumps(ids, separators=(",", ":")).encode()),
        (SNAPSHOT_VERSION_HEADER, str(version).encode())]


def _header_map(headers) -> dict:
    """``PublishColumns.header_map`` of one publish: the last of a name wins, text values."""
    return {k: None if v is None else v.decode("utf-8", "backslashreplace") for k, v in headers}


@pytest.fixture
def realtime_query(kafka_bootstrap: str, tmp_path: Path):
    """Factory: ``start(settings)`` runs the RTM query with the route function's
    ``settings`` (``udf_settings``'s keys, the Kafka properties as ``kafka.<property>``);
    stopped (stdin closed, then killed) at the end of the test."""
    jar = realtime_jar()
    started = []

    def start(settings: dict[str, str], publishes: str) -> subprocess.Popen:
        conf = {"spark.jars": ",".join([*(str(p) for p in jvm.jars("spark")), str(jar)]),
                "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "1"}
        udf_settings: dict[str, object] = {k: v for k, v in settings.items() if not k.startswith("kafka.")}
        udf_settings["kafka"] = {k[len("kafka."):]: v for k, v in settings.items()
                                 if k.startswith("kafka.")}
        args = {"conf": conf, "settings": udf_settings, "type": ROUTE_TYPE,
                "bootstrap": kafka_bootstrap,
                "publishes": publishes, "checkpoint": str(tmp_path / "checkpoint")}
        log = (tmp_path / "query.log").open("w")
        env = {**os.environ, "JAVA_TOOL_OPTIONS": short_jvm_options()}
        process = subprocess.Popen([sys.executable, "-c", _QUERY, json.dumps(args)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                   text=True, env=env)
        started.append((process, log))
        assert process.stdout is not None  # a PIPE
        line = process.stdout.readline()
        assert line.strip() == "started", (tmp_path / "query.log").read_text()[-3000:]
        return process

    yield start
    for process, log in started:
        if process.stdin is not None:  # a PIPE
            process.stdin.close()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def test_route_udf_writes_what_the_micro_batch_path_writes(base_config, kafka_bootstrap,
                                                           realtime_query, tmp_path):
    run = uuid.uuid4().hex[:8]
    publishes, view, changelog = f"rt-{run}.publishes", f"rt-{run}.view", f"rt-{run}.subscriptions"
    routed_topic, rejected_topic, prefix = f"rt-{run}.routed", f"rt-{run}.rejected", f"rt-{run}.deliveries."
    billing, ops, late, dlq = (prefix + "billing", prefix + "ops", prefix + "late",
                               prefix + "dlq")
    _create(kafka_bootstrap, publishes, view, changelog, routed_topic, rejected_topic, billing, ops,
            late, dlq)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 0})

    # The driver's state 1: two subscriptions, covering changelog offset 0.
    _produce(producer, changelog, b"s1", b"{}")
    _produce(producer, view, b"sub:s1",
             json.dumps(_sub("s1", "amq.topic", "billing", "orders.*.paid")).encode())
    _produce(producer, view, b"sub:s2", json.dumps(_sub(
        "s2", "mqtt", "ops", "sensors/+/temperature",
        {"match": "all", "criteria": {"unit": "celsius"}})).encode())
    _produce(producer, view, b"sub:u1",
             json.dumps(_sub("u1", "unrouted", "dlq", "stock.#")).encode())
    _produce(producer, view, b"mark", _mark(1, 1))
    realtime_query({"kafka.bootstrap.servers": kafka_bootstrap, "view_topic": view,
                    "changelog_topic": changelog, "publishes_topic": publishes,
                    "deliveries_topic_prefix": prefix, "rejected_topic": rejected_topic,
                    "routed_topic": routed_topic, "max_delivery_bytes": str(MAX_DELIVERY_BYTES)},
                   publishes)

    paid_headers: list[tuple[str, bytes | None]] = [
        ("h1", b"a"), (MESSAGE_ID_HEADER, b"forged"), ("h2", None), ("h1", b"\xff\xfe")]
    sensor_headers: list[tuple[str, bytes | None]] = [("exchange", b"mqtt"), ("unit", b"celsius")]
    big = b"x" * MAX_DELIVERY_BYTES
    publishes_written: list[tuple[bytes, bytes | None, list[tuple[str, bytes | None]] | None]] = [
        (b"orders.eu.paid", b"pay-1", paid_headers),                  # 0: routed to billing
        (b"orders.eu.shipped", b"ship-1", None),                      # 1: unroutable
        (b"orders.eu.paid", b"odd", [("exchange", b"no-such-exchange")]),  # 2: rejected by the kernel
        (b"orders.us.paid", big, [("h", b"v")]),                      # 3: over max_delivery_bytes
        (b"sensors/kitchen/temperature", b"21.5", sensor_headers),    # 4: routed to ops (mqtt)
        (b"orders.\xc3(.paid", None, None),                          # 5: a key not UTF-8
        (b"stock.eu", b"s-1", None),                                  # 6: through the alternate
    ]
    for key, value, headers in publishes_written:
        producer.produce(publishes, key=key, value=value, headers=None if headers is None else list(headers))
    producer.flush(30)
    ids = [f"{publishes}/0/{offset}" for offset in range(len(publishes_written))]

    def routed() -> dict:
        return {r.key().decode(): r for r in read_topic(base_config, routed_topic)}

    records = wait_until(lambda: (lambda r: r if len(r) >= len(ids) else None)(routed()),
                         "the routed records of the first publishes", timeout=120)
    values = {k: json.loads(r.value()) for k, r in records.items()}
    published_at = {r.offset(): r.timestamp()[1] for r in read_topic(base_config, publishes)}

    # 0: a delivery byte for byte, the publish's headers kept in order (the forged router
    # header dropped, a null value kept), then the router's.
    [delivery] = read_topic(base_config, billing)
    assert (delivery.key(), delivery.value()) == (b"orders.eu.paid", b"pay-1")
    assert delivery.headers() == _delivery_headers(paid_headers, ids[0], ["s1"], 1)
    assert values[ids[0]] == {
        "message_id": ids[0], "partition": 0, "offset": 0, "exchange": "amq.topic",
        "routing_key": "orders.eu.paid", "outcome": "routed", "reason": None,
        "deliveries": [{"subscriber": "billing", "subscription_ids": ["s1"]}],
        "headers": _header_map(paid_headers), "payload_bytes": 5,
        "published_at": published_at[0], "snapshot_version": 1, "alternate_exchange": None}
    assert values[ids[0]]["headers"]["h1"] == "\\xff\\xfe"

    # 1: unroutable: only its routed record.
    assert (values[ids[1]]["outcome"], values[ids[1]]["deliveries"], values[ids[1]]["headers"]) == (
        "unroutable", [], {})

    # 2 and 3: rejected, each with its copy in the rejected topic (rejected_copy's).
    rejected = {dict(r.headers())[MESSAGE_ID_HEADER].decode(): r
                for r in read_topic(base_config, rejected_topic)}
    assert set(rejected) == {i for i in ids if values[i]["outcome"] == "rejected"} >= {ids[2], ids[3]}
    kernel_reason = values[ids[2]]["reason"]
    assert values[ids[2]]["outcome"] == "rejected" and kernel_reason
    assert values[ids[2]]["exchange"] == "no-such-exchange"
    copy = rejected[ids[2]]
    assert (copy.key(), copy.value()) == (b"orders.eu.paid", b"odd")
    assert copy.headers() == rejected_copy(b"orders.eu.paid", b"odd", kept_headers(publishes_written[2][2]),
                                           kernel_reason, SOURCE_PUBLISH, ids[2], MAX_DELIVERY_BYTES)[1]

    key3, value3, headers3 = publishes_written[3]
    size = (record_size(key3, value3, kept_headers(headers3)) + _router_headers_size() + len(b"1")
            + len(ids[3].encode()) + len(b'["s1"]'))
    too_large = (f"a delivery of this publish would be {size:,} bytes, more than "
                 f"kafka.max_delivery_bytes ({MAX_DELIVERY_BYTES:,}): the broker would refuse it")
    value, copy_headers, reason = rejected_copy(key3, value3, headers3 or [], too_large, SOURCE_PUBLISH,
                                                ids[3], MAX_DELIVERY_BYTES)
    assert value is None and reason.startswith(too_large)  # the copy too is over the limit
    assert (values[ids[3]]["outcome"], values[ids[3]]["reason"], values[ids[3]]["deliveries"]) == (
        "rejected", reason, [])
    assert (rejected[ids[3]].key(), rejected[ids[3]].value(), rejected[ids[3]].headers()) == (
        key3, None, copy_headers)
    assert dict(copy_headers)[REASON_HEADER] == reason.encode()
    assert dict(copy_headers)[SOURCE_HEADER] == b"publish"

    # 4: the MQTT exchange (its exchange header kept on the delivery), header criteria met.
    [sensor] = read_topic(base_config, ops)
    assert (sensor.key(), sensor.value()) == (b"sensors/kitchen/temperature", b"21.5")
    assert sensor.headers() == _delivery_headers(sensor_headers, ids[4], ["s2"], 1)
    assert values[ids[4]]["deliveries"] == [{"subscriber": "ops", "subscription_ids": ["s2"]}]

    # 5: the audit's text of a key that is not UTF-8 (records.py text(): backslash escapes),
    # a null payload's size null.
    assert values[ids[5]]["routing_key"] == "orders.\\xc3(.paid"
    assert (values[ids[5]]["payload_bytes"], values[ids[5]]["headers"]) == (None, {})

    # 6: amq.topic routes it to no one: its alternate "unrouted" does, and its record says so.
    [through] = read_topic(base_config, dlq)
    assert (through.key(), through.value()) == (b"stock.eu", b"s-1")
    assert through.headers() == [(ALTERNATE_EXCHANGE_HEADER, b"unrouted"),
                                 *_delivery_headers([], ids[6], ["u1"], 1)]
    assert [values[ids[6]][k] for k in ("outcome", "exchange", "alternate_exchange")] == [
        "routed", "amq.topic", "unrouted"]
    assert values[ids[1]]["alternate_exchange"] is None  # "unrouted" takes no orders.#

    # Happens-before: a subscription's changelog record, then a publish it matches; the view
    # has not seen it yet, so the gate holds the publish (nothing routed) until the mark.
    _produce(producer, changelog, b"s3", b"{}")
    _produce(producer, publishes, b"orders.late", b"late-1")
    held = f"{publishes}/0/{len(ids)}"
    time.sleep(3)  # a negative check: the gate must hold the publish this long, and more
    assert held not in routed() and read_topic(base_config, late) == []
    _produce(producer, view, b"sub:s3", json.dumps(_sub("s3", "amq.topic", "late", "orders.#")).encode())
    _produce(producer, view, b"mark", _mark(2, 2))
    late_records = wait_until(lambda: read_topic(base_config, late),
                              "the held publish delivered once the view covers its subscription",
                              timeout=60)
    assert [(r.key(), r.value(), r.headers()) for r in late_records] == [
        (b"orders.late", b"late-1", _delivery_headers([], held, ["s3"], 2))]
    after = wait_until(lambda: routed().get(held), "the held publish's routed record")
    assert json.loads(after.value())["snapshot_version"] == 2


def test_shared_layout_incarnation_and_the_size_limit_to_the_byte(base_config, kafka_bootstrap,
                                                                  realtime_query):
    run = uuid.uuid4().hex[:8]
    publishes, view, changelog = f"rt-{run}.publishes", f"rt-{run}.view", f"rt-{run}.subscriptions"
    routed_topic, rejected_topic, shared = f"rt-{run}.routed", f"rt-{run}.rejected", f"rt-{run}.shared"
    _create(kafka_bootstrap, publishes, view, changelog, routed_topic, rejected_topic, shared)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 0})
    _produce(producer, view, b"sub:a", json.dumps(_sub("a", "amq.topic", "billing", "orders.#")).encode())
    _produce(producer, view, b"sub:b", json.dumps(_sub("b", "amq.topic", "operations", "orders.*")).encode())
    _produce(producer, view, b"mark", _mark(7, 0))
    limit = 2048
    realtime_query({"kafka.bootstrap.servers": kafka_bootstrap, "view_topic": view,
                    "changelog_topic": changelog, "publishes_topic": publishes, "incarnation": "2",
                    "shared_topic": shared, "rejected_topic": rejected_topic,
                    "routed_topic": routed_topic, "max_delivery_bytes": str(limit)}, publishes)

    key, headers = b"orders.eu", [("h", b"v"), ("exchange", b"amq.topic")]
    ids = [f"{publishes}~2/0/{offset}" for offset in range(2)]
    # _reject_oversize's largest delivery: the publish's record with the router's headers, plus
    # the longest subscriber's own bytes (its name as key, the routing key header's framing).
    empty = (record_size(key, b"", kept_headers(headers)) + _router_headers_size() + len(b"7")
             + len(ids[0].encode()) + len(b'["b"]') + header_size(ROUTING_KEY_HEADER)
             + len(b"operations"))
    fits, over = b"f" * (limit - empty), b"o" * (limit - empty + 1)
    for value in (fits, over):
        producer.produce(publishes, key=key, value=value, headers=None if headers is None else list(headers))
    producer.flush(30)

    records = wait_until(lambda: (lambda r: r if len(r) == 2 else None)(
        {r.key().decode(): json.loads(r.value()) for r in read_topic(base_config, routed_topic)}),
        "both routed records", timeout=120)
    deliveries = read_topic(base_config, shared)
    assert [(d.key(), d.value(), d.headers()) for d in deliveries] == [
        (subscriber.encode(), fits, kept_headers(headers) + [(ROUTING_KEY_HEADER, key)]
         + _delivery_headers([], ids[0], [sid], 7))
        for subscriber, sid in (("billing", "a"), ("operations", "b"))]
    assert records[ids[0]]["outcome"] == "routed"
    assert records[ids[0]]["deliveries"] == [{"subscriber": "billing", "subscription_ids": ["a"]},
                                             {"subscriber": "operations", "subscription_ids": ["b"]}]
    assert (records[ids[1]]["outcome"], records[ids[1]]["reason"]) == ("rejected", (
        f"a delivery of this publish would be {limit + 1:,} bytes, more than "
        f"kafka.max_delivery_bytes ({limit:,}): the broker would refuse it"
        " (the copy in the rejected topic has no payload or headers: too large)"))
    [copy] = read_topic(base_config, rejected_topic)
    assert (copy.key(), copy.value(), dict(copy.headers())[MESSAGE_ID_HEADER]) == (
        key, None, ids[1].encode())


def test_a_view_of_many_marks_loads_at_its_last_and_an_unreadable_subscription_holds_publishes(
        base_config, kafka_bootstrap, realtime_query):
    """The view thread applies each ``sub:`` record as it reads it and builds a table at the
    latest mark it has read: a view of 20,000 subscriptions in 200 steps (updates and removals
    among them) routes with exactly its final state. A subscription record the kernel cannot
    read holds every publish (no table without it) until a later record of its id."""
    run = uuid.uuid4().hex[:8]
    publishes, view, changelog = f"rt-{run}.publishes", f"rt-{run}.view", f"rt-{run}.subscriptions"
    routed_topic, rejected_topic, prefix = f"rt-{run}.routed", f"rt-{run}.rejected", f"rt-{run}.d."
    subscribers = [prefix + name for name in ("first", "last", "moved", "kept")]
    _create(kafka_bootstrap, publishes, view, changelog, routed_topic, rejected_topic, *subscribers)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    n, step = 20_000, 100
    for i in range(n):
        producer.produce(view, key=f"sub:n{i}".encode(), value=json.dumps(_sub(
            f"n{i}", "amq.topic", f"crowd{i % 50}", f"crowd.{i}.#")).encode())
        if i == 10:  # later moved to another subscriber and filter
            producer.produce(view, key=b"sub:m", value=json.dumps(_sub(
                "m", "amq.topic", "crowd0", "old.#")).encode())
        if i == 20:  # later removed
            producer.produce(view, key=b"sub:gone", value=json.dumps(_sub(
                "gone", "amq.topic", "first", "k.#")).encode())
        if (i + 1) % step == 0:
            producer.produce(view, key=b"mark", value=_mark((i + 1) // step, 0))
        if i % 1000 == 0:
            producer.poll(0)
    producer.produce(view, key=b"sub:m", value=json.dumps(_sub("m", "amq.topic", "moved", "k.#")).encode())
    producer.produce(view, key=b"sub:gone", value=None)
    producer.produce(view, key=b"sub:f", value=json.dumps(_sub("f", "amq.topic", "first", "k.*")).encode())
    producer.produce(view, key=b"sub:l", value=json.dumps(_sub("l", "amq.topic", "last", "k.a")).encode())
    last = n // step + 1
    producer.produce(view, key=b"mark", value=_mark(last, 0))
    producer.flush(60)
    realtime_query({"kafka.bootstrap.servers": kafka_bootstrap, "view_topic": view,
                    "changelog_topic": changelog, "publishes_topic": publishes,
                    "deliveries_topic_prefix": prefix, "rejected_topic": rejected_topic,
                    "routed_topic": routed_topic}, publishes)

    def routed() -> dict:
        return {r.key().decode(): json.loads(r.value()) for r in read_topic(base_config, routed_topic)}

    _produce(producer, publishes, b"k.a", b"1")
    _produce(producer, publishes, b"crowd.19999.x", b"2")
    got = wait_until(lambda: (lambda r: r if len(r) == 2 else None)(routed()),
                     "the routed records of the first two publishes", timeout=180)
    first, second = got[f"{publishes}/0/0"], got[f"{publishes}/0/1"]
    assert first["snapshot_version"] == second["snapshot_version"] == last
    assert first["deliveries"] == [{"subscriber": "first", "subscription_ids": ["f"]},
                                   {"subscriber": "last", "subscription_ids": ["l"]},
                                   {"subscriber": "moved", "subscription_ids": ["m"]}]
    assert second["deliveries"] == [{"subscriber": "crowd49", "subscription_ids": ["n19999"]}]

    # An unreadable subscription (no filter), marked: the publish after it waits.
    _produce(producer, changelog, b"bad", b"{}")
    _produce(producer, view, b"sub:bad", json.dumps({"id": "bad", "exchange": "amq.topic"}).encode())
    _produce(producer, view, b"mark", _mark(last + 1, 1))
    _produce(producer, publishes, b"k.a", b"3")
    held = f"{publishes}/0/2"
    time.sleep(3)  # a negative check: no table covers the changelog, so nothing is routed
    assert held not in routed()
    _produce(producer, view, b"sub:bad", json.dumps(_sub("bad", "amq.topic", "kept", "k.a")).encode())
    _produce(producer, view, b"mark", _mark(last + 2, 1))
    record = wait_until(lambda: routed().get(held), "the held publish once the subscription reads",
                        timeout=60)
    assert record["snapshot_version"] == last + 2
    assert [d["subscriber"] for d in record["deliveries"]] == ["first", "kept", "last", "moved"]

    # A publisher's clock 5 minutes ahead: the gate does not wait for the executor's clock
    # to pass the publish's timestamp (an end-offsets read begun after the publish reached
    # the task saw everything Kafka had before it).
    ahead = int(time.time() * 1000) + 300_000
    producer.produce(publishes, key=b"k.a", value=b"4", timestamp=ahead)
    producer.flush(30)
    record = wait_until(lambda: routed().get(f"{publishes}/0/3"),
                        "a publish stamped 5 minutes ahead", timeout=90)
    assert record["published_at"] == ahead

"""MQTT retained messages (streaming/router/retained.py) on a real broker, Spark and Delta.

One router, opened but not started, driven batch by batch with
:meth:`Router.process_batch` (so that a batch id can be re-run on purpose), then
stopped and opened again: the retained messages come back from the compacted topic.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow.compute as pc
from confluent_kafka import Consumer, TopicPartition
from deltalake import DeltaTable

from isolation import isolated_config
from kafka_io import KAFKA_TIMEOUT_S, headers_of, produce_one, read_topic
from schemas.records import (
    EXCHANGE_HEADER,
    MESSAGE_ID_HEADER,
    OUTCOME_CLEARED,
    OUTCOME_REJECTED,
    RETAIN_HEADER,
    RETAINED_HEADER,
    SUBSCRIPTION_IDS_HEADER,
)
from streaming.config import Config
from streaming.router.retained import retained_key
from streaming.router.service import Router

RETAIN = [(RETAIN_HEADER, b"true")]


def publish(cfg: Config, topic: str, payload: bytes, exchange: str = "mqtt",
            retain: bool = True) -> str:
    headers = [*(RETAIN if retain else []), (EXCHANGE_HEADER, exchange.encode())]
    return produce_one(cfg, cfg.kafka.publishes_topic, topic.encode(), payload, headers)


def subscribe(cfg: Config, sub_id: str, subscriber: str, filter_: str) -> None:
    value = {"exchange": "mqtt", "subscriber": subscriber, "filter": filter_}
    produce_one(cfg, cfg.kafka.subscriptions_topic, sub_id.encode(), json.dumps(value).encode())


def end_offsets(cfg: Config) -> dict[int, int]:
    """The publishes topic's end offsets now: where the next batch starts."""
    consumer = Consumer({"bootstrap.servers": cfg.kafka.bootstrap, "group.id": "tests"})
    try:
        topic = cfg.kafka.publishes_topic
        partitions = consumer.list_topics(topic, timeout=KAFKA_TIMEOUT_S).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                  timeout=KAFKA_TIMEOUT_S)[1]
                for p in partitions}
    finally:
        consumer.close()


def batch_from(spark, cfg: Config, start: dict[int, int]):
    """The publishes from ``start`` to the end, as a static DataFrame shaped like a batch."""
    offsets = json.dumps({cfg.kafka.publishes_topic: {str(p): o for p, o in start.items()}})
    return (spark.read.format("kafka")
            .option("kafka.bootstrap.servers", cfg.kafka.bootstrap)
            .option("subscribe", cfg.kafka.publishes_topic)
            .option("startingOffsets", offsets)
            .option("includeHeaders", "true")
            .load())


def received(cfg: Config, subscriber: str) -> list[tuple[str, str, bytes, bool]]:
    """(routing key, message id, payload, retained mark) of each delivery, in topic order."""
    return [(r.key().decode(), headers_of(r)[MESSAGE_ID_HEADER], r.value(),
             headers_of(r).get(RETAINED_HEADER) == "true")
            for r in read_topic(cfg, cfg.kafka.layout.topic(subscriber))]


def audit(cfg: Config, name: str) -> list[dict]:
    return DeltaTable(cfg.delta.table_path(name)).to_pyarrow_table().to_pylist()


def test_retained_messages_reach_new_subscriptions_once_marked_and_survive_a_restart(
        base_config: Config, spark, tmp_path: Path):
    cfg = isolated_config(base_config, tmp_path)
    tag = uuid.uuid4().hex[:6]
    live, late, everything, shared, system, after = (f"{n}-{tag}" for n in (
        "live", "late", "all", "shared", "sys", "after"))
    router = Router(cfg, spark)
    router.open()
    try:
        # Batch 0: retained publishes (one set then cleared), to a subscription that exists.
        subscribe(cfg, "live", live, "sensors/+/temperature")
        start = end_offsets(cfg)
        boiler = publish(cfg, "sensors/boiler/temperature", b"71.5")
        attic_set = publish(cfg, "sensors/attic/temperature", b"20")
        attic_clear = publish(cfg, "sensors/attic/temperature", b"")
        humidity = publish(cfg, "sensors/attic/humidity", b"40")
        load = publish(cfg, "$SYS/broker/load", b"1")
        amqp = publish(cfg, "orders.eu", b"x", exchange="amq.topic")
        plain = publish(cfg, "sensors/cellar/temperature", b"12", retain=False)
        router.process_batch(batch_from(spark, cfg, start), 0)

        # Routed as usual (publishes of different partitions in no particular order); the
        # clear is delivered to no one.
        assert sorted(received(cfg, live)) == sorted([
            ("sensors/boiler/temperature", boiler, b"71.5", False),
            ("sensors/attic/temperature", attic_set, b"20", False),
            ("sensors/cellar/temperature", plain, b"12", False)])
        retained_state = {r.key(): r.value() for r in read_topic(cfg, cfg.kafka.retained_topic)}
        assert retained_state[retained_key("mqtt", "sensors/attic/temperature")] is None
        assert retained_key("mqtt", "sensors/cellar/temperature") not in retained_state
        assert not any(json.loads(k)[0] == "amq.topic" for k in retained_state)

        # Batch 1: new subscriptions, and a live retained publish in the same batch.
        subscribe(cfg, "late", late, "sensors/+/temperature")
        subscribe(cfg, "all", everything, "#")
        subscribe(cfg, "shared", shared, "$share/g/sensors/#")
        subscribe(cfg, "sys", system, "$SYS/#")
        start = end_offsets(cfg)
        boiler_now = publish(cfg, "sensors/boiler/temperature", b"72")
        batch = batch_from(spark, cfg, start)
        router.process_batch(batch, 1)
        router.process_batch(batch, 1)  # a re-run of the same batch id
        assert router.flush_audit(60)

        # Once, marked, before the live stream; the cleared topic delivered to no one.
        assert received(cfg, late) == [
            ("sensors/boiler/temperature", boiler, b"71.5", True),
            ("sensors/boiler/temperature", boiler_now, b"72", False),
            ("sensors/boiler/temperature", boiler_now, b"72", False)]  # the re-run: at least once
        first = [(k, m, r) for k, m, _, r in received(cfg, everything) if r]
        assert sorted(first) == sorted([("sensors/boiler/temperature", boiler, True),
                                        ("sensors/attic/humidity", humidity, True)])  # no $SYS
        assert [m for _, m, _, r in received(cfg, system) if r] == [load]
        assert [m for _, m, _, _ in received(cfg, shared)] == [boiler_now, boiler_now]
        late_record = read_topic(cfg, cfg.kafka.layout.topic(late))[0]
        assert json.loads(headers_of(late_record)[SUBSCRIPTION_IDS_HEADER]) == ["late"]
        assert headers_of(late_record)[RETAIN_HEADER] == "true"

        messages = {r["message_id"]: r for r in audit(cfg, "messages")}
        assert messages[attic_clear]["outcome"] == OUTCOME_CLEARED
        assert messages[attic_clear]["deliveries"] == 0
        assert messages[amqp]["outcome"] == OUTCOME_REJECTED
        assert "not an MQTT exchange" in messages[amqp]["reason"]
        deliveries = audit(cfg, "deliveries")
        retained_rows = sorted((r["message_id"], r["subscriber"], r["batch_id"])
                               for r in deliveries if r["retained"])
        assert retained_rows == sorted([(boiler, late, 1), (boiler, everything, 1),
                                        (humidity, everything, 1), (load, system, 1)])
        assert not [r for r in deliveries if r["message_id"] == attic_clear]
        assert all(r["retained"] is False for r in deliveries if r["message_id"] == boiler_now)
    finally:
        router.stop()

    # A restart: the retained state comes back from the compacted topic. (The batches
    # above ran without a streaming query: its checkpoint folder is made as a query's
    # would be, else the router takes the pins for an old checkpoint's and starts anew.)
    router.layout.offsets.mkdir(parents=True, exist_ok=True)
    again = Router(cfg, spark)
    again.open()
    try:
        subscribe(cfg, "after", after, "sensors/boiler/#")
        again.process_batch(batch_from(spark, cfg, end_offsets(cfg)), 2)
        assert received(cfg, after) == [("sensors/boiler/temperature", boiler_now, b"72", True)]
        rows = [r for r in audit(cfg, "deliveries") if r["subscriber"] == after]
        assert [(r["message_id"], r["retained"], r["batch_id"]) for r in rows] == [
            (boiler_now, True, 2)]
        assert rows[0]["published_at"] is not None
        assert pc.sum(pc.equal(DeltaTable(cfg.delta.table_path("deliveries")).to_pyarrow_table()[
            "retained"], True)).as_py() == 5  # none again to the subscriptions of before
    finally:
        again.stop()

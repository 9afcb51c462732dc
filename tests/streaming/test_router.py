"""The router end to end on a real broker, real Spark and real Delta.

Most tests share one running router (module scope) and keep apart by using
their own subscriber names and routing keys; tests that need a router of
their own (replay, restart) drive :meth:`Router.process_batch` on one that
is opened but not started, which is also how a replayed batch id is
produced deterministically.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from schemas.records import (
    CHANGE_REJECTED,
    CHANGE_REMOVE,
    CHANGE_UPSERT,
    EXCHANGE_HEADER,
    MESSAGE_ID_HEADER,
    OUTCOME_REJECTED,
    OUTCOME_ROUTED,
    OUTCOME_UNROUTABLE,
    REASON_HEADER,
    SNAPSHOT_VERSION_HEADER,
    SOURCE_HEADER,
    SOURCE_PUBLISH,
    SOURCE_SUBSCRIPTION,
    SUBSCRIPTION_IDS_HEADER,
    message_id,
)
from streaming.config import Config
from streaming.router import Router

KAFKA_TIMEOUT_S = 30.0


# --- helpers -----------------------------------------------------------------------

def router_config(base: Config, root: Path) -> Config:
    """``base`` with this router's own topics, tables and checkpoints."""
    tag = uuid.uuid4().hex[:10]
    return dataclasses.replace(
        base,
        kafka=dataclasses.replace(
            base.kafka, publishes_topic=f"pub-{tag}", subscriptions_topic=f"subs-{tag}",
            rejected_topic=f"rej-{tag}", deliveries_topic_prefix=f"dlv-{tag}."),
        delta=dataclasses.replace(base.delta, warehouse=str(root / "delta")),
        streaming=dataclasses.replace(base.streaming, checkpoint_dir=root / "checkpoints",
                                      trigger_interval="100 milliseconds"),
    )


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _produce(config: Config, topic: str, key: bytes | None, value: bytes | None,
             headers: list[tuple[str, bytes]] | None = None) -> str:
    """Produce one record, wait for the ack, return its message id."""
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap})
    acked = []
    producer.produce(topic, key=key, value=value, headers=headers or [],
                     on_delivery=lambda err, msg: acked.append((err, msg)))
    assert producer.flush(KAFKA_TIMEOUT_S) == 0
    error, record = acked[0]
    assert error is None, error
    return message_id(record.topic(), record.partition(), record.offset())


def subscribe(config: Config, sub_id: str, exchange: str, subscriber: str, filter_: str,
              headers: dict | None = None) -> None:
    value = {"exchange": exchange, "subscriber": subscriber, "filter": filter_}
    if headers is not None:
        value["headers"] = headers
    _produce(config, config.kafka.subscriptions_topic, sub_id.encode(), json.dumps(value).encode())


def unsubscribe(config: Config, sub_id: str) -> None:
    _produce(config, config.kafka.subscriptions_topic, sub_id.encode(), None)


def publish(config: Config, routing_key: str | None, payload: bytes = b"payload",
            exchange: str | None = None, headers: list[tuple[str, bytes]] | None = None) -> str:
    all_headers = list(headers or [])
    if exchange is not None:
        all_headers.append((EXCHANGE_HEADER, exchange.encode()))
    key = None if routing_key is None else routing_key.encode()
    return _produce(config, config.kafka.publishes_topic, key, payload, all_headers)


def read_topic(config: Config, topic: str) -> list:
    """Every record of ``topic`` up to its end offsets now (none when it does not exist)."""
    consumer = Consumer({"bootstrap.servers": config.kafka.bootstrap, "group.id": "tests",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        metadata = consumer.list_topics(topic, timeout=KAFKA_TIMEOUT_S).topics[topic]
        if metadata.error is not None:
            return []
        todo = set()
        for partition in metadata.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                       timeout=KAFKA_TIMEOUT_S)
            if high > low:
                todo.add(partition)
        consumer.assign([TopicPartition(topic, p, 0) for p in todo])
        records = []
        while todo:
            message = consumer.poll(KAFKA_TIMEOUT_S)
            assert message is not None, f"no record from {topic} within {KAFKA_TIMEOUT_S}s"
            if message.error() is not None:
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                todo.discard(message.partition())
            else:
                records.append(message)
        return records
    finally:
        consumer.close()


def headers_of(record) -> dict[str, str]:
    return {k: v.decode() for k, v in record.headers() or []}


def deliveries_of(config: Config, subscriber: str) -> dict[str, dict[str, str]]:
    """message id -> headers of each record in the subscriber's topic."""
    records = read_topic(config, config.kafka.deliveries_topic(subscriber))
    return {headers_of(r)[MESSAGE_ID_HEADER]: headers_of(r) for r in records}


def table(spark, config: Config, name: str):
    return spark.read.format("delta").load(config.delta.table_path(name))


def rows_for(spark, config: Config, name: str, column: str, values) -> list:
    return table(spark, config, name).where(f"{column} IN ({','.join(repr(v) for v in values)})").collect()


# --- a running router shared by the routing tests ---------------------------------------

@pytest.fixture(scope="module")
def router(base_config: Config, spark, tmp_path_factory: pytest.TempPathFactory) -> Router:
    instance = Router(router_config(base_config, tmp_path_factory.mktemp("router")), spark)
    instance.start()
    try:
        yield instance
    finally:
        instance.stop()


def test_amqp_and_mqtt_exchanges_route_side_by_side_and_stay_isolated(router: Router, spark):
    cfg = router.config
    alice, bob = unique("alice"), unique("bob")
    subscribe(cfg, f"{alice}-amqp", "amq.topic", alice, "sensors.*.temp")
    subscribe(cfg, f"{bob}-mqtt", "mqtt", bob, "sensors/+/temp")
    subscribe(cfg, f"{alice}-mqtt", "mqtt", alice, "sensors/#")
    amqp = publish(cfg, "sensors.k1.temp", b"21.5", "amq.topic", [("trace", b"t-1")])
    mqtt = publish(cfg, "sensors/k1/temp", b"22.0", "mqtt")
    # The MQTT-shaped key on the AMQP exchange is one word: isolation means no MQTT match.
    crossed = publish(cfg, "sensors/k1/temp", b"x", "amq.topic")
    default = publish(cfg, "sensors.k2.temp", b"23.1")  # no exchange header: amq.topic
    router.process_all_available()

    to_alice = deliveries_of(cfg, alice)
    to_bob = deliveries_of(cfg, bob)
    assert set(to_alice) == {amqp, mqtt, default}
    assert set(to_bob) == {mqtt}
    first = to_alice[amqp]
    assert first["trace"] == "t-1" and first[EXCHANGE_HEADER] == "amq.topic"
    assert json.loads(first[SUBSCRIPTION_IDS_HEADER]) == [f"{alice}-amqp"]
    assert int(first[SNAPSHOT_VERSION_HEADER]) >= 1
    record = next(r for r in read_topic(cfg, cfg.kafka.deliveries_topic(alice))
                  if headers_of(r)[MESSAGE_ID_HEADER] == amqp)
    assert (record.key(), record.value()) == (b"sensors.k1.temp", b"21.5")

    messages = {r.message_id: r for r in rows_for(spark, cfg, "messages", "message_id",
                                                   [amqp, mqtt, crossed, default])}
    assert {m: (r.outcome, r.deliveries, r.exchange) for m, r in messages.items()} == {
        amqp: (OUTCOME_ROUTED, 1, "amq.topic"), mqtt: (OUTCOME_ROUTED, 2, "mqtt"),
        crossed: (OUTCOME_UNROUTABLE, 0, "amq.topic"), default: (OUTCOME_ROUTED, 1, "amq.topic")}
    assert messages[amqp].headers == {"trace": "t-1", EXCHANGE_HEADER: "amq.topic"}
    assert messages[amqp].payload_bytes == 4
    deliveries = rows_for(spark, cfg, "deliveries", "message_id", [amqp, mqtt, default])
    assert sorted((r.message_id, r.subscriber, r.delivery_topic) for r in deliveries) == sorted([
        (amqp, alice, cfg.kafka.deliveries_topic(alice)),
        (mqtt, alice, cfg.kafka.deliveries_topic(alice)),
        (mqtt, bob, cfg.kafka.deliveries_topic(bob)),
        (default, alice, cfg.kafka.deliveries_topic(alice))])


def test_header_criteria_all_any_and_presence(router: Router):
    cfg = router.config
    eu, us = unique("eu-desk"), unique("us-desk")
    subscribe(cfg, f"{eu}-s", "amq.topic", eu, "orders.#",
              {"match": "all", "criteria": {"region": "eu", "priority": None}})
    subscribe(cfg, f"{us}-s", "amq.topic", us, "orders.#",
              {"match": "any", "criteria": {"region": "us", "vip": None}})
    both = publish(cfg, "orders.new", headers=[("region", b"eu"), ("priority", b"high")])
    region_us = publish(cfg, "orders.new", headers=[("region", b"us")])
    no_priority = publish(cfg, "orders.new", headers=[("region", b"eu")])
    vip = publish(cfg, "orders.paid", headers=[("vip", b"")])
    other_topic = publish(cfg, "invoices.new", headers=[("region", b"us")])
    router.process_all_available()

    assert set(deliveries_of(cfg, eu)) == {both}
    assert set(deliveries_of(cfg, us)) == {region_us, vip}
    assert no_priority not in deliveries_of(cfg, eu) and other_topic not in deliveries_of(cfg, us)


def test_a_subscriber_with_two_matching_subscriptions_gets_one_delivery_listing_both(
        router: Router, spark):
    cfg = router.config
    carol = unique("carol")
    subscribe(cfg, f"{carol}-2", "amq.topic", carol, "stock.#")
    subscribe(cfg, f"{carol}-1", "amq.topic", carol, "stock.*")
    subscribe(cfg, f"{carol}-3", "amq.topic", carol, "bonds.*")
    sent = publish(cfg, "stock.acme")
    router.process_all_available()

    records = read_topic(cfg, cfg.kafka.deliveries_topic(carol))
    assert len(records) == 1
    assert json.loads(headers_of(records[0])[SUBSCRIPTION_IDS_HEADER]) == [f"{carol}-1", f"{carol}-2"]
    [row] = rows_for(spark, cfg, "deliveries", "message_id", [sent])
    assert (row.subscriber, row.subscription_ids) == (carol, [f"{carol}-1", f"{carol}-2"])


def test_unsubscribe_stops_deliveries(router: Router, spark):
    cfg = router.config
    dan = unique("dan")
    subscribe(cfg, f"{dan}-s", "mqtt", dan, "home/+/light")
    before = publish(cfg, "home/kitchen/light", exchange="mqtt")
    router.process_all_available()
    assert set(deliveries_of(cfg, dan)) == {before}

    unsubscribe(cfg, f"{dan}-s")
    after = publish(cfg, "home/kitchen/light", exchange="mqtt")
    router.process_all_available()
    assert set(deliveries_of(cfg, dan)) == {before}
    [message] = rows_for(spark, cfg, "messages", "message_id", [after])
    assert message.outcome == OUTCOME_UNROUTABLE
    changes = sorted(rows_for(spark, cfg, "subscriptions", "subscription_id", [f"{dan}-s"]),
                     key=lambda r: r.snapshot_version)
    assert [c.change for c in changes] == [CHANGE_UPSERT, CHANGE_REMOVE]
    assert changes[0].snapshot_version < changes[1].snapshot_version


def test_a_subscription_acked_before_a_publish_applies_to_it(router: Router, spark):
    """Happens-before: the router is idle and caught up; the subscription and the
    publish are written back to back; the batch that reads the publish routes it."""
    cfg = router.config
    router.process_all_available()
    erin = unique("erin")
    subscribe(cfg, f"{erin}-s", "amq.topic", erin, "news.#")
    sent = publish(cfg, "news.sports")
    router.process_all_available()

    delivered = deliveries_of(cfg, erin)
    assert set(delivered) == {sent}
    [change] = rows_for(spark, cfg, "subscriptions", "subscription_id", [f"{erin}-s"])
    assert int(delivered[sent][SNAPSHOT_VERSION_HEADER]) >= change.snapshot_version


def test_bad_publishes_and_bad_changes_are_rejected_while_routing_goes_on(router: Router, spark):
    cfg = router.config
    fay = unique("fay")
    bad_changes = {
        unique("bad-json"): b"{not json",
        unique("bad-filter"): json.dumps({"exchange": "mqtt", "subscriber": fay,
                                          "filter": "a/#/b"}).encode(),
        unique("bad-exchange"): json.dumps({"exchange": "nope", "subscriber": fay,
                                            "filter": "a"}).encode(),
        unique("bad-subscriber"): json.dumps({"exchange": "amq.topic", "subscriber": "no/slash",
                                              "filter": "a"}).encode(),
    }
    for sub_id, value in bad_changes.items():
        _produce(cfg, cfg.kafka.subscriptions_topic, sub_id.encode(), value)
    subscribe(cfg, f"{fay}-ok", "amq.topic", fay, "good.key")
    unknown_exchange = publish(cfg, "good.key", exchange="nope")
    invalid_topic = publish(cfg, "a/+/b", exchange="mqtt")
    null_key = publish(cfg, None, exchange="amq.topic")
    good = publish(cfg, "good.key")
    router.process_all_available()

    assert set(deliveries_of(cfg, fay)) == {good}
    rejected = {headers_of(r)[MESSAGE_ID_HEADER]: (r, headers_of(r))
                for r in read_topic(cfg, cfg.kafka.rejected_topic)}
    for sent in (unknown_exchange, invalid_topic, null_key):
        record, headers = rejected[sent]
        assert headers[SOURCE_HEADER] == SOURCE_PUBLISH and headers[REASON_HEADER]
        assert record.value() == b"payload"
    by_key = {r.key(): h for r, h in rejected.values() if h[SOURCE_HEADER] == SOURCE_SUBSCRIPTION}
    assert {k.decode() for k in by_key} >= set(bad_changes)

    messages = {r.message_id: r for r in rows_for(
        spark, cfg, "messages", "message_id", [unknown_exchange, invalid_topic, null_key, good])}
    assert messages[good].outcome == OUTCOME_ROUTED
    for sent in (unknown_exchange, invalid_topic, null_key):
        assert messages[sent].outcome == OUTCOME_REJECTED and messages[sent].reason
    assert "nope" in messages[unknown_exchange].reason
    assert messages[null_key].routing_key is None
    changes = rows_for(spark, cfg, "subscriptions", "subscription_id", list(bad_changes))
    assert {c.subscription_id for c in changes} == set(bad_changes)
    assert all(c.change == CHANGE_REJECTED and c.reason for c in changes)


# --- routers of their own ------------------------------------------------------------

def _batch(spark, config: Config):
    """The publishes topic as a static DataFrame shaped like a micro-batch."""
    return (spark.read.format("kafka")
            .option("kafka.bootstrap.servers", config.kafka.bootstrap)
            .option("subscribe", config.kafka.publishes_topic)
            .option("startingOffsets", "earliest")
            .option("includeHeaders", "true")
            .load())


def test_a_replayed_batch_uses_its_pinned_version_and_adds_no_audit_rows(
        base_config: Config, spark, tmp_path: Path):
    cfg = router_config(base_config, tmp_path)
    router = Router(cfg, spark)
    router.open()
    try:
        gus, hal = unique("gus"), unique("hal")
        subscribe(cfg, "r1", "amq.topic", gus, "replay.*")
        sent = publish(cfg, "replay.me")
        batch = _batch(spark, cfg)
        first = router.process_batch(batch, 0)
        assert (first.rows, first.deliveries, first.replayed) == (1, 1, False)

        unsubscribe(cfg, "r1")
        subscribe(cfg, "r2", "amq.topic", hal, "replay.*")
        again = router.process_batch(batch, 0)
        assert again.replayed and again.snapshot_version == first.snapshot_version
        gus_records = read_topic(cfg, cfg.kafka.deliveries_topic(gus))
        assert len(gus_records) == 2  # at least once: the replay writes Kafka again
        assert headers_of(gus_records[0]) == headers_of(gus_records[1])
        assert deliveries_of(cfg, hal) == {}
        assert [(r.subscriber, r.batch_id) for r in
                rows_for(spark, cfg, "deliveries", "message_id", [sent])] == [(gus, 0)]
        assert len(rows_for(spark, cfg, "messages", "message_id", [sent])) == 1

        later = router.process_batch(batch, 1)
        assert later.snapshot_version > first.snapshot_version and not later.replayed
        assert set(deliveries_of(cfg, hal)) == {sent}
        assert sorted((r.subscriber, r.batch_id) for r in
                      rows_for(spark, cfg, "deliveries", "message_id", [sent])) == [(gus, 0), (hal, 1)]
    finally:
        router.stop()


def test_a_restart_resumes_from_the_persisted_snapshot_and_the_changelog_after_it(
        base_config: Config, spark, tmp_path: Path):
    cfg = router_config(base_config, tmp_path)
    first = Router(cfg, spark)
    first.open()
    try:
        subscribe(cfg, "keep", "mqtt", "ivy", "a/+")
        subscribe(cfg, "drop", "mqtt", "ivy", "b/+")
        version = first.subscriptions.catch_up()
    finally:
        first.stop()
    unsubscribe(cfg, "drop")
    # An invalid value for a live id removes it, as a rebuild after compaction would.
    _produce(cfg, cfg.kafka.subscriptions_topic, b"keep",
             json.dumps({"exchange": "mqtt", "subscriber": "ivy", "filter": "a/#/b"}).encode())
    subscribe(cfg, "new", "mqtt", "jay", "c/#")

    second = Router(cfg, spark)
    second.open()
    try:
        assert second.subscriptions.version == version + 1
        assert len(second.subscriptions) == 1
        changes = table(spark, cfg, "subscriptions").collect()
        assert sorted((c.subscription_id, c.change, c.snapshot_version) for c in changes) == sorted([
            ("keep", CHANGE_UPSERT, version), ("drop", CHANGE_UPSERT, version),
            ("drop", CHANGE_REMOVE, version + 1), ("keep", CHANGE_REMOVE, version + 1),
            ("new", CHANGE_UPSERT, version + 1)])
    finally:
        second.stop()

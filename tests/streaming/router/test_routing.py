"""A routing task on its own (no Spark), producing to the real broker: the poison-pill net
that splits a batch around a record that makes routing raise, and the failures that are
not about a record, which must fail the task instead of becoming rejections."""

from __future__ import annotations

import time

import pytest
from bitroute_kernel import ColumnOverflowError, TableError
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from arrow_batches import source_batch
from compiler import Matcher, RoutingIndex, Snapshot, Subscription
from kafka_io import message_id_of
from router_runs import (
    KAFKA_TIMEOUT_S,
    create_publishes,
    delivered_ids,
    publish,
    route_all,
    subscribe,
)
from schemas.records import OUTCOME_REJECTED, OUTCOME_ROUTED, OUTCOME_UNROUTABLE
from streaming.kafka.errors import KafkaAccessError
from streaming.kafka.layout import DeliveryLayout
from streaming.router.batch.delivery import (
    DeliveryColumns,
    DeliveryProducer,
    DeliveryUnavailable,
    ProducerSettings,
)
from streaming.router.batch.routing import RouteSettings, route_safely
from waiting import wait_until


class RaisesOn(Matcher):
    """A real matcher that raises, as an unforeseen bug would, when a batch holds ``key``."""

    def __init__(self, snapshot: Snapshot, key: bytes) -> None:
        super().__init__(snapshot)
        self.key = key

    def match_columns(self, message_ids, exchanges, keys, headers=None):
        if self.key in keys:
            raise ValueError("cannot digest this key")
        return super().match_columns(message_ids, exchanges, keys, headers)


def _snapshot() -> Snapshot:
    index = RoutingIndex({"amq.topic": "amqp"})
    index.upsert(Subscription.from_changelog(
        b"s1", b'{"exchange": "amq.topic", "subscriber": "ann", "filter": "a.*"}'))
    return index.snapshot(1, {})


def _settings(prefix: str, rejected: str, bootstrap: str, **producer) -> RouteSettings:
    return RouteSettings("amq.topic", DeliveryLayout(prefix), rejected, 1, False,
                         ProducerSettings(bootstrap, 1_048_576, **producer))


def _message_ids(bootstrap: str, topic: str) -> list[str]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "t", "enable.auto.commit": False})
    try:
        high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1]
        consumer.assign([TopicPartition(topic, 0, 0)])
        ids: list[str] = []
        while len(ids) < high:
            message = consumer.poll(30)
            assert message is not None and message.error() is None
            ids.append(message_id_of(message))
        return ids
    finally:
        consumer.close()


def test_a_record_that_makes_routing_raise_is_found_and_rejected_and_the_rest_is_routed(
        kafka_bootstrap, new_topic):
    rejected = new_topic()
    prefix = f"{new_topic()}."  # a fresh prefix: the subscriber's topic is <prefix>ann
    ann_topic = new_topic_named(kafka_bootstrap, f"{prefix}ann")
    batch = source_batch([(b"a.1", b"v", []), (b"a.2", b"v", []), (b"boom", b"v", []),
                          (b"a.3", b"v", []), (b"b.1", b"v", [])])
    producer = DeliveryProducer(ProducerSettings(kafka_bootstrap, 1_048_576))
    rows = route_safely(RaisesOn(_snapshot(), b"boom"), producer, batch,
                        _settings(prefix, rejected, kafka_bootstrap)).to_pylist()

    by_id = {r["message_id"]: r for r in rows}
    assert [r["message_id"] for r in rows] == [f"p/0/{i}" for i in range(5)]
    assert by_id["p/0/2"]["outcome"] == OUTCOME_REJECTED
    assert "routing this publish failed: ValueError: cannot digest this key" in by_id["p/0/2"]["reason"]
    assert [by_id[f"p/0/{i}"]["outcome"] for i in (0, 1, 3)] == [OUTCOME_ROUTED] * 3
    assert by_id["p/0/4"]["outcome"] == OUTCOME_UNROUTABLE
    assert sorted(set(_message_ids(kafka_bootstrap, ann_topic))) == ["p/0/0", "p/0/1", "p/0/3"]
    assert _message_ids(kafka_bootstrap, rejected) == ["p/0/2"]


def test_kafka_unreachable_fails_the_task_and_rejects_nothing():
    producer = DeliveryProducer(ProducerSettings("127.0.0.1:1", 1_048_576, message_timeout_ms=1500))
    batch = source_batch([(b"a.1", b"v", []), (b"bad key #", b"v", [("exchange", b"nope")])])
    with pytest.raises(DeliveryUnavailable, match="did not acknowledge"):
        route_safely(Matcher(_snapshot()), producer, batch,
                     _settings("dlv.", "rejected", "127.0.0.1:1", message_timeout_ms=1500))


def test_a_flush_sends_at_once_whatever_the_linger(kafka_bootstrap, new_topic):
    """``kafka.delivery_linger_ms`` never delays a batch: the flush sends every shard's
    lingering records at once (a 50 s linger would otherwise hold them for 50 s)."""
    topics = [new_topic() for _ in range(6)]  # spread over the producer's shards
    producer = DeliveryProducer(ProducerSettings(kafka_bootstrap, 1_048_576, linger_ms=50_000))
    producer.produce_deliveries(DeliveryColumns.of_records(
        [t for t in topics for _ in range(3)], [b"k"] * 18, [b"v"] * 18))
    started = time.monotonic()
    assert producer.flush() == []
    assert time.monotonic() - started < 25
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "t"})
    try:
        written = {t: consumer.get_watermark_offsets(TopicPartition(t, 0), timeout=30)[1]
                   for t in topics}
    finally:
        consumer.close()
    assert written == {t: 3 for t in topics}


def new_topic_named(bootstrap: str, name: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    return name


class KernelFails(Matcher):
    """A real matcher whose kernel call fails as the kernel does: ``error`` raised for every
    batch of more than ``rows_at_most`` publishes (None: for every batch)."""

    def __init__(self, snapshot: Snapshot, error: Exception, rows_at_most: int | None = None):
        super().__init__(snapshot)
        self.error, self.rows_at_most = error, rows_at_most

    def match_columns(self, message_ids, exchanges, keys, headers=None):
        if self.rows_at_most is None or len(keys) > self.rows_at_most:
            raise self.error
        return super().match_columns(message_ids, exchanges, keys, headers)


def test_a_kernel_error_fails_the_task_instead_of_rejecting_the_batch(kafka_bootstrap, new_topic):
    rejected = new_topic()
    batch = source_batch([(b"a.1", b"v", []), (b"a.2", b"v", [])])
    producer = DeliveryProducer(ProducerSettings(kafka_bootstrap, 1_048_576))
    with pytest.raises(TableError, match="slot out of range"):
        route_safely(KernelFails(_snapshot(), TableError("slot out of range")), producer, batch,
                     _settings("dlv.", rejected, kafka_bootstrap))
    assert _message_ids(kafka_bootstrap, rejected) == []  # a bug is not bad input


@pytest.mark.parametrize("error", [
    KafkaAccessError("Kafka at x does not allow User:router to Write topic t"),
    KafkaException(KafkaError(KafkaError._FATAL, "fatal")),
    OSError("disk unreachable"),
    MemoryError(),
], ids=["access refused", "kafka client", "disk", "memory"])
def test_a_failure_not_about_a_record_fails_the_task_and_rejects_nothing(kafka_bootstrap, new_topic,
                                                                       error):
    rejected = new_topic()
    batch = source_batch([(b"a.1", b"v", []), (b"a.2", b"v", [])])
    producer = DeliveryProducer(ProducerSettings(kafka_bootstrap, 1_048_576))
    with pytest.raises(type(error)):
        route_safely(KernelFails(_snapshot(), error), producer, batch,
                     _settings("dlv.", rejected, kafka_bootstrap))
    assert _message_ids(kafka_bootstrap, rejected) == []


def test_a_batch_whose_deliveries_overflow_arrow_is_routed_in_halves(kafka_bootstrap, new_topic):
    rejected = new_topic()
    prefix = f"{new_topic()}."
    ann_topic = new_topic_named(kafka_bootstrap, f"{prefix}ann")
    batch = source_batch([(f"a.{i}".encode(), b"v", []) for i in range(4)])
    producer = DeliveryProducer(ProducerSettings(kafka_bootstrap, 1_048_576))
    rows = route_safely(KernelFails(_snapshot(), ColumnOverflowError("too many"), rows_at_most=1),
                        producer, batch, _settings(prefix, rejected, kafka_bootstrap)).to_pylist()
    assert [r["outcome"] for r in rows] == [OUTCOME_ROUTED] * 4
    assert sorted(_message_ids(kafka_bootstrap, ann_topic)) == [f"p/0/{i}" for i in range(4)]
    assert _message_ids(kafka_bootstrap, rejected) == []


# --- a delivery topic deleted while subscriptions feed it (a real streaming query) -------

def test_a_deleted_delivery_topic_is_recreated_and_delivered(isolated_config, spark):
    # On the executors (the driver's path runs the same route_batch). Three partitions:
    # a topic the broker auto-created would have its default, one.
    config = isolated_config(**{"streaming.driver_route_max_publishes": "0",
                                "kafka.delivery_partitions": "3"})
    create_publishes(config, 1)
    subscribe(config, "cat", "g/#")
    subscribe(config, "dan", "g/#")
    first = publish(config, 0, 1)
    route_all(config, spark)
    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap})
    topic = config.kafka.layout.topic("cat")
    admin.delete_topics([topic])[topic].result(KAFKA_TIMEOUT_S)
    wait_until(lambda: topic not in admin.list_topics(timeout=KAFKA_TIMEOUT_S).topics, f"topic {topic} deleted",
               timeout=KAFKA_TIMEOUT_S)

    later = publish(config, 0, 2)
    route_all(config, spark)
    assert delivered_ids(config, "cat") == set(later)
    assert delivered_ids(config, "dan") == set(first + later)
    metadata = admin.list_topics(topic, timeout=KAFKA_TIMEOUT_S).topics[topic]
    assert len(metadata.partitions) == config.kafka.delivery_partitions
    rows = DeltaTable(config.delta.table_path("messages")).to_pyarrow_table().to_pylist()
    assert {r["message_id"]: (r["outcome"], r["deliveries"]) for r in rows} == {
        m: (OUTCOME_ROUTED, 2) for m in first + later}

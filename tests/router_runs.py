"""An in-process router's runs and their Kafka in and out, for tests that drive
:class:`streaming.router.service.Router` over a real broker: publishes to chosen
partitions, subscriptions, Kafka's DeleteRecords, a subscriber's deliveries, the
audit's ``lost`` rows and a routing snapshot saved as the router saves it."""

from __future__ import annotations

import json

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import DeltaTable

from compiler import RoutingIndex, Subscription
from kafka_io import message_id_of
from schemas.records import EXCHANGE_HEADER, OUTCOME_LOST, message_id
from streaming.config import Config
from streaming.kafka.clients import record_position
from streaming.router.service import Router
from streaming.router.subscriptions.changelog import ChangelogReader, apply_record
from streaming.router.subscriptions.snapshots import SnapshotStore, SnapshotVersion
from streaming.state.checkpoint import CheckpointLayout

KAFKA_TIMEOUT_S = 30.0


def create_publishes(config: Config, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap})
    topic = config.kafka.publishes_topic
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(KAFKA_TIMEOUT_S)


def produce(config: Config, topic: str, records: list[tuple[int | None, bytes, bytes | None]],
            headers: list[tuple[str, str | bytes | None]] | None = None) -> list[str]:
    """Produce (partition, key, value) records; their message ids, in order."""
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap})
    acked: list[tuple[KafkaError | None, Message]] = []
    for partition, key, value in records:
        producer.produce(topic, value, key, partition=-1 if partition is None else partition,
                         headers=headers or [], on_delivery=lambda e, m: acked.append((e, m)))
        producer.flush(KAFKA_TIMEOUT_S)
    assert all(error is None for error, _ in acked)
    return [message_id(*record_position(m)) for _, m in acked]


def publish(config: Config, partition: int, count: int) -> list[str]:
    return produce(config, config.kafka.publishes_topic,
                   [(partition, b"g/1", b"reading")] * count, [(EXCHANGE_HEADER, b"mqtt")])


def subscribe(config: Config, subscriber: str, filter_: str) -> None:
    value = {"exchange": "mqtt", "subscriber": subscriber, "filter": filter_}
    produce(config, config.kafka.subscriptions_topic,
            [(None, subscriber.encode(), json.dumps(value).encode())])


def delete_before(config: Config, partition: int, offset: int) -> None:
    """Kafka's DeleteRecords: the partition's records before ``offset`` are gone."""
    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap})
    tp = TopicPartition(config.kafka.publishes_topic, partition, offset)
    result = admin.delete_records([tp])[tp].result(KAFKA_TIMEOUT_S)
    assert result.low_watermark == offset


def delivered_ids(config: Config, subscriber: str) -> set[str]:
    topic = config.kafka.layout.topic(subscriber)
    consumer = Consumer({"bootstrap.servers": config.kafka.bootstrap, "group.id": "tests",
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=KAFKA_TIMEOUT_S).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=KAFKA_TIMEOUT_S)
                for p in partitions}
        consumer.assign([TopicPartition(topic, p, low) for p, (low, high) in ends.items()
                         if high > low])
        left, ids = sum(high - low for low, high in ends.values()), set()
        while left:
            message = consumer.poll(KAFKA_TIMEOUT_S)
            assert message is not None and message.error() is None
            ids.add(message_id_of(message))
            left -= 1
        return ids
    finally:
        consumer.close()


def lost_rows(config: Config) -> dict[str, dict]:
    rows = DeltaTable(config.delta.table_path("messages")).to_pyarrow_table().to_pylist()
    return {r["message_id"]: r for r in rows if r["outcome"] == OUTCOME_LOST}


def route_all(config: Config, spark, **kwargs) -> Router:
    router = Router(config, spark, **kwargs)
    router.start()
    try:
        router.process_all_available()
        assert router.flush_audit(KAFKA_TIMEOUT_S)
    finally:
        router.stop()
    return router


def persist_snapshot(config: Config, version: int, *extra: Subscription) -> dict[int, int]:
    """Save snapshot ``version`` of the whole subscriptions changelog (plus ``extra``) in
    the router's checkpoint folder, as the router does; the changelog offsets it covers."""
    index = RoutingIndex(config.exchanges.dialects)
    for sub in extra:
        index.upsert(sub)
    reader = ChangelogReader(config)
    try:
        offsets = reader.read_to_end({}, lambda m: apply_record(
            index, m.key(), m.value(), *record_position(m)[1:], None, 0))
    finally:
        reader.close()
    store = SnapshotStore(CheckpointLayout.of(config.streaming.checkpoint_dir))
    store.save(SnapshotVersion.of(index.snapshot(version, offsets)), [])
    return offsets

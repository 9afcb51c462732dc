"""Reading a subscriber's deliveries in the order Kafka holds them, and the design's
ordering guarantee (docs/design.md, "Guarantees") as an assertion."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, TopicPartition

from kafka_io import message_id_of
from streaming.config import Config
from streaming.kafka.clients import record_position


def delivery_order(config: Config, subscriber: str) -> dict[int, list[str]]:
    """Per partition of the subscriber's topic, the message ids of its deliveries in the order
    Kafka holds them (in the shared layout, the records keyed by the subscriber)."""
    topic = config.kafka.layout.topic(subscriber)
    key = config.kafka.layout.subscriber_key(subscriber)
    consumer = Consumer({"bootstrap.servers": config.kafka.bootstrap, "group.id": uuid.uuid4().hex,
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        order: dict[int, list[str]] = {p: [] for p in partitions}
        read = dict.fromkeys(partitions, 0)
        while any(read[p] < ends[p] for p in partitions):
            record = consumer.poll(30)
            assert record is not None and record.error() is None
            _, partition, _ = record_position(record)
            read[partition] += 1
            if key is None or record.key() == key:
                order[partition].append(message_id_of(record))
        return order
    finally:
        consumer.close()


def assert_publish_order_kept(order: dict[int, list[str]]) -> None:
    """The design's ordering guarantee: in each delivery partition, the first copy of each
    delivery comes in the order of its publish's offset within its publishes partition
    (a re-run or a replay may repeat deliveries, which the first copies leave out)."""
    for partition, ids in order.items():
        first: dict[str, None] = dict.fromkeys(ids)  # first copies, in order
        last_offset: dict[tuple[str, str], int] = {}
        for mid in first:
            topic, publishes_partition, offset = mid.rsplit("/", 2)
            source = (topic, publishes_partition)
            assert last_offset.get(source, -1) < int(offset), (
                f"delivery partition {partition}: {mid} after offset {last_offset[source]}")
            last_offset[source] = int(offset)

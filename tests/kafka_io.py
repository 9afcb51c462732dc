"""Kafka in and out in tests: one record produced and acknowledged, a topic read back up
to the end offsets of now, a subscriber's deliveries by message id, headers as text."""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from schemas.records import MESSAGE_ID_HEADER, message_id
from streaming.config import Config
from streaming.kafka.clients import record_headers, record_position

KAFKA_TIMEOUT_S = 30.0


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
                error = message.error()
                assert error is not None and error.code() == KafkaError._PARTITION_EOF, error
                todo.discard(message.partition())
            else:
                records.append(message)
        return records
    finally:
        consumer.close()


def headers_of(record) -> dict[str, str]:
    """A record's headers as text (bytes that are not UTF-8 replaced)."""
    return {k: v.decode("utf-8", "replace") for k, v in record.headers() or []}


def message_id_of(record: Message) -> str:
    """The message id header of a record the router wrote (a delivery, a rejected publish)."""
    value = dict(record_headers(record) or ())[MESSAGE_ID_HEADER]
    assert value is not None, "a null message id header"
    return value.decode()


def produce_one(config: Config, topic: str, key: bytes | None, value: bytes | None, headers=(),
                timestamp_ms: int | None = None) -> str:
    """Produce one record (at ``timestamp_ms``, else now; ``headers`` a list of pairs or
    None) and wait for Kafka's acknowledgement; its message id."""
    # Up to the test broker's own limit (librdkafka's default stops at 1,000,000 bytes).
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap, "message.max.bytes": 2_000_000})
    acked: list = []
    producer.produce(topic, key=key, value=value, headers=list(headers or ()),
                     timestamp=timestamp_ms or 0,
                     on_delivery=lambda err, msg: acked.append((err, msg)))
    assert producer.flush(KAFKA_TIMEOUT_S) == 0
    error, record = acked[0]
    assert error is None, error
    return message_id(*record_position(record))


def deliveries_by_id(config: Config, subscriber: str) -> dict[str, dict[str, str]]:
    """message id -> headers of each delivery to ``subscriber`` (its delivery topic up to
    its end offsets now)."""
    return {headers_of(r)[MESSAGE_ID_HEADER]: headers_of(r)
            for r in read_topic(config, config.kafka.layout.topic(subscriber))}

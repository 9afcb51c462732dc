"""Reading a topic back in tests: every record up to the end offsets of now, and headers
as text."""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from schemas.records import MESSAGE_ID_HEADER
from streaming.config import Config
from streaming.kafka.clients import record_headers

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

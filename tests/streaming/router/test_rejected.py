"""streaming.router.batch.rejected: the rejected topic's one writer and failure policy, against the
real broker (bad publishes and bad subscription changes both go through it)."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, TopicPartition

from schemas.records import MESSAGE_ID_HEADER, REASON_HEADER, SOURCE_HEADER
from streaming.router.batch.delivery import DeliveryProducer, DeliveryUnavailable, ProducerSettings
from streaming.router.batch.rejected import BadRecord, write_rejected


def _read(bootstrap: str, topic: str) -> list:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "t", "enable.auto.commit": False})
    try:
        high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1]
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list = []
        while len(got) < high:
            got += [m for m in consumer.consume(high - len(got), timeout=10) if m.error() is None]
        return got
    finally:
        consumer.close()


def test_copies_are_whole_when_they_fit_else_bare_and_a_refused_one_says_so(kafka_bootstrap,
                                                                          new_topic):
    topic = new_topic(**{"max.message.bytes": "3000"})
    producer = DeliveryProducer(ProducerSettings(kafka_bootstrap, 1_048_576))
    records = [BadRecord(b"k1", b"small", [("trace", b"t")], "bad exchange", "publish", "p/0/1"),
               BadRecord(b"k2", b"x" * 5000, [("trace", b"t")], "too large", "publish", "p/0/2"),
               BadRecord(b"k3", b"y" * 3500, [], "refused", "subscription", "s/0/3")]
    reasons, refusals = write_rejected(producer, topic, records, limit=4000)

    assert reasons[0] == "bad exchange"
    assert reasons[1].startswith("too large (the copy in the rejected topic has no payload")
    assert reasons[2].startswith(f"refused (not written to {topic}: ") and len(refusals) == 1
    written = {dict(m.headers())[MESSAGE_ID_HEADER]: m for m in _read(kafka_bootstrap, topic)}
    assert sorted(written) == [b"p/0/1", b"p/0/2"]  # the refused one alone is left out
    assert "MSG_SIZE_TOO_LARGE" in refusals[0]
    whole, bare = written[b"p/0/1"], written[b"p/0/2"]
    assert whole.value() == b"small" and ("trace", b"t") in whole.headers()
    assert dict(whole.headers())[REASON_HEADER] == b"bad exchange"
    assert bare.value() is None and ("trace", b"t") not in bare.headers()
    assert dict(bare.headers())[SOURCE_HEADER] == b"publish"


def test_kafka_unreachable_raises_instead_of_dropping_the_copies():
    producer = DeliveryProducer(ProducerSettings("127.0.0.1:1", 1_048_576, message_timeout_ms=1500))
    with pytest.raises(DeliveryUnavailable):
        write_rejected(producer, "rejected", [BadRecord(b"k", b"v", [], "bad", "publish", "p/0/0")],
                       limit=4000)

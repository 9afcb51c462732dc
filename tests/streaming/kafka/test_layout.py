"""The delivery layouts: the layout value alone (no broker), then the shared layout
(``kafka.delivery_layout = "shared"``) on a real broker, real Spark and real Delta: every
subscriber's deliveries in one shared topic, keyed by subscriber in the partition Kafka's
default partitioner gives that key, the routing key in a header; ``bitroute tail`` reads
a subscriber's own records back."""

from __future__ import annotations

import dataclasses
import pickle
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from isolation import isolated_config
from kafka_io import headers_of, read_topic
from schemas.records import (
    MESSAGE_ID_HEADER,
    OUTCOME_REJECTED,
    OUTCOME_ROUTED,
    ROUTING_KEY_HEADER,
    SUBSCRIPTION_IDS_HEADER,
)
from streaming.config import Config, KafkaConfig
from streaming.kafka import client_verbs as client
from streaming.kafka.layout import DeliveryLayout
from streaming.kafka.partitioner import default_partition, murmur2
from streaming.kafka.records import HEADER_OVERHEAD
from streaming.router.batch.delivery import ProducerSettings
from streaming.router.batch.routing import RouteSettings
from streaming.router.service import Router

SHARED_PARTITIONS = 4


# Kafka's UtilsTest.testMurmur2: the Java producer's hashes (signed ints) of these keys.
@pytest.mark.parametrize("key, java_hash", [
    ("21", -973932308), ("foobar", -790332482), ("a-little-bit-long-string", -985981536),
    ("a-little-bit-longer-string", -1486304829),
    ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971), ("abc", 479470107),
])
def test_murmur2_is_the_java_producers_hash(key: str, java_hash: int):
    assert murmur2(key.encode()) == java_hash & 0xFFFFFFFF


def test_default_partition_is_in_range_and_refuses_no_partitions():
    assert {default_partition(f"s{i}".encode(), 3) for i in range(200)} == {0, 1, 2}
    with pytest.raises(ValueError, match="partitions must be >= 1"):
        default_partition(b"a", 0)


def _layouts() -> tuple[DeliveryLayout, DeliveryLayout]:
    own = KafkaConfig(deliveries_topic_prefix="dlv.", delivery_partitions=2).layout
    shared = KafkaConfig(delivery_layout="shared", shared_deliveries_topic="all",
                         shared_delivery_partitions=SHARED_PARTITIONS).layout
    return own, shared


def test_the_layout_value_says_where_each_subscribers_deliveries_go():
    own, shared = _layouts()
    assert (own.shared, own.topic("ann"), own.partitions) == (False, "dlv.ann", 2)
    assert (shared.shared, shared.topic("ann"), shared.partitions) == (True, "all", SHARED_PARTITIONS)
    subscribers = pa.array(["ann", "bob"])
    assert own.topic_column(subscribers).to_pylist() == ["dlv.ann", "dlv.bob"]
    assert shared.topic_column(subscribers).to_pylist() == ["all", "all"]
    # Delivery i goes to subscribers[i]: keyed by its publish's routing key, or by subscriber.
    routing_keys = pa.array([b"k0", b"k1"], pa.binary())
    keys, per_delivery = own.record_keys(subscribers, routing_keys)
    assert (keys.to_pylist(), per_delivery) == ([b"k0", b"k1"], False)
    keys, per_delivery = shared.record_keys(subscribers, routing_keys)
    assert (keys.to_pylist(), per_delivery) == ([b"ann", b"bob"], True)
    # The routing key moves to a header after the publish's own in the shared layout.
    assert (own.routing_key_header, shared.routing_key_header) == (None, ROUTING_KEY_HEADER)
    assert own.key_bytes(subscribers) == 0
    assert np.asarray(shared.key_bytes(subscribers)).tolist() == [len(ROUTING_KEY_HEADER) + HEADER_OVERHEAD + 3] * 2
    # bitroute tail reads all of a subscriber's own topic, or the shared partition of its key.
    assert (own.subscriber_key("ann"), own.subscriber_partitions("ann", [0, 1])) == (None, [0, 1])
    assert shared.subscriber_key("ann") == b"ann"
    assert shared.subscriber_partitions("ann", [0, 1, 2, 3]) == [
        default_partition(b"ann", SHARED_PARTITIONS)]


def test_the_layout_is_a_small_frozen_value_for_the_tasks():
    for layout in _layouts():
        data = pickle.dumps(layout)
        assert pickle.loads(data) == layout and len(data) < 200
        with pytest.raises(dataclasses.FrozenInstanceError):
            layout.partitions = 3  # type: ignore[misc]  # the refused assignment is the test


def test_a_routing_task_in_the_shared_layout_needs_kafkas_partitioner():
    _, shared = _layouts()
    with pytest.raises(ValueError, match="keyed_partitions"):
        RouteSettings("amq.topic", shared, "rej", 1, False, ProducerSettings("127.0.0.1:1", 4096))
    RouteSettings("amq.topic", shared, "rej", 1, False,
                  ProducerSettings("127.0.0.1:1", 4096, keyed_partitions=True))


@pytest.fixture
def shared_config(base_config: Config, tmp_path: Path) -> Config:
    cfg = isolated_config(base_config, tmp_path)
    return dataclasses.replace(cfg, kafka=dataclasses.replace(
        cfg.kafka, delivery_layout="shared", shared_delivery_partitions=SHARED_PARTITIONS,
        shared_deliveries_topic=f"shared-{uuid.uuid4().hex[:10]}", max_delivery_bytes=4096))


def test_the_shared_layout_routes_keyed_by_subscriber_and_tail_reads_one_subscriber(
        shared_config: Config, spark):
    cfg = shared_config
    topic = cfg.kafka.shared_deliveries_topic
    names = [f"{n}-{uuid.uuid4().hex[:6]}" for n in ("ann", "bob", "cy", "dee", "eve")]
    ann, bob = names[0], names[1]
    router = Router(cfg, spark)
    router.start()
    try:
        router.process_all_available()
        client.subscribe(cfg, "amq.topic", ann, "orders.*", sub_id="ann-1")
        client.subscribe(cfg, "amq.topic", ann, "orders.#", sub_id="ann-2")
        for i, name in enumerate(names[1:]):
            client.subscribe(cfg, "amq.topic", name, "orders.eu", sub_id=f"other-{i}")
        eu = client.publish(cfg, "amq.topic", "orders.eu", b"42", [("trace", b"t1")])
        us = client.publish(cfg, "amq.topic", "orders.us", b"43")
        huge = client.publish(cfg, "amq.topic", "orders.eu", b"x" * 4000)
        router.process_all_available()
        assert router.flush_audit(60)  # the audit reaches Delta in the background
        reports = [r for r in router.reports if r.rows]
        assert sum(r.rows for r in reports) == 3 and sum(r.deliveries for r in reports) == 6
        assert sum(r.rejected for r in reports) == 1
        # Small batches after the first: routed in the driver, without the Python workers.
        assert {r.routed_in for r in reports} == {"driver"}

        records = read_topic(cfg, topic)
        assert sorted((r.key().decode(), headers_of(r)[MESSAGE_ID_HEADER]) for r in records) == sorted(
            [(ann, eu), (ann, us)] + [(name, eu) for name in names[1:]])
        for record in records:
            assert record.partition() == default_partition(record.key(), SHARED_PARTITIONS)
            headers = headers_of(record)
            assert headers[ROUTING_KEY_HEADER] == ("orders.eu" if headers[MESSAGE_ID_HEADER] == eu
                                                   else "orders.us")
        ann_eu = next(r for r in records if r.key() == ann.encode()
                      and headers_of(r)[MESSAGE_ID_HEADER] == eu)
        assert headers_of(ann_eu)["trace"] == "t1" and ann_eu.value() == b"42"
        assert headers_of(ann_eu)[SUBSCRIPTION_IDS_HEADER] == '["ann-1","ann-2"]'

        seen: list[str] = []
        tailed = list(client.tail(cfg, ann, from_beginning=True, max_records=2, timeout_s=10,
                                  started=seen.append))
        assert sorted((d.message_id, d.routing_key) for d in tailed) == sorted(
            [(eu, "orders.eu"), (us, "orders.us")])
        assert {tuple(d.subscription_ids or ()) for d in tailed} == {("ann-1", "ann-2")}
        assert seen == [f"{topic} partition {default_partition(ann.encode(), SHARED_PARTITIONS)} "
                        f"(shared layout, records keyed {ann})"]
        assert [d.message_id for d in client.tail(cfg, bob, from_beginning=True, timeout_s=3)] == [eu]

        audit = DeltaTable(cfg.delta.table_path("deliveries")).to_pyarrow_table().to_pylist()
        assert {row["delivery_topic"] for row in audit} == {topic}
        assert len(audit) == 6
        messages = {r["message_id"]: r for r in
                    DeltaTable(cfg.delta.table_path("messages")).to_pyarrow_table().to_pylist()}
        assert messages[eu]["outcome"] == OUTCOME_ROUTED and messages[eu]["deliveries"] == 5
        assert messages[huge]["outcome"] == OUTCOME_REJECTED
        assert "more than kafka.max_delivery_bytes (4,096)" in messages[huge]["reason"]
    finally:
        router.stop()

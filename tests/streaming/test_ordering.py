"""The ordering guarantee (docs/design.md) on the executors' path and in the shared layout,
on a real broker and a real streaming query: publishes keyed over three partitions."""

from __future__ import annotations

import dataclasses
import json
import uuid

import pytest
from confluent_kafka import Producer

from delivery_order import assert_publish_order_kept, delivery_order
from schemas.records import EXCHANGE_HEADER
from streaming.router.service import Router

pytestmark = pytest.mark.integration


def test_deliveries_keep_their_publishes_order_per_partition_on_the_executors_shared_layout(
        base_config, spark, tmp_path):
    tag = uuid.uuid4().hex[:10]
    config = dataclasses.replace(
        base_config,
        kafka=dataclasses.replace(
            base_config.kafka, publishes_topic=f"pub-{tag}", subscriptions_topic=f"subs-{tag}",
            rejected_topic=f"rej-{tag}", deliveries_topic_prefix=f"dlv-{tag}.",
            shared_deliveries_topic=f"shared-{tag}", delivery_layout="shared", partitions=3),
        delta=dataclasses.replace(base_config.delta, warehouse=str(tmp_path / "delta")),
        streaming=dataclasses.replace(base_config.streaming, checkpoint_dir=tmp_path / "cp",
                                      driver_route_max_publishes=0,
                                      max_offsets_per_trigger=50))
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap, "linger.ms": 5})
    for subscriber in ("kay", "lee"):
        producer.produce(config.kafka.subscriptions_topic, json.dumps(
            {"exchange": "amq.topic", "subscriber": subscriber, "filter": "o.#"}).encode(),
            subscriber.encode())
    assert producer.flush(30) == 0
    router = Router(config, spark)
    router.start()
    try:
        for i in range(200):
            producer.produce(config.kafka.publishes_topic, b"x", f"o.{i % 11}".encode(),
                             headers=[(EXCHANGE_HEADER, b"amq.topic")])
        assert producer.flush(30) == 0
        router.process_all_available()
    finally:
        router.stop()
    assert len(router.reports) >= 4  # several batches of at most 50
    for subscriber in ("kay", "lee"):
        order = delivery_order(config, subscriber)
        ids = {m for partition in order.values() for m in partition}
        assert len(ids) == 200 and len({m.rsplit("/", 2)[1] for m in ids}) == 3
        assert_publish_order_kept(order)

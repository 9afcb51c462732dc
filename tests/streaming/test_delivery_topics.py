"""A subscriber's delivery topic deleted while its subscriptions remain, on a real broker,
a real streaming query and real Delta tables."""

from __future__ import annotations

import dataclasses

from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable
import pytest

from schemas.records import OUTCOME_ROUTED
from tests.streaming.test_retention import (
    TIMEOUT_S, create_publishes, delivered_ids, gap_config, publish, route_all, subscribe)
from waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("in_driver", [True, False], ids=["driver", "executors"])
def test_a_deleted_delivery_topic_is_recreated_and_delivered(base_config, spark, tmp_path,
                                                             in_driver):
    config = gap_config(base_config, tmp_path, "resume", 20_000 if in_driver else 0)
    config = dataclasses.replace(config, kafka=dataclasses.replace(config.kafka, delivery_partitions=3))
    create_publishes(config, 1)
    subscribe(config, "cat", "g/#")
    subscribe(config, "dan", "g/#")
    first = publish(config, 0, 1)
    route_all(config, spark)
    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap})
    topic = config.kafka.layout.topic("cat")
    admin.delete_topics([topic])[topic].result(TIMEOUT_S)
    wait_until(lambda: topic not in admin.list_topics(timeout=TIMEOUT_S).topics, TIMEOUT_S)

    later = publish(config, 0, 2)
    route_all(config, spark)
    assert delivered_ids(config, "cat") == set(later)
    assert delivered_ids(config, "dan") == set(first + later)
    metadata = admin.list_topics(topic, timeout=TIMEOUT_S).topics[topic]
    assert len(metadata.partitions) == config.kafka.delivery_partitions
    rows = DeltaTable(config.delta.table_path("messages")).to_pyarrow_table().to_pylist()
    assert {r["message_id"]: (r["outcome"], r["deliveries"]) for r in rows} == {
        m: (OUTCOME_ROUTED, 2) for m in first + later}

"""Retiring a subscriber (streaming.ops.retire, ``bitroute retire``) on a real broker, a real
running router and real Delta tables."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from kafka_io import produce_one
from schemas.records import CHANGE_REMOVE, EXCHANGE_HEADER
from streaming.cli.render import status_lines
from streaming.config import Config
from streaming.kafka.client_verbs import InvalidRequest
from streaming.ops.retire import retire
from streaming.ops.status import router_status
from streaming.router.service import Router

pytestmark = pytest.mark.integration

TIMEOUT_S = 30.0


def _subscribe(config: Config, sub_id: str, subscriber: str) -> None:
    value = {"exchange": "mqtt", "subscriber": subscriber, "filter": "r/#"}
    produce_one(config, config.kafka.subscriptions_topic, sub_id.encode(), json.dumps(value).encode())


def _publish(config: Config) -> None:
    produce_one(config, config.kafka.publishes_topic, b"r/1", b"x", [(EXCHANGE_HEADER, b"mqtt")])


def _deliveries(config: Config) -> dict[str, int]:
    rows = DeltaTable(config.delta.table_path("deliveries")).to_pyarrow_table().to_pylist()
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["subscriber"]] = counts.get(row["subscriber"], 0) + 1
    return counts


def test_a_retired_subscriber_gets_nothing_more_and_the_audit_says_why(isolated_config, spark):
    config = isolated_config()
    for sub_id, subscriber in (("ivy-1", "ivy"), ("ivy-2", "ivy"), ("joe-1", "joe")):
        _subscribe(config, sub_id, subscriber)
    router = Router(config, spark)
    router.start()
    try:
        _publish(config)
        router.process_all_available()
        kept = retire(config, "ivy")
        assert sorted(kept.subscription_ids) == ["ivy-1", "ivy-2"] and not kept.topic_deleted
        _publish(config)
        router.process_all_available()
        assert router.flush_audit(TIMEOUT_S)
        assert _deliveries(config) == {"ivy": 1, "joe": 2}
        changes = DeltaTable(config.delta.table_path("subscriptions")).to_pyarrow_table().to_pylist()
        removed = {c["subscription_id"]: c["reason"] for c in changes
                   if c["change"] == CHANGE_REMOVE}
        topic = config.kafka.layout.topic("ivy")
        assert removed == {i: f"subscriber ivy retired (bitroute retire; its delivery topic "
                              f"{topic} kept)" for i in ("ivy-1", "ivy-2")}
        status = router_status(config)
        assert status["unfed_delivery_topics"] == [topic]
        assert any(line.startswith("unfed topics:") and topic in line
                   for line in status_lines(status))

        deleted = retire(config, "ivy", delete_topic=True, wait_s=TIMEOUT_S)
        assert deleted.subscription_ids == [] and deleted.topic_deleted
        admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap})
        assert topic not in admin.list_topics(timeout=TIMEOUT_S).topics
        assert router_status(config)["unfed_delivery_topics"] == []
        with pytest.raises(InvalidRequest, match="subscriber 'ivy' has no live subscription"):
            retire(config, "ivy")
    finally:
        router.stop()


def test_the_shared_layout_has_no_topic_of_a_subscribers_own_to_delete(isolated_config):
    config = isolated_config(**{"kafka.delivery_layout": "shared"})
    with pytest.raises(InvalidRequest, match="no topic of kim's own to delete"):
        retire(config, "kim", delete_topic=True)

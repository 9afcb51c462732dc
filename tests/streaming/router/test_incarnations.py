"""A publishes topic deleted and created again (streaming.router.topics.incarnations), on a real
broker, real streaming queries and real Delta tables: the new topic's messages get ids of
their own, found at open and while the query runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable
from pyspark.errors import StreamingQueryException

from router_runs import KAFKA_TIMEOUT_S, create_publishes, delivered_ids, publish, route_all, subscribe
from streaming.config import load as load_config
from streaming.router.service import Router
from streaming.router.topics.incarnations import IncarnationRecord, publishing_incarnation
from streaming.state.checkpoint import CheckpointLayout
from waiting import wait_until


def test_the_record_numbers_incarnations_in_the_order_first_seen(tmp_path):
    config = load_config(overrides={"delta.warehouse": str(tmp_path / "delta"),
                                    "kafka.publishes_topic": "orders"})
    record = IncarnationRecord(config)
    assert record.incarnations() == [] and record.peek("A") == 0
    assert [record.number_of(i) for i in ("A", "A", "B", "A", "C")] == [0, 0, 1, 0, 2]
    assert record.peek("B") == 1 and record.peek("D") == 3  # D: the number it will get
    saved = json.loads((tmp_path / "delta" / "_bitroute" / "topics" / "orders.json").read_text())
    assert saved["topic"] == "orders"
    assert [(i["topic_id"], i["number"]) for i in saved["incarnations"]] == [
        ("A", 0), ("B", 1), ("C", 2)]


def recreate(config, partitions: int) -> None:
    """Delete the publishes topic and create it again, as an administrator would."""
    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap})
    topic = config.kafka.publishes_topic
    admin.delete_topics([topic])[topic].result(KAFKA_TIMEOUT_S)
    wait_until(lambda: topic not in admin.list_topics(timeout=KAFKA_TIMEOUT_S).topics,
               "the deleted topic is gone")
    wait_until(lambda: _created(config, partitions), "the topic is created again")


def _created(config, partitions: int) -> bool:
    try:
        create_publishes(config, partitions)
    except Exception:  # noqa: BLE001 - the deletion is still completing on the broker
        return False
    return True


def audited_ids(config) -> list[str]:
    rows = DeltaTable(config.delta.table_path("messages")).to_pyarrow_table(
        columns=["message_id"]).to_pylist()
    return [r["message_id"] for r in rows]


@pytest.mark.integration
def test_a_recreated_publishes_topic_gets_new_ids_at_open_and_while_running(isolated_config, spark):
    config = isolated_config()
    topic = config.kafka.publishes_topic
    create_publishes(config, 1)
    subscribe(config, "ann", "g/#")
    first = publish(config, 0, 3)
    route_all(config, spark)
    assert delivered_ids(config, "ann") == set(first)

    # Recreated while no router runs: found at open.
    recreate(config, 2)
    assert publishing_incarnation(config) == 1
    second = publish(config, 0, 2) + publish(config, 1, 1)
    assert second == [f"{topic}/0/0", f"{topic}/0/1", f"{topic}/1/0"]  # Kafka's coordinates
    second = [f"{topic}~1/0/0", f"{topic}~1/0/1", f"{topic}~1/1/0"]  # the router's ids
    layout = CheckpointLayout.of(config.streaming.checkpoint_dir)
    router = Router(config, spark)
    router.start()
    try:
        router.process_all_available()
        assert delivered_ids(config, "ann") == set(first + second)
        incarnations = IncarnationRecord(config).incarnations()
        assert [i["number"] for i in incarnations] == [0, 1]
        assert layout.retired_query(incarnations[0]["topic_id"]).is_dir()
        assert layout.publishes_topic_id_file.read_text().strip() == incarnations[1]["topic_id"]

        # Recreated while the router runs: the batch that sees it stops the query, the
        # router follows the new topic (what `bitroute run` does) and routes it from its start.
        recreate(config, 1)
        third = [f"{topic}~2/0/{o}" for o, _ in enumerate(publish(config, 0, 4))]
        with pytest.raises(StreamingQueryException):
            router.process_all_available()
        assert router.recreated is not None and "was deleted and created again" in router.recreated
        router.follow_recreated_topic()
        router.process_all_available()
        assert router.flush_audit(KAFKA_TIMEOUT_S)
    finally:
        router.stop()
    assert delivered_ids(config, "ann") == set(first + second + third)
    ids = audited_ids(config)
    assert sorted(ids) == sorted(first + second + third)  # one row each, none under two
    # The snapshot versions went on through both new checkpoints: their changes audited once.
    changes = DeltaTable(config.delta.table_path("subscriptions")).to_pyarrow_table(
        columns=["subscription_id"]).to_pylist()
    assert [c["subscription_id"] for c in changes] == ["ann"]
    assert [i["number"] for i in IncarnationRecord(config).incarnations()] == [0, 1, 2]
    record = json.loads(Path(IncarnationRecord(config).location).read_text())
    assert record["topic"] == topic

"""The runbooks of docs/operations.md in realtime mode, on a real broker, real Spark
(Real-Time Mode) and real Delta: a restored state folder goes on under a new router id;
a deleted delivery topic is back and delivered to (created by the router as the layout
says on a broker that creates no topics, once the Java producer gives up on it: its
timeouts are shortened for that test); ``bitroute retire --delete-topic`` waits for the
routing query; a recreated publishes topic ends the router with its one line and refuses
the next start.

One router serves the module's runbooks on the shared broker (the ``router`` fixture of
this folder's conftest.py); the recreated publishes topic ends it, so that test comes
last. The tests with routers of their own come first (one Spark session holds one
realtime router at a time: the queries' names).
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from kafka_io import KAFKA_TIMEOUT_S
from router_runs import create_publishes, delivered_ids, publish, subscribe
from streaming.kafka import clients
from streaming.kafka.broker import EmbeddedBroker, free_port
from streaming.kafka.topics import topic_id as admin_topic_id
from streaming.ops.retire import retire
from streaming.realtime.query import SINK_PRODUCER_OPTIONS
from streaming.router.errors import RouterModeError
from streaming.router.service import Router
from waiting import wait_until

DELIVERY_BOUND_S = 90
"""A delivery to a deleted topic may take the routing query's failure and restart."""
NO_LEADER_YET = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE})
"""What a topic created a moment ago may answer a read of its offsets."""
PRODUCER_GIVES_UP_MS = 8_000
"""The routing query's producer's timeouts where a test waits for it to give up on a
deleted topic (``delivery.timeout.ms`` may not be below ``request.timeout.ms``): seconds
longer than any answer of the test's own idle broker takes, the wait the test pays."""


def test_a_restored_state_folder_goes_on_under_a_new_router_id_and_audits_once(
        spark, isolated_config):
    """A copy taken after 2 publishes, restored after 2 more: found by its realtime audit
    (the snapshots are the same), the 2 later publishes routed again, every publish
    audited once."""
    import shutil
    from pathlib import Path

    config = isolated_config(**{"streaming.mode": "realtime", "kafka.partitions": "1",
                                "audit.commit_interval": "1 second"})
    folder = Path(config.streaming.checkpoint_dir)
    copy = folder.parent / "copy"

    def run(publishes: int, audited: int) -> str:
        router = Router(config, spark)
        router.start()
        try:
            if publishes:
                publish(config, 0, publishes)
            wait_until(lambda: len(_messages(config)) >= audited, f"{audited} messages rows",
                       DELIVERY_BOUND_S)
            return router._store.router_id()
        finally:
            router.stop()

    subscribe(config, "eel", "g/#")
    first = run(2, 2)
    shutil.copytree(folder, copy)
    assert run(2, 4) == first
    shutil.rmtree(folder)
    copy.rename(folder)
    assert run(1, 5) != first  # restored: a new router id
    ids = _messages(config)
    assert len(ids) == len(set(ids)) == 5, ids


class BrokerCreatingNoTopics(EmbeddedBroker):
    """The embedded broker with ``auto.create.topics.enable=false``, as production sets it."""

    def _server_properties(self) -> str:
        return super()._server_properties() + "auto.create.topics.enable=false\n"


def test_a_deleted_delivery_topic_on_a_broker_creating_no_topics_is_created_as_the_layout_says(
        spark, isolated_config, tmp_path, caplog, monkeypatch):
    """The Java producer gives up on the deleted topic, the routing query fails, and the
    router creates the topic with the layout's partitions before starting it again. The
    producer gives up after :data:`PRODUCER_GIVES_UP_MS` here, not its default 120 s
    (``delivery.timeout.ms``; ``max.block.ms``, 60 s, for a send that finds no metadata):
    the same failure, sooner."""
    for option in ("max.block.ms", "request.timeout.ms", "delivery.timeout.ms"):
        monkeypatch.setitem(SINK_PRODUCER_OPTIONS, f"kafka.{option}", str(PRODUCER_GIVES_UP_MS))
    broker = BrokerCreatingNoTopics(tmp_path / "kafka", port=free_port(),
                                    controller_port=free_port())
    broker.start()
    try:
        config = isolated_config(**{"kafka.bootstrap": broker.bootstrap,
                                    "streaming.mode": "realtime", "kafka.partitions": "1",
                                    "kafka.delivery_partitions": "2"})
        topic = config.kafka.layout.topic("fox")
        router = Router(config, spark)
        router.start()
        try:
            subscribe(config, "fox", "g/#")
            [first] = publish(config, 0, 1)
            _delivered(config, "fox", [first])
            _delete_topic(config, topic)
            [second] = publish(config, 0, 1)
            _delivered(config, "fox", [second], DELIVERY_BOUND_S + PRODUCER_GIVES_UP_MS / 1000)
        finally:
            router.stop()
        partitions = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(
            timeout=KAFKA_TIMEOUT_S).topics[topic].partitions
        assert len(partitions) == 2
        assert any(f"the delivery topic {topic} of subscriber fox did not exist" in m
                   for m in caplog.messages)
    finally:
        broker.stop()


def _delivered(config, subscriber: str, ids: list[str], bound_s: float = DELIVERY_BOUND_S) -> None:
    wait_until(lambda: set(ids) <= _ids(config, subscriber), f"{ids} delivered to {subscriber}",
               bound_s)


def _ids(config, subscriber: str) -> set[str]:
    try:
        return delivered_ids(config, subscriber)
    except (AssertionError, KeyError):  # the topic is not there (yet)
        return set()
    except KafkaException as exc:
        if exc.args[0].code() not in NO_LEADER_YET:
            raise
        return set()


def _delete_topic(config, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap})
    admin.delete_topics([topic])[topic].result(KAFKA_TIMEOUT_S)
    wait_until(lambda: topic not in admin.list_topics(timeout=KAFKA_TIMEOUT_S).topics,
               f"{topic} deleted")


def _recreate_publishes(config) -> None:
    """Delete the publishes topic and create it again. A broker that creates topics on
    demand may do so first, at a Spark client's request: a recreation too."""
    admin = clients.admin(config.kafka.client_settings)
    topic = config.kafka.publishes_topic
    old = admin_topic_id(admin, topic)
    _delete_topic(config, topic)

    def again():
        if admin_topic_id(admin, topic) is None:
            try:
                create_publishes(config, 1)
            except Exception:  # noqa: BLE001 - the deletion is completing, or it exists now
                return None
        return admin_topic_id(admin, topic) not in (None, old)
    wait_until(again, "the publishes topic created again")


def test_a_deleted_delivery_topic_is_back_and_the_next_publish_delivered(router):
    config = router.config
    subscribe(config, "cat", "g/#")
    [first] = publish(config, 0, 1)
    _delivered(config, "cat", [first])
    _delete_topic(config, config.kafka.layout.topic("cat"))
    [second] = publish(config, 0, 1)
    _delivered(config, "cat", [second])
    assert router.realtime.ended(0) is None  # still routing


def test_retire_deletes_the_topic_once_the_routing_query_routed_the_earlier_publishes(router):
    config = router.config
    subscribe(config, "dog", "g/#")
    [sent] = publish(config, 0, 1)
    _delivered(config, "dog", [sent])
    retirement = retire(config, "dog", delete_topic=True, wait_s=60)
    assert retirement.topic_deleted and retirement.subscription_ids == ["dog"]


def test_a_recreated_publishes_topic_ends_the_router_in_one_line_and_is_refused_at_start(
        router, spark):
    config = router.config
    _recreate_publishes(config)
    line = router.realtime.ended(30)
    assert line is not None and "realtime mode does not follow a recreated publishes topic" in line
    assert "streaming.mode = \"microbatch\" and a new streaming.checkpoint_dir" in line
    assert not router.query.isActive  # nothing of the new topic routed under the old ids
    router.stop()
    again = Router(config, spark)
    with pytest.raises(RouterModeError, match="does not follow a recreated publishes topic"):
        again.start()
    again.stop()


def _messages(config) -> list[str]:
    from deltalake import DeltaTable

    try:
        table = DeltaTable(config.delta.table_path("messages"))
    except Exception:  # noqa: BLE001 - not created yet
        return []
    return [r["message_id"] for r in table.to_pyarrow_table(columns=["message_id"]).to_pylist()]

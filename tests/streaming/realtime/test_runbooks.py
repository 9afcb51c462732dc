"""The runbooks of docs/operations.md in realtime mode, on a real broker, real Spark
(Real-Time Mode) and real Delta: a deleted delivery topic is back and delivered to,
``bitroute retire --delete-topic`` waits for the routing query, and a recreated
publishes topic ends the router with its one line and refuses the next start.

One router serves the module (its start is the cost: a JVM's Real-Time Mode queries);
the recreated publishes topic ends it, so that test comes last.
"""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient

from router_runs import delivered_ids, publish, subscribe
from streaming.ops.retire import retire
from streaming.router.errors import RouterModeError
from streaming.router.service import Router
from tests.streaming.router.test_incarnations import recreate

from isolation import isolated_config
from kafka_io import KAFKA_TIMEOUT_S
from waiting import wait_until

DELIVERY_BOUND_S = 90
"""A delivery to a deleted topic may take the routing query's failure and restart."""


@pytest.fixture(scope="module")
def router(spark, base_config, tmp_path_factory):
    config = isolated_config(base_config, tmp_path_factory.mktemp("runbooks"), **{
        "streaming.mode": "realtime",
        "kafka.partitions": "1",
        "audit.commit_interval": "1 second",
    })
    router = Router(config, spark)
    router.start()
    try:
        yield router
    finally:
        router.stop()


def _delivered(config, subscriber: str, ids: list[str]) -> None:
    wait_until(lambda: set(ids) <= _ids(config, subscriber), f"{ids} delivered to {subscriber}",
               DELIVERY_BOUND_S)


def _ids(config, subscriber: str) -> set[str]:
    try:
        return delivered_ids(config, subscriber)
    except (AssertionError, KeyError):  # the topic is not there (yet)
        return set()


def _delete_topic(config, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap})
    admin.delete_topics([topic])[topic].result(KAFKA_TIMEOUT_S)
    wait_until(lambda: topic not in admin.list_topics(timeout=KAFKA_TIMEOUT_S).topics,
               f"{topic} deleted")


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
    recreate(config, 1)
    line = router.realtime.ended(30)
    assert line is not None and "realtime mode does not follow a recreated publishes topic" in line
    assert "streaming.mode = \"microbatch\" and a new streaming.checkpoint_dir" in line
    assert not router.query.isActive  # nothing of the new topic routed under the old ids
    router.stop()
    again = Router(config, spark)
    with pytest.raises(RouterModeError, match="does not follow a recreated publishes topic"):
        again.start()
    again.stop()

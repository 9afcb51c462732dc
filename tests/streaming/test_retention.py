"""Publishes Kafka deleted before the router read them (streaming.router.retention), on a
real broker, a real streaming query and real Delta tables: Kafka's DeleteRecords does
what retention does to a router that was down longer than the retention."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import DeltaTable
from pyspark.errors import StreamingQueryException

from schemas.records import EXCHANGE_HEADER, MESSAGE_ID_HEADER, OUTCOME_LOST, message_id
from streaming.cli.render import status_lines
from streaming.config import Config
from streaming.ops.status import router_status
from streaming.router.service import Router

pytestmark = pytest.mark.integration

TIMEOUT_S = 30.0


def gap_config(base: Config, root: Path, policy: str, driver_route_max_publishes: int) -> Config:
    tag = uuid.uuid4().hex[:10]
    return dataclasses.replace(
        base,
        kafka=dataclasses.replace(
            base.kafka, publishes_topic=f"pub-{tag}", subscriptions_topic=f"subs-{tag}",
            rejected_topic=f"rej-{tag}", deliveries_topic_prefix=f"dlv-{tag}."),
        delta=dataclasses.replace(base.delta, warehouse=str(root / "delta")),
        streaming=dataclasses.replace(
            base.streaming, checkpoint_dir=root / "checkpoints", on_retention_gap=policy,
            driver_route_max_publishes=driver_route_max_publishes))


def create_publishes(config: Config, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap})
    topic = config.kafka.publishes_topic
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(TIMEOUT_S)


def produce(config: Config, topic: str, records: list[tuple[int | None, bytes, bytes | None]],
            headers: list[tuple[str, bytes]] | None = None) -> list[str]:
    """Produce (partition, key, value) records; their message ids, in order."""
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap})
    acked = []
    for partition, key, value in records:
        kwargs = {} if partition is None else {"partition": partition}
        producer.produce(topic, value, key, headers=headers or [],
                         on_delivery=lambda e, m: acked.append((e, m)), **kwargs)
        producer.flush(TIMEOUT_S)
    assert all(error is None for error, _ in acked)
    return [message_id(m.topic(), m.partition(), m.offset()) for _, m in acked]


def publish(config: Config, partition: int, count: int) -> list[str]:
    return produce(config, config.kafka.publishes_topic,
                   [(partition, b"g/1", b"reading")] * count, [(EXCHANGE_HEADER, b"mqtt")])


def subscribe(config: Config, subscriber: str, filter_: str) -> None:
    value = {"exchange": "mqtt", "subscriber": subscriber, "filter": filter_}
    produce(config, config.kafka.subscriptions_topic,
            [(None, subscriber.encode(), json.dumps(value).encode())])


def delete_before(config: Config, partition: int, offset: int) -> None:
    """Kafka's DeleteRecords: the partition's records before ``offset`` are gone."""
    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap})
    tp = TopicPartition(config.kafka.publishes_topic, partition, offset)
    result = admin.delete_records([tp])[tp].result(TIMEOUT_S)
    assert result.low_watermark == offset


def delivered_ids(config: Config, subscriber: str) -> set[str]:
    topic = config.kafka.layout.topic(subscriber)
    consumer = Consumer({"bootstrap.servers": config.kafka.bootstrap, "group.id": "tests",
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=TIMEOUT_S).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT_S)
                for p in partitions}
        consumer.assign([TopicPartition(topic, p, low) for p, (low, high) in ends.items()
                         if high > low])
        left, ids = sum(high - low for low, high in ends.values()), set()
        while left:
            message = consumer.poll(TIMEOUT_S)
            assert message is not None and message.error() is None
            ids.add(dict(message.headers())[MESSAGE_ID_HEADER].decode())
            left -= 1
        return ids
    finally:
        consumer.close()


def lost_rows(config: Config) -> dict[str, dict]:
    rows = DeltaTable(config.delta.table_path("messages")).to_pyarrow_table().to_pylist()
    return {r["message_id"]: r for r in rows if r["outcome"] == OUTCOME_LOST}


def route_all(config: Config, spark, **kwargs) -> Router:
    router = Router(config, spark, **kwargs)
    router.start()
    try:
        router.process_all_available()
        assert router.flush_audit(TIMEOUT_S)
    finally:
        router.stop()
    return router


def test_a_retention_gap_is_recorded_counted_and_routing_goes_on(base_config, spark, tmp_path):
    # On the executors' path: the lost rows go into audit files the driver writes beside
    # the tasks' own.
    config = gap_config(base_config, tmp_path, "resume", driver_route_max_publishes=0)
    create_publishes(config, 2)
    subscribe(config, "ann", "g/#")
    before = publish(config, 0, 3) + publish(config, 1, 3)
    route_all(config, spark)
    assert delivered_ids(config, "ann") == set(before)

    # The router is down: 20 publishes of partition 0 and 2 of partition 1 are deleted.
    gone = publish(config, 0, 20) + publish(config, 1, 2)
    kept = publish(config, 1, 2)
    delete_before(config, 0, 23)
    delete_before(config, 1, 5)
    kept += publish(config, 0, 5)
    pending = router_status(config)
    assert pending["retention_gap"]["records"] == 22
    assert pending["retention_gap"]["partitions"] == {"0": 20, "1": 2}
    line = next(t for t in status_lines(pending) if t.startswith("retention gap:"))
    assert line.endswith("22 publishes not routed yet were deleted by Kafka (partitions 0: 20, "
                         "1: 2); the router records them as lost when it reaches them "
                         "(streaming.on_retention_gap)")

    router = route_all(config, spark)
    assert delivered_ids(config, "ann") == set(before + kept)
    assert not set(gone) & delivered_ids(config, "ann")
    assert sum(r.lost for r in router.reports) == 22 and router.lost_total == 22
    lost = lost_rows(config)
    topic = config.kafka.publishes_topic
    assert set(lost) == {f"{topic}/0/3", f"{topic}/1/3"}
    assert "offsets 3..22 of partition 0 (20 publishes" in lost[f"{topic}/0/3"]["reason"]
    assert "offsets 3..4 of partition 1 (2 publishes" in lost[f"{topic}/1/3"]["reason"]
    assert all(r["deliveries"] == 0 and r["published_at"] is not None for r in lost.values())
    status = router_status(config)
    assert status["retention_gap"]["records"] == 0
    assert status["last_batch"]["lost_total"] == 22
    line = next(t for t in status_lines(status) if t.startswith("lost:"))
    assert "22 publishes lost to retention since the router started" in line


def test_the_stop_policy_stops_with_the_command_that_acknowledges_the_gap(
        base_config, spark, tmp_path):
    # Routed in the driver: the lost rows join the batch's routed rows.
    config = gap_config(base_config, tmp_path, "stop", driver_route_max_publishes=20_000)
    create_publishes(config, 1)
    subscribe(config, "bea", "g/#")
    before = publish(config, 0, 2)
    route_all(config, spark)
    publish(config, 0, 3)
    delete_before(config, 0, 5)
    kept = publish(config, 0, 2)

    stopped = Router(config, spark)
    stopped.start()
    try:
        with pytest.raises(StreamingQueryException):
            stopped.process_all_available()
    finally:
        stopped.stop()
    line = stopped.retention_stop
    assert line is not None and "\n" not in line
    assert "3 publishes were deleted by Kafka" in line and "offsets 2..4" in line
    assert "bitroute run --accept-retention-gap" in line
    assert lost_rows(config) == {} and delivered_ids(config, "bea") == set(before)

    accepted = route_all(config, spark, accept_retention_gap=True)
    assert delivered_ids(config, "bea") == set(before + kept)
    assert list(lost_rows(config)) == [f"{config.kafka.publishes_topic}/0/2"]
    assert accepted.lost_total == 3

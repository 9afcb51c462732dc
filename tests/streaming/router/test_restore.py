"""A router restored from an older copy of its state folder, on a real broker, Spark and Delta.

The copy is taken while the router runs (in the order docs/operations.md gives),
the router runs on for many batches and a subscription change, is stopped, and
the copy is put back twice over (a restore, then a second restore of the same
copy after the first restored router ran on): every publish reaches Kafka at
least once, the audit holds one ``messages`` row per publish, one
``deliveries`` row per (publish, subscriber) and one ``subscriptions`` row per
change, and snapshot versions are never reused.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from collections import Counter
from pathlib import Path

from confluent_kafka import Producer
from deltalake import DeltaTable

from kafka_io import KAFKA_TIMEOUT_S, headers_of, read_topic
from schemas.records import (
    EXCHANGE_HEADER,
    MESSAGE_ID_HEADER,
    RETAIN_HEADER,
    RETAIN_TRUE,
    message_id,
)
from streaming.config import Config
from streaming.kafka.clients import record_position
from streaming.router.service import Router


def _publish(config: Config, count: int, tag: str) -> list[str]:
    """``count`` publishes keyed over the topic's partitions; their message ids."""
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap})
    acked: list[str] = []
    for i in range(count):
        producer.produce(config.kafka.publishes_topic, b"x", f"r.{tag}.{i}".encode(),
                         headers=[(EXCHANGE_HEADER, b"amq.topic")],
                         on_delivery=lambda err, m: acked.append(
                             message_id(*record_position(m))))
    assert producer.flush(KAFKA_TIMEOUT_S) == 0 and len(acked) == count
    return acked


def _subscribe(config: Config, sub_id: str, subscriber: str, exchange: str = "amq.topic",
               filter_: str = "r.#") -> None:
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap})
    producer.produce(config.kafka.subscriptions_topic, json.dumps(
        {"exchange": exchange, "subscriber": subscriber, "filter": filter_}).encode(),
        sub_id.encode())
    assert producer.flush(KAFKA_TIMEOUT_S) == 0


def _retain(config: Config, topic: str) -> str:
    """An MQTT publish retained on ``topic``; its message id."""
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap})
    acked: list[str] = []
    producer.produce(config.kafka.publishes_topic, b"21.5", topic.encode(),
                     headers=[(EXCHANGE_HEADER, b"mqtt"), (RETAIN_HEADER, RETAIN_TRUE.encode())],
                     on_delivery=lambda err, m: acked.append(
                         message_id(*record_position(m))))
    assert producer.flush(KAFKA_TIMEOUT_S) == 0 and len(acked) == 1
    return acked[0]


def _run(config: Config, spark, publish: int, tag: str, max_offsets: int | None = None,
         executors: bool = False) -> tuple[Router, list[str]]:
    """Start a router (batches of at most ``max_offsets`` publishes, routed on the
    executors or in the driver), publish ``publish`` records and route everything
    available; the router is left running."""
    streaming = config.streaming
    config = dataclasses.replace(config, streaming=dataclasses.replace(
        streaming, max_offsets_per_trigger=max_offsets or streaming.max_offsets_per_trigger,
        driver_route_max_publishes=0 if executors else streaming.driver_route_max_publishes,
        executor_audit_files="tasks" if executors else streaming.executor_audit_files))
    router = Router(config, spark)
    router.start()
    sent = _publish(config, publish, tag)
    router.process_all_available()
    return router, sent


def _stop(router: Router) -> None:
    assert router.flush_audit(60)
    router.stop()


def _copy_state(checkpoint: Path, to: Path) -> None:
    """Copy a running router's state folder as docs/operations.md says: Spark's query
    checkpoint first (its commit log before its offset log), then the router's own state
    (its pins before its snapshots)."""
    for first, folder in (("commits", "publishes"), ("offsets", "publishes"), ("pins", "router")):
        shutil.copytree(checkpoint / folder / first, to / folder / first)
    for folder in ("publishes", "router"):
        shutil.copytree(checkpoint / folder, to / folder, dirs_exist_ok=True,
                        ignore=lambda at, names: [n for n in names if Path(at).parent == checkpoint
                                                  and n in ("commits", "offsets", "pins")])


def _restore(copy: Path, checkpoint: Path) -> None:
    shutil.rmtree(checkpoint)
    shutil.copytree(copy, checkpoint)


def _rows(config: Config, name: str) -> list[dict]:
    return DeltaTable(config.delta.table_path(name)).to_pyarrow_table().to_pylist()


def test_a_router_restored_from_an_old_copy_of_its_state_audits_each_publish_once(
        isolated_config, spark, tmp_path: Path, caplog):
    config = isolated_config(**{"kafka.partitions": "2", "streaming.max_offsets_per_trigger": "6",
                                "streaming.trigger_interval": "50 milliseconds"})
    checkpoint, copy = Path(config.streaming.checkpoint_dir), tmp_path / "state-copy"
    _subscribe(config, "s-ann", "ann")
    retained = _retain(config, "sensors/attic")  # retained, delivered to no one yet
    router, before = _run(config, spark, 6, "a")
    _copy_state(checkpoint, copy)  # while it runs
    copied_batches = router.reports[-1].batch_id
    _subscribe(config, "s-bob", "bob")  # changes after the copy
    _subscribe(config, "s-cat", "cat", "mqtt", "sensors/#")  # gets the retained message once
    more = _publish(config, 30, "b")
    router.process_all_available()
    ran_to = router.reports[-1].batch_id
    _stop(router)
    assert ran_to >= copied_batches + 5  # the original ran on for many batches

    _restore(copy, checkpoint)
    caplog.set_level(logging.WARNING, logger="streaming.router.restore")
    # Smaller batches than the original's: the publishes it audited come again in batch
    # ids it used and in higher ones, and a batch straddles what is audited.
    restored, after = _run(config, spark, 4, "c", max_offsets=4, executors=True)
    _stop(restored)
    lines = [r.getMessage() for r in caplog.records if "restored state" in r.getMessage()]
    assert len(lines) == 1 and f"batch {ran_to} of this router" in lines[0], lines
    assert min(r.batch_id for r in restored.reports) <= ran_to  # batch ids met again
    assert sum(r.rows for r in restored.reports if r.batch_id > ran_to) > len(after)

    _restore(copy, checkpoint)  # the same copy again, after the first restore ran on
    caplog.clear()
    again, last = _run(config, spark, 3, "d", max_offsets=10)  # routed in the driver
    _stop(again)
    lines = [r.getMessage() for r in caplog.records if "restored state" in r.getMessage()]
    assert len(lines) == 1 and "was restored from this state before" in lines[0], lines

    # Kafka: every publish at least once, repeats allowed (and made: the repeats are real).
    published = before + more + after + last
    cat = read_topic(config, config.kafka.layout.topic("cat"))
    assert [headers_of(r)[MESSAGE_ID_HEADER] for r in cat] == [retained]  # not again
    for subscriber, expected in (("ann", published), ("bob", more + after + last)):
        records = read_topic(config, config.kafka.layout.topic(subscriber))
        ids = Counter(headers_of(r)[MESSAGE_ID_HEADER] for r in records)
        assert set(ids) == set(expected), subscriber
        assert sum(ids.values()) > len(expected), subscriber

    # The audit: exactly once per publish, per (publish, subscriber), per change.
    messages = Counter(r["message_id"] for r in _rows(config, "messages"))
    assert messages == Counter(published + [retained])
    deliveries = Counter((r["message_id"], r["subscriber"]) for r in _rows(config, "deliveries"))
    assert deliveries == Counter([(m, "ann") for m in published]
                                 + [(m, "bob") for m in more + after + last]
                                 + [(retained, "cat")])
    changes = _rows(config, "subscriptions")
    assert sorted(r["subscription_id"] for r in changes) == ["s-ann", "s-bob", "s-cat"]
    # A snapshot version in the audit names one routing state: each restored router's
    # versions are above every version audited before it.
    version = {r["message_id"]: r["snapshot_version"] for r in _rows(config, "messages")}
    eras = [[version[m] for m in ids] for ids in (before + [retained] + more, after, last)]
    assert max(eras[0]) < min(eras[1]) and max(eras[1]) < min(eras[2])
    assert max(r["snapshot_version"] for r in changes) <= max(eras[0])

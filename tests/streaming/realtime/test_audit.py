"""Realtime mode's audit written by a Spark task (``streaming.executor_audit_files =
"tasks"``, the cluster's default) on a real broker, real Spark (Real-Time Mode) and real
Delta: each publish and (message, subscriber) audited exactly once, and publishes Kafka
deleted before the routing query read them recorded as ``lost`` (Kafka's DeleteRecords
does what retention does to a router that was down longer than the retention)."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from router_runs import delete_before, lost_rows, publish, subscribe
from streaming.router.service import Router
from waiting import wait_until

pytestmark = pytest.mark.integration

AUDIT_BOUND_S = 90
"""The routing query's first task, a checkpoint interval and the audit's jobs on a busy
2-core machine."""


def _rows(config, table: str) -> list[dict]:
    return DeltaTable(config.delta.table_path(table)).to_pyarrow_table().to_pylist()


def _audited(config, ids: set[str], subscriber: str):
    """(messages rows, deliveries rows) of ``ids`` once each has its rows, else None."""
    messages = [r for r in _rows(config, "messages") if r["message_id"] in ids]
    deliveries = [r for r in _rows(config, "deliveries")
                  if r["message_id"] in ids and r["subscriber"] == subscriber]
    return (messages, deliveries) if len(messages) >= len(ids) and \
        len(deliveries) >= len(ids) else None


@pytest.mark.parametrize("audit_files", ["tasks", "driver"])
def test_the_realtime_audit_is_exact_and_records_a_retention_gap(spark, isolated_config,
                                                                 audit_files):
    config = isolated_config(**{"streaming.mode": "realtime", "kafka.partitions": "1",
                                "audit.commit_interval": "1 second",
                                "streaming.executor_audit_files": audit_files})
    router = Router(config, spark)
    router.start()
    realtime = router.realtime
    try:
        assert realtime is not None and realtime.audit is not None
        assert realtime.audit.in_tasks == (audit_files == "tasks")
        subscribe(config, "ann", "g/#")
        wait_until(lambda: realtime.view.published_version, "the subscription", 60)
        before = publish(config, 0, 3)
        wait_until(lambda: _audited(config, set(before), "ann"), "the first audit",
                   AUDIT_BOUND_S)
    finally:
        router.stop()

    # The router is down: 20 publishes are deleted before it reads them.
    gone = publish(config, 0, 20)
    delete_before(config, 0, 23)
    kept = publish(config, 0, 5)
    router = Router(config, spark)
    router.start()
    try:
        wait_until(lambda: _audited(config, set(kept), "ann"), "the audit after the gap",
                   AUDIT_BOUND_S)
        assert router.flush_audit(30)
        topic = config.kafka.publishes_topic
        lost = lost_rows(config)
        assert set(lost) == {f"{topic}/0/3"}
        assert "offsets 3..22 of partition 0 (20 publishes" in lost[f"{topic}/0/3"]["reason"]
        assert lost[f"{topic}/0/3"]["deliveries"] == 0
        assert router.lost_total == 20
        assert router._status_figures()["lost_total"] == 20
    finally:
        router.stop()

    messages = _rows(config, "messages")
    ids = [r["message_id"] for r in messages if r["outcome"] != "lost"]
    assert sorted(ids) == sorted(before + kept)
    assert not set(gone) & set(ids)
    pairs = [(r["message_id"], r["subscriber"]) for r in _rows(config, "deliveries")]
    assert sorted(pairs) == sorted((i, "ann") for i in before + kept)

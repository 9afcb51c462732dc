"""Realtime mode under ``streaming.on_retention_gap = "stop"`` on a real broker, real Spark
(Real-Time Mode) and real Delta: publishes Kafka deleted before the routing query read
them stop the router at its start with the gap's line, the checkpoint left in place, and
``--accept-retention-gap`` (``Router(accept_retention_gap=True)``) routes on past them."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from router_runs import delete_before, publish, subscribe
from streaming.realtime.retention import SET_ASIDE, committed_offsets
from streaming.router.errors import RetentionGapError
from streaming.router.service import Router
from waiting import wait_until

pytestmark = pytest.mark.integration

AUDIT_BOUND_S = 90
"""The routing query's first task, a checkpoint interval and the audit's jobs on a busy
2-core machine."""


def _audited(config, ids: set[str]) -> bool:
    rows = DeltaTable(config.delta.table_path("messages")).to_pyarrow_table().to_pylist()
    return ids <= {r["message_id"] for r in rows}


def test_a_retention_gap_stops_a_realtime_router_under_stop_until_acknowledged(
        spark, isolated_config):
    config = isolated_config(**{"streaming.mode": "realtime", "kafka.partitions": "1",
                                "audit.commit_interval": "1 second",
                                "streaming.on_retention_gap": "stop"})
    router = Router(config, spark)
    router.start()
    try:
        realtime = router.realtime
        assert realtime is not None
        subscribe(config, "ann", "g/#")
        wait_until(lambda: realtime.view.published_version, "the subscription", 60)
        before = publish(config, 0, 3)
        # Audited: the routing query's checkpoint committed past them.
        wait_until(lambda: _audited(config, set(before)), "the first audit", AUDIT_BOUND_S)
    finally:
        router.stop()

    # The router is down: 20 publishes are deleted before it reads them.
    publish(config, 0, 20)
    delete_before(config, 0, 23)
    checkpoint = router.layout.realtime_routing
    topic = config.kafka.publishes_topic
    committed = committed_offsets(checkpoint, topic)
    assert committed is not None

    stopped = Router(config, spark)
    with pytest.raises(RetentionGapError) as raised:
        stopped.start()
    stopped.stop()
    line = str(raised.value)
    assert f"{topic} partition 0 offsets 3..22" in line
    assert 'streaming.on_retention_gap = "stop"' in line
    assert "bitroute run --accept-retention-gap" in line
    assert committed_offsets(checkpoint, topic) == committed  # not moved aside
    assert not list(checkpoint.parent.glob(f"{checkpoint.name}{SET_ASIDE}*"))

    kept = publish(config, 0, 2)
    accepted = Router(config, spark, accept_retention_gap=True)
    accepted.start()
    try:
        assert list(checkpoint.parent.glob(f"{checkpoint.name}{SET_ASIDE}*"))
        wait_until(lambda: _audited(config, set(kept)), "the audit past the gap",
                   AUDIT_BOUND_S)
    finally:
        accepted.stop()

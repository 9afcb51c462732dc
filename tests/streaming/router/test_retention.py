"""Publishes Kafka deleted before the router read them (streaming.router.topics.retention), on a
real broker, a real streaming query and real Delta tables: Kafka's DeleteRecords does
what retention does to a router that was down longer than the retention."""

from __future__ import annotations

import pytest
from pyspark.errors import StreamingQueryException

from router_runs import (
    create_publishes,
    delete_before,
    delivered_ids,
    lost_rows,
    publish,
    route_all,
    subscribe,
)
from streaming.cli.render import status_lines
from streaming.ops.status import router_status
from streaming.router.service import Router

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("audit_files", ["tasks", "driver"])
def test_a_retention_gap_is_recorded_counted_and_routing_goes_on(isolated_config, spark,
                                                                 audit_files):
    # On the executors' path: the lost rows go into audit files the driver writes beside
    # the tasks' own (tasks), or join the tasks' routed rows in the journal (driver).
    config = isolated_config(**{"streaming.driver_route_max_publishes": "0",
                                "streaming.executor_audit_files": audit_files})
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


def test_the_stop_policy_stops_with_the_command_that_acknowledges_the_gap(isolated_config, spark):
    # Routed in the driver: the lost rows join the batch's routed rows.
    config = isolated_config(**{"streaming.on_retention_gap": "stop",
                                "streaming.driver_route_max_publishes": "20000"})
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

"""A realtime router's stop on a real broker and real Spark (Real-Time Mode): the routing
query's stop interrupts its never-ending task, which Spark logs as errors ("Aborting
task ... InterruptedException"); the router's stop quiets those loggers around it and
restores them after."""

from __future__ import annotations

import pytest

from router_runs import publish, subscribe
from streaming.realtime.query import CANCEL_NOISE_LOGGERS
from streaming.router.service import Router
from waiting import wait_until

pytestmark = pytest.mark.integration


def _levels(spark) -> list[str]:
    log4j = spark.sparkContext._jvm.org.apache.logging.log4j
    return [str(log4j.LogManager.getLogger(name).getLevel()) for name in CANCEL_NOISE_LOGGERS]


def test_a_realtime_routers_stop_logs_no_aborted_task(spark, isolated_config, request):
    capture = request.config.pluginmanager.getplugin("capturemanager")
    assert capture is not None and capture.is_globally_capturing(), "run with fd capture"
    config = isolated_config(**{"streaming.mode": "realtime", "kafka.partitions": "1",
                                "audit.commit_interval": "1 second"})
    before = _levels(spark)
    assert "OFF" not in before
    router = Router(config, spark)
    router.start()
    try:
        realtime = router.realtime
        assert realtime is not None and realtime.audit is not None
        subscribe(config, "ann", "g/#")
        wait_until(lambda: realtime.view.published_version, "the subscription", 60)
        publish(config, 0, 3)
        audit = realtime.audit
        wait_until(lambda: audit.publishes >= 3, "the routing task's records audited", 90)
        capture.read_global_capture()  # what the start said
    finally:
        router.stop()
    _, err = capture.read_global_capture()
    assert "Aborting task" not in err and "InterruptedException" not in err, err[-3000:]
    assert _levels(spark) == before

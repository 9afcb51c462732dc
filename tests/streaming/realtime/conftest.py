"""Shared fixture of the realtime tests: one realtime router per test module.

Test modules here are imported by path (no packages), so the router is handed out as a
fixture rather than imported.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from isolation import isolated_config
from streaming.config import Config
from streaming.router.service import Router


@pytest.fixture(scope="module")
def router(spark, base_config: Config, tmp_path_factory: pytest.TempPathFactory,
           request: pytest.FixtureRequest) -> Iterator[Router]:
    """A started router of ``streaming.mode = "realtime"`` on the shared broker, with its own
    topics and folders, serving the tests of one module (its start is the cost: a JVM's
    Real-Time Mode queries), stopped after them. Its publishes topic has one partition:
    Real-Time Mode holds a slot per partition, and the session's local[2] keeps the other
    for the audit. A module whose test ends the router runs that test last."""
    config = isolated_config(base_config, tmp_path_factory.mktemp(request.module.__name__), **{
        "streaming.mode": "realtime",
        "kafka.partitions": "1",
        "audit.commit_interval": "1 second",
        # An alternate exchange for amq.topic (test_service.py routes a publish through it).
        "exchanges.dialects.unrouted": "amqp",
        "exchanges.alternates.amq.topic": "unrouted",
    })
    router = Router(config, spark)
    router.start()
    try:
        yield router
    finally:
        router.stop()

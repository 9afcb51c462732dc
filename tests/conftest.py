"""Shared fixtures: one real Kafka broker and one real SparkSession per test run.

``kafka_bootstrap`` starts the embedded broker on free loopback ports in a
temporary folder (or uses ``BITROUTE_KAFKA_BOOTSTRAP`` when set) and stops it
at the end. ``spark`` builds the session through the product's own factory,
configured for a small machine. ``new_topic`` is a factory of fresh topics.
"""

from __future__ import annotations

import itertools
import os
import uuid
from pathlib import Path

import pytest

from streaming import config as bitroute_config
from streaming.kafka.broker import EmbeddedBroker, free_port


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> str:
    external = os.environ.get("BITROUTE_KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    broker = EmbeddedBroker(tmp_path_factory.mktemp("kafka"), port=free_port(),
                            controller_port=free_port())
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def base_config(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
                ) -> bitroute_config.Config:
    """The configuration every integration test starts from (per-test paths come on top)."""
    root = tmp_path_factory.mktemp("bitroute")
    return bitroute_config.load(overrides={
        "kafka.bootstrap": kafka_bootstrap,
        "delta.warehouse": str(root / "delta"),
        "streaming.checkpoint_dir": str(root / "checkpoints"),
        "spark.master": "local[2]",
        "spark.shuffle_partitions": "2",
        "spark.log_level": "ERROR",
    }, environ={})


@pytest.fixture(scope="session")
def spark(base_config: bitroute_config.Config):
    from streaming.router.session import spark_session

    session = spark_session(base_config)
    try:
        yield session
    finally:
        session.stop()


_topic_numbers = itertools.count()


@pytest.fixture
def new_topic(kafka_bootstrap: str):
    """Factory: ``new_topic(partitions=1)`` creates a fresh topic and returns its name."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})

    def create(partitions: int = 1, **topic_config: str) -> str:
        name = f"test-{next(_topic_numbers)}-{uuid.uuid4().hex[:8]}"
        futures = admin.create_topics([NewTopic(name, partitions, 1, config=topic_config)])
        futures[name].result(timeout=30)
        return name

    return create


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary current directory, so relative default paths land in it."""
    monkeypatch.chdir(tmp_path)
    return tmp_path

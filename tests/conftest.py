"""Shared fixtures: one real Kafka broker and one real SparkSession per test run, and the
factories tests build their own corner from.

``kafka_bootstrap`` starts the embedded broker on free loopback ports in a
temporary folder (or uses ``BITROUTE_KAFKA_BOOTSTRAP`` when set) and stops it
at the end. ``spark`` builds the session through the product's own factory,
configured for a small machine. ``s3`` is an S3-compatible server (moto) for the
session. Factories: ``new_topic`` (a fresh topic),
``isolated_settings`` / ``isolated_config`` (a test's own topics and folders on
the shared broker), ``cli`` (``bitroute`` as a child process), ``router_process``
(``bitroute run`` as a child process, killed at the end of the test).

The ``integration`` marker is set here, not by hand: on every test that uses the
broker or Spark (any fixture that needs ``kafka_bootstrap`` or ``spark``), on every
test under a folder or in a file of ``INTEGRATION_PATHS`` (Delta tables, a broker or
JVM of their own, minutes of packing). ``-m "not integration"`` is the quick run of the rest.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cli_runner import run_cli
from isolation import isolated_config as _isolated_config, isolated_settings as _isolated_settings
from router_process import RouterProcess
from s3_server import S3Server, running as s3_running
from streaming import config as bitroute_config
from streaming.kafka.broker import EmbeddedBroker, free_port

INTEGRATION_FIXTURES = frozenset({"kafka_bootstrap", "spark"})
"""A test whose fixtures include one of these needs the broker or Spark."""

TESTS = Path(__file__).resolve().parent
INTEGRATION_PATHS = tuple(TESTS / path for path in (
    "streaming/audit",                   # Delta tables (delta-rs, and Spark in child processes)
    "streaming/cli/test_run.py",         # `bitroute run`: a JVM of its own
    "streaming/kafka/test_broker.py",    # brokers of its own
    "streaming/kafka/test_broker_watch.py",
    "streaming/kafka/test_security.py",  # a secured broker of its own
    "streaming/state/test_lease.py",     # the lease beside Delta tables (audit migrate)
    "streaming/router/test_reliability.py",
    "streaming/test_pack.py",            # packs the executors' environment: a minute or two
))
"""Tests that need a broker, Spark or Delta without using the shared fixtures (or, like
``bitroute pack``, take minutes: the quick run stays under one)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path)).resolve()
        if (INTEGRATION_FIXTURES.intersection(getattr(item, "fixturenames", ()))
                or any(path == p or p in path.parents for p in INTEGRATION_PATHS)):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _unit_tests_start_no_broker_or_spark(request: pytest.FixtureRequest,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A test without the ``integration`` marker that starts the embedded broker or a
    SparkSession in this process fails, naming the fix, instead of slowing the quick run."""
    if request.node.get_closest_marker("integration") is not None:
        return
    from pyspark.sql import SparkSession

    def refuse(*args, **kwargs):
        raise AssertionError(f"{request.node.nodeid} starts a broker or Spark: use the shared "
                             "fixtures (kafka_bootstrap, spark) or add its file to "
                             "tests/conftest.py INTEGRATION_PATHS")
    monkeypatch.setattr(EmbeddedBroker, "start", refuse)
    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", refuse)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
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
    from streaming.session import spark_session

    session = spark_session(base_config)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One S3-compatible server (moto, tests/s3_server.py) for the session: its start is
    paid once. Tests share its bucket, each under a warehouse prefix of its own."""
    with s3_running(tmp_path_factory.mktemp("s3") / "moto.log") as server:
        yield server


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


@pytest.fixture
def isolated_settings(base_config: bitroute_config.Config, tmp_path_factory: pytest.TempPathFactory
                      ) -> Callable[..., dict[str, str]]:
    """Factory: ``isolated_settings(root=None, **extra)`` is ``--set`` style settings with
    the shared broker, fresh topics, and the warehouse and checkpoints under ``root`` (a
    new temporary folder by default); ``extra`` (dotted keys) on top."""
    def make(root: Path | None = None, **extra: str) -> dict[str, str]:
        return _isolated_settings(base_config, root or tmp_path_factory.mktemp("isolated"), **extra)
    return make


@pytest.fixture
def isolated_config(base_config: bitroute_config.Config, tmp_path_factory: pytest.TempPathFactory
                    ) -> Callable[..., bitroute_config.Config]:
    """Factory: ``isolated_config(root=None, **extra)``, the :class:`Config` of
    ``isolated_settings``."""
    def make(root: Path | None = None, **extra: str) -> bitroute_config.Config:
        return _isolated_config(base_config, root or tmp_path_factory.mktemp("isolated"), **extra)
    return make


@pytest.fixture
def cli():
    """``cli(*args, settings=None, env=None, cwd=None, timeout=120)``: ``bitroute ARGS`` as
    a child process (tests/cli_runner.py), finished, its output captured as text."""
    return run_cli


@pytest.fixture
def router_process(tmp_path: Path, kafka_bootstrap: str):
    """Factory: ``router_process(settings, log=None, **kwargs)`` starts ``bitroute run``
    (tests/router_process.py) with ``settings`` as ``--set`` flags; every router still
    running at the end of the test is killed with its JVM."""
    started: list[RouterProcess] = []

    def start(settings: dict[str, str], log: Path | None = None, **kwargs) -> RouterProcess:
        router = RouterProcess(settings, log or tmp_path / f"router-{len(started)}.log", **kwargs)
        started.append(router)
        return router

    yield start
    for router in started:
        if router.process.poll() is None:
            router.kill()

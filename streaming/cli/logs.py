"""Where logs go when bitroute runs as a command: set up once, at the command's start.

The library only names its loggers (``logging.getLogger(__name__)``, all under
``streaming``) and never configures them. A command sends them to stderr, one
line each, as ``bitroute: <message>``, from INFO up (a failure being retried is
a warning, its recovery info); stdout stays the command's output. librdkafka's
own lines (``bitroute.kafka``, :data:`streaming.kafka.KAFKA_LOG`) are kept off
the terminal, and so are the JVM Kafka clients' warnings once Spark runs
(:func:`quiet_kafka_client_logs`): bitroute reports a Kafka outage itself
(:mod:`streaming.kafka.broker_watch`).
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LIBRARY = "streaming"
KAFKA = "bitroute.kafka"
FORMAT = "bitroute: %(message)s"


class _Stderr(logging.StreamHandler):
    """``sys.stderr`` as it is when a record is written (a test may have replaced it)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def configure_logging() -> None:
    """The library's logs to stderr from INFO up, librdkafka's nowhere. Idempotent."""
    library = logging.getLogger(LIBRARY)
    if not any(isinstance(handler, _Stderr) for handler in library.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter(FORMAT))
        library.addHandler(handler)
    library.setLevel(logging.INFO)
    logging.getLogger(KAFKA).propagate = False


def quiet_kafka_client_logs(spark: SparkSession) -> None:
    """Keep the JVM Kafka clients' per-attempt connection warnings off the terminal.

    During a broker outage the Kafka source's consumer logs a WARN line per
    reconnection attempt (hundreds in a few seconds); the router reports an
    outage itself, once when it starts failing and once when it recovers.
    """
    jvm = spark.sparkContext._jvm
    if jvm is None:  # a stopped context: no JVM logs to quiet
        return
    jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
        "org.apache.kafka", jvm.org.apache.logging.log4j.Level.ERROR)

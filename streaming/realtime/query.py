"""Realtime mode's routing query: Kafka publishes -> the JVM route function -> Kafka.

The query is one projection, which Spark's Real-Time Mode accepts (its allowlist:
a JVM scalar UDF, ``inline``, the Kafka sink with a per-row ``topic``)::

    publishes.selectExpr("inline(bitroute_route(partition, offset, key, value, headers,
                                                timestamp))")
             .writeStream.format("kafka").outputMode("update").trigger(realTime=...)

``bitroute_route`` is ``io.bitroute.realtime.RouteUdf`` (``realtime/``, in the jar of
:mod:`streaming.realtime.jar`), built here with the router's settings and registered
through py4j: the UDF object is serialised into the plan, so the settings (Kafka
credentials included) reach the executors without a Spark setting, a log line or a
plan string. Per publish it returns the deliveries, the rejected copy if any, and the
routed record the audit reads (:mod:`streaming.realtime.audit`); it matches with the
Rust kernel over JNI (``kernel/jni``), against the routing view
(:mod:`streaming.realtime.view`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import ArrayType, BinaryType, StringType, StructField, StructType

from streaming.config import Config
from streaming.realtime.errors import RealtimeJarMissing

UDF_NAME = "bitroute_route"
SINK_RETRY_BACKOFF_MS = 5
"""The Kafka sink producer's ``retry.backoff.ms``, which also spaces its metadata refreshes:
a new subscriber topic's first delivery waits for one (Kafka backs off exponentially up to
``retry.backoff.max.ms`` on failures)."""
UDF_CLASS = "io.bitroute.realtime.RouteUdf"

SINK_PRODUCER_OPTIONS: dict[str, str] = {
    # Each record is sent as it is made: the latency is the point of the mode. (A linger
    # would not spare the producer's sender its scan of every partition it has written per
    # record: a record that opens a batch wakes it all the same.)
    "kafka.linger.ms": "0",
    # The first record to a topic waits in send() for the topic's metadata, and the producer
    # refreshes metadata at most once per retry.backoff.ms (100 ms by default): a router's
    # first minute, sending to a thousand subscriber topics for the first time one after
    # another, waited ~50 s for them.
    "kafka.retry.backoff.ms": str(SINK_RETRY_BACKOFF_MS),
}
"""The Kafka sink's own producer options, beside the connection's. The rest are the Java
producer's defaults, among them how long a record to a deleted delivery topic waits before
it fails the routing query (``delivery.timeout.ms``, 120 s, or ``max.block.ms``, 60 s:
:mod:`streaming.realtime.delivery_topics`); a test that waits for that failure shortens
them here."""

ROUTE_OUTPUT = ArrayType(StructType([
    StructField("topic", StringType(), False),
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
    StructField("headers", ArrayType(StructType([
        StructField("key", StringType(), False),
        StructField("value", BinaryType(), True),
    ]), False), False),
]), False)
"""What ``bitroute_route`` returns per publish: the Kafka sink's columns of each record."""


def udf_settings(config: Config, incarnation: int) -> dict[str, object]:
    """The route function's settings (``RouteUdf(String)``'s JSON)."""
    kafka = config.kafka
    layout = kafka.layout
    return {
        "kafka": java_client_properties(config),
        "view_topic": kafka.routing_view_topic,
        "changelog_topic": kafka.subscriptions_topic,
        "publishes_topic": kafka.publishes_topic,
        "incarnation": incarnation,
        "deliveries_topic_prefix": layout.topic_prefix,
        "shared_topic": layout.shared_topic or "",
        "rejected_topic": kafka.rejected_topic,
        "routed_topic": kafka.routed_topic,
        "max_delivery_bytes": kafka.max_delivery_bytes,
        "clock_skew_ms": config.streaming.realtime_clock_skew_ms,
    }


def java_client_properties(config: Config) -> dict[str, str]:
    """The Java Kafka client's properties for the router's connection: the Kafka source's
    options (TLS, SASL, ``[kafka.client]``) without their ``kafka.`` prefix."""
    return {key[len("kafka."):]: str(value)
            for key, value in config.kafka.client_settings.spark_options().items()
            if key.startswith("kafka.")}


def register_route_function(spark: SparkSession, config: Config, incarnation: int) -> None:
    """Build ``RouteUdf`` with the router's settings and register it as ``bitroute_route``.

    The driver's JVM must have the realtime jar (``spark.jars`` of a session bitroute
    launches; ``--jars`` under spark-submit, which ``docker/submit.sh`` gives): else
    :class:`RealtimeJarMissing`."""
    from py4j.java_gateway import JavaClass

    jvm = spark.sparkContext._jvm
    if jvm is None:
        raise RuntimeError("the Spark session has no JVM")
    udf_class = jvm.io.bitroute.realtime.RouteUdf
    if not isinstance(udf_class, JavaClass):  # py4j's JavaPackage: no such class
        raise RealtimeJarMissing(
            f"realtime mode's {UDF_CLASS} is not in the Spark driver's JVM: give it "
            "bitroute-realtime.jar (bitroute jars builds it; under spark-submit add it to "
            "--jars, as docker/submit.sh does when it can build it)")
    udf = udf_class(json.dumps(udf_settings(config, incarnation)))
    return_type = spark._jsparkSession.parseDataType(ROUTE_OUTPUT.json())
    spark._jsparkSession.udf().register(UDF_NAME, udf, return_type)


def start_routing_query(spark: SparkSession, config: Config, checkpoint: Path,
                        starting_offsets: str) -> StreamingQuery:
    """Start the routing query (it resumes from ``checkpoint``; a new one starts at
    ``starting_offsets``, Spark's JSON or ``earliest``). Call
    :func:`register_route_function` first."""
    kafka = config.kafka
    options = kafka.client_settings.spark_options()
    publishes = (spark.readStream.format("kafka")
                 .options(**options)
                 .option("subscribe", kafka.publishes_topic)
                 .option("startingOffsets", starting_offsets)
                 .option("includeHeaders", "true")
                 .option("failOnDataLoss", "false")
                 .load())
    return (publishes
            .selectExpr(f"inline({UDF_NAME}(partition, offset, key, value, headers, timestamp))")
            .writeStream
            .queryName("bitroute-realtime-routing")
            .format("kafka")
            .options(**options)
            .options(**SINK_PRODUCER_OPTIONS)
            .option("checkpointLocation", str(checkpoint))
            .outputMode("update")
            # pyspark's overloads of trigger() lack realTime, which it takes (Real-Time Mode).
            .trigger(realTime=config.streaming.realtime_checkpoint_interval)  # type: ignore[call-overload]
            .start())


CANCEL_NOISE_LOGGERS = (
    "org.apache.spark.util.Utils",
    "org.apache.spark.sql.execution.datasources.v2.WriteToDataSourceV2Exec",
    "org.apache.spark.sql.execution.datasources.v2.DataWritingSparkTask",
)
"""Spark's loggers of a cancelled write task: a Real-Time Mode task reads for ever, and
the query's stop interrupts it, which Spark logs as errors (``Aborting task``, with
the Kafka consumer's ``InterruptedException`` and its stack; the write's and its
partition's abort). Spark's own noise at a stop the router asked for."""


@contextmanager
def cancel_noise_quieted(spark: SparkSession) -> Iterator[None]:
    """Within: :data:`CANCEL_NOISE_LOGGERS` off in the driver's JVM (a ``local[...]``
    master's tasks log there; a cluster's executors log in their own JVMs, not on the
    router's stderr); their levels restored after, so that a task failing later in the
    same JVM is told as before."""
    jvm = spark.sparkContext._jvm
    if jvm is None:  # a stopped context: nothing logs
        yield
        return
    log4j = jvm.org.apache.logging.log4j
    configurator = log4j.core.config.Configurator
    previous = {name: log4j.LogManager.getLogger(name).getLevel()
                for name in CANCEL_NOISE_LOGGERS}
    for name in CANCEL_NOISE_LOGGERS:
        configurator.setLevel(name, log4j.Level.OFF)
    try:
        yield
    finally:
        for name, level in previous.items():
            configurator.setLevel(name, level)

"""The Spark schemas of the record contracts (names in :mod:`schemas.records`).

The Delta audit tables' columns (``DELIVERIES_TABLE``, ``MESSAGES_TABLE``,
``SUBSCRIPTIONS_TABLE``, each partitioned by day on its last column:
:data:`schemas.records.PARTITION_COLUMNS`) and the rows the routing tasks return
(``ROUTED_PUBLISH``). Arrow schemas derive from them (:func:`arrow_schema`).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DateType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from schemas.records import DELIVERIES, MESSAGES, SUBSCRIPTIONS

#: Output of the routing tasks (``mapInArrow``, :mod:`streaming.router.batch.routing`): one
#: row per publish with what became of it. ``deliveries`` lists the deliveries
#: Kafka acknowledged (empty when unroutable or rejected); ``reason`` is why a
#: rejected publish was rejected; ``alternate_exchange`` names the alternate exchange whose
#: subscriptions took the deliveries of a publish its own exchange routed to no one (null
#: otherwise; a builder may leave the column out: null). The audit rows are made from it.
ROUTED_PUBLISH = StructType([
    StructField("message_id", StringType(), False),
    StructField("exchange", StringType(), True),
    StructField("routing_key", StringType(), True),
    StructField("outcome", StringType(), False),
    StructField("reason", StringType(), True),
    StructField("deliveries", ArrayType(StructType([
        StructField("subscriber", StringType(), False),
        StructField("subscription_ids", ArrayType(StringType(), False), False),
    ]), False), False),
    StructField("headers", MapType(StringType(), StringType(), True), True),
    StructField("payload_bytes", IntegerType(), True),
    StructField("published_at", TimestampType(), True),
    StructField("alternate_exchange", StringType(), True),
])

#: One audit file a routing task wrote into a table's folder, not yet committed
#: (:class:`streaming.audit.files.AuditFile`).
AUDIT_FILE = StructType([
    StructField("table", StringType(), False),
    StructField("path", StringType(), False),
    StructField("size", LongType(), False),
    StructField("partition_column", StringType(), True),
    StructField("partition_value", StringType(), True),
    StructField("records", LongType(), False),
    StructField("modification_time", LongType(), False),
    StructField("stats", StringType(), False),
])

#: Output of a routing task that wrote its audit itself (a batch routed on the
#: executors, :mod:`streaming.router.batch.routing`): one row per task with its counts
#: and the audit files it wrote, so the driver receives no per-publish row.
ROUTED_TASK = StructType([
    StructField("publishes", LongType(), False),
    StructField("deliveries", LongType(), False),
    StructField("rejected", LongType(), False),
    StructField("files", ArrayType(AUDIT_FILE, False), False),
    # A sample (at most LATENCY_SAMPLE) of its publishes' end-to-end latency in ms: publish
    # timestamp to the acknowledgement of their deliveries (bitroute status, the metrics).
    StructField("latency_ms", ArrayType(LongType(), False), True),
    # Its publishes whose lifetime (the expiry header) ended before they were routed.
    StructField("expired", LongType(), True),
    # A replay's chunk (streaming.router.replay.replay): per subscription id, the deliveries
    # listing it (null for a live batch's task).
    StructField("subscriptions", MapType(StringType(), LongType(), False), True),
])

#: Delta table ``deliveries``: one row per (message, subscriber). ``retained``: true for a
#: delivery of a topic's retained message made when an MQTT subscription was applied
#: (streaming.router.retained); ``replayed``: true for a delivery made by a replay
#: (``subscribe --since``, streaming.router.replay.replay); both false for a live one, null in rows
#: written before the column existed (added to an older table when the router opens it).
#: ``alternate_exchange``: the alternate exchange whose subscription took the delivery, the
#: publish's own ``exchange`` routing it to no one (null otherwise, and in older rows).
DELIVERIES_TABLE = StructType([
    StructField("message_id", StringType(), False),
    StructField("subscriber", StringType(), False),
    StructField("subscription_ids", ArrayType(StringType(), False), False),
    StructField("exchange", StringType(), False),
    StructField("routing_key", StringType(), False),
    StructField("delivery_topic", StringType(), False),
    StructField("snapshot_version", LongType(), False),
    StructField("batch_id", LongType(), False),
    StructField("published_at", TimestampType(), True),
    StructField("retained", BooleanType(), True),
    StructField("replayed", BooleanType(), True),
    StructField("alternate_exchange", StringType(), True),
    StructField("routed_at", TimestampType(), False),
    StructField("routed_date", DateType(), False),
])

#: Delta table ``messages``: one row per publish with its outcome. ``alternate_exchange``: a
#: routed publish's alternate exchange, when its deliveries came through it (its own
#: ``exchange`` routed it to no one); null otherwise and in rows written before the column.
MESSAGES_TABLE = StructType([
    StructField("message_id", StringType(), False),
    StructField("exchange", StringType(), True),
    StructField("routing_key", StringType(), True),
    StructField("outcome", StringType(), False),
    StructField("deliveries", IntegerType(), False),
    StructField("reason", StringType(), True),
    StructField("headers", MapType(StringType(), StringType(), True), True),
    StructField("payload_bytes", IntegerType(), True),
    StructField("snapshot_version", LongType(), False),
    StructField("batch_id", LongType(), False),
    StructField("published_at", TimestampType(), True),
    StructField("alternate_exchange", StringType(), True),
    StructField("routed_at", TimestampType(), False),
    StructField("routed_date", DateType(), False),
])

#: Delta table ``subscriptions``: every change read from the changelog (``retain_handling``,
#: ``retain_as_published`` and ``no_local`` added to an older table when the router opens it).
SUBSCRIPTIONS_TABLE = StructType([
    StructField("subscription_id", StringType(), False),
    StructField("change", StringType(), False),
    StructField("exchange", StringType(), True),
    StructField("subscriber", StringType(), True),
    StructField("filter", StringType(), True),
    StructField("header_match", StringType(), True),
    StructField("header_criteria", MapType(StringType(), StringType(), True), True),
    StructField("reason", StringType(), True),
    StructField("snapshot_version", LongType(), False),
    StructField("changelog_partition", IntegerType(), False),
    StructField("changelog_offset", LongType(), False),
    StructField("changed_at", TimestampType(), True),
    # An upsert's MQTT subscription options (compiler.options), null for other changes and in
    # rows written before the columns existed.
    StructField("retain_handling", IntegerType(), True),
    StructField("retain_as_published", BooleanType(), True),
    StructField("no_local", BooleanType(), True),
    StructField("applied_at", TimestampType(), False),
    StructField("applied_date", DateType(), False),
])

AUDIT_TABLES = {
    DELIVERIES: DELIVERIES_TABLE,
    MESSAGES: MESSAGES_TABLE,
    SUBSCRIPTIONS: SUBSCRIPTIONS_TABLE,
}


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema of one of these Spark schemas, timestamps as microseconds in UTC.

    That is what Spark hands Python over Arrow with ``spark.sql.session.timeZone``
    set to UTC (streaming/session.py), and the Delta tables' timestamp type.
    pyspark 4.0 gave UTC by default; 4.2's ``to_arrow_schema`` needs the zone named.
    """
    return to_arrow_schema(schema, timezone="UTC")


def utc_date(timestamps: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """The UTC calendar date (Arrow ``date32``) of each of ``timestamps`` (a timestamp in UTC)."""
    return pc.cast(pc.cast(timestamps, pa.timestamp("us", tz="UTC")), pa.date32())

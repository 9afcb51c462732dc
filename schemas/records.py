"""The record contracts: every Kafka header, JSON field and Delta column, named once.

Kafka, publishes (input): key = routing key (UTF-8), value = payload (opaque,
never parsed), headers = message properties used by header criteria, plus the
optional :data:`EXCHANGE_HEADER` (default exchange from config). The message
id is ``<topic>/<partition>/<offset>``: unique and stable across replays.

Kafka, subscriptions (compacted changelog): key = subscription id; value =
JSON ``{exchange, subscriber, filter, headers?: {match, criteria}}``
(:data:`SUBSCRIPTION_FIELDS`); a null value (tombstone) removes it.

Kafka, deliveries: one topic per subscriber; value = the original payload, key
= the routing key, headers = the original headers plus :data:`MESSAGE_ID_HEADER`,
:data:`SUBSCRIPTION_IDS_HEADER` (a JSON array of the matched subscription ids)
and :data:`SNAPSHOT_VERSION_HEADER` (decimal).

Kafka, rejected: the original key, value and headers of a bad publish or a bad
subscription change, plus :data:`REASON_HEADER`, :data:`SOURCE_HEADER`
(``publish`` or ``subscription``) and :data:`MESSAGE_ID_HEADER` (the record's
``<topic>/<partition>/<offset>``).

Delta: ``deliveries`` (one row per message x subscriber), ``messages`` (one row
per publish with its outcome), ``subscriptions`` (every applied change with the
snapshot version it produced); columns below.
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

# --- Kafka headers -----------------------------------------------------------
EXCHANGE_HEADER = "exchange"
MESSAGE_ID_HEADER = "bitroute.message_id"
SUBSCRIPTION_IDS_HEADER = "bitroute.subscription_ids"
SNAPSHOT_VERSION_HEADER = "bitroute.snapshot_version"
REASON_HEADER = "bitroute.reason"
SOURCE_HEADER = "bitroute.source"
#: Headers the router adds; a publish carrying one of them has it replaced.
ROUTER_HEADERS = (MESSAGE_ID_HEADER, SUBSCRIPTION_IDS_HEADER, SNAPSHOT_VERSION_HEADER,
                  REASON_HEADER, SOURCE_HEADER)

SOURCE_PUBLISH = "publish"
SOURCE_SUBSCRIPTION = "subscription"

# --- Subscription changelog JSON ---------------------------------------------
SUBSCRIPTION_FIELDS = ("exchange", "subscriber", "filter", "headers")
HEADER_CRITERIA_FIELDS = ("match", "criteria")

# --- Message outcomes (messages.outcome) and change kinds (subscriptions.change)
OUTCOME_ROUTED = "routed"
OUTCOME_UNROUTABLE = "unroutable"
OUTCOME_REJECTED = "rejected"
CHANGE_UPSERT = "upsert"
CHANGE_REMOVE = "remove"
CHANGE_REJECTED = "rejected"


def message_id(topic: str, partition: int, offset: int) -> str:
    """The id of the Kafka record at ``topic/partition/offset``."""
    return f"{topic}/{partition}/{offset}"


# --- Spark schemas -------------------------------------------------------------
#: Output of the routing tasks (``mapInArrow``, :mod:`streaming.routing`): one
#: row per publish with what became of it. ``deliveries`` lists the deliveries
#: Kafka acknowledged (empty when unroutable or rejected); ``reason`` is why a
#: rejected publish was rejected. The audit rows are made from it.
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
])

#: Delta table ``deliveries``: one row per (message, subscriber).
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
    StructField("routed_at", TimestampType(), False),
])

#: Delta table ``messages``: one row per publish with its outcome.
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
    StructField("routed_at", TimestampType(), False),
])

#: Delta table ``subscriptions``: every change read from the changelog.
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
    StructField("applied_at", TimestampType(), False),
])

AUDIT_TABLES = {
    "deliveries": DELIVERIES_TABLE,
    "messages": MESSAGES_TABLE,
    "subscriptions": SUBSCRIPTIONS_TABLE,
}

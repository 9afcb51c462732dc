"""Kafka output of a routed micro-batch: per-subscriber deliveries and rejected publishes.

Both go out in one Spark Kafka batch write (the sink routes each row by its
``topic`` column), from inside ``foreachBatch``.

Deliveries: one record per (publish, subscriber) on
``config.kafka.deliveries_topic(subscriber)``; key = the routing key, value =
the payload, headers = the publish's headers minus any router header
(``schemas.records.ROUTER_HEADERS``, which a publisher cannot forge) plus
``bitroute.message_id``, ``bitroute.subscription_ids`` (JSON array of every
matched subscription of that subscriber, sorted) and
``bitroute.snapshot_version`` (decimal).

Rejected publishes: the original key, value and headers (minus router
headers) on ``config.kafka.rejected_topic``, plus ``bitroute.reason``,
``bitroute.source`` = ``publish`` and ``bitroute.message_id``.

Delivery semantics: at least once. A batch replayed after a crash writes its
records again, identical except for Kafka's own offsets and timestamps; the
message id header lets a consumer drop the repeat.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from schemas.records import (
    MESSAGE_ID_HEADER,
    REASON_HEADER,
    ROUTER_HEADERS,
    SNAPSHOT_VERSION_HEADER,
    SOURCE_HEADER,
    SOURCE_PUBLISH,
    SUBSCRIPTION_IDS_HEADER,
)
from streaming.config import Config

HEADERS_TYPE = "array<struct<key:string,value:binary>>"
"""The Kafka connector's header column type."""

PRODUCER_OPTIONS = {
    # A batch fans out to many small records over many delivery topic
    # partitions (one open batch each). Measured on 775k deliveries over 2,000
    # partitions (docs/benchmarks.md, end to end): linger 20 ms with Kafka's
    # 16 kB batches writes about 200k records/s; 256 kB batches exhausted the
    # 32 MB buffer (partitions x batch.size must fit in buffer.memory) and
    # crawled at 11k/s; lz4 cost 4x on loopback, so records go uncompressed.
    "kafka.linger.ms": "20",
    "kafka.buffer.memory": str(128 << 20),
}
"""Producer settings of the Spark Kafka sink (``kafka.``-prefixed Kafka producer configs)."""


def kafka_records(routed: DataFrame, config: Config, version: int) -> DataFrame:
    """The records to write for a routed batch: topic, key, value, headers."""
    # The publish's own headers are filtered once per publish, before the fan-out.
    deliveries = (routed.where(F.col("error").isNull())
                  .select("message_id", "key", "value", _original_headers().alias("kept_headers"),
                          F.explode("deliveries").alias("d"))
                  .select(
                      F.concat(F.lit(config.kafka.deliveries_topic_prefix),
                               F.col("d.subscriber")).alias("topic"),
                      F.col("key"),
                      F.col("value"),
                      F.concat(F.col("kept_headers"), F.array(
                          _header(MESSAGE_ID_HEADER, F.col("message_id")),
                          _header(SUBSCRIPTION_IDS_HEADER, F.to_json("d.subscription_ids")),
                          _header(SNAPSHOT_VERSION_HEADER, F.lit(str(version))),
                      )).alias("headers"),
                  ))
    rejected = (routed.where(F.col("error").isNotNull())
                .select(
                    F.lit(config.kafka.rejected_topic).alias("topic"),
                    F.col("key"),
                    F.col("value"),
                    F.concat(_original_headers(), F.array(
                        _header(REASON_HEADER, F.col("error")),
                        _header(SOURCE_HEADER, F.lit(SOURCE_PUBLISH)),
                        _header(MESSAGE_ID_HEADER, F.col("message_id")),
                    )).alias("headers"),
                ))
    return deliveries.unionByName(rejected)


def write_kafka(records: DataFrame, config: Config) -> None:
    """Write ``records`` (topic, key, value, headers) and wait until Kafka acknowledged them."""
    (records.write.format("kafka")
     .option("kafka.bootstrap.servers", config.kafka.bootstrap)
     .options(**PRODUCER_OPTIONS)
     .save())


def _original_headers() -> Column:
    headers = F.coalesce(F.col("headers"), F.array().cast(HEADERS_TYPE))
    return F.filter(headers, lambda h: ~h["key"].isin(*ROUTER_HEADERS))


def _header(name: str, value: Column) -> Column:
    return F.struct(F.lit(name).alias("key"), value.cast("binary").alias("value"))

"""The Delta audit tables: created if missing, appended exactly once per batch or version.

Tables (schemas in :mod:`schemas.records`) live at ``config.delta.table_path(name)``:

- ``deliveries``: one row per (message, subscriber) routed;
- ``messages``: one row per publish with its outcome (routed, unroutable,
  rejected + reason);
- ``subscriptions``: one row per changelog record read, with the snapshot
  version it produced.

Exactly once: every append is a Delta idempotent write, ``txnAppId`` +
``txnVersion``. Delta records the highest ``txnVersion`` committed per
``txnAppId`` in the table's log, atomically with the rows, and skips a write
whose ``txnVersion`` is not above it. The publish tables use the micro-batch
id as ``txnVersion``, the subscriptions table the snapshot version, under app
ids derived from the router id (:meth:`streaming.snapshots.SnapshotStore.router_id`),
so a replayed batch or a re-applied version adds no row, and a new router
(a fresh checkpoint folder) is not mistaken for a replay of an old one.
Precondition: batch ids and versions handed to one router's appends increase.
"""

from __future__ import annotations

import pyarrow as pa
from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from schemas.records import (
    AUDIT_TABLES,
    DELIVERIES_TABLE,
    MESSAGES_TABLE,
    OUTCOME_REJECTED,
    OUTCOME_ROUTED,
    OUTCOME_UNROUTABLE,
    SUBSCRIPTIONS_TABLE,
)
from streaming.config import Config
from streaming.matching import header_map


class AuditTables:
    """Appends to the three audit tables of ``config`` for the router ``router_id``."""

    def __init__(self, spark: SparkSession, config: Config, router_id: str) -> None:
        self._spark = spark
        self._config = config
        self._publishes_app = f"bitroute-{router_id}-publishes"
        self._changelog_app = f"bitroute-{router_id}-changelog"

    def path(self, table: str) -> str:
        return self._config.delta.table_path(table)

    def ensure(self) -> None:
        """Create each missing table with its schema; existing tables are left as they are."""
        for name, schema in AUDIT_TABLES.items():
            (DeltaTable.createIfNotExists(self._spark)
             .location(self.path(name))
             .addColumns(schema)
             .execute())

    def append_subscriptions(self, version: int, changes: pa.Table) -> None:
        """Append the changes that produced snapshot ``version`` (an Arrow table
        of ``SUBSCRIPTIONS_TABLE``), once: a second call for ``version`` adds nothing."""
        if not changes.num_rows:
            return
        frame = self._spark.createDataFrame(changes, SUBSCRIPTIONS_TABLE)
        self._append(frame, "subscriptions", self._changelog_app, version)

    def append_deliveries(self, routed: DataFrame, version: int, batch_id: int) -> None:
        """One row per (routed publish, subscriber) of micro-batch ``batch_id``, once."""
        prefix = self._config.kafka.deliveries_topic_prefix
        rows = (routed.where(F.col("error").isNull())
                .select("message_id", "exchange", "key", "published_at",
                        F.explode("deliveries").alias("d"))
                .select(
                    F.col("message_id"),
                    F.col("d.subscriber").alias("subscriber"),
                    F.col("d.subscription_ids").alias("subscription_ids"),
                    F.col("exchange"),
                    F.col("key").cast("string").alias("routing_key"),
                    F.concat(F.lit(prefix), F.col("d.subscriber")).alias("delivery_topic"),
                    F.lit(version).cast("long").alias("snapshot_version"),
                    F.lit(batch_id).cast("long").alias("batch_id"),
                    F.col("published_at"),
                    F.current_timestamp().alias("routed_at"),
                ))
        self._append(_conform(rows, DELIVERIES_TABLE), "deliveries", self._publishes_app, batch_id)

    def append_messages(self, routed: DataFrame, version: int, batch_id: int) -> None:
        """One row per publish of micro-batch ``batch_id`` with its outcome, once."""
        count = F.size("deliveries")
        outcome = (F.when(F.col("error").isNotNull(), F.lit(OUTCOME_REJECTED))
                   .when(count > 0, F.lit(OUTCOME_ROUTED))
                   .otherwise(F.lit(OUTCOME_UNROUTABLE)))
        rows = routed.select(
            F.col("message_id"),
            F.col("exchange"),
            F.col("key").cast("string").alias("routing_key"),
            outcome.alias("outcome"),
            count.alias("deliveries"),
            F.col("error").alias("reason"),
            header_map(F.col("headers")).alias("headers"),
            F.length("value").alias("payload_bytes"),
            F.lit(version).cast("long").alias("snapshot_version"),
            F.lit(batch_id).cast("long").alias("batch_id"),
            F.col("published_at"),
            F.current_timestamp().alias("routed_at"),
        )
        self._append(_conform(rows, MESSAGES_TABLE), "messages", self._publishes_app, batch_id)

    def _append(self, frame: DataFrame, table: str, app_id: str, txn_version: int) -> None:
        (frame.write.format("delta").mode("append")
         .option("txnAppId", app_id)
         .option("txnVersion", str(txn_version))
         .save(self.path(table)))


def _conform(frame: DataFrame, schema) -> DataFrame:
    """``frame``'s columns cast to the table's types, in the table's order."""
    columns: list[Column] = [F.col(f.name).cast(f.dataType).alias(f.name) for f in schema.fields]
    return frame.select(*columns)

"""The Delta audit tables: created if missing, appended exactly once per batch or version.

Written with delta-rs (the ``deltalake`` package) from the driver: no Spark
job, so a commit costs milliseconds where a Spark Delta write cost about a
second per micro-batch (docs/benchmarks.md). The tables are ordinary Delta
tables (protocol reader 1 / writer 2) that Spark, delta-rs and
``bitroute audit`` all read.

Tables (schemas in :mod:`schemas.tables`) live at ``config.delta.table_path(name)``:

- ``deliveries``: one row per (message, subscriber) routed and acknowledged by Kafka;
- ``messages``: one row per publish with its outcome (routed, unroutable,
  rejected + reason);
- ``subscriptions``: one row per changelog record read, with the snapshot
  version it produced.

Exactly once: every append is an idempotent write, a Delta application
transaction (``txn`` action: app id + version) committed atomically with the
rows. Before writing, :meth:`AuditTables._append` reads the highest version
committed for its app id and skips a write whose version is not above it.
The publish tables use the micro-batch id as the version, the subscriptions
table the snapshot version, under app ids derived from the router id
(:meth:`streaming.snapshots.SnapshotStore.router_id`), so a replayed batch or
a re-applied version adds no row, and a new router (a fresh checkpoint
folder) is not mistaken for a replay of an old one. The same ``txn`` actions
are what Spark's ``txnAppId``/``txnVersion`` wrote in earlier versions, so
tables written by them continue exactly where they were.

Preconditions: batch ids and versions handed to one router's appends
increase, and one process writes for a router id (the router lock).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError

from schemas.tables import AUDIT_TABLES, arrow_schema
from streaming.config import Config, KafkaConfig
from streaming.kafka_records import delivery_topic_column

ARROW_SCHEMAS = {name: arrow_schema(schema) for name, schema in AUDIT_TABLES.items()}
"""Each audit table's Arrow schema (the Spark StructTypes of schemas.tables, converted)."""


class AuditTables:
    """Appends to the three audit tables of ``config`` for the router ``router_id``.

    Thread-safe: the two publish tables are appended concurrently.
    """

    def __init__(self, config: Config, router_id: str) -> None:
        self._config = config
        self._publishes_app = f"bitroute-{router_id}-publishes"
        self._changelog_app = f"bitroute-{router_id}-changelog"
        self._tables: dict[str, DeltaTable] = {}
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="bitroute-audit")

    def path(self, table: str) -> str:
        return self._config.delta.table_path(table)

    def ensure(self) -> None:
        """Create each missing table with its schema; existing tables are left as they are."""
        for name, schema in ARROW_SCHEMAS.items():
            try:
                table = DeltaTable(self.path(name))
            except TableNotFoundError:
                table = DeltaTable.create(self.path(name), schema=schema, mode="ignore")
            self._tables[name] = table

    def close(self) -> None:
        self._threads.shutdown(wait=True)

    def append_subscriptions(self, version: int, changes: pa.Table) -> None:
        """Append the changes that produced snapshot ``version`` (an Arrow table
        of ``SUBSCRIPTIONS_TABLE``), once: a second call for ``version`` adds nothing."""
        if not changes.num_rows:
            return
        self._append("subscriptions", changes, self._changelog_app, version)

    def append_batch(self, routed: pa.Table, version: int, batch_id: int,
                     routed_at: datetime | None = None) -> None:
        """The ``messages`` and ``deliveries`` rows of micro-batch ``batch_id``, once each.

        ``routed`` holds the batch's ``ROUTED_PUBLISH`` rows; the two tables
        are appended concurrently (each commit is mostly fixed cost).
        """
        routed_at = routed_at or datetime.now(timezone.utc)
        futures = [
            self._threads.submit(self._append, "messages", messages_rows(routed, version, batch_id, routed_at),
                                 self._publishes_app, batch_id),
            self._threads.submit(self._append, "deliveries",
                                 deliveries_rows(routed, version, batch_id, routed_at, self._config.kafka),
                                 self._publishes_app, batch_id),
        ]
        for future in futures:
            future.result()

    def _append(self, name: str, rows: pa.Table, app_id: str, txn_version: int) -> None:
        table = self._table(name)
        table.update_incremental()
        committed = table.transaction_version(app_id)
        if committed is not None and committed >= txn_version:
            return  # a replay: these rows are in the table already
        write_deltalake(table, rows, mode="append", commit_properties=CommitProperties(
            app_transactions=[Transaction(app_id, txn_version)]))

    def _table(self, name: str) -> DeltaTable:
        with self._lock:
            table = self._tables.get(name)
            if table is None:
                table = self._tables[name] = DeltaTable(self.path(name))
            return table


def messages_rows(routed: pa.Table, version: int, batch_id: int, routed_at: datetime) -> pa.Table:
    """One ``messages`` row per publish of ``routed`` (``ROUTED_PUBLISH`` rows)."""
    n = routed.num_rows
    schema = ARROW_SCHEMAS["messages"]
    columns = {
        "message_id": routed["message_id"],
        "exchange": routed["exchange"],
        "routing_key": routed["routing_key"],
        "outcome": routed["outcome"],
        "deliveries": pc.list_value_length(routed["deliveries"]),
        "reason": routed["reason"],
        "headers": routed["headers"],
        "payload_bytes": routed["payload_bytes"],
        "snapshot_version": pa.array([version] * n, pa.int64()),
        "batch_id": pa.array([batch_id] * n, pa.int64()),
        "published_at": routed["published_at"],
        "routed_at": pa.array([routed_at] * n, schema.field("routed_at").type),
    }
    return pa.table([columns[f.name].cast(f.type) for f in schema], schema=schema)


def deliveries_rows(routed: pa.Table, version: int, batch_id: int, routed_at: datetime,
                    kafka: KafkaConfig) -> pa.Table:
    """One ``deliveries`` row per (publish, subscriber) acknowledged in ``routed``."""
    schema = ARROW_SCHEMAS["deliveries"]
    lists = routed["deliveries"].combine_chunks()
    owner = pc.list_parent_indices(lists)
    subscriber, subscription_ids = lists.flatten().flatten()
    n = len(owner)
    columns = {
        "message_id": routed["message_id"].take(owner),
        "subscriber": subscriber,
        "subscription_ids": subscription_ids,
        "exchange": routed["exchange"].take(owner),
        "routing_key": routed["routing_key"].take(owner),
        "delivery_topic": delivery_topic_column(
            subscriber, kafka.deliveries_topic_prefix,
            kafka.shared_deliveries_topic if kafka.shared_layout else None),
        "snapshot_version": pa.array([version] * n, pa.int64()),
        "batch_id": pa.array([batch_id] * n, pa.int64()),
        "published_at": routed["published_at"].take(owner),
        "routed_at": pa.array([routed_at] * n, schema.field("routed_at").type),
    }
    return pa.table([columns[f.name].cast(f.type) for f in schema], schema=schema)

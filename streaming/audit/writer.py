"""The Delta audit tables: created if missing, appended exactly once per batch or version.

Committed with delta-rs (the ``deltalake`` package) from the driver: no Spark
job, so a commit costs milliseconds where a Spark Delta write cost about a
second per micro-batch (docs/benchmarks.md). The publish tables' data files
are written by whoever routed the batch (:mod:`streaming.audit.files`): the
routing tasks on the executors, or, for a batch routed in the driver, the
committer itself; a commit adds them (``add`` actions). The tables are
ordinary Delta tables (protocol reader 1 / writer 2) that Spark, delta-rs and
``bitroute audit`` all read.

Tables (schemas in :mod:`schemas.tables`) live at ``config.delta.table_path(name)``:

- ``deliveries``: one row per (message, subscriber) routed and acknowledged by Kafka;
- ``messages``: one row per publish with its outcome (routed, unroutable,
  rejected + reason);
- ``subscriptions``: one row per changelog record read, with the snapshot
  version it produced.

Layout: a table this module creates is partitioned by the UTC day of its
time column (:data:`schemas.records.PARTITION_COLUMNS`: ``routed_date``,
``applied_date``, the last column of each schema). A table created
unpartitioned by an earlier version (without the date column) is appended to
in its own layout, never rewritten here: :func:`unpartitioned` names it and
``bitroute audit migrate`` (:mod:`streaming.audit.migration`) rewrites it
once on request. Every write uses :func:`writer_properties` and no post-commit
hook: checkpoints and expired-log cleanup are the background maintenance's
(streaming/audit/maintenance.py), off the critical path.

Exactly once: every append is an idempotent write, a Delta application
transaction (``txn`` action: app id + version) committed atomically with the
rows. Before writing, :meth:`AuditTables._append` reads the highest version
committed for its app id and skips a write whose version is not above it.
The publish tables use micro-batch ids as versions (a group of batches
committed together, :meth:`AuditTables.append_publishes`, carries the highest
id of the group, and each table drops the batches at or below its committed
version first), the subscriptions table the snapshot version, under app ids
derived from the router id (:meth:`streaming.router.subscriptions.snapshots.SnapshotStore.router_id`),
so a re-run batch or a re-applied version adds no row, and a new router (a
fresh checkpoint folder) is not mistaken for a re-run of an old one. The same
``txn`` actions are what Spark's ``txnAppId``/``txnVersion`` wrote in earlier
versions, so tables written by them continue exactly where they were.

Preconditions: batch ids and versions handed to one router's appends
increase, and one process writes for a router id (the router lock).

Restores: each commit also records how far its table's audit reaches, and a
router restarted on an older copy of its state folder leaves out the rows
below what it took over (:mod:`streaming.audit.audited`, :attr:`AuditTables.marks`).

Memory: a delta-rs ``DeltaTable`` kept open grows with every commit it makes
or follows (``update_incremental``): about 60 KB per commit per table in the
router's driver, which is what made the driver grow by megabytes a minute
(docs/architecture.md, "Memory over time"), while a table loaded afresh holds
far less per file. Each table object is therefore dropped and loaded again
after it has followed :data:`TABLE_RELOAD_COMMITS` versions.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import (
    CommitProperties,
    DeltaTable,
    PostCommitHookProperties,
    Transaction,
    write_deltalake,
)
from deltalake.exceptions import TableNotFoundError

from schemas.records import DELIVERIES, MESSAGES, PARTITION_COLUMNS, SUBSCRIPTIONS
from schemas.tables import AUDIT_TABLES, arrow_schema, utc_date
from streaming.audit.audited import (
    AuditedMark,
    changes_not_audited,
    latest_mark,
    next_offsets,
    rows_not_audited,
    span_against,
)
from streaming.audit.files import AuditFile, audit_files, write_table_files
from streaming.audit.properties import table_properties, writer_properties
from streaming.audit.storage import storage_options, warehouse_filesystem
from streaming.config import Config
from streaming.kafka.layout import DeliveryLayout

TABLE_RELOAD_COMMITS = 100
"""Versions one ``DeltaTable`` object follows before it is loaded afresh (module docstring):
between reloads it grows by about 60 KB per version. The maintenance writes a checkpoint
every pass (``audit.maintenance_interval``, about 30 group commits apart at the defaults),
so a reload reads one checkpoint and the few commits after it."""

ARROW_SCHEMAS = {name: arrow_schema(schema) for name, schema in AUDIT_TABLES.items()}
"""Each audit table's Arrow schema (the Spark StructTypes of schemas.tables, converted)."""

PUBLISH_TABLES = (MESSAGES, DELIVERIES)
"""The tables a micro-batch appends to, in the order their rows are made."""

MAX_COMMIT_ROWS = 1_000_000
"""Rows of one table in one commit, at most (but one batch's, which are never split):
a larger group of journaled batches is committed as several transactions, in order."""

NO_POST_COMMIT_HOOKS = PostCommitHookProperties(create_checkpoint=False,
                                                cleanup_expired_logs=False)
"""Appends write no checkpoint and delete no log: the maintenance does, in the background."""


@dataclass(frozen=True)
class PublishBatch:
    """One micro-batch routed in the driver: its ``ROUTED_PUBLISH`` rows and what they were
    routed with (the committer writes their files)."""

    batch_id: int
    snapshot_version: int
    routed_at: datetime
    routed: pa.Table
    start: dict[int, int] | None = None
    """Publishes offsets (partition -> offset) the batch read from, None when unknown."""
    end: dict[int, int] | None = None
    """Publishes offsets the batch read up to (exclusive), None when unknown."""

    @property
    def publishes(self) -> int:
        return self.routed.num_rows


@dataclass(frozen=True)
class FileBatch:
    """One micro-batch routed on the executors: the audit files its tasks wrote
    (``files``: a table of :data:`streaming.audit.files.AUDIT_FILE_ARROW` columns) and its
    publishes' count."""

    batch_id: int
    snapshot_version: int
    routed_at: datetime
    files: pa.Table
    publishes: int
    start: dict[int, int] | None = None
    """Publishes offsets (partition -> offset) the batch read from, None when unknown."""
    end: dict[int, int] | None = None
    """Publishes offsets the batch read up to (exclusive), None when unknown."""

    def table_files(self, table: str) -> list[AuditFile]:
        """The files of ``table`` (messages or deliveries)."""
        return [f for f in audit_files(self.files) if f.table == table]


AuditBatch = PublishBatch | FileBatch
"""A journaled batch's audit, in either form."""


class AuditTables:
    """Appends to the three audit tables of ``config`` for the router ``router_id``
    (the ``subscriptions`` rows of its snapshot versions under ``snapshot_audit_id``,
    :meth:`streaming.router.subscriptions.snapshots.SnapshotStore.snapshot_audit_id`; default the router id).

    Thread-safe: the two publish tables are appended concurrently.
    """

    def __init__(self, config: Config, router_id: str, snapshot_audit_id: str | None = None,
                 publishes_stream: str = "publishes") -> None:
        self._config = config
        self._storage = storage_options(config.delta)
        # Each stream of publish batches numbers its batches itself (realtime mode's audit
        # query: "realtime-publishes"), so each has its own Delta app id.
        self._publishes_app = f"bitroute-{router_id}-{publishes_stream}"
        # Snapshot versions outlive a router id taken for a new streaming checkpoint.
        self._changelog_app = f"bitroute-{snapshot_audit_id or router_id}-changelog"
        self._retained_app = f"bitroute-{router_id}-retained"
        self._retained_applied_app = f"bitroute-{router_id}-retained-applied"
        self._replay_app = f"bitroute-{router_id}-replay"
        self._tables: dict[str, DeltaTable] = {}
        self._loaded_at: dict[str, int] = {}  # the version each table object was loaded at
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="bitroute-audit")
        self._filesystem, self._root = warehouse_filesystem(config.delta)
        self.router_id = router_id
        self.topic = config.kafka.publishes_topic
        """The lineage key of the marks (:mod:`streaming.audit.audited`)."""
        self.ancestors: tuple[str, ...] = ()
        """The router ids this router's state was restored from (recorded in every mark)."""
        self.marks: dict[str, AuditedMark] = {}
        """Per table, the mark this router took over and advanced with each commit: rows
        below it are in the table already and are left out (a restore). Set at open,
        before the first commit (:mod:`streaming.router.restore`)."""

    def path(self, table: str) -> str:
        return self._config.delta.table_path(table)

    def ensure(self) -> None:
        """Create each missing table, partitioned by day, with the retention properties of
        ``[audit]`` (:func:`table_properties`; set at creation, so that the maintenance's
        first pass has no property commit to race the appends with); existing tables are
        left as they are."""
        for name, schema in ARROW_SCHEMAS.items():
            try:
                table = DeltaTable(self.path(name), storage_options=self._storage)
            except TableNotFoundError:
                table = DeltaTable.create(self.path(name), schema=schema, mode="ignore",
                                          storage_options=self._storage,
                                          partition_by=[PARTITION_COLUMNS[name]],
                                          configuration=table_properties(self._config.audit))
            add_missing_columns(table, name)
            self._tables[name] = table
            self._loaded_at[name] = table.version()

    def unpartitioned(self) -> list[str]:
        """The tables in the layout of an earlier version (no day partitions), to migrate."""
        return [name for name in ARROW_SCHEMAS if not is_partitioned(self._table(name), name)]

    def close(self) -> None:
        self._threads.shutdown(wait=True)

    def append_subscriptions(self, version: int, changes: pa.Table) -> None:
        """Append the changes that produced snapshot ``version`` (an Arrow table
        of ``SUBSCRIPTIONS_TABLE``), once: a second call for ``version`` adds nothing."""
        changes = changes_not_audited(changes, self._restored_changes())
        if not changes.num_rows:
            return
        advanced = self._mark(SUBSCRIPTIONS).advanced(
            next_offsets(changes["changelog_partition"], changes["changelog_offset"]),
            self.router_id, self.ancestors, version)
        self._append(SUBSCRIPTIONS, changes, self._changelog_app, version, mark=advanced)

    def _restored_changes(self) -> dict[int, int] | None:
        """The changelog offsets a router this one was restored from audited, or None.

        Only another router's mark (a restore) leaves changes out: a router's own
        changelog read again (an index rebuilt at open) is audited again, as it was."""
        mark = self.marks.get(SUBSCRIPTIONS)
        return dict(mark.offsets) if mark is not None and mark.router_id != self.router_id \
            else None

    def change_audited(self, partition: int, offset: int) -> bool:
        """Whether the changelog record at ``partition``/``offset`` was applied and audited
        by a router this one was restored from: what it implied (retained deliveries
        included) took place then."""
        audited = self._restored_changes()
        return audited is not None and offset < audited.get(partition, 0)

    def latest_mark(self, table: str) -> AuditedMark | None:
        """The newest mark of this router's publishes topic in ``table`` (its last commits)."""
        delta = self._table(table)
        delta.update_incremental()
        return latest_mark(delta, self.topic)

    def changelog_version(self) -> int | None:
        """The highest snapshot version this router id committed to ``subscriptions``."""
        delta = self._table(SUBSCRIPTIONS)
        delta.update_incremental()
        return delta.transaction_version(self._changelog_app)

    def append_retained(self, rows: pa.Table, batch_id: int) -> None:
        """Append the ``deliveries`` rows of the retained messages delivered when batch
        ``batch_id`` first applied new subscriptions (streaming.router.retained), once:
        under their own app id, versioned by the batch id."""
        if rows.num_rows:
            # A table object of its own: the committer's thread appends to the same table
            # through the shared one meanwhile. Loaded only for a batch that delivered some.
            self._append(DELIVERIES, rows, self._retained_app, batch_id,
                         table=DeltaTable(self.path(DELIVERIES), storage_options=self._storage))

    def append_retained_applied(self, rows: pa.Table, version: int) -> None:
        """Append the ``deliveries`` rows of the retained messages delivered when the router
        applied snapshot ``version`` while no batch ran (streaming.router.retained), once:
        under their own app id, versioned by the snapshot version."""
        if rows.num_rows:
            self._append(DELIVERIES, rows, self._retained_applied_app, version,
                         table=DeltaTable(self.path(DELIVERIES), storage_options=self._storage))

    def append_replayed(self, rows: pa.Table, chunk: int) -> None:
        """Append replayed ``deliveries`` rows (streaming.router.replay.replay) of replay chunk
        ``chunk`` (increasing), once: under their own app id, so that they never meet the
        batches' versions."""
        if rows.num_rows:
            self._append(DELIVERIES, rows, self._replay_app, chunk)

    def append_replayed_files(self, files: Sequence[AuditFile], chunk: int) -> None:
        """Add the replayed ``deliveries`` files of replay chunk ``chunk`` (increasing), which
        its routing tasks wrote (streaming.router.replay.replay), in one transaction, once: under
        the replays' app id, versioned by the chunk's number. Files of a chunk already
        committed are left untracked (the vacuum deletes them)."""
        if not files:
            return
        table = self._table(DELIVERIES)
        table.update_incremental()
        committed = table.transaction_version(self._replay_app)
        if committed is not None and committed >= chunk:
            return  # the chunk ran again after a crash: its rows are in the table already
        partitioned = is_partitioned(table, DELIVERIES)
        table.create_write_transaction(
            [f.add_action() for f in files], mode="append", schema=table.schema(),
            partition_by=[PARTITION_COLUMNS[DELIVERIES]] if partitioned else None,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(self._replay_app, chunk)]),
            post_commithook_properties=NO_POST_COMMIT_HOOKS)
        table.update_incremental()  # the object does not follow its own transaction
        self._reload_if_grown(DELIVERIES, table)

    def publishes_version(self, table: str) -> int | None:
        """The highest batch id committed to publish table ``table`` (None: none yet)."""
        delta = self._table(table)
        delta.update_incremental()
        return delta.transaction_version(self._publishes_app)

    def append_publishes(self, batches: Sequence[AuditBatch]) -> None:
        """The ``messages`` and ``deliveries`` rows of ``batches`` (increasing ids), once each.

        The two tables are appended concurrently, each in as few transactions
        as :data:`MAX_COMMIT_ROWS` allows, each transaction's ``txn`` version
        the highest batch id it holds. A table first drops the batches at or
        below its committed version: after a crash between the two tables'
        commits, the table that has them adds nothing and the other catches up.
        A :class:`FileBatch` brings its files; the rows of a :class:`PublishBatch`
        are written as files here, the group's rows together.
        """
        futures = [self._threads.submit(self._append_group, name, batches)
                   for name in PUBLISH_TABLES]
        for future in futures:
            future.result()

    def _append_group(self, name: str, batches: Sequence[AuditBatch]) -> None:
        committed = self.publishes_version(name)
        todo = [b for b in batches if committed is None or b.batch_id > committed]
        group: list[AuditBatch] = []
        rows = 0
        sizes = [_table_rows(b, name) for b in todo]
        for i, batch in enumerate(todo):
            group.append(batch)
            rows += sizes[i]
            last = i == len(todo) - 1
            if last or rows + sizes[i + 1] > MAX_COMMIT_ROWS:
                # A commit even when the group has no row: its txn version records the batches.
                self._commit_files(name, group, batch.batch_id)
                group, rows = [], 0

    def _commit_files(self, name: str, group: Sequence[AuditBatch], txn_version: int) -> None:
        """Add the files of ``group`` to table ``name`` in one transaction (``txn_version``),
        writing the files of its driver-routed batches first."""
        table = self._table(name)
        table.update_incremental()
        committed = table.transaction_version(self._publishes_app)
        if committed is not None and committed >= txn_version:
            return  # a re-run: these rows are in the table already
        partitioned = is_partitioned(table, name)
        mark = self.marks.get(name)
        audited = mark.offsets if mark is not None else None
        files: list[AuditFile] = []
        routed: list[pa.Table] = []
        for batch in group:
            where = span_against(batch.start, batch.end, audited)
            if where == "before":  # a restore's repeat: its rows are in the table
                continue
            if isinstance(batch, FileBatch):
                batch_files = batch.table_files(name)
                if where == "across" and audited is not None:  # "across" a mark there is
                    batch_files = self._files_not_audited(name, batch_files, audited,
                                                          batch.batch_id)
                files += batch_files
            else:
                rows = self._rows(name, batch)
                routed.append(rows_not_audited(rows, audited) if where == "across" else rows)
        advanced = self._mark(name)
        for batch in group:
            advanced = advanced.advanced(batch.end, self.router_id, self.ancestors,
                                         batch.snapshot_version)
        if routed:
            rows = pa.concat_tables(routed)
            if not partitioned:  # an earlier version's table: its own columns
                rows = rows.drop_columns([PARTITION_COLUMNS[name]])
            files += write_table_files(
                self._filesystem, f"{self._root}/{name}", name, rows,
                PARTITION_COLUMNS[name] if partitioned else None, f"b{txn_version:010d}-driver")
        table.create_write_transaction(
            [f.add_action() for f in files], mode="append", schema=table.schema(),
            partition_by=[PARTITION_COLUMNS[name]] if partitioned else None,
            commit_properties=CommitProperties(
                custom_metadata=advanced.metadata(),
                app_transactions=[Transaction(self._publishes_app, txn_version)]),
            post_commithook_properties=NO_POST_COMMIT_HOOKS)
        self.marks[name] = advanced
        table.update_incremental()  # the object does not follow its own transaction
        self._reload_if_grown(name, table)

    def _mark(self, name: str) -> AuditedMark:
        """Table ``name``'s mark as this router records it next (its own when it took none)."""
        mark = self.marks.get(name)
        return mark if mark is not None else AuditedMark(self.topic, self.router_id,
                                                         self.ancestors)

    def _files_not_audited(self, name: str, files: list[AuditFile], audited: Mapping[int, int],
                           batch_id: int) -> list[AuditFile]:
        """``files`` of a batch that straddles ``audited``, rewritten without the rows below
        it (only after a restore; the files replaced stay untracked: the vacuum deletes them)."""
        kept: list[AuditFile] = []
        for file in files:
            rows = pq.read_table(f"{self._root}/{name}/{file.path}", filesystem=self._filesystem)
            rows = rows_not_audited(rows, audited)
            if file.partition_column is not None and file.partition_value is not None:
                day = date.fromisoformat(file.partition_value)
                rows = rows.append_column(file.partition_column,
                                          pa.array([day] * rows.num_rows, pa.date32()))
            kept += write_table_files(self._filesystem, f"{self._root}/{name}", name, rows,
                                      file.partition_column, f"b{batch_id:010d}-restored")
        return kept

    def _rows(self, name: str, batch: PublishBatch) -> pa.Table:
        if name == MESSAGES:
            return messages_rows(batch.routed, batch.snapshot_version, batch.batch_id,
                                 batch.routed_at)
        return deliveries_rows(batch.routed, batch.snapshot_version, batch.batch_id,
                               batch.routed_at, self._config.kafka.layout)

    def _append(self, name: str, rows: pa.Table, app_id: str, txn_version: int,
                mark: AuditedMark | None = None, table: DeltaTable | None = None) -> None:
        table = table if table is not None else self._table(name)
        table.update_incremental()
        committed = table.transaction_version(app_id)
        if committed is not None and committed >= txn_version:
            return  # a re-run: these rows are in the table already
        partitioned = is_partitioned(table, name)
        if not partitioned:  # an earlier version's table: its own columns
            rows = rows.drop_columns([PARTITION_COLUMNS[name]])
        # In the table's column order (a column added to an earlier version's table is last).
        rows = rows.select([f.name for f in table.schema().fields if f.name in rows.column_names])
        write_deltalake(
            table, rows, mode="append",
            partition_by=[PARTITION_COLUMNS[name]] if partitioned else None,
            writer_properties=writer_properties(name, rows.num_rows),
            post_commithook_properties=NO_POST_COMMIT_HOOKS,
            commit_properties=CommitProperties(
                custom_metadata=mark.metadata() if mark is not None else None,
                app_transactions=[Transaction(app_id, txn_version)]))
        if mark is not None:
            self.marks[name] = mark
        self._reload_if_grown(name, table)

    def _reload_if_grown(self, name: str, table: DeltaTable) -> None:
        """Drop the object of table ``name`` once it has followed :data:`TABLE_RELOAD_COMMITS`
        versions since it was loaded (its own commits and others', such as the
        maintenance's); the next :meth:`_table` loads a fresh one."""
        with self._lock:
            if table.version() - self._loaded_at.get(name, 0) >= TABLE_RELOAD_COMMITS:
                self._tables.pop(name, None)

    def _table(self, name: str) -> DeltaTable:
        with self._lock:
            table = self._tables.get(name)
            if table is None:
                table = self._tables[name] = DeltaTable(self.path(name),
                                                        storage_options=self._storage)
                self._loaded_at[name] = table.version()
            return table


def _table_rows(batch: AuditBatch, name: str) -> int:
    """The rows ``batch`` adds to publish table ``name``."""
    if isinstance(batch, FileBatch):
        return sum(f.records for f in batch.table_files(name))
    if name == MESSAGES:
        return batch.routed.num_rows
    return pc.sum(pc.list_value_length(batch.routed["deliveries"])).as_py() or 0


def add_missing_columns(table: DeltaTable, name: str) -> None:
    """Add to ``table`` the nullable columns of audit table ``name`` that an earlier version
    created it without (``deliveries.retained``, ``deliveries.replayed``,
    ``subscriptions.retain_handling``, ``subscriptions.retain_as_published``,
    ``messages.alternate_exchange``, ``deliveries.alternate_exchange``); its rows read
    them as null."""
    from deltalake.schema import Field, PrimitiveType

    have = {f.name for f in table.schema().fields}
    missing = [f for f in ARROW_SCHEMAS[name] if f.name not in have and f.nullable]
    if missing:
        types = {pa.bool_(): PrimitiveType("boolean"), pa.int32(): PrimitiveType("integer"),
                 pa.string(): PrimitiveType("string")}
        table.alter.add_columns([Field(f.name, types[f.type], nullable=True) for f in missing])


def is_partitioned(table: DeltaTable, name: str) -> bool:
    """Whether audit table ``name`` has this version's layout (partitioned by its day)."""
    return table.metadata().partition_columns == [PARTITION_COLUMNS[name]]


def _versions(routed: pa.Table, version: int, rows: pa.Array | None = None) -> pa.Array:
    """The snapshot version of each row: ``routed``'s own ``snapshot_version`` column
    (realtime mode routes each publish with the version its executor held,
    :mod:`streaming.realtime.audit`), taken at ``rows`` when given, else ``version``."""
    if ROUTED_VERSION_COLUMN in routed.column_names:
        column = routed[ROUTED_VERSION_COLUMN]
        return (column.take(rows) if rows is not None else column).cast(pa.int64())
    return pa.array([version] * (routed.num_rows if rows is None else len(rows)), pa.int64())


ROUTED_VERSION_COLUMN = "snapshot_version"
"""The optional column of ``ROUTED_PUBLISH`` rows giving each publish's snapshot version."""


def _alternates(routed: pa.Table, rows: pa.Array | None = None) -> pa.Array:
    """Each row's ``alternate_exchange`` (null where ``routed`` has no such column: rows
    that no alternate exchange can route, such as a retained message's)."""
    if "alternate_exchange" in routed.column_names:
        column = routed["alternate_exchange"]
        return column.take(rows) if rows is not None else column
    return pa.nulls(routed.num_rows if rows is None else len(rows), pa.string())


def messages_rows(routed: pa.Table, version: int, batch_id: int, routed_at: datetime) -> pa.Table:
    """One ``messages`` row per publish of ``routed`` (``ROUTED_PUBLISH`` rows, each routed
    with ``version`` unless they carry a ``snapshot_version`` column)."""
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
        "snapshot_version": _versions(routed, version),
        "batch_id": pa.array([batch_id] * n, pa.int64()),
        "published_at": routed["published_at"],
        "alternate_exchange": _alternates(routed),
        "routed_at": pa.array([routed_at] * n, schema.field("routed_at").type),
    }
    columns["routed_date"] = utc_date(columns["routed_at"])
    return pa.table([columns[f.name].cast(f.type) for f in schema], schema=schema)


def deliveries_rows(routed: pa.Table, version: int, batch_id: int, routed_at: datetime,
                    layout: DeliveryLayout, retained: bool = False,
                    replayed: bool = False) -> pa.Table:
    """One ``deliveries`` row per (publish, subscriber) acknowledged in ``routed``, each with
    the topic ``layout`` wrote it to (``retained``: a topic's retained message delivered
    when a subscription was applied, streaming.router.retained; ``replayed``: made by a
    replay, streaming.router.replay.replay)."""
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
        "delivery_topic": layout.topic_column(subscriber),
        "snapshot_version": _versions(routed, version, owner),
        "batch_id": pa.array([batch_id] * n, pa.int64()),
        "published_at": routed["published_at"].take(owner),
        "retained": pa.array([retained] * n, pa.bool_()),
        "replayed": pa.array([replayed] * n, pa.bool_()),
        "alternate_exchange": _alternates(routed, owner),
        "routed_at": pa.array([routed_at] * n, schema.field("routed_at").type),
    }
    columns["routed_date"] = utc_date(columns["routed_at"])
    return pa.table([columns[f.name].cast(f.type) for f in schema], schema=schema)

"""``bitroute audit migrate``: audit tables of an earlier layout rewritten as partitioned by day.

A table created before the tables were partitioned (no ``routed_date`` /
``applied_date`` column, no partitions) keeps working as it is; this rewrites
it in place, once, on request: every row read and written again with its date
column, partitioned by it (:data:`schemas.records.PARTITION_COLUMNS`), in one
Delta commit (an overwrite that also changes the schema and the partitioning).
The table's history stays (earlier versions remain readable by time travel
until the maintenance's file retention removes their files) and so do its ``txn``
application versions, so a batch re-run after the migration still adds no
row. A table in this version's layout is left alone ("already partitioned").

With the router stopped: :func:`migrate` runs under the state folder's router
lock (:mod:`streaming.state.lock`) and refuses while a router holds it, or holds
the lease of the publishes topic and warehouse (:mod:`streaming.state.lease`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError

from schemas.records import PARTITION_COLUMNS, PARTITION_SOURCES
from schemas.tables import utc_date
from streaming.audit.errors import MigrationError
from streaming.audit.properties import writer_properties
from streaming.audit.queries import arrow_table
from streaming.audit.storage import StorageOptions, check_commit_safety, storage_options
from streaming.audit.writer import (
    ARROW_SCHEMAS,
    NO_POST_COMMIT_HOOKS,
    is_partitioned,
)
from streaming.config import Config
from streaming.errors import one_line
from streaming.state.lock import RouterLock

PROGRESS_EVERY_ROWS = 1_000_000


@dataclass(frozen=True)
class Migrated:
    """What :func:`migrate` did to one table: ``result`` is ``migrated``,
    ``already partitioned`` or ``missing``; ``version`` the table's version after."""

    table: str
    path: str
    result: str
    rows: int = 0
    version: int | None = None


def migrate(config: Config, progress: Callable[[str], None] = lambda _: None) -> list[Migrated]:
    """Migrate every audit table of ``config`` that needs it, under the router lock
    (:class:`streaming.state.lock.RouterLockedError` while a router runs)."""
    from streaming.state.lease import ensure_free

    storage = storage_options(config.delta)
    check_commit_safety(config.delta)
    with RouterLock(config.streaming.checkpoint_dir):
        ensure_free(config)  # a router of another checkpoint folder, on any host
        return [migrate_table(config.delta.table_path(name), name, progress, storage)
                for name in ARROW_SCHEMAS]


def migrate_table(path: str, name: str, progress: Callable[[str], None],
                  storage: StorageOptions | None = None) -> Migrated:
    """Rewrite audit table ``name`` at ``path`` partitioned by day, in one commit."""
    try:
        if not DeltaTable.is_deltatable(path, storage_options=storage):
            return Migrated(name, path, "missing")
        table = DeltaTable(path, storage_options=storage)
    except (DeltaError, OSError) as exc:
        raise MigrationError(f"{path}: {one_line(exc)}") from None
    if is_partitioned(table, name):
        return Migrated(name, path, "already partitioned", version=table.version())
    day = PARTITION_COLUMNS[name]
    target = ARROW_SCHEMAS[name]
    before = pa.schema([f for f in target if f.name != day])
    found = pa.schema(table.schema().to_arrow())
    # Nullable columns a later version added (alternate_exchange, ...) may be missing, or
    # appended at the end by the router's add_missing_columns: read as null, in order.
    added = [f for f in before if f.nullable and f.name not in found.names]
    if (sorted(found.names) != sorted(set(before.names) - {f.name for f in added})
            or table.metadata().partition_columns):
        raise MigrationError(f"{path}: the {name} table has columns {found.names} partitioned "
                             f"by {table.metadata().partition_columns}: not a bitroute layout "
                             "this version can migrate")
    total = _rows(table)
    progress(f"{name}: reading {total:,} rows of {path}")
    try:
        # Read whole before writing: delta-rs cannot read a table while it writes one
        # (one async runtime), so the migration needs memory for the table's rows.
        rows = table.to_pyarrow_table()
    except (DeltaError, OSError) as exc:
        raise MigrationError(f"{path}: {one_line(exc)}") from None
    progress(f"{name}: rewriting {rows.num_rows:,} rows partitioned by {day}")
    written = [0]

    def batches() -> Iterator[pa.RecordBatch]:
        source = PARTITION_SOURCES[day]
        for batch in rows.to_batches(max_chunksize=100_000):
            batch = pa.Table.from_batches([batch])
            for field in added:
                batch = batch.append_column(field, pa.nulls(batch.num_rows, field.type))
            batch = batch.select(before.names).cast(before)
            batch = batch.append_column(target.field(day), utc_date(batch[source]))
            yield from batch.to_batches()
            step = written[0] // PROGRESS_EVERY_ROWS
            written[0] += batch.num_rows
            if written[0] // PROGRESS_EVERY_ROWS > step:
                progress(f"{name}: {written[0]:,} of {rows.num_rows:,} rows")

    try:
        write_deltalake(table, pa.RecordBatchReader.from_batches(target, batches()),
                        mode="overwrite", schema_mode="overwrite", partition_by=[day],
                        writer_properties=writer_properties(name),  # full row groups
                        post_commithook_properties=NO_POST_COMMIT_HOOKS)
        version = DeltaTable(path, storage_options=storage).version()
    except (DeltaError, OSError) as exc:
        raise MigrationError(f"{path}: {one_line(exc)}") from None
    progress(f"{name}: {written[0]:,} rows migrated (Delta version {version})")
    return Migrated(name, path, "migrated", written[0], version)


def _rows(table: DeltaTable) -> int:
    try:
        counts = arrow_table(table.get_add_actions(flatten=True)).column("num_records")
        return sum(int(n) for n in counts.to_pylist() if n is not None)
    except (KeyError, DeltaError):
        return 0

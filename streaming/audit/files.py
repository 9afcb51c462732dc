"""Audit files: audit rows written as Parquet files into their table's folder, committed later.

Whoever routes a batch writes its audit files: a routing task on an executor
writes the ``messages`` and ``deliveries`` rows of the publishes it routed,
after Kafka acknowledged their deliveries, and hands back only the files'
:class:`AuditFile` records (a few hundred bytes each); the driver journals
those and the committer adds them to the tables in its group rounds
(``create_write_transaction`` with :meth:`AuditFile.add_action`, one
transaction per table, its ``txn`` version the group's highest batch id). A
batch routed in the driver has its rows journaled instead, and the committer
writes their files itself with the same function, so every file of a table
has one layout: this module's.

Contracts:

- :func:`write_table_files` returns only after every file is complete and
  durable (local files fsynced with their folder; an object store's PUT is
  durable when it returns). A file's name is unique (the writer's label plus a
  random part), so attempts of one task never overwrite each other's files.
- A file is part of a table only once a commit adds it. The files of a task
  attempt whose result Spark discarded (a failure, a retry, speculation) or of
  a batch the driver never journaled (a crash) are never added: they are
  untracked, and the maintenance's full vacuum deletes them once they are older
  than ``audit.file_retention``.
- The writer properties are the tables' (:func:`parquet_options`, matching
  :func:`streaming.audit.properties.writer_properties` for delta-rs rewrites):
  Snappy, row groups of :data:`ROW_GROUP_ROWS`, a bloom filter on
  ``message_id`` for the publish tables, column statistics; the Delta
  statistics of each file (:func:`delta_stats`) are taken from its rows.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.transaction import AddAction
from pyarrow import fs

from schemas.tables import AUDIT_FILE, arrow_schema
from streaming.atomic import sync_folder

ROW_GROUP_ROWS = 131_072
"""Rows per Parquet row group of the audit tables' files."""

BLOOM_FILTER_FPP = 0.01
"""False-positive rate of the bloom filter on ``message_id``."""

BLOOM_FILTER_TABLES = ("messages", "deliveries")
"""The tables whose files carry a bloom filter on ``message_id``."""

AUDIT_FILE_ARROW = pa.struct(list(arrow_schema(AUDIT_FILE)))
"""One :class:`AuditFile` as an Arrow struct (what tasks return and the journal keeps)."""

_STATS_TYPES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_integer,
                pa.types.is_timestamp, pa.types.is_boolean)


@dataclass(frozen=True)
class AuditFile:
    """One Parquet file written into an audit table's folder, not yet committed.

    ``path`` is relative to the table's folder (``routed_date=2026-11-26/part-...``);
    ``partition_column``/``partition_value`` are None for a table without partitions.
    """

    table: str
    path: str
    size: int
    partition_column: str | None
    partition_value: str | None
    records: int
    modification_time: int
    stats: str

    def add_action(self) -> AddAction:
        """The Delta ``add`` action that makes this file part of its table."""
        values = {} if self.partition_column is None else {self.partition_column:
                                                            self.partition_value}
        return AddAction(self.path, self.size, values, self.modification_time, True, self.stats)

    def as_row(self) -> dict:
        return {name: getattr(self, name) for name in AUDIT_FILE_ARROW.names}


def audit_files(rows: pa.Array | pa.ChunkedArray | pa.Table) -> list[AuditFile]:
    """The :class:`AuditFile` records of an Arrow array of :data:`AUDIT_FILE_ARROW` structs
    (or a table with those columns)."""
    return [AuditFile(**record) for record in rows.to_pylist()]


def parquet_options(table: str, rows: int) -> dict:
    """``pyarrow.parquet.write_table`` options of a file of ``rows`` rows of ``table``."""
    options: dict = {"compression": "snappy", "row_group_size": ROW_GROUP_ROWS,
                     "write_statistics": True}
    if table in BLOOM_FILTER_TABLES:
        ndv = max(1, min(ROW_GROUP_ROWS, rows))
        options["bloom_filter_options"] = {"message_id": {"ndv": ndv, "fpp": BLOOM_FILTER_FPP}}
    return options


def write_table_files(filesystem: fs.FileSystem, table_dir: str, table: str, rows: pa.Table,
                      partition_column: str | None, label: str) -> list[AuditFile]:
    """Write ``rows`` (the table's columns, the partition column last when partitioned)
    as one file per partition value under ``table_dir``; return their records.

    ``label`` names the writer in the file names (``b<batch>-t<task>-a<attempt>``).
    Nothing is written for no rows.
    """
    if not rows.num_rows:
        return []
    if partition_column is None:
        return [_write_file(filesystem, table_dir, table, rows, None, None, label)]
    written = []
    days = rows[partition_column]
    values = pc.unique(days)
    for day in values.to_pylist():
        part = rows if len(values) == 1 else rows.filter(pc.equal(days, pa.scalar(day, days.type)))
        written.append(_write_file(filesystem, table_dir, table, part.drop_columns(
            [partition_column]), partition_column, _partition_text(day), label))
    return written


def _partition_text(value: object) -> str:
    return value.isoformat() if isinstance(value, date) else str(value)


def _write_file(filesystem: fs.FileSystem, table_dir: str, table: str, rows: pa.Table,
                partition_column: str | None, partition_value: str | None,
                label: str) -> AuditFile:
    folder = "" if partition_column is None else f"{partition_column}={partition_value}/"
    relative = f"{folder}part-{label}-{uuid.uuid4().hex}.snappy.parquet"
    path = f"{table_dir}/{relative}"
    options = parquet_options(table, rows.num_rows)
    if isinstance(filesystem, fs.LocalFileSystem):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as file:
            pq.write_table(rows, file, **options)
            file.flush()
            os.fsync(file.fileno())
        sync_folder(os.path.dirname(path))
        size = os.path.getsize(path)
    else:
        with filesystem.open_output_stream(path) as stream:
            pq.write_table(rows, stream, **options)
            size = stream.tell()
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    return AuditFile(table, relative, size, partition_column, partition_value, rows.num_rows,
                     now_ms, delta_stats(rows))


def delta_stats(rows: pa.Table) -> str:
    """The Delta ``stats`` JSON of a file holding ``rows``: its record count, and the
    minimum, maximum and null count of each top-level string, integer, boolean and
    timestamp column (nested columns have none, as delta-rs writes them).

    Timestamps are written in milliseconds, as the Delta protocol has them: the
    minimum rounded down and the maximum rounded up, so that data skipping never
    drops a file holding a row it asks for.
    """
    minimum: dict[str, object] = {}
    maximum: dict[str, object] = {}
    nulls: dict[str, int] = {}
    for field in rows.schema:
        if not any(test(field.type) for test in _STATS_TYPES):
            continue
        column = rows[field.name]
        nulls[field.name] = column.null_count
        if column.null_count == len(column):
            continue
        bounds = pc.min_max(column)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if pa.types.is_timestamp(field.type):
            low, high = _millis(low, up=False), _millis(high, up=True)
        minimum[field.name], maximum[field.name] = low, high
    return json.dumps({"numRecords": rows.num_rows, "minValues": minimum,
                       "maxValues": maximum, "nullCount": nulls}, separators=(",", ":"))


def _millis(moment: datetime, up: bool) -> str:
    """``moment`` in UTC to the millisecond, rounded down, or up when ``up``."""
    micros = moment.microsecond % 1000
    moment = moment - timedelta(microseconds=micros)
    if up and micros:
        moment += timedelta(milliseconds=1)
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment.isoformat(timespec="milliseconds") + "Z"

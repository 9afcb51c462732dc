"""Queries over the Delta audit tables: who got which message, and the subscriptions when.

The tables (``deliveries``, ``messages``, ``subscriptions``; schemas in
:mod:`schemas.tables`) live at ``config.delta.table_path(name)``. A query
selects one table, optionally as of a Delta table version (time travel),
filters it and orders it:

- ``subscriber`` (deliveries, subscriptions) and ``message_id`` (deliveries,
  messages) are equality filters;
- ``since`` (inclusive) and ``until`` (exclusive) bound the table's time
  column: ``routed_at`` for deliveries and messages, ``applied_at`` for
  subscriptions;
- ``state`` (subscriptions only) reduces the changes to the subscriptions in
  force: per subscription id its latest applied change (highest snapshot
  version, then changelog offset; rejected changes change nothing), kept when
  it is an upsert. With ``until`` it is the state at that time, with
  ``as_of_version`` the state the table recorded at that Delta version; the
  ``subscriber`` filter applies after the reduction.

Rows come back ordered by :data:`ORDER_COLUMNS`, as JSON-ready dicts in the
table's column order, timestamps as ISO-8601 strings in UTC
(``2025-01-31T12:00:00.000000Z``), arrays as lists and maps as objects.

On a table partitioned by day (``routed_date``/``applied_date``, the UTC
date of the time column: every table this version creates), ``since`` and
``until`` also bound the date column, so the scan reads only the files of the
days in range. The date column is not part of a query's output: rows have the
columns they had before the tables were partitioned.

The tables are read with delta-rs (the ``deltalake`` package: its DataFusion
SQL scan applies the filters), reduced and sorted with Arrow compute: no JVM
and no Spark, so a query answers in about a second (docs/audit.md). Tables
written by Spark (bitroute before delta-rs wrote them) and by delta-rs read
the same.

Errors are :class:`AuditError` (no table, no such version, storage that
cannot be reached, a table delta-rs cannot read) and its subclass :class:`InvalidQuery` (a filter that does not
apply, a malformed timestamp).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import DeltaError

from schemas.records import (
    CHANGE_REJECTED,
    CHANGE_UPSERT,
    DELIVERIES,
    MESSAGES,
    MESSAGE_ID_PATTERN,
    PARTITION_COLUMNS,
    SUBSCRIPTIONS,
)
from streaming.audit.storage import StorageError, StorageOptions, storage_options
from streaming.config import Config
from streaming.errors import BitrouteError

TIME_COLUMNS = {DELIVERIES: "routed_at", MESSAGES: "routed_at", SUBSCRIPTIONS: "applied_at"}
"""The time column of each audit table, bounded by ``since`` and ``until``."""

ORDER_COLUMNS = {
    "deliveries": ("routed_at", "message_id", "subscriber"),
    "messages": ("routed_at", "message_id"),
    "subscriptions": ("snapshot_version", "changelog_partition", "changelog_offset"),
}
"""Row order; message ids sort by topic, then partition and offset as numbers (parsed
with :data:`schemas.records.MESSAGE_ID_PATTERN`); an id of another shape sorts as
(id, -1, -1)."""
_FILTER_TABLES = {"subscriber": ("deliveries", "subscriptions"),
                  "message_id": ("deliveries", "messages")}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
"""strftime of Arrow: ``%S`` of a microsecond timestamp prints ``SS.ffffff``."""


class AuditError(BitrouteError):
    """An audit query cannot run: the table or the version is missing, or unreadable."""


class InvalidQuery(AuditError):
    """The query's arguments are wrong (a filter that does not apply to the table, a bad time)."""


@dataclass(frozen=True)
class AuditQuery:
    """What to read; see the module docstring for the meaning of each field."""

    table: str
    subscriber: str | None = None
    message_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    as_of_version: int | None = None
    state: bool = False

    def __post_init__(self) -> None:
        if self.table not in TIME_COLUMNS:
            raise InvalidQuery(f"unknown audit table {self.table!r}: expected one of "
                               f"{', '.join(TIME_COLUMNS)}")
        for name, tables in _FILTER_TABLES.items():
            if getattr(self, name) is not None and self.table not in tables:
                flag = "--" + name.replace("_", "-")
                raise InvalidQuery(f"{flag} does not apply to the {self.table} table "
                                   f"(it applies to {' and '.join(tables)})")
        if self.state and self.table != "subscriptions":
            raise InvalidQuery("--state applies to the subscriptions table only")
        if self.state and self.since is not None:
            raise InvalidQuery("--since does not apply to --state (the state at --until "
                               "takes every earlier change into account)")
        if self.as_of_version is not None and self.as_of_version < 0:
            raise InvalidQuery(f"--as-of-version must be >= 0, got {self.as_of_version}")


def run(config: Config, query: AuditQuery) -> tuple[list[str], list[dict[str, object]]]:
    """The query's column names and rows (see module docstring)."""
    path = config.delta.table_path(query.table)
    try:
        storage = storage_options(config.delta)
    except StorageError as exc:
        raise AuditError(str(exc)) from None
    table = _read(path, query, storage)  # ordered by DataFusion, but under state
    if query.state:
        table = _in_force(table)
        if query.subscriber is not None:
            table = table.filter(pc.field("subscriber") == query.subscriber)
        keys = _order_keys(table, query.table)
        table = table.take(pc.sort_indices(keys, [(k, "ascending") for k in keys.column_names]))
    return table.column_names, _json_rows(table)


def _read(path: str, query: AuditQuery, storage: StorageOptions | None = None) -> pa.Table:
    """The rows of the table at ``path`` (as of ``query.as_of_version``) that pass the
    query's filters, but for ``subscriber`` under ``state``, which applies after the
    reduction.

    delta-rs's own reader (DataFusion SQL) scans the table: it reads what Spark
    writes as well (deletion vectors, column mapping, checkpoints), skips files
    and row groups whose statistics rule the filters out, and returns the
    table's Arrow types (strings as ``string``, not DataFusion's ``string_view``).
    """
    try:
        found = DeltaTable.is_deltatable(path, storage_options=storage)
    except OSError as exc:  # storage unreachable: a URI's host, credentials
        raise AuditError(f"{path}: {_one_line(exc)}") from None
    if not found:
        raise AuditError(f"no audit table at {path}: has the router run?")
    try:
        delta = DeltaTable(path, version=query.as_of_version, storage_options=storage)
    except DeltaError as exc:
        if query.as_of_version is not None:
            latest = DeltaTable(path, storage_options=storage).version()
            if query.as_of_version > latest:
                raise AuditError(f"{path}: no Delta version {query.as_of_version} "
                                 f"(the latest is {latest})") from None
        raise AuditError(f"{path}: {_one_line(exc)}") from None

    schema = pa.schema(delta.schema().to_arrow())
    day = PARTITION_COLUMNS[query.table]
    partitioned = delta.metadata().partition_columns == [day]
    columns = [name for name in schema.names if name != day]
    sql = (f"SELECT {', '.join(map(_name, columns))} FROM {_name(query.table)}"
           + "".join(f"{' WHERE' if i == 0 else ' AND'} {c}"
                     for i, c in enumerate(conditions(query, partitioned)))
           + ("" if query.state else _order_by(query.table)))
    try:
        rows = arrow_table(QueryBuilder().register(query.table, delta).execute(sql))
    except (DeltaError, OSError, pa.ArrowException) as exc:
        if query.as_of_version is not None and "not found" in str(exc):
            raise AuditError(f"{path}: version {query.as_of_version}'s files were vacuumed "
                             "(audit.file_retention); time travel reaches back only that "
                             "far") from None
        raise AuditError(f"{path}: {_one_line(exc)}") from None
    return rows.cast(pa.schema([schema.field(name) for name in columns]))


def _order_by(table: str) -> str:
    """``ORDER BY`` :data:`ORDER_COLUMNS` in DataFusion SQL, a message id as (topic,
    partition, offset) numbers and an id of another shape as (id, -1, -1), like
    :func:`_order_keys`. Sorting in the scan rather than with Arrow compute keeps
    a query from converting Python values to Arrow, which imports pandas
    (0.4-0.7 s of a short command's time)."""
    keys = []
    for column in ORDER_COLUMNS[table]:
        name = _name(column)
        if column != "message_id":
            keys.append(name)
            continue
        parts = f"regexp_match({name}, {_text(MESSAGE_ID_PATTERN)})"
        keys += [f"coalesce({parts}[1], {name})",
                 f"coalesce(CAST({parts}[2] AS BIGINT), -1)",
                 f"coalesce(CAST({parts}[3] AS BIGINT), -1)"]
    return " ORDER BY " + ", ".join(keys)


def conditions(query: AuditQuery, partitioned: bool) -> list[str]:
    """The SQL conditions of ``query``'s filters (``subscriber`` but under ``state``);
    on a ``partitioned`` table a time bound adds its day bound, which DataFusion
    applies to the partition values, so the files of other days are not read."""
    time = TIME_COLUMNS[query.table]
    day = _name(PARTITION_COLUMNS[query.table])
    found = []
    if query.since is not None:
        found.append(f"{_name(time)} >= {_timestamp(query.since)}")
        if partitioned:
            found.append(f"{day} >= {_date(query.since)}")
    if query.until is not None:
        found.append(f"{_name(time)} < {_timestamp(query.until)}")
        if partitioned:  # until is exclusive, its own day may still hold earlier rows
            found.append(f"{day} <= {_date(query.until)}")
    if query.message_id is not None:
        found.append(f"{_name('message_id')} = {_text(query.message_id)}")
    if query.subscriber is not None and not query.state:
        found.append(f"{_name('subscriber')} = {_text(query.subscriber)}")
    return found


def arrow_table(data: object) -> pa.Table:
    """A pyarrow Table of what delta-rs returns (arro3 objects: a stream, or one batch).

    ``pa.table(data)`` asks first whether ``data`` is a pandas DataFrame, which
    imports pandas: 0.4-0.7 s of every short-lived command's time (measured
    on ``bitroute audit``). Reading the Arrow PyCapsule interface directly
    imports nothing.
    """
    if hasattr(data, "__arrow_c_stream__"):
        return pa.RecordBatchReader.from_stream(data).read_all()
    return pa.Table.from_batches([pa.record_batch(data)])


def _name(identifier: str) -> str:
    """A column or table name in DataFusion SQL (unquoted names are lowercased)."""
    return '"' + identifier.replace('"', '""') + '"'


def _text(value: str) -> str:
    """A string literal in DataFusion SQL: quotes doubled, backslashes are plain characters."""
    return "'" + value.replace("'", "''") + "'"


def _timestamp(moment: datetime) -> str:
    """An aware datetime as a literal of Delta's timestamp type (microseconds, UTC): the
    whole range of ``datetime`` fits, unlike DataFusion's nanosecond ``TIMESTAMP``."""
    return f"""arrow_cast('{moment.isoformat()}', 'Timestamp(Microsecond, Some("UTC"))')"""


def _date(moment: datetime) -> str:
    """The UTC date of an aware datetime as a DataFusion ``DATE`` literal."""
    return f"DATE '{moment.astimezone(timezone.utc).date().isoformat()}'"


def _in_force(changes: pa.Table) -> pa.Table:
    """Per subscription id its latest applied change, when that is an upsert."""
    applied = changes.filter(pc.field("change") != CHANGE_REJECTED)
    applied = applied.take(pc.sort_indices(applied, [("subscription_id", "ascending"),
                                                     ("snapshot_version", "descending"),
                                                     ("changelog_offset", "descending")]))
    ids = applied["subscription_id"].combine_chunks()
    # The first row of each run of one id is its latest change.
    first = pa.concat_arrays([pa.array([True] if len(ids) else [], pa.bool_()),
                              pc.not_equal(ids[1:], ids[:-1])])
    latest = applied.filter(first)
    return latest.filter(pc.field("change") == CHANGE_UPSERT)


def _order_keys(table: pa.Table, name: str) -> pa.Table:
    """The sort keys of ``table``'s rows, most significant first: its order columns, a
    message id as (topic, partition, offset) so that ``t/0/2`` comes before ``t/0/10``."""
    keys = {}
    for column in ORDER_COLUMNS[name]:
        if column != "message_id":
            keys[column] = table[column]
            continue
        ids = table[column]
        parts = pc.extract_regex(ids, MESSAGE_ID_PATTERN)
        matched = pc.is_valid(parts)

        def number(field: str) -> pa.ChunkedArray:
            digits = pc.if_else(matched, pc.struct_field(parts, field), "-1")
            return pc.cast(digits, pa.int64())

        keys[column] = pc.if_else(matched, pc.struct_field(parts, "topic"), ids)
        keys[f"{column}.partition"] = number("partition")
        keys[f"{column}.offset"] = number("offset")
    return pa.table(keys)


def _json_rows(table: pa.Table) -> list[dict[str, object]]:
    """``table``'s rows as dicts of JSON values (see module docstring)."""
    columns = []
    for column in table.columns:
        kind = column.type
        if pa.types.is_timestamp(kind):  # Delta's timestamp: microseconds, UTC
            columns.append(pc.strftime(column, _TIME_FORMAT).to_pylist())
        elif pa.types.is_map(kind):
            columns.append([None if v is None else dict(v) for v in column.to_pylist()])
        else:
            columns.append(column.to_pylist())
    names = table.column_names
    return [dict(zip(names, values)) for values in zip(*columns)]


def _one_line(exc: BaseException) -> str:
    """delta-rs's message, a chain of causes on indented ``↳`` lines in colour, as one line."""
    lines = (line.strip().lstrip("↳").strip() for line in _ANSI.sub("", str(exc)).splitlines())
    return ": ".join(line for line in lines if line) or type(exc).__name__

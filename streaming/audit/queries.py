"""Queries over the Delta audit tables: who got which message, and the subscriptions when.

The tables (``deliveries``, ``messages``, ``subscriptions``; schemas in
:mod:`schemas.tables`) live at ``config.delta.table_path(name)``. A query
selects one table, optionally as of a Delta table version (time travel),
filters it and orders it:

- ``subscriber`` (deliveries, subscriptions) and ``message_id`` (deliveries,
  messages) are equality filters;
- ``replayed`` and ``retained`` (deliveries) keep the deliveries a replay made
  (``subscribe --since``) and those of retained messages made when a subscription
  was applied (rows older than the columns, where they are null, are neither);
- ``since`` (inclusive) and ``until`` (exclusive) bound the table's time
  column: ``routed_at`` for deliveries and messages, ``applied_at`` for
  subscriptions;
- ``state`` (subscriptions only) reduces the changes to the subscriptions in
  force: per subscription id its latest applied change (highest snapshot
  version, then changelog offset; rejected changes change nothing), kept when
  it is an upsert. With ``until`` it is the state at that time, with
  ``as_of_version`` the state the table recorded at that Delta version; the
  ``subscriber`` filter applies after the reduction.

Rows come back ordered by :data:`ORDER_COLUMNS`: :func:`read` streams them as
Arrow record batches, read a time window at a time so that the first rows
come before the last are read, and ``limit`` keeps the newest rows, read from
the newest files back; :func:`run` collects them as JSON-ready dicts in the
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

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import DeltaError

from schemas.records import (
    CHANGE_REJECTED,
    CHANGE_UPSERT,
    DELIVERIES,
    MESSAGE_ID_PATTERN,
    MESSAGES,
    PARTITION_COLUMNS,
    SUBSCRIPTIONS,
)
from streaming.audit.errors import AuditError, InvalidQuery
from streaming.audit.storage import StorageError, StorageOptions, storage_options, warehouse_filesystem
from streaming.config import Config
from streaming.errors import one_line

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
_MARK_FILTERS = ("replayed", "retained")
"""The deliveries' boolean mark columns a query may keep only the true rows of."""
_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
"""strftime of Arrow: ``%S`` of a microsecond timestamp prints ``SS.ffffff``."""


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
    replayed: bool = False
    retained: bool = False

    def __post_init__(self) -> None:
        if self.table not in TIME_COLUMNS:
            raise InvalidQuery(f"unknown audit table {self.table!r}: expected one of "
                               f"{', '.join(TIME_COLUMNS)}")
        for flag in _MARK_FILTERS:
            if getattr(self, flag) and self.table != DELIVERIES:
                raise InvalidQuery(f"--{flag} applies to the deliveries table only")
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


@dataclass(frozen=True)
class Answer:
    """A query's answer as it is read: its column names, and its rows as Arrow record
    batches in the query's order (:data:`ORDER_COLUMNS`), each batch produced when the
    part of the table holding it has been read (the first batch does not wait for
    the last), in the table's Arrow types (timestamps as microseconds in UTC)."""

    schema: pa.Schema
    batches: Iterator[pa.RecordBatch]

    @property
    def columns(self) -> list[str]:
        return self.schema.names


def read(config: Config, query: AuditQuery, limit: int | None = None) -> Answer:
    """The query's answer, streamed (see :class:`Answer`); with ``limit``, only the newest
    ``limit`` rows in the query's order (still oldest first), read from the newest
    part of the table back until they are found.

    The table is opened and the plan made before this returns (so a missing
    table or version raises here); a part of the table that cannot be read
    raises :class:`AuditError` from the iteration.

    How it streams: a deliveries or messages query (but for ``message_id``,
    whose answer is small) is split into time windows planned from the Delta
    log's per-file statistics of the time column: files whose time ranges
    overlap share a window, and consecutive files are joined until a window
    holds :data:`FIRST_WINDOW_ROWS` rows of the table or :data:`FIRST_WINDOW_FILES`
    files, both growing :data:`WINDOW_GROWTH` times window after window up to
    :data:`MAX_WINDOW_ROWS` and :data:`MAX_WINDOW_FILES` (a compacted file counts
    as its row groups: :func:`_windows`). Each window is one DataFusion query,
    sorted with Arrow, whose time (and day) bounds prune the files of other
    windows, so a window's rows are in order among themselves and after every
    earlier window's. The first rows therefore come after one small window's
    read, whatever the answer's size; a window is as large as the largest
    group of overlapping files.
    """
    if limit is not None and limit < 1:
        raise InvalidQuery(f"--limit must be >= 1, got {limit}")
    path = config.delta.table_path(query.table)
    try:
        storage = storage_options(config.delta)
    except StorageError as exc:
        raise AuditError(str(exc)) from None
    delta = _open(path, query, storage)
    schema = pa.schema(delta.schema().to_arrow())
    day = PARTITION_COLUMNS[query.table]
    partitioned = delta.metadata().partition_columns == [day]
    columns = [name for name in schema.names if name != day]
    output = pa.schema([schema.field(name) for name in columns])
    if query.state:
        return Answer(output, _state_batches(path, delta, query, columns, output, partitioned,
                                             limit))
    windows = _windows(delta, query, newest_first=limit is not None,
                       footer=lambda file: _footer(config, query.table, file))
    batches: Iterator[pa.RecordBatch]
    if limit is None:
        batches = (batch for window in windows
                   for batch in _batches(_scan(path, delta, query, columns, output,
                                               partitioned, window)))
    else:
        batches = _newest(path, delta, query, columns, output, partitioned, windows, limit)
    return Answer(output, batches)


def run(config: Config, query: AuditQuery,
        limit: int | None = None) -> tuple[list[str], list[dict[str, object]]]:
    """The query's column names and rows, collected (see module docstring); :func:`read`
    streams them."""
    answer = read(config, query, limit)
    table = pa.Table.from_batches(list(answer.batches), answer.schema)
    return answer.columns, _json_rows(table)


FIRST_WINDOW_ROWS = 65_536
"""Table rows (every subscriber's) of a query's first time window: small, so that the
first rows are on screen quickly."""
MAX_WINDOW_ROWS = 1_048_576
"""Table rows of the largest time window: large, so that the per-query cost of a window
(planning, file pruning over the log) is paid rarely, and small enough that a window's
answer, held to be sorted, stays within a few hundred MB when no filter drops a row."""
FIRST_WINDOW_FILES = 64
"""Files of a query's first time window: a file costs about half a millisecond to open
and read however few its rows, and a router on small batches writes thousands."""
MAX_WINDOW_FILES = 4_096
"""Files of the largest time window."""
WINDOW_GROWTH = 4
"""Each window's budgets are this many times the previous one's: a window's query costs
about 0.1 s of planning over a log of 2,000 files, so few windows, growing fast."""
_STATS_PAD_US = 1_000
"""Delta statistics of timestamps may be truncated to milliseconds (Spark writes them
so): a file's rows may lie up to 1 ms after its recorded maximum."""

Window = tuple[int | None, int | None]
"""A time window of a query: [lower, upper) in microseconds since the epoch (None: open)."""


def _windows(delta: DeltaTable, query: AuditQuery, newest_first: bool,
             footer: Callable[[str], Any] | None = None) -> list[Window]:
    """The time windows of ``query`` over ``delta``'s files, oldest first (see :func:`read`);
    joined from the newest file back when ``newest_first`` (a ``--limit``, which reads
    from the newest window back).

    A file of more than :data:`FIRST_WINDOW_ROWS` rows (a compacted one) counts as
    its row groups, each with its own time range, when ``footer(path)`` gives its
    Parquet metadata: DataFusion skips the row groups outside a window's bounds,
    so that a day compacted in time order is read a row group at a time."""
    whole: list[Window] = [(None, None)]
    if query.table == SUBSCRIPTIONS or query.message_id is not None:
        return whole
    time = TIME_COLUMNS[query.table]
    actions = arrow_table(delta.get_add_actions(flatten=True))
    names = actions.column_names
    if f"min.{time}" not in names or f"max.{time}" not in names or not actions.num_rows:
        return whole
    low = actions[f"min.{time}"].cast(pa.int64())
    high = actions[f"max.{time}"].cast(pa.int64())
    if low.null_count or high.null_count:  # a file without statistics: no plan
        return whole
    since = None if query.since is None else _micros(query.since)
    until = None if query.until is None else _micros(query.until)
    units = []
    for path, lo, hi, rows in zip(actions["path"].to_pylist(), low.to_pylist(),
                                  high.to_pylist(), actions["num_records"].to_pylist(), strict=True):
        parts = None
        if footer is not None and (rows or 0) > FIRST_WINDOW_ROWS:
            parts = _row_groups(footer, path, time)
        units += parts or [(lo, hi, rows or 0)]
    files = sorted(
        (lo, hi, rows) for lo, hi, rows in units
        if (since is None or hi + _STATS_PAD_US > since) and (until is None or lo < until))
    # Files (and row groups) whose time ranges overlap, each group's [start, last, rows,
    # files]. Each window's query bounds its rows by time, not its files: a boundary
    # inside a unit's range costs a second read of that unit, never a row. So a unit
    # that overlaps the group only at its edge (less than half of its own range: a
    # micro-batch cut between two row groups, compaction's bins in loose time order)
    # starts a new group, and one that overlaps more joins it (else a unit spanning a
    # day would be read by every window).
    groups: list[list[int]] = []
    for lo, hi, rows in files:
        if groups and 2 * (groups[-1][1] - lo) >= max(hi - lo, 1):
            groups[-1][1] = max(groups[-1][1], hi)
            groups[-1][2] += rows
            groups[-1][3] += 1
        else:
            groups.append([lo, hi, rows, 1])
    if newest_first:
        groups.reverse()
    starts: list[int] = []  # each window's first group, in reading order
    rows_budget, files_budget = FIRST_WINDOW_ROWS, FIRST_WINDOW_FILES
    held_rows = held_files = 0
    for i, (_, _, rows, count) in enumerate(groups):
        if not starts or held_rows >= rows_budget or held_files >= files_budget:
            if starts:
                rows_budget = min(WINDOW_GROWTH * rows_budget, MAX_WINDOW_ROWS)
                files_budget = min(WINDOW_GROWTH * files_budget, MAX_WINDOW_FILES)
            starts.append(i)
            held_rows = held_files = 0
        held_rows += rows
        held_files += count
    if newest_first:  # each window but the oldest begins (in time) at its oldest group
        bounds = [groups[i - 1][0] for i in starts[1:]]
    else:
        bounds = [groups[i][0] for i in starts[1:]]
    # On whole milliseconds: a file whose statistics were truncated to milliseconds
    # (Spark's) is then never pruned from the window that holds some of its rows.
    bounds = sorted({bound - bound % 1_000 for bound in bounds})
    edges = [None, *bounds, None]
    return list(pairwise(edges))


_TIME_UNITS = {"milliseconds": 1_000, "microseconds": 1, "nanoseconds": 0.001}


def _row_groups(footer: Callable[[str], Any], path: str,
                column: str) -> list[tuple[int, int, int]] | None:
    """(min, max in microseconds, rows) of each row group of the file at ``path`` (relative
    to the table) from its ``column`` statistics; None when they cannot be had (no such
    column: column mapping; no statistics; an INT96 timestamp; a footer unreadable)."""
    try:
        metadata = footer(path)
        found = []
        for i in range(metadata.num_row_groups):
            group = metadata.row_group(i)
            chunk = next(group.column(j) for j in range(group.num_columns)
                         if group.column(j).path_in_schema == column)
            stats = chunk.statistics
            unit = next((scale for name, scale in _TIME_UNITS.items()
                         if name in str(stats.logical_type)), None)
            if chunk.physical_type != "INT64" or unit is None or not stats.has_min_max:
                return None
            found.append((int(stats.min_raw * unit), int(stats.max_raw * unit),
                          group.num_rows))
        return found or None
    except (OSError, StopIteration, pa.ArrowException, AttributeError):
        return None


def _footer(config: Config, table: str, path: str) -> object:
    """The Parquet metadata of file ``path`` (as the Delta log names it) of audit table
    ``table``, read through the warehouse's filesystem."""
    import pyarrow.parquet as pq

    filesystem, root = warehouse_filesystem(config.delta)
    with filesystem.open_input_file(f"{root}/{table}/{unquote(path)}") as file:
        return pq.ParquetFile(file).metadata


def _micros(moment: datetime) -> int:
    """An aware datetime in microseconds since the epoch."""
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _moment(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _scan(path: str, delta: DeltaTable, query: AuditQuery, columns: list[str],
          output: pa.Schema, partitioned: bool, window: Window) -> pa.Table:
    """The rows of one time window, in the query's order (but under ``state``, which
    orders after its reduction).

    The sort is Arrow's (:func:`_sorted`), not the SQL's ``ORDER BY``: DataFusion's
    ``regexp_match`` of every message id doubled a query's CPU time (2.2 s against
    1.1 s for 100k rows, where Arrow's sort takes 0.4 s)."""
    where = conditions(query, partitioned) + _window_conditions(query, partitioned, window)
    sql = (f"SELECT {', '.join(map(_name, columns))} FROM {_name(query.table)}"
           + "".join(f"{' WHERE' if i == 0 else ' AND'} {c}" for i, c in enumerate(where)))
    with _reading(path, query):
        stream = QueryBuilder().register(query.table, delta).execute(sql)
        table = arrow_table(stream)
    # One array per column first: DataFusion yields a batch per file, and casting (its
    # string_view to the table's string) or sorting batch by batch costs ~0.2 ms a batch.
    table = table.combine_chunks().cast(output)
    return table if query.state else _sorted(table, query.table)


def _batches(table: pa.Table) -> Iterator[pa.RecordBatch]:
    """``table``'s rows as record batches of at most :data:`BATCH_ROWS` rows."""
    for batch in table.combine_chunks().to_batches(max_chunksize=BATCH_ROWS):
        if batch.num_rows:
            yield batch


BATCH_ROWS = 65_536
"""Rows per record batch handed on (and written at once by the verb)."""


def _window_conditions(query: AuditQuery, partitioned: bool, window: Window) -> list[str]:
    """The SQL bounds of one time window (and of its days, on a partitioned table)."""
    time = _name(TIME_COLUMNS[query.table])
    day = _name(PARTITION_COLUMNS[query.table])
    lower, upper = window
    found = []
    if lower is not None:
        found.append(f"{time} >= {_timestamp(_moment(lower))}")
        if partitioned:
            found.append(f"{day} >= {_date(_moment(lower))}")
    if upper is not None:
        found.append(f"{time} < {_timestamp(_moment(upper))}")
        if partitioned:
            found.append(f"{day} <= {_date(_moment(upper))}")
    return found


def _newest(path: str, delta: DeltaTable, query: AuditQuery, columns: list[str],
            output: pa.Schema, partitioned: bool, windows: list[Window],
            limit: int) -> Iterator[pa.RecordBatch]:
    """The newest ``limit`` rows, oldest first: windows read from the newest back until
    they hold ``limit`` rows (older windows are never read)."""
    found: list[pa.Table] = []
    held = 0
    for window in reversed(windows):
        part = _scan(path, delta, query, columns, output, partitioned, window)
        found.append(part.slice(max(0, part.num_rows - (limit - held))))
        held += found[-1].num_rows
        if held >= limit:
            break
    yield from _batches(pa.concat_tables(reversed(found)))


def _state_batches(path: str, delta: DeltaTable, query: AuditQuery, columns: list[str],
                   output: pa.Schema, partitioned: bool,
                   limit: int | None) -> Iterator[pa.RecordBatch]:
    """``--state``: every change read, reduced to the subscriptions in force (small:
    one row per live subscription), then ordered."""
    table = _in_force(_scan(path, delta, query, columns, output, partitioned, (None, None)))
    if query.subscriber is not None:
        table = table.filter(pc.field("subscriber") == query.subscriber)
    table = _sorted(table, query.table)
    if limit is not None:
        table = table.slice(max(0, table.num_rows - limit))
    yield from _batches(table)


def _open(path: str, query: AuditQuery, storage: StorageOptions | None = None) -> DeltaTable:
    """The Delta table at ``path`` as of ``query.as_of_version``.

    delta-rs's own reader (DataFusion SQL) scans it: it reads what Spark
    writes as well (deletion vectors, column mapping, checkpoints), skips files
    and row groups whose statistics rule the filters out, and returns the
    table's Arrow types (strings as ``string``, not DataFusion's ``string_view``,
    once cast).
    """
    try:
        found = DeltaTable.is_deltatable(path, storage_options=storage)
    except OSError as exc:  # storage unreachable: a URI's host, credentials
        raise AuditError(f"{path}: {one_line(exc)}") from None
    if not found:
        raise AuditError(f"no audit table at {path}: has the router run?")
    try:
        return DeltaTable(path, version=query.as_of_version, storage_options=storage)
    except DeltaError as exc:
        if query.as_of_version is not None:
            latest = DeltaTable(path, storage_options=storage).version()
            if query.as_of_version > latest:
                raise AuditError(f"{path}: no Delta version {query.as_of_version} "
                                 f"(the latest is {latest})") from None
        raise AuditError(f"{path}: {one_line(exc)}") from None


@contextmanager
def _reading(path: str, query: AuditQuery) -> Iterator[None]:
    """delta-rs's and Arrow's errors while a query runs, as :class:`AuditError`."""
    try:
        yield
    except (DeltaError, OSError, pa.ArrowException) as exc:
        if query.as_of_version is not None and "not found" in str(exc):
            raise AuditError(f"{path}: version {query.as_of_version}'s files were vacuumed "
                             "(audit.file_retention); time travel reaches back only that "
                             "far") from None
        raise AuditError(f"{path}: {one_line(exc)}") from None


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
    found += [f"{_name(flag)} = true" for flag in _MARK_FILTERS if getattr(query, flag)]
    return found


def delivered(config: Config, subscribers: list[str], since: datetime) -> pa.Table:
    """``(message_id, subscriber)`` of every ``deliveries`` row of ``subscribers`` routed
    on ``since``'s UTC day or later (every row, on a table not partitioned by day); empty
    when the table does not exist yet. A replay's one-delivery-per-(message, subscriber)
    check (:mod:`streaming.router.replay.replay`). Raises :class:`AuditError` when the table
    cannot be read."""
    path = config.delta.table_path(DELIVERIES)
    storage = storage_options(config.delta)
    empty = pa.table({"message_id": pa.array([], pa.string()),
                      "subscriber": pa.array([], pa.string())})
    if not subscribers:
        return empty
    try:
        if not DeltaTable.is_deltatable(path, storage_options=storage):
            return empty
    except OSError as exc:
        raise AuditError(f"{path}: {one_line(exc)}") from None
    query = AuditQuery(DELIVERIES)
    delta = _open(path, query, storage)
    where = [f"{_name('subscriber')} IN ({', '.join(_text(s) for s in sorted(subscribers))})"]
    if PARTITION_COLUMNS[DELIVERIES] in delta.metadata().partition_columns:
        where.append(f"{_name(PARTITION_COLUMNS[DELIVERIES])} >= {_date(since)}")
    sql = (f"SELECT {_name('message_id')}, {_name('subscriber')} FROM {_name(DELIVERIES)} "
           f"WHERE {' AND '.join(where)}")
    with _reading(path, query):
        table = arrow_table(QueryBuilder().register(DELIVERIES, delta).execute(sql))
    return table.combine_chunks().cast(empty.schema) if table.num_rows else empty


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
    return f"DATE '{moment.astimezone(UTC).date().isoformat()}'"


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


def _sorted(table: pa.Table, name: str) -> pa.Table:
    """``table``'s rows in the order of :data:`ORDER_COLUMNS` of table ``name``, a message
    id as (topic, partition, offset) so that ``t/0/2`` comes before ``t/0/10``, and an
    id of another shape as (id, -1, -1).

    Built of arrays only, no Python value (one converted to Arrow imports pandas,
    0.4-0.7 s of a short command's time): an id of another shape has null numbers,
    and nulls sort first, as -1 would (the order columns themselves are never null).
    """
    if not table.num_rows:
        return table
    keys, names = [], []
    for column in ORDER_COLUMNS[name]:
        values = table[column]
        if column != "message_id":
            keys.append(values)
            names.append(column)
            continue
        if pc.all(pc.match_substring_regex(values, MESSAGE_ID_PATTERN)).as_py():
            # Every id has the shape: splitting at the last two slashes is 4x cheaper than
            # extracting the pattern's groups (0.2 against 0.8 us an id).
            split = pc.split_pattern(values, "/", max_splits=2, reverse=True)
            # list_slice, not list_element: its index would be a Python value (pandas).
            topic, partition, offset = (pc.list_flatten(pc.list_slice(split, i, i + 1))
                                        for i in range(3))
        else:
            parts = pc.extract_regex(values, MESSAGE_ID_PATTERN)
            topic = pc.if_else(pc.is_valid(parts), pc.struct_field(parts, "topic"), values)
            partition = pc.struct_field(parts, "partition")
            offset = pc.struct_field(parts, "offset")
        keys += [topic, pc.cast(partition, pa.int64()), pc.cast(offset, pa.int64())]
        names += [column, f"{column}.partition", f"{column}.offset"]
    order = pc.sort_indices(pa.Table.from_arrays(keys, names),
                            [(k, "ascending", "at_start") for k in names])
    return table.take(order)


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
    return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]

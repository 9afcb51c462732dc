"""Queries over the Delta audit tables: who got which message, and the subscriptions when.

The tables (``deliveries``, ``messages``, ``subscriptions``; schemas in
:mod:`schemas.records`) live at ``config.delta.table_path(name)``. A query
selects one table, optionally as of a Delta table version (time travel,
``versionAsOf``), filters it and orders it:

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
table's column order, timestamps as
ISO-8601 strings in UTC (``2025-01-31T12:00:00.000000Z``), arrays as lists and
maps as objects. The session is :func:`streaming.session.spark_session`'s: an
active one is reused and never stopped here.

Errors are :class:`AuditError` (no table, no such version) and its subclass
:class:`InvalidQuery` (a filter that does not apply, a malformed timestamp).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from schemas.records import AUDIT_TABLES, CHANGE_REJECTED, CHANGE_UPSERT
from streaming.config import Config

TIME_COLUMNS = {"deliveries": "routed_at", "messages": "routed_at",
                "subscriptions": "applied_at"}
ORDER_COLUMNS = {
    "deliveries": ("routed_at", "message_id", "subscriber"),
    "messages": ("routed_at", "message_id"),
    "subscriptions": ("snapshot_version", "changelog_partition", "changelog_offset"),
}
"""Row order; message ids sort by topic, then partition and offset as numbers."""
_FILTER_TABLES = {"subscriber": ("deliveries", "subscriptions"),
                  "message_id": ("deliveries", "messages")}
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
"""A warehouse given as a URI (``hdfs://``, ``s3a://``, ``file:``) rather than a local path."""
# UTC whatever the session's time zone, so the strings also sort chronologically.
_JSON_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX", "timeZone": "UTC",
                 "ignoreNullFields": "false"}


class AuditError(RuntimeError):
    """An audit query cannot run: the table or the version is missing."""


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
        if self.table not in AUDIT_TABLES:
            raise InvalidQuery(f"unknown audit table {self.table!r}: expected one of "
                               f"{', '.join(AUDIT_TABLES)}")
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


def parse_time(text: str, flag: str) -> datetime:
    """An ISO-8601 timestamp as an aware UTC datetime; one without an offset is UTC."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidQuery(f"{flag}: expected an ISO-8601 timestamp such as "
                           f"2025-01-31T12:00:00Z, got {text!r}") from None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def run(config: Config, query: AuditQuery) -> tuple[list[str], list[dict[str, object]]]:
    """The query's column names and rows (see module docstring)."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    from streaming.session import spark_session

    path = config.delta.table_path(query.table)
    # A local table that is missing is reported before the JVM starts: fast,
    # and without Spark's start-up log lines around the one-line error.
    if not _URI.match(path) and not (Path(path) / "_delta_log").is_dir():
        raise AuditError(_missing(path))
    spark = spark_session(config)
    frame = _select(spark, path, query)
    columns = frame.columns
    try:
        lines = frame.select(F.to_json(F.struct(*[F.col(c) for c in columns]),
                                       _JSON_OPTIONS).alias("row")).collect()
    except AnalysisException as exc:
        raise AuditError(_first_line(exc)) from None
    rows = [json.loads(line.row) for line in lines]
    rows.sort(key=lambda row: tuple(_order_value(row[c]) if c == "message_id" else row[c]
                                    for c in ORDER_COLUMNS[query.table]))
    return columns, rows


def render_table(columns: list[str], rows: list[dict[str, object]]) -> list[str]:
    """An aligned text table: a header, a rule, one line per row, then ``(N rows)``.

    Lists are joined with ``,``, maps shown as ``name=value`` (``name`` alone
    for a null value), nulls as empty cells.
    """
    cells = [[_cell(row[c]) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]

    def line(values: list[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()

    return [line(columns), line(["-" * w for w in widths]), *map(line, cells),
            f"({len(rows)} row{'' if len(rows) == 1 else 's'})"]


def _missing(path: str) -> str:
    return f"no audit table at {path}: has the router run?"


def _select(spark, path: str, query: AuditQuery):
    from delta.tables import DeltaTable
    from pyspark.errors import AnalysisException
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if not DeltaTable.isDeltaTable(spark, path):
        raise AuditError(_missing(path))
    reader = spark.read.format("delta")
    if query.as_of_version is not None:
        reader = reader.option("versionAsOf", query.as_of_version)
    try:
        frame = reader.load(path)
    except AnalysisException as exc:
        raise AuditError(f"{path}: {_first_line(exc)}") from None

    moment = F.col(TIME_COLUMNS[query.table])
    if query.since is not None:
        frame = frame.filter(moment >= _timestamp(query.since))
    if query.until is not None:
        frame = frame.filter(moment < _timestamp(query.until))
    if query.message_id is not None:
        frame = frame.filter(F.col("message_id") == query.message_id)
    if query.state:
        latest = Window.partitionBy("subscription_id").orderBy(
            F.col("snapshot_version").desc(), F.col("changelog_offset").desc())
        frame = (frame.filter(F.col("change") != CHANGE_REJECTED)
                 .withColumn("_rank", F.row_number().over(latest))
                 .filter((F.col("_rank") == 1) & (F.col("change") == CHANGE_UPSERT))
                 .drop("_rank"))
    if query.subscriber is not None:
        frame = frame.filter(F.col("subscriber") == query.subscriber)
    # Not sorted here: every row is collected on the driver anyway, and a Spark
    # sort would add a shuffle (and a sampling job) to each query.
    return frame


def _order_value(message_id: str) -> tuple[str, int, int]:
    topic, _, position = message_id.rpartition("/")
    topic, _, partition = topic.rpartition("/")
    if partition.isdecimal() and position.isdecimal():
        return topic, int(partition), int(position)
    return message_id, -1, -1


def _timestamp(moment: datetime):
    from pyspark.sql import functions as F

    # A string with an explicit offset reads the same whatever the session time zone.
    return F.lit(moment.isoformat()).cast("timestamp")


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ",".join(_cell(v) for v in value)
    if isinstance(value, dict):
        return ",".join(k if v is None else f"{k}={_cell(v)}" for k, v in value.items())
    return str(value)


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0]

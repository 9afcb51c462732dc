"""``bitroute sql``: one Spark SQL statement over the audit tables, with Delta Lake.

A local SparkSession (:func:`streaming.session.spark_session`) is built with
the ``delta`` jars of ``conf/jvm.toml`` and Delta's two settings
(:data:`DELTA_SETTINGS`), the router's own session having neither. Each audit
table that exists at ``config.delta.table_path(name)`` is registered in the
session's (in-memory) catalog under its name, ``deliveries``, ``messages``,
``subscriptions``, as an external Delta table: registering reads the table's
log and writes nothing to it. Names, not views, so that Delta's table
statements take them: ``SELECT ... FROM deliveries VERSION AS OF 3``,
``TIMESTAMP AS OF '...'``, ``DESCRIBE HISTORY deliveries``, ``DESCRIBE DETAIL``.
``delta.`<path>``` works as well.

The result comes back as column names and JSON-ready rows (:func:`json_value`):
timestamps as ISO-8601 in UTC (``2025-01-31T12:00:00.000000Z``, the session's
time zone is UTC), dates as ``2025-01-31``, arrays as lists, maps and structs as
objects, decimals as strings (exact), binary as base64, NaN and infinities as
strings, so that the CLI prints them as ``bitroute audit`` does.

Errors are :class:`SqlError` (a missing audit table, a failure while running)
and its subclass :class:`InvalidStatement` (Spark could not parse or analyse
the statement, two result columns of one name), each one line.

Starting Spark takes seconds (about 10 on a busy 2-core machine); ``bitroute
audit`` answers the usual look-ups in about one, without a JVM.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa

from schemas.records import DELIVERIES, MESSAGES, SUBSCRIPTIONS
from streaming.audit.errors import InvalidStatement, SqlError
from streaming.config import Config
from streaming.errors import one_line

TABLES = (DELIVERIES, MESSAGES, SUBSCRIPTIONS)
"""The audit tables ``bitroute sql`` registers, under these names."""

DELTA_SETTINGS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
"""The two settings that give a Spark session Delta Lake (with the ``delta`` jars)."""

_INVALID_CLASSES = ("ParseException", "AnalysisException")


def table_location(config: Config, name: str) -> str:
    """Where audit table ``name`` lives, as Spark needs it: a local path made
    absolute (the JVM works in another folder), a URI unchanged."""
    path = config.delta.table_path(name)
    return path if "://" in path else str(Path(path).absolute())


def run(config: Config, statement: str) -> tuple[list[str], list[dict[str, object]]]:
    """Run ``statement`` and return its column names and JSON-ready rows."""
    from deltalake import DeltaTable  # delta-rs: is the table there? (no JVM needed)

    from streaming.audit.storage import StorageError, spark_settings, storage_options

    try:
        storage = storage_options(config.delta)
        s3a = spark_settings(config.delta)
        found = {name: DeltaTable.is_deltatable(table_location(config, name),
                                                storage_options=storage) for name in TABLES}
    except (StorageError, OSError) as exc:
        raise SqlError(str(exc) if isinstance(exc, StorageError) else
                       f"delta.warehouse {config.delta.warehouse}: {one_line(exc)}") from None
    if not any(found.values()):
        raise SqlError(f"no audit table under {config.delta.warehouse}: has the router run?")

    from pyspark.errors import PySparkException

    from streaming.session import spark_session

    settings = {"spark.app.name": f"{config.spark.app_name} sql", **DELTA_SETTINGS, **s3a}
    if s3a:  # an s3:// warehouse: Hadoop's S3A connector too (conf/jvm.toml [s3a])
        from streaming import jvm

        settings["spark.jars"] = ",".join(str(p) for p in [*jvm.jars("delta"), *jvm.jars("s3a")])
    spark = spark_session(config, jar_group="delta", extra_settings=settings)
    try:
        for name, present in found.items():
            if present:
                location = table_location(config, name).replace("\\", "\\\\").replace("'", "\\'")
                spark.sql(f"CREATE TABLE `{name}` USING delta LOCATION '{location}'")
        try:
            if s3a:
                _refuse_writes(spark, statement, config.delta.warehouse)
            result = spark.sql(statement).toArrow()
        except PySparkException as exc:
            missing = [n for n, present in found.items() if not present and f"`{n}`" in str(exc)]
            if missing:
                raise SqlError(f"no audit table at {table_location(config, missing[0])}: "
                               "has the router run?") from None
            kind = InvalidStatement if type(exc).__name__ in _INVALID_CLASSES else SqlError
            raise kind(one_line(exc)) from None
    finally:
        spark.stop()
    return result.column_names, json_rows(result)


READ_ONLY_COMMANDS = frozenset({
    "DescribeDeltaHistory", "DescribeDeltaHistoryCommand", "DescribeDeltaDetailCommand",
    "DescribeRelation", "DescribeColumn", "DescribeTableCommand", "DescribeColumnCommand",
    "ShowTables", "ShowColumns", "ShowTableProperties", "ShowCreateTable", "ShowFunctions",
    "DescribeFunction", "ShowNamespaces", "ShowViews", "ShowPartitions", "SetCommand",
    "ExplainCommand", "ShowTablesCommand", "ShowColumnsCommand",
})
"""Commands ``bitroute sql`` runs on an object-store warehouse: they read, never commit."""


def _refuse_writes(spark, statement: str, warehouse: str) -> None:
    """Raise :class:`SqlError` when ``statement`` would write: delta-spark 4.4 commits to S3
    without a conditional put (``S3SingleDriverLogStore``), which could overwrite a commit
    the router makes at the same moment (docs/running.md, "Concurrent writers"). Parsed,
    not run: a query is read-only; a command is unless it is a known reader."""
    plan = spark._jsparkSession.sessionState().sqlParser().parsePlan(statement)
    command = spark._jvm.java.lang.Class.forName(
        "org.apache.spark.sql.catalyst.plans.logical.Command")
    kind = plan.getClass().getSimpleName()
    writes = (command.isInstance(plan) and kind not in READ_ONLY_COMMANDS) or any(
        word in kind for word in ("Insert", "Restore", "Clone", "Optimize", "Vacuum", "Merge"))
    if writes:
        raise SqlError(f"bitroute sql does not write to {warehouse} ({kind}): Delta-Spark's "
                       "commits on S3 are not safe beside the router's (docs/running.md, "
                       "\"Concurrent writers\"); `bitroute audit maintain` compacts and "
                       "vacuums the tables")


def json_rows(table: pa.Table) -> list[dict[str, object]]:
    """``table``'s rows as dicts of JSON values (see module docstring)."""
    names = table.column_names
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InvalidStatement(f"the result has more than one column named {repeated[0]!r}: "
                               "give each its own name (AS)")
    converters = [_converter(field.type) for field in table.schema]
    columns = [[convert(v) for v in column.to_pylist()]
               for convert, column in zip(converters, table.columns, strict=True)]
    return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]


def json_value(value: object) -> object:
    """One Python value of a Spark result as JSON (see module docstring)."""
    if isinstance(value, datetime):
        if value.tzinfo is None:  # TIMESTAMP_NTZ: no zone to name
            return value.strftime("%Y-%m-%dT%H:%M:%S.%f")
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _converter(kind: pa.DataType) -> Callable[[Any], object]:
    """A function from a ``to_pylist`` value of Arrow type ``kind`` to its JSON value."""
    if pa.types.is_map(kind):
        key, item = _converter(kind.key_type), _converter(kind.item_type)
        return lambda v: None if v is None else {str(key(k)): item(x) for k, x in v}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        item = _converter(kind.value_type)
        return lambda v: None if v is None else [item(x) for x in v]
    if pa.types.is_struct(kind):
        fields = {kind.field(i).name: _converter(kind.field(i).type)
                  for i in range(kind.num_fields)}
        return lambda v: None if v is None else {k: fields[k](x) for k, x in v.items()}
    return json_value

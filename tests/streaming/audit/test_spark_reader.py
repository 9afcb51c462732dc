"""The audit tables read by Spark with Delta Lake: a user's own session, as
docs/audit.md configures it, and ``bitroute sql``.

A real router (``bitroute run``, a child process) writes the three tables; it
is stopped before anything reads them, so that rows the router commits late
(a journaled audit is flushed when the router stops) are in. Every Spark reader
runs in a child process of its own: a JVM holds one SparkContext, whose jars
and SQL extensions are fixed when it starts, and the suite's shared session
(tests/conftest.py ``spark``, the router's configuration) has no Delta. The
expected answers come from delta-rs and ``bitroute audit`` (no JVM).

The checks hold for tables with more columns than schemas.tables lists (a
partition column, say): they compare row counts, versions and the columns the
contracts name.

The schema check keeps every audit table readable by Spark: timestamps with a
time zone, and a protocol Spark accepts (delta-io/delta-rs#2882: a timestamp
without a zone next to NOT NULL columns makes delta-rs write protocol 3/7 with
``timestampNtz`` and without the ``invariants`` feature, which Spark refuses).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from docs_session import SPARK_TIMEOUT_S, docs_session_script
from isolation import isolated_settings
from router_process import RouterProcess  # the router as a child process
from schemas.tables import AUDIT_TABLES, arrow_schema
from short_jvm import short_jvm_env
from streaming import jvm
from streaming.audit import queries as audit
from streaming.audit.writer import AuditTables
from streaming.config import Config, load
from streaming.kafka import client_verbs as client

ROOT = Path(__file__).resolve().parents[3]
BITROUTE = Path(sys.executable).with_name("bitroute")


@pytest.fixture(scope="module")
def routed(base_config: Config, tmp_path_factory: pytest.TempPathFactory) -> Config:
    """The configuration of a router that ran and stopped: its tables hold routed,
    unroutable and rejected publishes and subscription changes over several commits."""
    root = tmp_path_factory.mktemp("spark-reader")
    settings = isolated_settings(base_config, root)
    config = load(overrides=settings, environ={})
    client.subscribe(config, "amq.topic", "alpha", "orders.#", sub_id="a1")
    client.subscribe(config, "amq.topic", "beta", "orders.*.paid", sub_id="b1")
    router = RouterProcess(settings, root / "router.log")
    try:
        router.wait_for(re.compile(r"snapshot v\d+ with 2 subscriptions"))
        for key in ("orders.eu.paid", "orders.us.paid", "orders.eu", "audit.none"):
            client.publish(config, "amq.topic", key, b"x")
        client.publish(config, "no-such-exchange", "orders.eu.paid", b"x")
        client.unsubscribe(config, "b1")
        client.publish(config, "amq.topic", "orders.eu.paid", b"x")
        while sum(int(m.group(1)) for m in _batches(router.seen)) < 6:  # every publish routed
            router.wait_for(re.compile(r"^batch \d+: .*"))
    finally:
        status = router.terminate(signal.SIGTERM)
    assert status == 0, (root / "router.log").read_text()[-3000:]
    return config


def _batches(lines: list[str]):
    pattern = re.compile(r"^batch \d+: (\d+) publishes")
    return [m for m in map(pattern.match, lines) if m]


def _audit_rows(config: Config, table: str) -> int:
    return len(audit.run(config, audit.AuditQuery(table))[1])


def _versions(config: Config, table: str) -> list[int]:
    return sorted(entry["version"] for entry in DeltaTable(config.delta.table_path(table)).history())


_CHECKS = '''
# Task counts for a small machine (Delta's default reads a table's log in 50 tasks); the
# statements below are the user's as they stand.
spark.conf.set("spark.sql.shuffle.partitions", "2")
spark.conf.set("spark.databricks.delta.snapshotPartitions", "2")

import json as _json
_answers = {}
for _name in ("deliveries", "messages", "subscriptions"):
    _path = f"{warehouse}/{_name}"
    _frame = spark.read.format("delta").load(_path)
    _history = spark.sql(f"DESCRIBE HISTORY delta.`{_path}`").collect()
    _latest = max(row["version"] for row in _history)
    _answers[_name] = {
        "count": _frame.count(),
        "columns": {f.name: f.dataType.simpleString() for f in _frame.schema.fields},
        "versions": sorted(row["version"] for row in _history),
        "previous": _latest - 1,
        "previous_count": spark.read.format("delta").option("versionAsOf", _latest - 1)
                               .load(_path).count(),
        "previous_sql": spark.sql(f"SELECT count(*) AS n FROM delta.`{_path}` "
                                  f"VERSION AS OF {_latest - 1}").collect()[0]["n"],
    }
print("ANSWERS " + _json.dumps(_answers))
spark.stop()
'''


def test_a_users_own_session_configured_as_the_docs_say_reads_every_audit_table(
        routed: Config, tmp_path: Path):
    warehouse = str(Path(routed.delta.warehouse).absolute())
    script = docs_session_script(jvm.jars("delta")[0].parent, warehouse) + _CHECKS
    (tmp_path / "reader.py").write_text(script)
    done = subprocess.run([sys.executable, "reader.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=SPARK_TIMEOUT_S, env=short_jvm_env())
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("ANSWERS ")]
    answers = json.loads(line.removeprefix("ANSWERS "))

    for name, contract in AUDIT_TABLES.items():
        got = answers[name]
        assert got["count"] == _audit_rows(routed, name) > 0, name
        assert got["versions"] == _versions(routed, name), name
        previous = DeltaTable(routed.delta.table_path(name), version=got["previous"])
        assert got["previous_count"] == got["previous_sql"] == previous.to_pyarrow_table().num_rows
        for field in contract.fields:  # the contract's columns, with Spark's own types
            assert got["columns"][field.name] == field.dataType.simpleString(), (name, field.name)


def _sql(config: Config, statement: str, *flags: str) -> subprocess.CompletedProcess:
    sets = [arg for key in ("delta.warehouse", "streaming.checkpoint_dir")
            for arg in ("--set", f"{key}={_setting(config, key)}")]
    return subprocess.run([str(BITROUTE), "sql", statement, *flags, *sets,
                           "--set", "spark.master=local[2]", "--set", "spark.log_level=ERROR",
                           "--set", "spark.shuffle_partitions=2",  # tasks for a small machine
                           "--set", "spark.options.spark.databricks.delta.snapshotPartitions=2"],
                          capture_output=True, text=True, timeout=SPARK_TIMEOUT_S,
                          env=short_jvm_env())


def _setting(config: Config, key: str) -> str:
    section, name = key.split(".")
    return str(getattr(getattr(config, section), name))


def test_bitroute_sql_counts_and_time_travel_agree_with_bitroute_audit(routed: Config):
    previous = _versions(routed, "subscriptions")[-2]
    done = _sql(routed, "SELECT (SELECT count(*) FROM deliveries) AS deliveries, "
                        "(SELECT count(*) FROM messages) AS messages, "
                        "(SELECT count(*) FROM subscriptions) AS subscriptions, "
                        f"(SELECT count(*) FROM subscriptions VERSION AS OF {previous}) AS before",
                "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    [row] = [json.loads(line) for line in done.stdout.splitlines()]  # stdout: JSON only
    assert row == {
        "deliveries": _audit_rows(routed, "deliveries"),
        "messages": _audit_rows(routed, "messages"),
        "subscriptions": _audit_rows(routed, "subscriptions"),
        "before": len(audit.run(routed, audit.AuditQuery("subscriptions",
                                                         as_of_version=previous))[1]),
    }


def test_bitroute_sql_describes_history_as_an_aligned_table(routed: Config):
    done = _sql(routed, "DESCRIBE HISTORY deliveries")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].split()[:2] == ["version", "timestamp"]
    assert set(lines[1]) <= {"-", " "}
    versions = _versions(routed, "deliveries")
    assert lines[-1] == f"({len(versions)} rows)"
    assert sorted(int(line.split()[0]) for line in lines[2:-1]) == versions
    assert DeltaTable(routed.delta.table_path("deliveries")).version() == versions[-1], \
        "registering the table wrote to it"


def test_bitroute_sql_bad_statement_is_a_one_line_error(routed: Config):
    done = _sql(routed, "SELEKT * FROM deliveries")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines()[-1].startswith("bitroute: error: [PARSE_SYNTAX_ERROR]")


def test_bitroute_sql_without_audit_tables_says_so_without_starting_spark(tmp_path: Path):
    done = subprocess.run([str(BITROUTE), "sql", "SELECT 1", "--set",
                           f"delta.warehouse={tmp_path / 'none'}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines()[-1] == (f"bitroute: error: no audit table under "
                                            f"{tmp_path / 'none'}: has the router run?")


# --- the schema check (no Spark) -----------------------------------------------------

SPARK_READER_FEATURES = {"columnMapping", "deletionVectors", "timestampNtz", "v2Checkpoint",
                         "typeWidening", "vacuumProtocolCheck"}
"""Reader features Delta 4.4 on Spark 4.2 supports (of those delta-rs may write)."""


def spark_refusals(schema: pa.Schema, table: DeltaTable) -> list[str]:
    """Why Spark would refuse ``table`` (written with ``schema``): nothing when readable."""
    problems = [f"{f.name}: a timestamp without a time zone (delta-io/delta-rs#2882)"
                for f in schema if pa.types.is_timestamp(f.type) and f.type.tz is None]
    protocol = table.protocol()
    if protocol.min_reader_version > 3 or protocol.min_writer_version > 7:
        problems.append(f"protocol {protocol.min_reader_version}/{protocol.min_writer_version}")
    if protocol.min_writer_version == 7:
        if any(not f.nullable for f in schema) and \
                "invariants" not in (protocol.writer_features or []):
            problems.append("NOT NULL columns without the invariants writer feature")
        unknown = set(protocol.reader_features or []) - SPARK_READER_FEATURES
        if unknown:
            problems.append(f"reader features Spark lacks: {sorted(unknown)}")
    return problems


def test_every_audit_table_as_the_router_creates_it_is_readable_by_spark(tmp_path: Path):
    config = load(overrides={"delta.warehouse": str(tmp_path)}, environ={})
    tables = AuditTables(config, "r1")
    tables.ensure()
    tables.close()
    for name, contract in AUDIT_TABLES.items():
        table = DeltaTable(config.delta.table_path(name))
        schema = pa.schema(table.schema().to_arrow())
        assert spark_refusals(schema, table) == [], name
        assert spark_refusals(arrow_schema(contract), table) == [], name


def test_the_schema_check_catches_the_timestamp_without_zone_trap(tmp_path: Path):
    schema = pa.schema([pa.field("id", pa.string(), nullable=False),
                        pa.field("at", pa.timestamp("us"))])
    table = DeltaTable.create(str(tmp_path / "t"), schema=schema)
    problems = spark_refusals(schema, table)
    assert problems and "delta-rs#2882" in problems[0]
    assert table.protocol().min_writer_version == 7  # what Spark is then handed


def test_the_delta_jars_match_the_pinned_delta_spark_and_spark():
    """delta-spark (PyPI) equals the Delta jars, whose name carries pyspark's minor version."""
    import tomllib

    with (ROOT / "pyproject.toml").open("rb") as handle:
        pins = dict(r.split("==") for r in tomllib.load(handle)["project"]["dependencies"]
                    if "==" in r)
    spark_minor = ".".join(pins["pyspark"].split(".")[:2])
    artifacts = jvm.coordinates("delta")["artifacts"]
    assert f"io.delta:delta-spark_{spark_minor}_2.13:{pins['delta-spark']}" in artifacts
    assert all(a.startswith("io.delta:") and a.endswith(f":{pins['delta-spark']}")
               for a in artifacts)

"""``bitroute audit`` on real Delta tables.

The fixture tables are written with delta-rs (``deltalake.write_deltalake``)
from Arrow tables of the schemas.tables StructTypes; a second warehouse of the
same rows, laid out as the router lays its tables out (each created empty
first) and checkpointed every second version, must read the same. The verb
runs in-process, and as the installed ``bitroute`` command where its output or
its imports are the point.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from schemas.records import PARTITION_COLUMNS, PARTITION_SOURCES
from schemas.tables import AUDIT_TABLES, MESSAGES_TABLE, arrow_schema
from streaming.audit import queries as audit
from streaming.cli.main import main
from streaming.kafka.broker import free_port

T0 = datetime(2025, 1, 31, 12, 0, tzinfo=timezone.utc)
BITROUTE = Path(sys.executable).with_name("bitroute")


def _at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def _iso(minutes: int) -> str:
    return _at(minutes).strftime("%Y-%m-%dT%H:%M:%S.000000Z")


# One list of rows per commit, per table, in the StructTypes' column order.
# deliveries: m1 -> alice, bob; m2 -> alice. messages: m1, m2 routed, m10 rejected
# (written before m2, routed at the same time: its place comes from its offset).
# subscriptions: the first commit adds a1, b1, b2; the second removes b1 and rejects x.
COMMITS = {
    "deliveries": [[
        ("p/0/1", "alice", ["a1"], "amq.topic", "a.b", "dlv.alice", 2, 0, _at(0), _at(1)),
        ("p/0/1", "bob", ["b1", "b2"], "amq.topic", "a.b", "dlv.bob", 2, 0, _at(0), _at(1)),
        ("p/0/2", "alice", ["a1"], "amq.topic", "a.c", "dlv.alice", 2, 1, None, _at(5)),
    ]],
    "messages": [[
        ("p/0/1", "amq.topic", "a.b", "routed", 2, None, {"color": "red"}, 5, 2, 0, _at(0), _at(1)),
        ("p/0/10", "nope", "a.d", "rejected", 0, "unknown exchange 'nope'", None, 3, 2, 1,
         _at(4), _at(5)),
        ("p/0/2", "amq.topic", "a.c", "routed", 1, None, {}, 0, 2, 1, _at(4), _at(5)),
    ]],
    "subscriptions": [[
        ("a1", "upsert", "amq.topic", "alice", "a.*", None, None, None, 1, 0, 0, _at(0), _at(0)),
        ("b1", "upsert", "amq.topic", "bob", "#", "any", {"k": None, "c": "red"}, None, 1, 1, 0,
         _at(0), _at(0)),
        ("b2", "upsert", "amq.topic", "bob", "a.b", None, None, None, 2, 1, 1, _at(1), _at(1)),
    ], [
        ("b1", "remove", None, None, None, None, None, None, 3, 1, 2, _at(2), _at(2)),
        ("x", "rejected", None, None, None, None, None, "bad JSON", 3, 0, 1, _at(2), _at(2)),
    ]],
}


def _earlier_schema(name: str) -> pa.Schema:
    """Table ``name``'s schema before the tables were partitioned: no date column."""
    schema = arrow_schema(AUDIT_TABLES[name])
    return schema.remove(schema.get_field_index(PARTITION_COLUMNS[name]))


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tables as delta-rs wrote them before they were partitioned by day (no date
    column, one commit per list of rows): subscriptions has Delta versions 0 and 1."""
    root = tmp_path_factory.mktemp("warehouse")
    for name, commits in COMMITS.items():
        schema = _earlier_schema(name)
        for rows in commits:
            table = pa.Table.from_pylist([dict(zip(schema.names, row)) for row in rows], schema)
            write_deltalake(root / name, table, mode="append")
    return root


@pytest.fixture(scope="module")
def checkpointed_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same rows in tables created empty (Delta version 0), as the router creates
    them (with their date column, partitioned by day), then one commit per list of
    rows, with ``delta.checkpointInterval=2``:
    delta-rs checkpoints after every second commit (versions 1, 3, ...), so that
    subscriptions' version 1 is read from a Parquet checkpoint alone and version 2
    from that checkpoint and one JSON commit."""
    root = tmp_path_factory.mktemp("checkpointed-warehouse")
    for name, commits in COMMITS.items():
        schema = arrow_schema(AUDIT_TABLES[name])
        day = PARTITION_COLUMNS[name]
        source = schema.names.index(PARTITION_SOURCES[day])
        DeltaTable.create(root / name, schema=schema, partition_by=[day],
                          configuration={"delta.checkpointInterval": "2"})
        for rows in commits:
            dated = [(*row, row[source].date()) for row in rows]
            table = pa.Table.from_pylist([dict(zip(schema.names, row)) for row in dated], schema)
            write_deltalake(root / name, table, mode="append", partition_by=[day])
    return root


def _audit(capsys, warehouse: Path | str, *args: str) -> tuple[int, str, str]:
    code = main(["audit", *args, "--set", f"delta.warehouse={warehouse}"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _json(capsys, warehouse: Path, *args: str) -> list[dict]:
    code, out, err = _audit(capsys, warehouse, *args, "--json")
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_who_got_message_m(capsys, warehouse):
    rows = _json(capsys, warehouse, "deliveries", "--message-id", "p/0/1")
    assert rows == [
        {"message_id": "p/0/1", "subscriber": "alice", "subscription_ids": ["a1"],
         "exchange": "amq.topic", "routing_key": "a.b", "delivery_topic": "dlv.alice",
         "snapshot_version": 2, "batch_id": 0, "published_at": _iso(0), "routed_at": _iso(1)},
        {"message_id": "p/0/1", "subscriber": "bob", "subscription_ids": ["b1", "b2"],
         "exchange": "amq.topic", "routing_key": "a.b", "delivery_topic": "dlv.bob",
         "snapshot_version": 2, "batch_id": 0, "published_at": _iso(0), "routed_at": _iso(1)},
    ]


def test_what_subscriber_s_received_between_t1_and_t2(capsys, warehouse):
    def ids(*window: str) -> list[str]:
        return [r["message_id"] for r in
                _json(capsys, warehouse, "deliveries", "--subscriber", "alice", *window)]

    assert ids() == ["p/0/1", "p/0/2"]
    assert ids("--since", T0.isoformat(), "--until", _iso(5)) == ["p/0/1"]
    # A timestamp without an offset is UTC; --since is inclusive.
    assert ids("--since", "2025-01-31T12:05:00") == ["p/0/2"]
    assert ids("--until", "2025-01-31T13:00:00+02:00") == []
    # Bounds outside the nanosecond range (1677-2262) are fine: Delta times are microseconds.
    assert ids("--since", "0001-01-01", "--until", "9999-12-31") == ["p/0/1", "p/0/2"]


def test_filter_values_are_data_not_sql(capsys, warehouse):
    for value in ["x' OR '1'='1", "alice' --", "a\\'", "'"]:
        assert _json(capsys, warehouse, "deliveries", "--subscriber", value) == []
        assert _json(capsys, warehouse, "messages", "--message-id", value) == []


def test_messages_show_their_outcome_and_null_fields(capsys, warehouse):
    [row] = _json(capsys, warehouse, "messages", "--message-id", "p/0/10")
    assert row["outcome"] == "rejected"
    assert row["reason"] == "unknown exchange 'nope'"
    assert row["headers"] is None


def test_human_output_is_an_aligned_table(capsys, warehouse):
    code, out, _ = _audit(capsys, warehouse, "messages")
    assert code == 0
    lines = out.splitlines()
    header, rule, *body, count = lines
    assert header.split() == [f.name for f in MESSAGES_TABLE.fields if f.name != "routed_date"]
    assert set(rule.replace(" ", "")) == {"-"}
    assert count == "(3 rows)"
    # Message ids sort by number within a topic partition: p/0/2 before p/0/10.
    assert [line.split()[0] for line in body] == ["p/0/1", "p/0/2", "p/0/10"]
    column = header.index("outcome")
    assert [line[column:].split()[0] for line in body] == ["routed", "routed", "rejected"]
    assert "color=red" in body[0]


def test_subscriptions_time_travel_and_state(capsys, warehouse):
    def ids(*args: str) -> list[tuple[str, str]]:
        return [(r["subscription_id"], r["change"])
                for r in _json(capsys, warehouse, "subscriptions", *args)]

    assert ids() == [("a1", "upsert"), ("b1", "upsert"), ("b2", "upsert"),
                     ("x", "rejected"), ("b1", "remove")]
    assert ids("--as-of-version", "0") == [("a1", "upsert"), ("b1", "upsert"), ("b2", "upsert")]
    assert ids("--state") == [("a1", "upsert"), ("b2", "upsert")]
    assert ids("--state", "--as-of-version", "0") == [("a1", "upsert"), ("b1", "upsert"),
                                                      ("b2", "upsert")]
    assert ids("--state", "--until", _iso(1)) == [("a1", "upsert"), ("b1", "upsert")]
    assert ids("--state", "--subscriber", "bob") == [("b2", "upsert")]
    assert ids("--state", "--subscriber", "alice", "--until", _iso(0)) == []
    [b1] = _json(capsys, warehouse, "subscriptions", "--as-of-version", "0", "--subscriber",
                 "bob", "--until", _iso(1))
    assert (b1["header_match"], b1["header_criteria"]) == ("any", {"k": None, "c": "red"})


@pytest.mark.parametrize("args, checkpointed_args", [
    (["deliveries"], ["deliveries"]),
    (["messages"], ["messages"]),
    (["subscriptions"], ["subscriptions"]),
    (["subscriptions", "--state"], ["subscriptions", "--state"]),
    # There, version 0 is the empty table the router created.
    (["subscriptions", "--as-of-version", "0"], ["subscriptions", "--as-of-version", "1"]),
])
def test_created_and_checkpointed_tables_read_the_same(capsys, warehouse, checkpointed_warehouse,
                                                       args, checkpointed_args):
    log = checkpointed_warehouse / "subscriptions" / "_delta_log"
    assert sorted(p.name for p in log.glob("*.checkpoint.parquet")) == [
        "00000000000000000001.checkpoint.parquet"]
    assert sorted(p.name for p in log.glob("*.json")) == [f"{v:020d}.json" for v in range(3)]
    expected = _json(capsys, warehouse, *args)
    assert expected
    assert _json(capsys, checkpointed_warehouse, *checkpointed_args) == expected


def test_json_output_of_the_command_is_json_lines_only(warehouse, tmp_path):
    """``bitroute audit ... --json | jq .`` works: every stdout line is a JSON object,
    whatever reaches stderr, and the command leaves nothing in the current folder."""
    result = subprocess.run(
        [str(BITROUTE), "audit", "subscriptions", "--json",
         "--set", f"delta.warehouse={warehouse}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["subscription_id"] for r in rows] == ["a1", "b1", "b2", "x", "b1"]
    assert list(tmp_path.iterdir()) == []


def test_the_verb_imports_no_spark(warehouse):
    script = (
        "import sys\n"
        "from streaming.cli.main import main\n"
        f"code = main(['audit', 'messages', '--json', '--set', 'delta.warehouse={warehouse}'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j')),"
        " file=sys.stderr)\n"
        "sys.exit(code)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 3
    assert result.stderr.splitlines() == ["[]"]


def test_the_verb_names_tables_and_changes_as_the_schemas_do():
    assert list(audit.TIME_COLUMNS) == list(AUDIT_TABLES)
    for name, schema in AUDIT_TABLES.items():
        assert {audit.TIME_COLUMNS[name], *audit.ORDER_COLUMNS[name]} <= set(schema.names)
        day = PARTITION_COLUMNS[name]
        assert schema.names[-1] == day and PARTITION_SOURCES[day] == audit.TIME_COLUMNS[name]


def test_partitioned_tables_answer_without_their_date_column(capsys, checkpointed_warehouse):
    """The verb's columns are the tables' columns before the date partitions."""
    rows = _json(capsys, checkpointed_warehouse, "messages", "--since", T0.isoformat())
    assert list(rows[0]) == _earlier_schema("messages").names
    code, out, _ = _audit(capsys, checkpointed_warehouse, "deliveries")
    assert code == 0 and "routed_date" not in out


def test_missing_table_is_one_line_error(capsys, tmp_path):
    code, out, err = _audit(capsys, tmp_path / "empty", "deliveries")
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"bitroute: error: no audit table at {tmp_path / 'empty'}/deliveries: has the router run?"]


def test_unreachable_storage_is_one_line_error(capsys):
    warehouse = f"hdfs://127.0.0.1:{free_port()}/delta"
    code, out, err = _audit(capsys, warehouse, "messages")
    assert (code, out) == (1, "")
    [line] = err.splitlines()
    assert line.startswith(f"bitroute: error: {warehouse}/messages: ")
    assert "Connection refused" in line and "\x1b" not in line


@pytest.mark.parametrize("args, code, message", [
    (["subscriptions", "--as-of-version", "9"], 1, "subscriptions: no Delta version 9 (the "
                                                   "latest is 1)"),
    (["messages", "--subscriber", "bob"], 2,
     "--subscriber does not apply to the messages table (it applies to deliveries and "
     "subscriptions)"),
    (["subscriptions", "--message-id", "p/0/1"], 2, "--message-id does not apply"),
    (["deliveries", "--state"], 2, "--state applies to the subscriptions table only"),
    (["deliveries", "--since", "yesterday"], 2,
     "--since: expected an ISO-8601 timestamp such as 2025-01-31T12:00:00Z, got 'yesterday'"),
])
def test_bad_queries_are_one_line_errors(capsys, warehouse, args, code, message):
    result, out, err = _audit(capsys, warehouse, *args)
    assert (result, out) == (code, "")
    [line] = err.splitlines()
    assert line.startswith("bitroute: error: ") and message in line

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
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from schemas.records import PARTITION_COLUMNS, PARTITION_SOURCES
from schemas.tables import AUDIT_TABLES, MESSAGES_TABLE, arrow_schema
from streaming.audit import queries as audit
from streaming.cli.main import main
from streaming.kafka.broker import free_port

T0 = datetime(2025, 1, 31, 12, 0, tzinfo=UTC)
BITROUTE = Path(sys.executable).with_name("bitroute")


def _at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def _iso(minutes: int) -> str:
    return _at(minutes).strftime("%Y-%m-%dT%H:%M:%S.000000Z")


# One list of rows per commit, per table, in the StructTypes' column order.
# deliveries: m1 -> alice, bob; m2 -> alice. messages: m1, m2 routed, m10 rejected
# (written before m2, routed at the same time: its place comes from its offset).
# subscriptions: the first commit adds a1, b1, b2; the second removes b1 and rejects x.
COMMITS: dict[str, list[list[tuple]]] = {
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


#: Columns added after the rows above were written: null in them (``deliveries``'
#: marks, ``subscriptions``' MQTT subscription options, the publish tables' alternate exchange).
LATER_COLUMNS = ("retained", "replayed", "retain_handling", "retain_as_published", "no_local",
                 "alternate_exchange")


def _named(schema: pa.Schema, row: tuple) -> dict:
    """A positional row of the lists above as a row of ``schema``."""
    return dict(zip([n for n in schema.names if n not in LATER_COLUMNS], row, strict=True))


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
            table = pa.Table.from_pylist([_named(schema, row) for row in rows], schema)
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
        source = [n for n in schema.names if n not in LATER_COLUMNS].index(
            PARTITION_SOURCES[day])
        DeltaTable.create(root / name, schema=schema, partition_by=[day],
                          configuration={"delta.checkpointInterval": "2"})
        for rows in commits:
            dated = [(*row, row[source].date()) for row in rows]
            table = pa.Table.from_pylist([_named(schema, row) for row in dated], schema)
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
         "snapshot_version": 2, "batch_id": 0, "published_at": _iso(0), "retained": None,
         "replayed": None, "alternate_exchange": None, "routed_at": _iso(1)},
        {"message_id": "p/0/1", "subscriber": "bob", "subscription_ids": ["b1", "b2"],
         "exchange": "amq.topic", "routing_key": "a.b", "delivery_topic": "dlv.bob",
         "snapshot_version": 2, "batch_id": 0, "published_at": _iso(0), "retained": None,
         "replayed": None, "alternate_exchange": None, "routed_at": _iso(1)},
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


def test_replayed_and_retained_keep_the_deliveries_so_marked(capsys, tmp_path):
    """--replayed: the deliveries a replay made; --retained: the retained messages delivered
    when a subscription was applied; a live row (false) and a row older than the columns
    (null) are neither; both flags keep the rows that are both (none)."""
    schema = arrow_schema(AUDIT_TABLES["deliveries"])
    DeltaTable.create(tmp_path / "deliveries", schema=schema, partition_by=["routed_date"])
    marks = {"p/0/1": (False, False), "p/0/2": (None, None), "p/0/3": (False, True),
             "p/0/4": (True, False), "p/0/5": (False, True)}
    rows = [{"message_id": m, "subscriber": "ann", "subscription_ids": ["a1"],
             "exchange": "amq.topic", "routing_key": "a.b", "delivery_topic": "dlv.ann",
             "snapshot_version": 1, "batch_id": 0, "published_at": _at(0), "retained": retained,
             "replayed": replayed, "routed_at": _at(i), "routed_date": _at(i).date()}
            for i, (m, (retained, replayed)) in enumerate(marks.items())]
    write_deltalake(tmp_path / "deliveries", pa.Table.from_pylist(rows, schema), mode="append",
                    partition_by=["routed_date"])

    def ids(*flags: str) -> list[str]:
        return [r["message_id"] for r in _json(capsys, tmp_path, "deliveries", *flags)]

    assert ids() == list(marks)
    assert ids("--replayed") == ["p/0/3", "p/0/5"]
    assert ids("--retained") == ["p/0/4"]
    assert ids("--replayed", "--retained") == []
    assert ids("--replayed", "--subscriber", "ann", "--limit", "1") == ["p/0/5"]


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
    (["messages", "--replayed"], 2, "--replayed applies to the deliveries table only"),
    (["subscriptions", "--retained"], 2, "--retained applies to the deliveries table only"),
    (["deliveries", "--since", "yesterday"], 2,
     "--since 'yesterday': expected an ISO-8601 time (2026-11-26T17:00:00Z, 2026-11-26; UTC "
     "when it names no zone) or a duration back from now (90s, 15m, 2h, 7d, 1h30m)"),
    (["deliveries", "--until", "1m2h"], 2, "--until '1m2h': expected an ISO-8601 time"),
])
def test_bad_queries_are_one_line_errors(capsys, warehouse, args, code, message):
    result, out, err = _audit(capsys, warehouse, *args)
    assert (result, out) == (code, "")
    [line] = err.splitlines()
    assert line.startswith("bitroute: error: ") and message in line


# --- streamed answers: time windows, Arrow rendering, --limit ---------------------------------
#
# A router on small batches leaves one file per batch: ``many_files`` is 60 commits (a
# minute apart, over three days) of messages and deliveries, with strings JSON must
# escape. The window sizes are made small so that an answer spans many windows.

TEXTS = ['plain', 'quote " and \\ backslash', 'tab\tnew\nline\r', 'ctl \x01\x1f end',
         'unicode é ✓ \u2028', '', 'a,b=c']


def _many_rows(commit: int) -> dict[str, list[tuple]]:
    at = T0 - timedelta(days=2) + timedelta(hours=commit)  # 60 hours: three days
    text = TEXTS[commit % len(TEXTS)]
    deliveries, messages = [], []
    for i in range(5):
        offset = commit * 5 + i
        for subscriber in ("alice", "bob") if i % 2 else ("alice",):
            deliveries.append((f"p/0/{offset}", subscriber, [f"{subscriber}-1", text],
                               "amq.topic", f"k.{text}", f"dlv.{subscriber}", 1, commit,
                               None if i == 3 else at - timedelta(seconds=1), at))
        messages.append((f"p/0/{offset}", "amq.topic", f"k.{text}", "routed" if i else "rejected",
                         2 if i % 2 else 1, text if not i else None,
                         None if i == 2 else {"h": text, "empty": None}, i, 1, commit,
                         at - timedelta(seconds=1), at))
    return {"deliveries": deliveries, "messages": messages}


@pytest.fixture(scope="module")
def many_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("many-files")
    for name in ("deliveries", "messages"):
        schema = arrow_schema(AUDIT_TABLES[name])
        day = PARTITION_COLUMNS[name]
        DeltaTable.create(root / name, schema=schema, partition_by=[day])
        for commit in range(60):
            rows = [(*row, row[-1].date()) for row in _many_rows(commit)[name]]
            table = pa.Table.from_pylist([_named(schema, row) for row in rows], schema)
            write_deltalake(root / name, table, mode="append", partition_by=[day])
    return root


@pytest.fixture
def small_windows(monkeypatch):
    monkeypatch.setattr(audit, "FIRST_WINDOW_ROWS", 8)
    monkeypatch.setattr(audit, "MAX_WINDOW_ROWS", 30)


@pytest.fixture
def few_files_windows(monkeypatch):
    monkeypatch.setattr(audit, "FIRST_WINDOW_FILES", 3)
    monkeypatch.setattr(audit, "MAX_WINDOW_FILES", 12)


def _expected(warehouse: Path, table: str, keep=lambda row: True) -> list[dict]:
    """The rows of ``table`` as the verb shows them, made in Python from the whole table."""
    rows = DeltaTable(str(warehouse / table)).to_pyarrow_table().to_pylist()
    for row in rows:
        del row[PARTITION_COLUMNS[table]]
        for name, value in row.items():
            if isinstance(value, datetime):
                row[name] = value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            elif name == "headers" and value is not None:
                row[name] = dict(value)
    rows = [row for row in rows if keep(row)]
    order = ("subscriber",) if table == "deliveries" else ()
    return sorted(rows, key=lambda r: (r["routed_at"], int(r["message_id"].split("/")[2]),
                                       *(r[c] for c in order)))


def test_a_streamed_answer_spans_windows_and_reads_as_one(capsys, many_files, small_windows):
    query = audit.AuditQuery("deliveries", subscriber="alice")
    windows = audit._windows(DeltaTable(str(many_files / "deliveries")), query, False)
    assert len(windows) > 5
    assert windows[0][0] is None and windows[-1][1] is None
    assert all(a[1] == b[0] for a, b in pairwise(windows))
    for args, keep in [
        (["deliveries", "--subscriber", "alice"], lambda r: r["subscriber"] == "alice"),
        (["deliveries"], lambda r: True),
        (["messages", "--since", _iso(-20 * 60), "--until", _iso(3 * 60)],
         lambda r: _iso(-20 * 60) <= r["routed_at"] < _iso(3 * 60)),
    ]:
        code, out, err = _audit(capsys, many_files, *args, "--json")
        assert code == 0, err
        expected = _expected(many_files, args[0], keep)
        assert len(expected) > 20
        # Byte for byte what json.dumps of each row prints (escapes, nulls, maps, lists).
        assert out == "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in expected)


def test_the_streamed_table_is_the_collected_table(capsys, many_files, small_windows,
                                                   monkeypatch):
    from streaming.cli.render import table

    code, out, _ = _audit(capsys, many_files, "messages")
    assert code == 0
    columns, rows = audit.run(_config(many_files), audit.AuditQuery("messages"))
    expected = table(columns, rows)
    # Windows after the first may widen a column: the cells are the same, the padding
    # not; with one window the whole text is the same.
    assert re.sub(" +", " ", out) == re.sub(" +", " ", "\n".join(expected) + "\n")
    assert expected[-1] == "(300 rows)"
    monkeypatch.setattr(audit, "FIRST_WINDOW_ROWS", 10**9)
    code, out, _ = _audit(capsys, many_files, "messages")
    assert out == "\n".join(expected) + "\n"


def _config(warehouse: Path):
    from streaming import config as bitroute_config
    return bitroute_config.load(overrides={"delta.warehouse": str(warehouse)}, environ={})


def test_the_first_rows_come_before_the_later_files_are_read(tmp_path, many_files,
                                                               few_files_windows):
    """The first batch of an answer is read from the oldest window alone: with every
    file of the last two days gone from disk it still comes, and the iteration fails
    only when it reaches them; ``--limit`` reads from the newest files back, so with
    the first day's files gone it still answers."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(many_files, copy)
    days = sorted(p for p in (copy / "deliveries").iterdir() if p.name.startswith("routed_date="))
    assert len(days) == 3
    moved = tmp_path / "moved"
    moved.mkdir()
    for day in days[1:]:
        shutil.move(day, moved / day.name)
    query = audit.AuditQuery("deliveries")
    assert len(audit._windows(DeltaTable(str(copy / "deliveries")), query, False)) > 5
    answer = audit.read(_config(copy), query)
    first = next(answer.batches)
    assert first.num_rows and first["message_id"][0].as_py() == "p/0/0"
    with pytest.raises(audit.AuditError):
        list(answer.batches)
    for day in days[1:]:
        shutil.move(moved / day.name, day)
    shutil.move(days[0], moved / days[0].name)
    newest = _expected(many_files, "deliveries", lambda r: r["subscriber"] == "bob")[-4:]
    columns, rows = audit.run(_config(copy), audit.AuditQuery("deliveries", subscriber="bob"),
                              limit=4)
    assert rows == newest


@pytest.mark.parametrize("args, count", [
    (["deliveries", "--subscriber", "alice", "--limit", "7"], 7),
    (["deliveries", "--limit", "1000"], None),  # more than there are: all of them
    (["messages", "--message-id", "p/0/3", "--limit", "1"], 1),
    (["messages", "--since", _iso(-30), "--limit", "3"], 3),
])
def test_limit_keeps_the_newest_rows_in_time_order(capsys, many_files, small_windows, args,
                                                   count):
    everything = [a for a in args if a != "--limit" and not a.isdigit() or a == "p/0/3"]
    code, out, err = _audit(capsys, many_files, *everything, "--json")
    assert code == 0, err
    whole = out.split("\n")[:-1]  # not splitlines: a JSON string may hold U+2028
    code, out, err = _audit(capsys, many_files, *args, "--json")
    assert code == 0, err
    assert out.split("\n")[:-1] == whole[-(count or len(whole)):]
    code, out, _ = _audit(capsys, many_files, *args)
    assert out.split("\n")[-2] == f"({count or len(whole)} row{'s' if count != 1 else ''})"


def test_limit_on_the_subscriptions_state_and_bad_limits(capsys, warehouse):
    rows = _json(capsys, warehouse, "subscriptions", "--state", "--limit", "1")
    assert [r["subscription_id"] for r in rows] == ["b2"]
    for bad in ("0", "-2", "many"):
        with pytest.raises(SystemExit) as exit_:
            _audit(capsys, warehouse, "deliveries", "--limit", bad)
        captured = capsys.readouterr()
        assert (exit_.value.code, captured.out) == (2, "")
        assert "argument --limit:" in captured.err.splitlines()[-1]
    code, _, err = _audit(capsys, warehouse, "migrate", "--limit", "3")
    assert code == 2 and "--limit does not apply to audit migrate" in err


def test_no_rows_is_a_header_and_a_count(capsys, many_files):
    code, out, _ = _audit(capsys, many_files, "deliveries", "--subscriber", "nobody")
    header, rule, count = out.splitlines()
    assert header.split()[:2] == ["message_id", "subscriber"]
    assert count == "(0 rows)"
    assert _json(capsys, many_files, "deliveries", "--subscriber", "nobody") == []


def test_a_compacted_file_is_read_a_row_group_at_a_time(capsys, tmp_path, many_files,
                                                        small_windows):
    """Compaction leaves a file per day of many row groups, in no particular time order:
    the windows follow the row groups' time ranges (more windows than files), and the
    answer is the same."""
    import shutil

    from deltalake import WriterProperties

    copy = tmp_path / "compacted"
    shutil.copytree(many_files, copy)
    table = DeltaTable(str(copy / "deliveries"))
    table.optimize.compact(writer_properties=WriterProperties(max_row_group_size=16))
    table = DeltaTable(str(copy / "deliveries"))
    assert len(table.file_uris()) == 3
    config = _config(copy)
    query = audit.AuditQuery("deliveries")

    def footer(path: str):
        return audit._footer(config, "deliveries", path)

    assert footer(table.get_add_actions(flatten=True)["path"][0].as_py()).num_row_groups > 3
    assert len(audit._windows(table, query, False, footer)) > 6
    assert len(audit._windows(table, query, True, footer)) > 6
    code, out, err = _audit(capsys, copy, "deliveries", "--json")
    assert code == 0, err
    assert out == "".join(json.dumps(row, ensure_ascii=False) + "\n"
                          for row in _expected(many_files, "deliveries"))
    code, out, err = _audit(capsys, copy, "deliveries", "--json", "--limit", "11")
    assert out.split("\n")[:-1] == [json.dumps(row, ensure_ascii=False) for row in
                                    _expected(many_files, "deliveries")[-11:]]


def test_message_ids_sort_by_topic_partition_and_offset_as_numbers():
    """An id of another shape sorts as (id, -1, -1); a topic may hold slashes."""
    ids = ["x", "t/0/10", "t/0/2", "a/b/1/1", "t/1/0", "t/0/-1"]
    at = pa.array([T0] * len(ids), pa.timestamp("us", tz="UTC"))
    table = pa.table({"routed_at": at, "message_id": pa.array(ids)})
    order = ["a/b/1/1", "t/0/2", "t/0/10", "t/1/0", "t/0/-1", "x"]  # "t" < "t/0/-1"
    assert audit._sorted(table, "messages")["message_id"].to_pylist() == order
    shaped = [i for i in order if i not in ("x", "t/0/-1")]  # the fast path: all of one shape
    table = table.filter(pa.array([i in shaped for i in ids]))
    assert audit._sorted(table, "messages")["message_id"].to_pylist() == shaped


def test_the_verb_imports_no_pandas(many_files):
    """pyarrow imports pandas (0.4-0.7 s) to convert any Python value: the streamed path,
    its windows, sort and rendering, converts none."""
    script = (
        "import sys\n"
        "from streaming.audit import queries\n"
        "from streaming.cli.main import main\n"
        "queries.FIRST_WINDOW_ROWS = 8\n"
        f"for form in (['--json'], [], ['--limit', '3'], ['--subscriber', 'bob']):\n"
        f"    main(['audit', 'deliveries', *form, '--set', 'delta.warehouse={many_files}'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas'), file=sys.stderr)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "(3 rows)" in result.stdout
    assert result.stderr.splitlines() == ["[]"]

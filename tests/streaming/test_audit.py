"""``bitroute audit`` on real Delta tables written with the schemas.records StructTypes.

The verb runs in-process on the session's SparkSession (the factory reuses the
active session), against a warehouse of tables the fixture writes.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from schemas.records import DELIVERIES_TABLE, MESSAGES_TABLE, SUBSCRIPTIONS_TABLE
from streaming.cli import main

T0 = datetime(2025, 1, 31, 12, 0, tzinfo=timezone.utc)


def _at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def _iso(minutes: int) -> str:
    return _at(minutes).strftime("%Y-%m-%dT%H:%M:%S.000000Z")


@pytest.fixture(scope="module")
def warehouse(spark, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """deliveries: m1 -> alice, bob; m2 -> alice. messages: m1, m2 routed, m10 rejected.
    subscriptions: Delta version 0 adds a1, b1, b2; version 1 removes b1 and rejects x."""
    root = tmp_path_factory.mktemp("warehouse")

    def write(name, schema, rows):
        spark.createDataFrame(rows, schema).write.format("delta").mode("append").save(
            str(root / name))

    write("deliveries", DELIVERIES_TABLE, [
        ("p/0/1", "alice", ["a1"], "amq.topic", "a.b", "dlv.alice", 2, 0, _at(0), _at(1)),
        ("p/0/1", "bob", ["b1", "b2"], "amq.topic", "a.b", "dlv.bob", 2, 0, _at(0), _at(1)),
        ("p/0/2", "alice", ["a1"], "amq.topic", "a.c", "dlv.alice", 2, 1, None, _at(5)),
    ])
    write("messages", MESSAGES_TABLE, [
        ("p/0/1", "amq.topic", "a.b", "routed", 2, None, {"color": "red"}, 5, 2, 0, _at(0), _at(1)),
        ("p/0/2", "amq.topic", "a.c", "routed", 1, None, {}, 0, 2, 1, _at(4), _at(5)),
        ("p/0/10", "nope", "a.d", "rejected", 0, "unknown exchange 'nope'", None, 3, 2, 1,
         _at(4), _at(5)),
    ])
    write("subscriptions", SUBSCRIPTIONS_TABLE, [
        ("a1", "upsert", "amq.topic", "alice", "a.*", None, None, None, 1, 0, 0, _at(0), _at(0)),
        ("b1", "upsert", "amq.topic", "bob", "#", "any", {"k": None, "c": "red"}, None, 1, 1, 0,
         _at(0), _at(0)),
        ("b2", "upsert", "amq.topic", "bob", "a.b", None, None, None, 2, 1, 1, _at(1), _at(1)),
    ])
    write("subscriptions", SUBSCRIPTIONS_TABLE, [
        ("b1", "remove", None, None, None, None, None, None, 3, 1, 2, _at(2), _at(2)),
        ("x", "rejected", None, None, None, None, None, "bad JSON", 3, 0, 1, _at(2), _at(2)),
    ])
    return root


def _audit(capsys, warehouse: Path, *args: str) -> tuple[int, str, str]:
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
    assert header.split() == [f.name for f in MESSAGES_TABLE.fields]
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
    [b1] = _json(capsys, warehouse, "subscriptions", "--as-of-version", "0", "--subscriber",
                 "bob", "--until", _iso(1))
    assert (b1["header_match"], b1["header_criteria"]) == ("any", {"k": None, "c": "red"})


def test_missing_table_is_one_line_error(capsys, spark, tmp_path):
    code, out, err = _audit(capsys, tmp_path / "empty", "deliveries")
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"bitroute: error: no audit table at {tmp_path / 'empty'}/deliveries: has the router run?"]


@pytest.mark.parametrize("args, code, message", [
    (["subscriptions", "--as-of-version", "9"], 1, "9"),
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

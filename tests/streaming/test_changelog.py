"""Applying changelog records to the index: upserts, tombstones, rejections (no Kafka needed).

The index is a function of the latest record per key, as the compacted
changelog is: an invalid value for a live id removes that subscription.
"""

from __future__ import annotations

import json

import pytest

from compiler import RoutingIndex
from schemas.records import CHANGE_REJECTED, CHANGE_REMOVE, CHANGE_UPSERT
from schemas.tables import SUBSCRIPTIONS_TABLE
from streaming.changelog import Change, apply_record, changes_table

APPLIED_AT_MS = 1_700_000_000_000


def apply(index, key, value, partition, offset, changed_at_ms=None) -> Change:
    return apply_record(index, key, value, partition, offset, changed_at_ms, APPLIED_AT_MS)


@pytest.fixture
def index() -> RoutingIndex:
    return RoutingIndex({"amq.topic": "amqp", "mqtt": "mqtt"})


def _value(**fields) -> bytes:
    return json.dumps(fields).encode()


def test_an_upsert_is_applied_and_recorded_with_its_fields(index):
    change = apply(index, b"s1", _value(
        exchange="mqtt", subscriber="bob", filter="a/+",
        headers={"match": "any", "criteria": {"x": "1", "y": None}}), 0, 7, 1_600_000_000_000)
    assert "s1" in index
    assert change == Change("s1", CHANGE_UPSERT, "mqtt", "bob", "a/+", "any",
                            {"x": "1", "y": None}, None, 0, 7, 1_600_000_000_000, APPLIED_AT_MS)
    assert Change(*json.loads(json.dumps(change))) == change


def test_changes_become_the_arrow_form_of_the_subscriptions_table(index):
    changes = [apply(index, b"s1", _value(exchange="amq.topic", subscriber="bob", filter="a.#"),
                     1, 5, 1_600_000_000_000),
               apply(index, b"s1", None, 1, 6)]
    table = changes_table(changes, 4)
    assert table.column_names == [f.name for f in SUBSCRIPTIONS_TABLE.fields]
    rows = table.to_pylist()
    assert [(r["subscription_id"], r["change"], r["snapshot_version"], r["changelog_offset"])
            for r in rows] == [("s1", CHANGE_UPSERT, 4, 5), ("s1", CHANGE_REMOVE, 4, 6)]
    assert rows[0]["changed_at"].year == 2020 and rows[1]["changed_at"] is None
    assert rows[1]["applied_at"].timestamp() == APPLIED_AT_MS / 1000
    assert changes_table([], 4).num_rows == 0


def test_a_tombstone_removes_and_one_for_an_unknown_id_changes_nothing(index):
    apply(index, b"s1", _value(exchange="amq.topic", subscriber="bob", filter="a.#"), 0, 0)
    assert apply(index, b"s1", None, 0, 1).change == CHANGE_REMOVE
    assert "s1" not in index
    assert apply(index, b"nobody", None, 0, 2).change == CHANGE_REMOVE
    assert len(index) == 0


@pytest.mark.parametrize("key, value, reason", [
    (b"j", b"{not json", "not JSON"),
    (b"f", _value(exchange="mqtt", subscriber="bob", filter="a/#/b"), "a/#/b"),
    (b"e", _value(exchange="nope", subscriber="bob", filter="a"), "unknown exchange"),
    (b"s", _value(exchange="amq.topic", subscriber="no/slash", filter="a"), "subscriber"),
    (None, _value(exchange="amq.topic", subscriber="bob", filter="a"), "key"),
    (None, None, "tombstone without a key"),
])
def test_a_bad_change_is_rejected_with_a_reason(index, key, value, reason):
    change = apply(index, key, value, 1, 4)
    assert change.change == CHANGE_REJECTED
    assert reason in change.reason
    assert len(index) == 0


def test_an_invalid_value_for_a_live_subscription_removes_it(index):
    apply(index, b"s1", _value(exchange="mqtt", subscriber="bob", filter="a/+"), 0, 0)
    change = apply(index, b"s1", _value(exchange="mqtt", subscriber="bob", filter="a/#/b"), 0, 1)
    assert change.change == CHANGE_REMOVE
    assert "a/#/b" in change.reason and "removed" in change.reason
    assert (change.exchange, change.subscriber, change.filter) == ("mqtt", "bob", "a/#/b")
    assert "s1" not in index

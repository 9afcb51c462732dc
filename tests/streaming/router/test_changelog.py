"""Applying changelog records to the index: upserts, tombstones, rejections (no Kafka needed);
then, on the session's broker, the reader's progress and a catch-up's pending version.

The index is a function of the latest record per key, as the compacted
changelog is: an invalid value for a live id removes that subscription.
"""

from __future__ import annotations

import json

import pytest

from compiler import RoutingIndex
from schemas.records import CHANGE_REJECTED, CHANGE_REMOVE, CHANGE_UPSERT
from schemas.tables import SUBSCRIPTIONS_TABLE
from streaming.kafka.clients import record_position
from streaming.router.subscriptions.changelog import Change, apply_record
from streaming.router.subscriptions.subscription_sync import changes_table

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
                            {"x": "1", "y": None}, None, 0, 7, 1_600_000_000_000, APPLIED_AT_MS,
                            0, False, False, False)
    assert Change(*json.loads(json.dumps(change))) == change
    again = apply(index, b"s1", _value(exchange="mqtt", subscriber="bob", filter="a/+",
                                       retain_handling=1, retain_as_published=True,
                                       no_local=True), 0, 8)
    assert (again.retain_handling, again.retain_as_published, again.existed,
            again.no_local) == (1, True, True, True)


def test_changes_persisted_before_the_option_fields_read_with_none(index):
    """A version's changes as an earlier build persisted them (JSON arrays without the
    option fields) read back as changes and become audit rows with null options."""
    change = apply(index, b"s1", _value(exchange="mqtt", subscriber="bob", filter="a/+"), 0, 7)
    older = json.loads(json.dumps(change))[:len(change) - 4]
    assert Change(*older).retain_handling is None
    rows = changes_table([older], 4).to_pylist()
    assert (rows[0]["subscription_id"], rows[0]["retain_handling"],
            rows[0]["retain_as_published"], rows[0]["no_local"]) == ("s1", None, None, None)


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
    assert change.change == CHANGE_REJECTED and change.reason is not None
    assert reason in change.reason
    assert len(index) == 0


def test_an_invalid_value_for_a_live_subscription_removes_it(index):
    apply(index, b"s1", _value(exchange="mqtt", subscriber="bob", filter="a/+"), 0, 0)
    change = apply(index, b"s1", _value(exchange="mqtt", subscriber="bob", filter="a/#/b"), 0, 1)
    assert change.change == CHANGE_REMOVE
    assert change.reason is not None and "a/#/b" in change.reason and "removed" in change.reason
    assert (change.exchange, change.subscriber, change.filter) == ("mqtt", "bob", "a/#/b")
    assert "s1" not in index


# --- progress of a catch-up, on the session's broker -------------------------------------

def _changelog(base_config, new_topic, records: int):
    """A config whose changelog is a fresh 2-partition topic holding ``records`` upserts."""
    import dataclasses

    from confluent_kafka import Producer

    topic = new_topic(partitions=2)
    config = dataclasses.replace(
        base_config, kafka=dataclasses.replace(base_config.kafka, subscriptions_topic=topic))
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap, "linger.ms": 20})
    for i in range(records):
        producer.produce(topic, key=f"s{i}".encode(), partition=i % 2,
                         value=_value(exchange="amq.topic", subscriber="bob", filter=f"a.{i}"))
    assert producer.flush(60) == 0
    return config


def test_read_to_end_reports_progress_from_zero_to_the_offsets_it_covers(base_config, new_topic):
    from streaming.router.subscriptions.changelog import POLL_MAX_RECORDS, ChangelogReader

    records = 3 * POLL_MAX_RECORDS + 500
    config = _changelog(base_config, new_topic, records)
    reader = ChangelogReader(config)
    try:
        calls: list[tuple[int, int]] = []
        applied: list[int] = []
        offsets = reader.read_to_end({}, lambda m: applied.append(record_position(m)[2]),
                                     progress=lambda done, total: calls.append((done, total)))
        assert offsets == {0: records // 2, 1: records // 2}
        assert len(applied) == records
        assert calls[0] == (0, records) and calls[-1] == (records, records)
        assert len(calls) >= 1 + records // POLL_MAX_RECORDS  # after each poll, not only at the ends
        assert {total for _, total in calls} == {records}
        dones = [done for done, _ in calls]
        assert dones == sorted(dones), "progress went backwards"

        # From a position: only what is left counts; nothing left is (0, 0) twice.
        calls.clear()
        reader.read_to_end({0: 1000, 1: 1500}, lambda m: None,
                           progress=lambda done, total: calls.append((done, total)))
        left = records - 2500
        assert calls[0] == (0, left) and calls[-1] == (left, left)
        calls.clear()
        reader.read_to_end(offsets, lambda m: None,
                           progress=lambda done, total: calls.append((done, total)))
        assert calls == [(0, 0), (0, 0)]
    finally:
        reader.close()


def test_a_slow_catch_up_prints_progress_lines_and_its_total(base_config, new_topic):
    import io

    from streaming.cli.progress import CatchUpProgress
    from streaming.router.subscriptions.changelog import ChangelogReader

    records = 2500
    config = _changelog(base_config, new_topic, records)
    ticks = iter(range(0, 10_000, 3))  # each look at the clock is 3 s later
    out = io.StringIO()
    reader = ChangelogReader(config)
    try:
        reader.read_to_end({}, lambda m: None,
                           progress=CatchUpProgress(out, clock=lambda: float(next(ticks))))
    finally:
        reader.close()
    lines = out.getvalue().splitlines()
    assert lines, "no progress printed"
    assert all(line.startswith("bitroute: catching up the changelog: ") for line in lines[:-1])
    assert lines[-1].startswith(f"bitroute: caught up the changelog: {records:,} records in ")
    assert any(f" of {records:,} records (" in line for line in lines[:-1])


def test_a_catch_up_stays_pending_until_committed_and_a_rollback_reads_it_again(
        base_config, new_topic, tmp_path):
    from confluent_kafka import Producer

    from streaming.router.subscriptions.changelog import RejectedRecord, Subscriptions
    from streaming.router.subscriptions.snapshots import BatchSnapshots, SnapshotStore
    from streaming.state.checkpoint import CheckpointLayout

    config = _changelog(base_config, new_topic, 3)
    topic = config.kafka.subscriptions_topic
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap})
    producer.produce(topic, key=b"bad", value=b"{not json", partition=0, headers=[("h", b"1")])
    assert producer.flush(30) == 0
    store = SnapshotStore(CheckpointLayout.of(tmp_path))

    state, resumed = Subscriptions.open(config, BatchSnapshots(store))
    try:
        assert (state.version, resumed, store.versions()) == (0, [], [0])
        pending = state.catch_up()
        assert pending is not None
        assert pending.version == 1 and state.version == 0 and state.offsets == {}
        assert len(pending.changes) == 4 and len(state) == 3  # applied, not committed
        assert pending.offsets == {0: 3, 1: 1}
        assert pending.subscribers() == {"bob"}
        [bad] = pending.rejected
        assert bad._replace(reason="") == RejectedRecord(topic, 0, 2, b"bad", b"{not json",
                                                         [("h", b"1")], "")
        assert "not JSON" in bad.reason
        with pytest.raises(RuntimeError, match="pending"):
            state.catch_up()

        state.rollback()
        assert (state.version, len(state), store.versions()) == (0, 0, [0])
        again = state.catch_up()
        assert again is not None
        # The same records (partitions interleave in any order; applied_at is the new read's).
        assert sorted(c._replace(applied_at_ms=0) for c in again.changes) == sorted(
            c._replace(applied_at_ms=0) for c in pending.changes)
        with pytest.raises(RuntimeError, match="not the pending"):
            state.commit(pending)
        state.commit(again)
        assert (state.version, state.offsets, store.versions()) == (1, again.offsets, [0, 1])
        assert not store.load(1).reads_headers  # recorded with the version: no criteria in it
        assert state.catch_up() is None and state.version == 1
    finally:
        state.close()

    reopened, resumed = Subscriptions.open(config, BatchSnapshots(store))
    try:
        assert (reopened.version, len(reopened), reopened.offsets) == (1, 3, again.offsets)
        assert resumed == again.changes
    finally:
        reopened.close()


def test_a_catch_up_copies_the_headers_of_only_the_records_that_read_them(
        base_config, new_topic, tmp_path, monkeypatch):
    """A first catch-up applies millions of upserts: their headers are not copied out of
    each record; a tombstone's (its removal's reason) and a rejected record's (kept with
    it) are."""
    from confluent_kafka import Producer

    from schemas.records import REASON_HEADER
    from streaming.router.subscriptions import changelog
    from streaming.router.subscriptions.snapshots import BatchSnapshots, SnapshotStore
    from streaming.state.checkpoint import CheckpointLayout

    config = _changelog(base_config, new_topic, 0)
    topic = config.kafka.subscriptions_topic
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap})
    for i in range(50):
        producer.produce(topic, key=f"s{i}".encode(), partition=0, headers=[("h", b"up")],
                         value=_value(exchange="amq.topic", subscriber="bob", filter=f"a.{i}"))
    producer.produce(topic, key=b"s0", value=None, partition=0,
                     headers=[("h", b"gone"), (REASON_HEADER, b"retired")])
    producer.produce(topic, key=b"bad", value=b"{not json", partition=0, headers=[("h", b"1")])
    assert producer.flush(30) == 0
    copied: list[int] = []
    copy = changelog.record_headers

    def record_headers(message):
        copied.append(message.offset())
        return copy(message)

    monkeypatch.setattr(changelog, "record_headers", record_headers)
    state, _ = changelog.Subscriptions.open(config, BatchSnapshots(
        SnapshotStore(CheckpointLayout.of(tmp_path))))
    try:
        pending = state.catch_up()
        assert pending is not None and len(pending.changes) == 52
        assert sorted(copied) == [50, 51]
        removed = pending.changes[50]
        assert (removed.change, removed.reason) == (CHANGE_REMOVE, "retired")
        # A change with a reason keeps its record, headers included (the tombstone's once).
        assert {r.offset: r.headers for r in pending.rejected} == {
            50: [("h", b"gone"), (REASON_HEADER, b"retired")], 51: [("h", b"1")]}
    finally:
        state.close()

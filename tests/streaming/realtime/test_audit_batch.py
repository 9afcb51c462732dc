"""Realtime mode's audit of one batch of routed records (streaming.realtime.audit_batch):
repeats left out, retention gaps told apart from other gaps, the rows made, and the
Spark task's one row; on Arrow tables, with Kafka's earliest offsets given."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from schemas.records import OUTCOME_LOST, OUTCOME_ROUTED, message_id
from streaming.realtime.audit_batch import (
    AuditTask,
    AuditTaskSettings,
    audit_batch,
    lost_ranges,
    select,
    task_result,
)

TOPIC = "publishes"


def _records(offsets: list[tuple[int, int]], subscribers: int = 2) -> pa.Table:
    """Parsed routed records at (partition, offset), each delivered to ``subscribers``."""
    n = len(offsets)
    return pa.table({
        "message_id": [f"{TOPIC}/{p}/{o}" for p, o in offsets],
        "partition": pa.array([p for p, _ in offsets], pa.int32()),
        "offset": pa.array([o for _, o in offsets], pa.int64()),
        "exchange": ["amq.topic"] * n,
        "routing_key": ["a.b"] * n,
        "outcome": [OUTCOME_ROUTED] * n,
        "reason": pa.array([None] * n, pa.string()),
        "deliveries": [[{"subscriber": f"s{i}", "subscription_ids": [f"s{i}-1"]}
                        for i in range(subscribers)]] * n,
        "headers": pa.array([None] * n, pa.map_(pa.string(), pa.string())),
        "payload_bytes": pa.array([3] * n, pa.int32()),
        "published_at": pa.array([1_700_000_000_000 + o for _, o in offsets], pa.int64()),
        "snapshot_version": pa.array([7] * n, pa.int64()),
        "alternate_exchange": pa.array(["ae"] + [None] * (n - 1), pa.string()),
        "routed_at": pa.array([datetime(2026, 11, 27, tzinfo=UTC)] * n,
                              pa.timestamp("us", tz="UTC")),
    })


def _never(partitions):
    raise AssertionError(f"Kafka asked for {partitions} without a gap")


def test_repeats_below_the_mark_and_second_routings_are_left_out():
    partitions = np.array([0, 0, 1, 0, 1, 0], dtype=np.int64)
    offsets = np.array([4, 5, 9, 5, 10, 6], dtype=np.int64)
    kept = select(partitions, offsets, {0: 5})
    # Partition 0: 4 is audited, 5 twice (the first kept); partition 1 has no mark.
    assert kept.tolist() == [1, 5, 2, 4]


def test_consecutive_offsets_ask_kafka_nothing():
    audit, rows = audit_batch(_records([(0, 5), (0, 6), (1, 0)]), {0: 5}, _never, TOPIC, 0)
    assert (audit.publishes, audit.deliveries, audit.repeats) == (3, 6, 0)
    assert audit.seen_end == {0: 7, 1: 1} and audit.start == {0: 5, 1: 0}
    assert audit.end == {0: 7, 1: 1} and not audit.lost
    assert rows.num_rows == 3 and rows["snapshot_version"].to_pylist() == [7, 7, 7]
    assert rows["alternate_exchange"].to_pylist() == ["ae", None, None]


def test_a_gap_below_kafkas_earliest_offset_is_lost_and_one_still_in_the_log_is_not():
    # Partition 0: audited up to 4, then 10 (5..9 deleted: earliest 10); partition 1:
    # 3 then 5 (4 is a transaction marker, still in the log).
    asked = []

    def earliest(partitions):
        asked.append(partitions)
        return {0: 10, 1: 0}

    records = _records([(0, 10), (0, 11), (1, 3), (1, 5)])
    audit, rows = audit_batch(records, {0: 5, 1: 3}, earliest, TOPIC, 2)
    assert asked == [[0, 1]]
    [gap] = audit.lost
    assert (gap.partition, gap.first_offset, gap.end_offset, gap.records) == (0, 5, 10, 5)
    assert gap.message_id == message_id(TOPIC, 0, 5, 2)
    assert gap.lost_before == datetime.fromtimestamp(1_700_000_000_010 / 1000, UTC)
    assert audit.start == {0: 5, 1: 3} and audit.end == {0: 12, 1: 6}
    lost = [r for r in rows.to_pylist() if r["outcome"] == OUTCOME_LOST]
    assert len(lost) == 1 and "offsets 5..9 of partition 0 (5 publishes" in lost[0]["reason"]
    assert lost[0]["deliveries"] == [] and lost[0]["snapshot_version"] == 7


def test_a_gap_between_two_kept_records_is_found_and_clipped_to_the_earliest_offset():
    partitions = np.array([0, 0, 0], dtype=np.int64)
    offsets = np.array([3, 8, 20], dtype=np.int64)
    published = np.array([1, 2, 3], dtype=np.int64)
    # 4..7 deleted, 9..19: 9..14 deleted, 15..19 still in the log (earliest 15).
    assert lost_ranges(partitions, offsets, published, {0: 3}, lambda _: {0: 15}) == [
        (0, 4, 8, 2), (0, 9, 15, 3)]
    # Without a mark, the first record starts the partition: no gap before it.
    assert lost_ranges(partitions[:1], offsets[:1], published[:1], {}, _never) == []


def test_the_task_writes_the_files_and_returns_one_row(tmp_path, isolated_config):
    config = isolated_config()
    settings = AuditTaskSettings(
        delta=config.delta, layout=config.kafka.layout, batch_id=4,
        routed_at=datetime(2026, 11, 27, 12, tzinfo=UTC),
        partitioned=frozenset({"messages", "deliveries"}), floor={0: 5}, earliest={0: 8},
        topic=TOPIC)
    assert list(AuditTask(settings)(iter([]))) == []  # an empty batch: no row
    records = _records([(0, 4), (0, 8), (0, 9), (0, 8)], subscribers=3)
    [row] = list(AuditTask(settings)(iter(records.to_batches())))
    audit = task_result(pa.Table.from_batches([row]), TOPIC, 0)
    assert (audit.publishes, audit.deliveries, audit.repeats) == (2, 6, 2)
    assert audit.seen_end == {0: 10} and audit.start == {0: 5} and audit.end == {0: 10}
    assert [(g.first_offset, g.end_offset) for g in audit.lost] == [(5, 8)]
    assert audit.files is not None
    files = audit.files.to_pylist()
    assert {f["table"] for f in files} == {"messages", "deliveries"}
    assert {f["table"]: f["records"] for f in files} == {"messages": 3, "deliveries": 6}
    messages = next(f for f in files if f["table"] == "messages")
    rows = pq.read_table(f"{config.delta.table_path('messages')}/{messages['path']}")
    assert sorted(rows["message_id"].to_pylist()) == [f"{TOPIC}/0/5", f"{TOPIC}/0/8",
                                                      f"{TOPIC}/0/9"]
    assert set(rows["batch_id"].to_pylist()) == {4}

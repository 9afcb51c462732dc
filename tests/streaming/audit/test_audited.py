"""The marks each audit commit records and the rows a router that took one over leaves out
(streaming/audit/audited.py, streaming/audit/writer.py), on real Delta tables (delta-rs) in
a temporary folder; no Spark, no Kafka."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from audit_rows import routed_rows
from schemas.records import DELIVERIES, MESSAGES
from streaming.audit.audited import AuditedMark, rows_not_audited, span_against
from streaming.audit.writer import AuditTables, FileBatch, PublishBatch
from streaming.config import AuditConfig, Config, DeltaConfig, KafkaConfig, StreamingConfig
from streaming.kafka.layout import DeliveryLayout
from streaming.router.batch.delivery import ProducerSettings
from streaming.router.batch.routing import RouteSettings, TaskAudit, write_task_audit

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def _config(root: Path, topic: str = "p") -> Config:
    return Config(delta=DeltaConfig(warehouse=str(root / "delta")),
                  kafka=KafkaConfig(publishes_topic=topic),
                  streaming=StreamingConfig(checkpoint_dir=root / "checkpoints"),
                  audit=AuditConfig(file_retention="0 hours"))


def _tables(config: Config, router_id: str) -> AuditTables:
    tables = AuditTables(config, router_id)
    tables.ensure()
    return tables


def _file_batch(config: Config, batch_id: int, rows: pa.Table, start: dict, end: dict) -> FileBatch:
    """What the executors' tasks of a batch write and the driver journals."""
    settings = RouteSettings(
        default_exchange="amq.topic", layout=DeliveryLayout("d."), rejected_topic="r",
        snapshot_version=4, with_headers=False, producer=ProducerSettings("127.0.0.1:1", 1_000_000),
        audit=TaskAudit(config.delta, batch_id, NOW, frozenset({MESSAGES, DELIVERIES})))
    row = write_task_audit(rows, settings)
    files = pa.Table.from_struct_array(row.column("files").flatten())
    return FileBatch(batch_id, 4, NOW, files, row.column("publishes")[0].as_py(), start, end)


def _ids(config: Config, table: str) -> Counter:
    data = DeltaTable(config.delta.table_path(table)).to_pyarrow_table()
    if table == DELIVERIES:
        return Counter(zip(data["message_id"].to_pylist(), data["subscriber"].to_pylist(), strict=True))
    return Counter(data["message_id"].to_pylist())


def test_where_a_batch_lies_against_a_mark():
    mark = {0: 10, 1: 5}
    assert span_against({0: 10, 1: 5}, {0: 14, 1: 9}, mark) == "after"
    assert span_against({0: 2, 1: 0}, {0: 10, 1: 5}, mark) == "before"
    assert span_against({0: 8, 1: 5}, {0: 12, 1: 5}, mark) == "across"
    assert span_against(None, {0: 10, 1: 4}, mark) == "before"  # a start unknown: the end says
    assert span_against(None, {0: 11}, mark) == "across"
    assert span_against({0: 0}, None, {}) == "after"  # no mark: nothing to sort
    rows = routed_rows(0, publishes=4)  # p/0/0 .. p/0/3
    assert rows_not_audited(rows, {0: 2, 1: 99})["message_id"].to_pylist() == ["p/0/2", "p/0/3"]


def test_a_mark_reads_back_from_its_commit_metadata_and_never_moves_back():
    mark = AuditedMark("p", "r2", ("r1",), {0: 7, 3: 2}, 5)
    assert AuditedMark.of_commit(mark.metadata()) == mark
    assert AuditedMark.of_commit({"bitroute.audited": "not json"}) is None
    assert mark.advanced({0: 6, 1: 4}, "r3", ("r1", "r2")).offsets == {0: 7, 1: 4, 3: 2}


def test_a_router_that_took_over_a_mark_audits_only_the_rows_above_it(tmp_path):
    config = _config(tmp_path)
    first = _tables(config, "r1")
    # The original router audits publishes 0/100..102 (batch 1), driver-routed.
    first.append_publishes([PublishBatch(1, 4, NOW, routed_rows(1, publishes=3),
                                         {0: 100}, {0: 103})])
    first.close()
    # A router of another publishes topic commits into the same warehouse after it.
    other = _tables(_config(tmp_path, topic="q"), "q1")
    other.append_publishes([PublishBatch(1, 4, NOW, routed_rows(7, publishes=1), {0: 700},
                                         {0: 701})])
    other.close()

    restored = _tables(config, "r2")
    assert restored.latest_mark(MESSAGES) == AuditedMark("p", "r1", (), {0: 103}, 4)
    restored.ancestors = ("r1",)
    marks = {name: restored.latest_mark(name) for name in (MESSAGES, DELIVERIES)}
    restored.marks = {name: mark for name, mark in marks.items() if mark is not None}
    assert len(restored.marks) == 2
    # Batch 1 again with other boundaries: on the executors it straddles the mark (its
    # files are rewritten), in the driver it lies below it; batch 2 is new.
    restored.append_publishes([
        _file_batch(config, 1, routed_rows(1, publishes=5), {0: 100}, {0: 105}),
        PublishBatch(2, 4, NOW, routed_rows(1, publishes=3), {0: 100}, {0: 103}),
        PublishBatch(3, 4, NOW, routed_rows(2, publishes=2), {0: 200}, {0: 202}),
    ])
    expected = [f"p/0/{o}" for o in (100, 101, 102, 103, 104, 200, 201)]
    assert _ids(config, MESSAGES) == Counter(expected + ["p/0/700"])
    assert _ids(config, DELIVERIES) == Counter(
        [(m, s) for m in expected for s in ("s0", "s1")] + [("p/0/700", "s0"), ("p/0/700", "s1")])
    assert restored.latest_mark(DELIVERIES) == AuditedMark("p", "r2", ("r1",), {0: 202}, 4)
    restored.close()

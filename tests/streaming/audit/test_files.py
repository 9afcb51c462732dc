"""Audit files written by the routing tasks (streaming/audit/files.py) and committed by the
driver's committer, on real Delta tables (delta-rs) in temporary folders; no Spark, no Kafka.

A task's audit is its files; the committer adds the files a journaled batch names, and
nothing else: the files of an attempt Spark discarded or of a batch never journaled stay
untracked until the maintenance's vacuum deletes them.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from audit_rows import routed_rows as _routed
from schemas.records import DELIVERIES, MESSAGES
from streaming.audit import files as audit_files, queries as audit
from streaming.audit.committer import AuditCommitter
from streaming.audit.journal import AuditJournal
from streaming.audit.maintenance import maintain
from streaming.audit.writer import AuditTables, FileBatch, PublishBatch
from streaming.config import AuditConfig, Config, DeltaConfig, StreamingConfig
from streaming.kafka.layout import DeliveryLayout
from streaming.router.batch.delivery import ProducerSettings
from streaming.router.batch.routing import RouteSettings, TaskAudit, write_task_audit
from waiting import wait_until

NOW = datetime(2026, 3, 10, 12, 0, 0, 123456, tzinfo=UTC)


def _config(root: Path) -> Config:
    return Config(delta=DeltaConfig(warehouse=str(root / "delta")),
                  streaming=StreamingConfig(checkpoint_dir=root / "checkpoints"),
                  audit=AuditConfig(file_retention="0 hours"))


def _settings(config: Config, batch_id: int) -> RouteSettings:
    return RouteSettings(
        default_exchange="amq.topic", layout=DeliveryLayout("bitroute.deliveries."),
        rejected_topic="bitroute.rejected", snapshot_version=4, with_headers=False,
        producer=ProducerSettings("127.0.0.1:1", 1_000_000),
        audit=TaskAudit(config.delta, batch_id, NOW, frozenset({MESSAGES, DELIVERIES})))


def _task(config: Config, batch_id: int, **shape: Any) -> FileBatch:
    """What one task attempt of batch ``batch_id`` returns, as the driver journals it."""
    row = write_task_audit(_routed(batch_id, **shape), _settings(config, batch_id))
    files = pa.Table.from_struct_array(row.column("files").flatten())
    return FileBatch(batch_id, 4, NOW, files, row.column("publishes")[0].as_py())


def _tables(config: Config) -> AuditTables:
    tables = AuditTables(config, "r1")
    tables.ensure()
    return tables


def _rows(config: Config, table: str) -> Counter:
    columns = ["message_id", "subscriber"] if table == DELIVERIES else ["message_id"]
    data = DeltaTable(config.delta.table_path(table)).to_pyarrow_table(columns=columns)
    return Counter(zip(*(data[c].to_pylist() for c in columns), strict=True))


def _parquet_files(config: Config, table: str) -> set[str]:
    root = Path(config.delta.table_path(table))
    return {str(p.relative_to(root)) for p in root.rglob("*.parquet")}


def test_a_task_returns_its_counts_and_files_and_writes_no_row_through_the_driver(tmp_path):
    config = _config(tmp_path)
    _tables(config).close()
    row = write_task_audit(_routed(1, publishes=4, fanout=3), _settings(config, 1))
    assert row.schema.names == ["publishes", "deliveries", "rejected", "files", "latency_ms",
                                "expired", "subscriptions"]
    assert row.column("subscriptions")[0].as_py() is None  # a replay chunk's task's only
    assert len(row.column("latency_ms")[0].as_py()) == 4  # a sample of each publish's latency
    assert row.num_rows == 1
    assert (row.column("publishes")[0].as_py(), row.column("deliveries")[0].as_py(),
            row.column("rejected")[0].as_py()) == (4, 12, 0)
    files = audit_files.audit_files(row.column("files").flatten())
    assert sorted((f.table, f.records) for f in files) == [(DELIVERIES, 12), (MESSAGES, 4)]
    for f in files:
        assert f.path.startswith("routed_date=2026-03-10/part-b0000000001-driver-")
        assert (f.partition_column, f.partition_value) == ("routed_date", "2026-03-10")
        on_disk = Path(config.delta.table_path(f.table)) / f.path
        assert on_disk.stat().st_size == f.size
        assert json.loads(f.stats)["numRecords"] == f.records


def test_task_files_carry_the_tables_writer_properties(tmp_path):
    config = _config(tmp_path)
    _tables(config).close()
    batch = _task(config, 1, publishes=5, fanout=2)
    for f in batch.table_files(DELIVERIES) + batch.table_files(MESSAGES):
        parquet = pq.ParquetFile(Path(config.delta.table_path(f.table)) / f.path)
        assert "routed_date" not in parquet.schema_arrow.names  # in the folder, as Delta has it
        column = parquet.schema_arrow.names.index("message_id")
        chunk = parquet.metadata.row_group(0).column(column)
        assert chunk.compression == "SNAPPY"
        assert chunk.bloom_filter_offset is not None and chunk.bloom_filter_length > 0
        assert chunk.statistics is not None and chunk.statistics.has_min_max


def test_executor_files_and_driver_rows_commit_together_once_and_a_discarded_attempt_never(
        tmp_path):
    config = _config(tmp_path)
    tables = _tables(config)
    committer = AuditCommitter(tables, AuditJournal(tmp_path / "journal"), 0.2, 100)
    committer.recover()
    discarded = _task(config, 1)  # an attempt whose result Spark dropped (retry, speculation)
    kept = _task(config, 1)  # the attempt whose result reached the driver
    assert committer.submit(kept)
    assert committer.submit(PublishBatch(2, 4, NOW, _routed(2)))  # routed in the driver
    assert committer.submit(_task(config, 3, fanout=0))
    before = {t: DeltaTable(config.delta.table_path(t)).version() for t in (MESSAGES, DELIVERIES)}
    assert committer.flush(30)
    for table in (MESSAGES, DELIVERIES):
        delta = DeltaTable(config.delta.table_path(table))
        assert delta.version() == before[table] + 1, "one transaction for the group"
        assert delta.transaction_version("bitroute-r1-publishes") == 3
    messages, deliveries = _rows(config, MESSAGES), _rows(config, DELIVERIES)
    assert sum(messages.values()) == 9 and set(messages.values()) == {1}
    assert sum(deliveries.values()) == 12 and set(deliveries.values()) == {1}
    # A re-run of batch 1 (a new attempt after a restart) is refused: its files stay out.
    again = _task(config, 1)
    assert not committer.submit(again)
    assert sum(_rows(config, MESSAGES).values()) == 9

    untracked = {f.path for b in (discarded, again) for f in b.table_files(MESSAGES)}
    assert untracked <= _parquet_files(config, MESSAGES)
    assert not untracked & set(DeltaTable(config.delta.table_path(MESSAGES)).file_uris()), \
        "a discarded attempt's file was committed"
    # The vacuum deletes untracked files once older than audit.file_retention (1 s at least).
    assert maintain(config).ok
    wait_until(lambda: maintain(config).ok and not untracked & _parquet_files(config, MESSAGES),
               timeout=20, what="the vacuum to delete the discarded attempt's files")
    assert sum(_rows(config, MESSAGES).values()) == 9
    assert sum(_rows(config, DELIVERIES).values()) == 12
    committer.stop()
    tables.close()


def test_a_query_at_the_edge_of_a_files_time_range_finds_its_rows(tmp_path):
    # routed_at is NOW (to the microsecond): the file's statistics are in milliseconds, the
    # minimum rounded down and the maximum up, so bounds tight around the row (since is
    # inclusive, until exclusive) never skip its file.
    config = _config(tmp_path)
    tables = _tables(config)
    tables.append_publishes([_task(config, 1)])
    since = audit.AuditQuery(table=DELIVERIES, since=NOW)
    until = dataclasses.replace(since, since=None, until=NOW + timedelta(microseconds=1))
    assert len(audit.run(config, since)[1]) == 6
    assert len(audit.run(config, until)[1]) == 6
    tables.close()


def test_delta_statistics_round_timestamps_outward_and_skip_nested_columns():
    moment = datetime(2026, 3, 10, 23, 59, 59, 999_500, tzinfo=UTC)
    rows = pa.table({
        "at": pa.array([moment, moment - timedelta(microseconds=1_000)],
                       pa.timestamp("us", tz="UTC")),
        "name": ["b", None], "n": [3, 1],
        "tags": pa.array([["x"], []], pa.list_(pa.string())),
    })
    stats = json.loads(audit_files.delta_stats(rows))
    assert stats["numRecords"] == 2
    assert stats["minValues"] == {"at": "2026-03-10T23:59:59.998Z", "name": "b", "n": 1}
    assert stats["maxValues"] == {"at": "2026-03-11T00:00:00.000Z", "name": "b", "n": 3}
    assert stats["nullCount"] == {"at": 0, "name": 1, "n": 0}

"""The audit journal, the group committer, day partitions and ``bitroute audit migrate``,
on real Delta tables (delta-rs) in temporary folders; no Spark, no Kafka."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from audit_rows import routed_rows as _routed
from schemas.records import DELIVERIES, MESSAGES, PARTITION_COLUMNS
from streaming.audit import migration as audit_migration, queries as audit, writer as delta_sink
from streaming.audit.committer import AuditCommitter, AuditStopping
from streaming.audit.journal import AuditJournal
from streaming.audit.writer import ARROW_SCHEMAS, AuditTables, PublishBatch
from streaming.cli.main import main
from streaming.config import Config, DeltaConfig, StreamingConfig
from streaming.state.lock import RouterLock, RouterLockedError
from waiting import wait_until

APP = "bitroute-r1-publishes"
NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def _config(root: Path) -> Config:
    return Config(delta=DeltaConfig(warehouse=str(root / "delta")),
                  streaming=StreamingConfig(checkpoint_dir=root / "checkpoints"))


def _batch(batch_id: int, routed_at: datetime = NOW, **shape: Any) -> PublishBatch:
    return PublishBatch(batch_id, 1, routed_at, _routed(batch_id, **shape))


def _tables(root: Path) -> AuditTables:
    tables = AuditTables(_config(root), "r1")
    tables.ensure()
    return tables


def _committer(root: Path, tables: AuditTables, max_pending: int = 100) -> AuditCommitter:
    return AuditCommitter(tables, AuditJournal(root / "journal"), 0.2, max_pending)


def _rows(root: Path, table: str) -> Counter:
    columns = ["message_id", "subscriber"] if table == DELIVERIES else ["message_id"]
    data = DeltaTable(str(root / "delta" / table)).to_pyarrow_table(columns=columns)
    return Counter(zip(*(data[c].to_pylist() for c in columns), strict=True))


def test_a_journaled_batch_survives_a_new_process_and_reads_back_whole(tmp_path):
    journal = AuditJournal(tmp_path / "j")
    batch = dataclasses.replace(_batch(7), start={0: 10, 1: 4}, end={0: 13, 1: 4})
    journal.write(batch)
    (tmp_path / "j" / ".00000000000000000008.arrow.tmp").write_bytes(b"half a file")
    again = AuditJournal(tmp_path / "j")  # as after a crash
    assert again.pending() == [7]
    assert [p.name for p in (tmp_path / "j").iterdir()] == ["00000000000000000007.arrow"]
    read = again.read(7)
    assert isinstance(read, PublishBatch)
    assert (read.batch_id, read.snapshot_version, read.routed_at) == (7, 1, NOW)
    assert read.routed.equals(batch.routed)
    assert (read.start, read.end) == ({0: 10, 1: 4}, {0: 13, 1: 4})  # what the batch read
    assert 0.0 < again.oldest_age_s() < 600.0  # from the file's time: journaled just now
    again.remove([7])
    assert again.pending() == [] and again.oldest_age_s() == 0.0


def test_pending_batches_are_group_committed_once_and_reruns_are_not_journaled(tmp_path):
    tables = _tables(tmp_path)
    committer = _committer(tmp_path, tables)
    committer.recover()
    before = {t: DeltaTable(tables.path(t)).version() for t in (MESSAGES, DELIVERIES)}
    assert all(committer.submit(_batch(b, fanout=0 if b == 4 else 2)) for b in range(5))
    assert not committer.submit(_batch(3))  # journaled already
    assert committer.pending_batches == 5
    assert committer.flush(30) and committer.pending_batches == 0
    assert committer.lag_seconds == 0.0
    for table in (MESSAGES, DELIVERIES):
        delta = DeltaTable(tables.path(table))
        assert delta.version() == before[table] + 1, "one transaction for the whole group"
        assert delta.transaction_version(APP) == 4
        assert delta.metadata().partition_columns == [PARTITION_COLUMNS[table]]
    assert not committer.submit(_batch(2))  # committed to both tables already
    assert sum(_rows(tmp_path, MESSAGES).values()) == 15
    assert set(_rows(tmp_path, DELIVERIES).values()) == {1}
    assert sum(_rows(tmp_path, DELIVERIES).values()) == 4 * 3 * 2
    tables.close()


def test_a_group_too_large_for_one_commit_is_split_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr(delta_sink, "MAX_COMMIT_ROWS", 7)
    tables = _tables(tmp_path)
    tables.append_publishes([_batch(b) for b in range(5)])  # 3 publishes, 6 deliveries each
    messages = DeltaTable(tables.path(MESSAGES))
    versions = [json.loads(line) for v in range(1, messages.version() + 1)
                for line in (tmp_path / "delta" / MESSAGES / "_delta_log" / f"{v:020d}.json")
                .read_text().splitlines()]
    txns = [a["txn"]["version"] for a in versions if "txn" in a]
    assert txns == [1, 3, 4]  # 2 batches (6 rows), 2, 1
    deliveries = DeltaTable(tables.path(DELIVERIES))
    assert deliveries.version() == 5  # one batch per commit: 6 rows each, never split
    assert sum(_rows(tmp_path, MESSAGES).values()) == 15
    tables.close()


def test_a_crash_between_the_two_tables_commits_adds_each_row_once(tmp_path):
    tables = _tables(tmp_path)
    first = _committer(tmp_path, tables)
    for b in range(3):
        first.submit(_batch(b))
    # The crash: messages committed the group, deliveries did not, the journal stays.
    tables._append_group(MESSAGES, [first.journal.read(b) for b in range(3)])
    assert DeltaTable(tables.path(DELIVERIES)).transaction_version(APP) is None

    tables = _tables(tmp_path)
    second = _committer(tmp_path, tables)
    second.recover()
    assert second.pending_batches == 0
    assert sum(_rows(tmp_path, MESSAGES).values()) == 9
    assert set(_rows(tmp_path, MESSAGES).values()) == {1}
    assert sum(_rows(tmp_path, DELIVERIES).values()) == 18
    assert set(_rows(tmp_path, DELIVERIES).values()) == {1}
    tables.close()


def test_a_crash_after_both_commits_before_the_journal_removal_adds_nothing(tmp_path):
    tables = _tables(tmp_path)
    first = _committer(tmp_path, tables)
    for b in range(3):
        first.submit(_batch(b))
    tables.append_publishes([first.journal.read(b) for b in range(3)])  # then the crash
    versions = {t: DeltaTable(tables.path(t)).version() for t in (MESSAGES, DELIVERIES)}

    second = _committer(tmp_path, _tables(tmp_path))
    second.recover()
    assert second.pending_batches == 0
    assert list((tmp_path / "journal").glob("*.arrow")) == []
    assert {t: DeltaTable(tables.path(t)).version() for t in versions} == versions
    assert sum(_rows(tmp_path, DELIVERIES).values()) == 18
    assert not second.submit(_batch(1))  # Spark's re-run of a batch it never committed
    tables.close()


def test_a_full_journal_makes_the_audit_stage_wait_until_the_committer_drains_it(
        tmp_path, caplog):
    tables = _tables(tmp_path)
    committer = _committer(tmp_path, tables, max_pending=2)
    committer.recover()
    committer.submit(_batch(0))
    committer.submit(_batch(1))
    returned = threading.Event()

    def submit_third() -> None:
        committer.submit(_batch(2))
        returned.set()

    waiter = threading.Thread(target=submit_third)
    waiter.start()
    assert not returned.wait(0.5), "the third batch waits for room"
    assert "audit.max_pending_batches = 2" in caplog.text
    committer.start()  # the committer drains the journal; the batch goes on
    assert returned.wait(30)
    waiter.join()
    committer.stop(30)
    assert committer.pending_batches == 0
    assert sum(_rows(tmp_path, MESSAGES).values()) == 9

    stopping = threading.Event()
    blocked = AuditCommitter(tables, AuditJournal(tmp_path / "j2"), 0.2, 1, stopping=stopping)
    blocked.submit(_batch(10))
    stopping.set()
    with pytest.raises(AuditStopping):
        blocked.submit(_batch(11))
    tables.close()


def test_a_failing_commit_is_retried_reported_and_recovers(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="streaming.audit.committer")
    tables = _tables(tmp_path)
    committer = _committer(tmp_path, tables)
    committer.recover()
    committer.submit(_batch(0))
    append = AuditTables.append_publishes
    failures = [2]

    def failing(self, batches):
        if failures[0]:
            failures[0] -= 1
            raise OSError("disk unreachable")
        append(self, batches)

    monkeypatch.setattr(AuditTables, "append_publishes", failing)
    committer.start()
    assert committer.flush(30)
    err = caplog.text
    assert err.count("failed (attempt") == 1 and "disk unreachable" in err
    assert "succeeded at attempt 3" in err
    committer.stop(10)
    tables.close()


def _write_earlier_layout(root: Path) -> None:
    """messages and deliveries as an earlier version wrote them: no date column, no
    partitions, one commit per batch with its txn version."""
    for table in (MESSAGES, DELIVERIES):
        path = root / "delta" / table
        schema = ARROW_SCHEMAS[table].remove(len(ARROW_SCHEMAS[table]) - 1)
        DeltaTable.create(path, schema=schema)
        for b in range(3):
            args = (_routed(b), 1, b, NOW - timedelta(days=2 - b))
            rows = (delta_sink.messages_rows(*args) if table == MESSAGES
                    else delta_sink.deliveries_rows(*args, Config().kafka.layout))
            write_deltalake(path, rows.drop_columns([PARTITION_COLUMNS[table]]), mode="append",
                            commit_properties=delta_sink.CommitProperties(
                                app_transactions=[delta_sink.Transaction(APP, b)]))


def test_an_earlier_unpartitioned_table_is_appended_in_its_own_layout(tmp_path):
    _write_earlier_layout(tmp_path)
    tables = _tables(tmp_path)
    assert tables.unpartitioned() == [DELIVERIES, MESSAGES]
    tables.append_publishes([_batch(3)])
    messages = DeltaTable(tables.path(MESSAGES))
    assert messages.metadata().partition_columns == []
    assert "routed_date" not in pa.schema(messages.schema().to_arrow()).names
    assert sum(_rows(tmp_path, MESSAGES).values()) == 12
    tables.close()


def test_migrate_partitions_in_one_commit_keeping_rows_history_and_txn_versions(
        tmp_path, capsys):
    _write_earlier_layout(tmp_path)
    config = _config(tmp_path)
    before = {t: (DeltaTable(config.delta.table_path(t)).version(), _rows(tmp_path, t))
              for t in (MESSAGES, DELIVERIES)}
    code = main(["audit", "migrate", "--json",
                 "--set", f"delta.warehouse={tmp_path / 'delta'}",
                 "--set", f"streaming.checkpoint_dir={tmp_path / 'checkpoints'}"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    results = {r["table"]: r for r in map(json.loads, captured.out.splitlines())}
    assert results["subscriptions"]["result"] == "missing"
    assert "deliveries: rewriting 18 rows partitioned by routed_date" in captured.err
    for table, (version, rows) in before.items():
        assert results[table]["result"] == "migrated" and results[table]["version"] == version + 1
        delta = DeltaTable(config.delta.table_path(table))
        assert delta.version() == version + 1, "one commit"
        assert delta.metadata().partition_columns == ["routed_date"]
        assert delta.protocol().min_reader_version == 1 and delta.protocol().min_writer_version == 2
        assert delta.transaction_version(APP) == 2
        assert _rows(tmp_path, table) == rows
        assert len(delta.history()) == version + 2
        old = DeltaTable(config.delta.table_path(table), version=version).to_pyarrow_table()
        assert old.num_rows == sum(rows.values())  # the history still reads
        days = pa.table(delta.get_add_actions(flatten=True))["partition.routed_date"]
        assert len(set(days.to_pylist())) == 3

    tables = _tables(tmp_path)
    assert tables.unpartitioned() == []
    tables.append_publishes([_batch(2), _batch(3)])  # batch 2 is a re-run: only 3 adds rows
    assert sum(_rows(tmp_path, MESSAGES).values()) == 12
    assert set(_rows(tmp_path, DELIVERIES).values()) == {1}
    tables.close()

    assert main(["audit", "migrate", "--set", f"delta.warehouse={tmp_path / 'delta'}",
                 "--set", f"streaming.checkpoint_dir={tmp_path / 'checkpoints'}"]) == 0
    assert "messages: already partitioned" in capsys.readouterr().out


def test_migrate_reads_a_column_a_later_version_added_as_null(tmp_path):
    """messages written before alternate_exchange existed (no such column); deliveries
    given it since by the router (add_missing_columns appends it, after routed_at)."""
    for table in (MESSAGES, DELIVERIES):
        path = tmp_path / "delta" / table
        old = [PARTITION_COLUMNS[table], "alternate_exchange"]
        schema = pa.schema([f for f in ARROW_SCHEMAS[table] if f.name not in old])
        DeltaTable.create(path, schema=schema)
        args = (_routed(0), 1, 0, NOW)
        rows = (delta_sink.messages_rows(*args) if table == MESSAGES
                else delta_sink.deliveries_rows(*args, Config().kafka.layout))
        write_deltalake(path, rows.drop_columns(old), mode="append")
        if table == DELIVERIES:
            delta_sink.add_missing_columns(DeltaTable(path), table)
            assert DeltaTable(path).schema().fields[-1].name == "alternate_exchange"
    done = {m.table: m for m in audit_migration.migrate(_config(tmp_path))}
    for table in (MESSAGES, DELIVERIES):
        assert done[table].result == "migrated" and done[table].rows == sum(
            _rows(tmp_path, table).values())
        rows = DeltaTable(str(tmp_path / "delta" / table)).to_pyarrow_table()
        assert rows.schema.names == ARROW_SCHEMAS[table].names
        assert rows["alternate_exchange"].null_count == rows.num_rows > 0


def test_migrate_refuses_while_a_router_holds_the_state_folder(tmp_path, capsys):
    _write_earlier_layout(tmp_path)
    config = _config(tmp_path)
    settings = ["--set", f"delta.warehouse={tmp_path / 'delta'}",
                "--set", f"streaming.checkpoint_dir={tmp_path / 'checkpoints'}"]
    with RouterLock(config.streaming.checkpoint_dir):
        with pytest.raises(RouterLockedError):
            audit_migration.migrate(config, lambda _: None)
        assert main(["audit", "migrate", *settings]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"(pid {os.getpid()} on" in err[0], err
    assert "cannot migrate the audit tables while a router runs" in err[0]
    assert DeltaTable(config.delta.table_path(MESSAGES)).metadata().partition_columns == []
    assert main(["audit", "migrate", "--since", "2026-01-01", *settings]) == 2
    assert "--since does not apply to audit migrate" in capsys.readouterr().err


def test_since_on_a_partitioned_table_reads_only_the_files_of_its_days(tmp_path):
    """Three days of batches; the files of the two earlier days are then deleted from
    disk (not from the log): a query that touched them would fail."""
    tables = _tables(tmp_path)
    days = [NOW - timedelta(days=2), NOW - timedelta(days=1), NOW]
    tables.append_publishes([_batch(b, routed_at=day) for b, day in enumerate(days)])
    config = _config(tmp_path)
    query = audit.AuditQuery(DELIVERIES, subscriber="s1",
                             since=NOW - timedelta(hours=1))
    assert "\"routed_date\" >= DATE '2026-03-10'" in audit.conditions(query, partitioned=True)
    root = Path(tables.path(DELIVERIES))
    for old in days[:2]:
        for file in (root / f"routed_date={old.date().isoformat()}").glob("*.parquet"):
            file.unlink()
    columns, rows = audit.run(config, query)
    assert [r["message_id"] for r in rows] == [f"p/0/{200 + i}" for i in range(3)]
    assert "routed_date" not in columns
    with pytest.raises(audit.AuditError):  # the same query without its bound reads them
        audit.run(config, audit.AuditQuery(DELIVERIES, subscriber="s1"))
    tables.close()


ROUND_INTERVAL_S = 3.0
"""The committer's interval in the two tests of round timing: long against a round's
own work (milliseconds), short enough to wait out."""


def _timed_rounds(tables: AuditTables, monkeypatch: pytest.MonkeyPatch,
                  during=None) -> list[tuple[float, list[int]]]:
    """Record each round's publishes append as (monotonic start, batch ids); ``during``
    (batch ids) is called inside the append, before it writes."""
    rounds: list[tuple[float, list[int]]] = []
    append = tables.append_publishes

    def timed(batches: list[PublishBatch]) -> None:
        rounds.append((time.monotonic(), [b.batch_id for b in batches]))
        if during is not None:
            during(rounds[-1][1])
        append(batches)

    monkeypatch.setattr(tables, "append_publishes", timed)
    return rounds


def test_after_a_quiet_spell_a_batch_is_committed_at_once_then_rounds_keep_their_interval(
        tmp_path, monkeypatch):
    """Rounds start at least ``interval_s`` apart: a lone batch does not wait out the
    interval, and a second batch right after it does (one commit per interval)."""
    tables = _tables(tmp_path)
    rounds = _timed_rounds(tables, monkeypatch)
    committer = AuditCommitter(tables, AuditJournal(tmp_path / "journal"), ROUND_INTERVAL_S, 100)
    committer.recover()
    committer.start()
    try:
        submitted = time.monotonic()
        committer.submit(_batch(1))
        wait_until(lambda: not committer.pending_batches, "batch 1 committed", timeout=30)
        assert rounds[0][0] - submitted < ROUND_INTERVAL_S / 2, "the lone batch waited"
        assert sum(_rows(tmp_path, MESSAGES).values()) == _batch(1).routed.num_rows
        committer.submit(_batch(2))
        wait_until(lambda: not committer.pending_batches, "batch 2 committed", timeout=30)
        assert [ids for _, ids in rounds] == [[1], [2]]
        # The second round's start is at least the interval after the first's (less the
        # moment between a round's start and its append).
        assert rounds[1][0] - rounds[0][0] >= ROUND_INTERVAL_S - 0.5
    finally:
        committer.stop()
        tables.close()


def test_a_batch_journaled_during_a_commit_waits_for_the_next_round(tmp_path, monkeypatch):
    """A round commits what was pending when it began: batches journaled while it commits
    wait for the next round, ``interval_s`` later. Chaining rounds until the journal is
    empty made a commit (a Delta file and log entry per table) per batch under steady
    traffic."""
    tables = _tables(tmp_path)
    committer = AuditCommitter(tables, AuditJournal(tmp_path / "journal"), ROUND_INTERVAL_S, 100)
    rounds = _timed_rounds(tables, monkeypatch,
                           during=lambda ids: ids == [1] and committer.submit(_batch(2)))
    committer.recover()
    committer.start()
    try:
        committer.submit(_batch(1))
        wait_until(lambda: len(rounds) == 2 and not committer.pending_batches,
                   "batch 2 committed in a round of its own", timeout=30)
        assert [ids for _, ids in rounds] == [[1], [2]]
        assert rounds[1][0] - rounds[0][0] >= ROUND_INTERVAL_S - 0.5
        assert sum(_rows(tmp_path, MESSAGES).values()) == 2 * _batch(1).routed.num_rows
    finally:
        committer.stop()
        tables.close()

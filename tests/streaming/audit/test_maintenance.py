"""The audit tables' upkeep (streaming/audit/maintenance.py) on real Delta tables.

Rows reach the tables through the router's own writer
(:class:`streaming.audit.writer.AuditTables`, idempotent appends with ``txn``
versions); each test then checks what a maintenance pass promises: the file
bound, the log bound, retention and vacuum, exactness under concurrent
appends, a SIGKILL mid-pass.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from streaming.audit import queries as audit
from streaming.audit.maintenance import (
    BackgroundMaintenance,
    MaintenanceReport,
    maintain,
    read_report,
    small_files_by_partition,
)
from streaming.audit.table_stats import table_stats
from streaming.audit.writer import AuditTables, PublishBatch
from streaming.config import load
from streaming.router.batch.routing import ROUTED_ARROW
from waiting import wait_until

ROUTER = "r1"
APP = f"bitroute-{ROUTER}-publishes"
NOW = datetime.now(UTC)


def _log_older_than(config, table: str, seconds: float):
    """A condition: every entry of ``table``'s log is older than ``seconds`` (a retention
    measured from the commits' times has passed for all of them)."""
    return _files_older_than(Path(config.delta.table_path(table)) / "_delta_log", seconds)


def _files_older_than(folder: Path, seconds: float):
    """A condition: every file under ``folder`` was last written more than ``seconds`` ago."""
    return lambda: time.time() - max(p.stat().st_mtime for p in folder.rglob("*")
                                     if p.is_file()) > seconds


def _data_files(table: Path) -> set[Path]:
    """Every file of ``table`` outside its log (a file being written among them)."""
    return {p for p in table.rglob("*") if p.is_file() and "_delta_log" not in p.parts}


def _config(tmp_path: Path, **audit_keys: object):
    overrides: dict[str, object] = {"delta.warehouse": str(tmp_path / "delta"),
                 "streaming.checkpoint_dir": str(tmp_path / "checkpoints")}
    overrides.update({f"audit.{k}": v for k, v in audit_keys.items()})
    return load(overrides=overrides, environ={})


def _routed(batch_id: int, publishes: int = 4, subscribers: int = 3) -> pa.Table:
    rows = [{
        "message_id": f"p/0/{batch_id * publishes + i}",
        "exchange": "amq.topic", "routing_key": "a.b", "outcome": "routed", "reason": None,
        "deliveries": [{"subscriber": f"s{k}", "subscription_ids": [f"id{k}"]}
                       for k in range(subscribers)],
        "headers": {"k": "v" * 20}, "payload_bytes": 100, "published_at": NOW,
    } for i in range(publishes)]
    return pa.Table.from_pylist(rows, ROUTED_ARROW)


def _append(tables: AuditTables, batches: range, routed_at: datetime | None = None) -> None:
    for batch_id in batches:
        _append_one(tables, batch_id, routed_at)


def _append_one(tables: AuditTables, batch_id: int, routed_at: datetime | None = None) -> None:
    """Batch ``batch_id`` committed alone, as the committer commits a group of one."""
    tables.append_publishes([PublishBatch(batch_id, 1, routed_at or datetime.now(UTC),
                                          _routed(batch_id))])


def _exact(config, batches: int, publishes: int = 4, subscribers: int = 3) -> None:
    """Exactly one row per publish and per (message, subscriber), txn at the last batch."""
    deliveries = DeltaTable(config.delta.table_path("deliveries"))
    messages = DeltaTable(config.delta.table_path("messages"))
    pairs = Counter(zip(*(deliveries.to_pyarrow_table(columns=["message_id", "subscriber"])
                          .to_pydict().values()), strict=True))
    assert len(pairs) == batches * publishes * subscribers
    assert set(pairs.values()) == {1}
    ids = Counter(messages.to_pyarrow_table(columns=["message_id"])["message_id"].to_pylist())
    assert len(ids) == batches * publishes and set(ids.values()) == {1}
    for table in (deliveries, messages):
        assert table.transaction_version(APP) == batches - 1


@pytest.fixture
def tables(tmp_path):
    def make(config):
        sink = AuditTables(config, ROUTER)
        sink.ensure()
        made.append(sink)
        return sink
    made: list[AuditTables] = []
    yield make
    for sink in made:
        sink.close()


def test_a_pass_bounds_the_files_of_a_table_of_many_small_appends(tmp_path, tables):
    m, target = 8, 1 << 20
    config = _config(tmp_path, compact_min_files=m, target_file_size=target)
    sink = tables(config)
    _append(sink, range(60))
    path = config.delta.table_path("deliveries")
    assert table_stats(path).files == 60  # one file per append: past the threshold

    progress: list[tuple[str, str, str]] = []
    report = maintain(config, progress=lambda *step: progress.append(step))

    assert report.ok, report.error
    for name in ("deliveries", "messages"):
        stats = table_stats(config.delta.table_path(name))
        bound = math.floor(2 * stats.bytes / target) + m - 1
        assert stats.files <= bound, (name, stats)
        t = next(t for t in report.tables if t.table == name)
        assert (t.files_before, t.files_after) == (60, stats.files)
        assert t.files_compacted == 60 and t.compacted_into >= 1
        assert t.checkpoint_version == stats.version
    small = small_files_by_partition(DeltaTable(path), [], target)
    assert len(small.get((), [])) < m
    _exact(config, 60)
    assert ("deliveries", "compact", "start") in progress
    saved = read_report(config)
    assert saved is not None and saved["tables"][0]["table"] == "deliveries"

    again = maintain(config)  # nothing left to do: no compaction, no new checkpoint
    assert again.ok and all(t.files_compacted == 0 for t in again.tables)


def test_a_partition_under_the_threshold_is_left_alone(tmp_path, tables):
    config = _config(tmp_path, compact_min_files=16)
    _append(tables(config), range(10))
    report = maintain(config, tables=["messages"])
    assert report.ok and report.tables[0].files_compacted == 0
    assert table_stats(config.delta.table_path("messages")).files == 10


def test_expired_log_cleanup_keeps_the_log_within_its_bound(tmp_path, tables):
    config = _config(tmp_path, log_retention="1 second", compact_min_files=1000)
    sink = tables(config)
    _append(sink, range(40))
    log = Path(config.delta.table_path("messages")) / "_delta_log"
    assert len(os.listdir(log)) == 41
    wait_until(_log_older_than(config, "messages", 1.0))
    report = maintain(config, tables=["messages"])

    assert report.ok, report.error
    t = report.tables[0]
    # Left: the pass's property commit (younger than the retention), the
    # checkpoint, _last_checkpoint: every older commit is gone.
    entries = sorted(os.listdir(log))
    assert t.log_entries_removed is not None and t.log_entries_removed >= 40
    assert len(entries) <= 4, entries
    assert t.log_entries == len(entries)
    _append(sink, range(40, 45))
    _exact(config, 45)
    assert DeltaTable(config.delta.table_path("messages")).history()  # still readable


def test_retention_deletes_old_rows_and_vacuum_their_files(tmp_path, tables):
    config = _config(tmp_path, retention_days=3, file_retention="1 second",
                     compact_min_files=1000)
    sink = tables(config)
    _append(sink, range(0, 5), routed_at=NOW - timedelta(days=10))
    _append(sink, range(5, 10), routed_at=NOW - timedelta(days=1))
    old_version = DeltaTable(config.delta.table_path("messages")).version()

    first = maintain(config, tables=["messages", "deliveries"])
    assert first.ok, first.error
    assert [t.rows_deleted for t in first.tables] == [5 * 4, 5 * 4 * 3]
    for table in ("messages", "deliveries"):  # the deletions are older than file_retention
        wait_until(_log_older_than(config, table, config.audit.file_retention_s))
    second = maintain(config, tables=["messages", "deliveries"])
    assert second.ok and all(t.files_vacuumed >= 5 for t in second.tables)

    messages = DeltaTable(config.delta.table_path("messages")).to_pyarrow_table()
    assert sorted(set(messages["batch_id"].to_pylist())) == list(range(5, 10))
    assert pc.min(messages["routed_at"]).as_py() > NOW - timedelta(days=3)
    # A time-travel read of a version whose files were vacuumed fails in one line.
    with pytest.raises(audit.AuditError, match="messages: version .* vacuumed"):
        audit.run(config, audit.AuditQuery(table="messages", as_of_version=old_version))


def test_compaction_concurrent_with_appends_keeps_the_audit_exact(tmp_path, tables):
    config = _config(tmp_path, compact_min_files=4)
    sink = tables(config)
    _append(sink, range(30))
    # The first pass sets the tables' properties: a metadata change, which an append in
    # flight sees as a conflict (the router retries it, exactly once by its txn version).
    assert maintain(config, tables=["deliveries", "messages"]).ok
    done = threading.Event()
    appended: list[int] = []
    errors: list[BaseException] = []

    def appender() -> None:
        batch_id = 30
        try:
            while not done.is_set() or batch_id < 90:
                _append_one(sink, batch_id)
                appended.append(batch_id)
                if batch_id % 7 == 0:  # a re-run batch adds nothing
                    _append_one(sink, batch_id)
                batch_id += 1
        except BaseException as exc:  # noqa: BLE001 - the test asserts the appender failed nowhere
            errors.append(exc)

    thread = threading.Thread(target=appender)
    thread.start()
    reports = []
    try:
        def one_pass() -> bool:
            reports.append(maintain(config, tables=["deliveries", "messages"]))
            return len(appended) >= 40 or not thread.is_alive()

        wait_until(one_pass, "40 batches appended during maintenance passes", timeout=300)
    finally:
        done.set()
        thread.join(120)
    assert not errors, errors
    assert reports and all(r.ok for r in reports), [r.error for r in reports]
    assert sum(t.files_compacted for r in reports for t in r.tables) > 0
    _exact(config, appended[-1] + 1)


def test_background_maintenance_reports_a_failure_once_and_stops_fast(tmp_path, tables, caplog):
    config = _config(tmp_path, maintenance_interval="1 second")
    tables(config)
    (Path(config.delta.table_path("messages")) / "_delta_log" / "00000000000000000000.json"
     ).write_text("not json\n")  # a broken table: every pass fails on it
    background = BackgroundMaintenance(config)
    reports: list[MaintenanceReport] = []
    background.listeners.append(reports.append)
    background.start()
    wait_until(lambda: len(reports) >= 2, timeout=120)
    started = time.monotonic()
    background.stop()
    assert time.monotonic() - started < 5
    failures = [r.getMessage() for r in caplog.records
                if r.levelname == "WARNING" and "audit maintenance failed" in r.getMessage()]
    assert failures and len(failures) <= len(reports) + 1
    assert all("messages" in line for line in failures), failures
    assert reports and not reports[-1].ok
    assert [t.table for t in reports[-1].tables] == ["deliveries", "messages", "subscriptions"]
    saved = read_report(config)
    assert saved is not None and saved["error"].startswith("messages")


def test_the_verb_runs_a_pass_with_progress_and_json(tmp_path, tables):
    config = _config(tmp_path, compact_min_files=4)
    _append(tables(config), range(6))
    env = dict(os.environ, BITROUTE_DELTA_WAREHOUSE=config.delta.warehouse,
               BITROUTE_STREAMING_CHECKPOINT_DIR=str(config.streaming.checkpoint_dir),
               BITROUTE_AUDIT_COMPACT_MIN_FILES="4")
    done = subprocess.run([sys.executable, "-m", "streaming.cli.main", "audit", "maintain",
                           "--table", "messages", "--json"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["tables"][0]["files_compacted"] == 6
    assert "messages: compact" in done.stderr
    broken = subprocess.run([sys.executable, "-m", "streaming.cli.main", "audit", "maintain",
                             "--table", "nope"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert broken.returncode == 2 and "nope" in broken.stderr


KILLED_PASS = """
import sys
from streaming.audit.maintenance import maintain
from streaming.config import load
config = load(overrides={"delta.warehouse": sys.argv[1], "streaming.checkpoint_dir": sys.argv[2],
                         "audit.compact_min_files": "2", "audit.file_retention": "1 second"},
              environ={})
def progress(table, step, detail):
    print(table, step, detail, flush=True)
maintain(config, tables=["deliveries"], progress=progress)
"""


@pytest.mark.parametrize("step", ["compact", "vacuum"])
def test_sigkill_mid_pass_leaves_the_table_readable_and_exact(tmp_path, tables, step):
    config = _config(tmp_path, compact_min_files=2, file_retention="1 second")
    sink = tables(config)
    batches = 200
    _append(sink, range(batches))
    path = config.delta.table_path("deliveries")
    if step == "vacuum":  # files to vacuum: compacted by a first pass, then old enough
        maintain(config, tables=["deliveries"])
        _append(sink, range(batches, batches + 100))
        batches += 100
        maintain(config, tables=["deliveries"])
        wait_until(_log_older_than(config, "deliveries", config.audit.file_retention_s))
    version = DeltaTable(path).version()
    written = _data_files(Path(path))
    process = subprocess.Popen([sys.executable, "-c", KILLED_PASS, config.delta.warehouse,
                                str(config.streaming.checkpoint_dir)],
                               stdout=subprocess.PIPE, text=True)
    try:
        for line in process.stdout or ():
            if line.startswith(f"deliveries {step} start"):
                # The fault's moment: delta-rs has begun to write (compact) or delete
                # (vacuum) the table's data files.
                wait_until(lambda: process.poll() is not None or (
                    _data_files(Path(path)) - written if step == "compact"
                    else written - _data_files(Path(path))), f"the {step} under way", 60, poll=0.005)
                process.send_signal(signal.SIGKILL)
                break
        assert process.wait(60) == -signal.SIGKILL, f"the pass ended before its {step} was killed"
    finally:
        process.kill()
        process.wait()

    table = DeltaTable(path)
    assert table.version() >= version
    deliveries = table.to_pyarrow_table(columns=["message_id", "subscriber"])
    assert deliveries.num_rows == batches * 4 * 3
    assert table.transaction_version(APP) == batches - 1
    wait_until(_files_older_than(Path(path), config.audit.file_retention_s))
    after = maintain(config, tables=["deliveries"])
    assert after.ok, after.error
    assert DeltaTable(path).to_pyarrow_table(columns=["message_id"]).num_rows == batches * 4 * 3
    # what that pass removed is now past file_retention: vacuumed
    wait_until(_files_older_than(Path(path), config.audit.file_retention_s))
    assert maintain(config, tables=["deliveries"]).ok
    files = {p.name for p in Path(path).rglob("*.parquet") if "_delta_log" not in p.parts}
    assert files == {Path(p).name for p in DeltaTable(path).file_uris()}  # no orphan left


def test_status_shows_each_tables_size_and_the_last_pass(tmp_path, tables):
    from streaming.cli.render import status_lines
    from streaming.ops import status

    config = _config(tmp_path, compact_min_files=4)
    _append(tables(config), range(6))
    maintain(config)
    report = status.router_status(config)
    deliveries = report["audit_tables"]["deliveries"]
    assert deliveries["files"] == 1 and deliveries["bytes"] > 0
    assert deliveries["version"] == DeltaTable(config.delta.table_path("deliveries")).version()
    assert deliveries["log_entries"] == len(os.listdir(
        Path(config.delta.table_path("deliveries")) / "_delta_log"))
    assert report["maintenance"]["ok"]
    lines = "\n".join(status_lines(report))
    assert "table deliveries:" in lines and "1 data files" in lines
    assert "maintenance:" in lines and "6 files compacted" in lines
    json.dumps(report)  # --json prints it as it is

"""Upkeep of the Delta audit tables: their files, their log and the cost of reading them stay bounded.

One pass (:func:`maintain`) over each audit table (``config.delta.table_path(name)``),
in this order:

1. properties: ``delta.logRetentionDuration`` = ``audit.log_retention``,
   ``delta.deletedFileRetentionDuration`` = ``audit.file_retention``,
   ``delta.enableExpiredLogCleanup`` = true (one metadata commit, only when
   they differ: the first pass, or after the configuration changed);
2. compaction: each partition (each value of the partition columns read from
   the table's metadata; an unpartitioned table is one partition) holding at
   least ``audit.compact_min_files`` files smaller than half
   ``audit.target_file_size`` is rewritten by ``optimize.compact`` into files
   of about ``target_file_size``;
3. retention (opt-in, ``audit.retention_days`` > 0): rows older than that many
   days are deleted: whole day partitions of a table partitioned by a DATE
   column (``routed_date < cutoff day``: no file rewritten), else the rows of
   its time column (``routed_at``/``applied_at``) before the cutoff;
4. vacuum: data files removed from the table (by compaction or retention)
   more than ``file_retention`` ago are deleted, and so are files no commit
   names that are older than ``file_retention`` (leftovers of a writer or a
   compaction killed before its commit); a file younger than that is never
   touched, so an append in flight is safe;
5. checkpoint at the current version (when it has none yet);
6. expired-log cleanup: log entries older than ``log_retention`` and older
   than the newest checkpoint are deleted.

Concurrency: the appends of the router (blind appends with a ``txn`` action)
commit concurrently with every step. Delta's conflict rules (and delta-rs's
checker) let a blind append commit after a compaction that read older files,
and a compaction commit after appends that added files it did not read;
compaction keeps the ``txn`` versions (they are table state, not file
state). A step that loses a race against another maintenance (two passes at
once, e.g. ``bitroute audit maintain`` by hand while the router runs) fails
with a commit conflict: that table's pass reports it and the next pass
retries. delta-rs releases the GIL in all of these calls, so a pass in a
background thread takes CPU from a batch but never blocks it.

Bounds after a pass (``B`` = bytes of a partition, ``T`` = target_file_size,
``m`` = compact_min_files): files of the partition <= floor(2B/T) + m - 1
(files of at least T/2 bytes, plus fewer than m small ones), plus the commits
of the appends since; ``_delta_log`` entries <= commits within
``log_retention`` + checkpoints within it + the newest checkpoint (+ its
``_last_checkpoint``).

The last pass's :class:`MaintenanceReport` is written atomically to
``<checkpoint_dir>/router/maintenance.json`` for ``bitroute status``.

Library use (benchmarks)::

    report = maintain(config, progress=lambda table, step, detail: print(table, step, detail))
    report.ok, report.tables[0].files_after

The background form is :class:`BackgroundMaintenance` (``start``/``stop``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from deltalake import DeltaTable, WriterProperties
from deltalake.exceptions import TableNotFoundError

from schemas.records import AUDIT_TABLE_NAMES, DELIVERIES, MESSAGES, SUBSCRIPTIONS
from streaming.atomic import write_atomically
from streaming.audit.properties import table_properties
from streaming.audit.queries import arrow_table
from streaming.audit.storage import StorageOptions, check_commit_safety, storage_options
from streaming.audit.table_stats import (
    delta_log,
    last_checkpoint_version,
    log_entries,
    table_stats,
)
from streaming.config import AuditConfig, Config
from streaming.errors import one_line
from streaming.state.checkpoint import CheckpointLayout

_log = logging.getLogger(__name__)

TIME_COLUMNS = {DELIVERIES: "routed_at", MESSAGES: "routed_at", SUBSCRIPTIONS: "applied_at"}
"""The column retention compares with its cutoff, on a table not partitioned by day."""
SMALL_FRACTION = 0.5
"""A file under this fraction of ``target_file_size`` counts as small for compaction."""
STOP_WAIT_S = 5.0
"""How long stopping the background maintenance waits for a pass in progress."""
COMPACT_TASKS = 1
"""Parallel tasks of a compaction: one core, leaving the rest to routing."""

STEPS = ("properties", "compact", "retention", "vacuum", "checkpoint", "log cleanup")
Progress = Callable[[str, str, str], None]
"""``progress(table, step, detail)``: called as each step of a table starts and ends."""
WriterPropertiesFor = Callable[[str], WriterProperties | None]
"""The parquet writer properties of a table's rewritten files
(:func:`streaming.audit.properties.writer_properties`)."""


@dataclass
class TableReport:
    """What one pass did to one table. ``error`` set = this table's pass failed at ``step``."""

    table: str
    files_before: int = 0
    bytes_before: int = 0
    files_after: int = 0
    bytes_after: int = 0
    partitions_compacted: int = 0
    files_compacted: int = 0
    compacted_into: int = 0
    rows_deleted: int = 0
    files_vacuumed: int = 0
    checkpoint_version: int | None = None
    log_entries_removed: int | None = None
    log_entries: int | None = None
    version: int | None = None
    seconds: float = 0.0
    skipped: str | None = None
    error: str | None = None
    step: str | None = None


@dataclass
class MaintenanceReport:
    """One pass over the tables. ``ok`` when no table failed and the pass was not stopped."""

    started_at: str
    finished_at: str = ""
    seconds: float = 0.0
    tables: list[TableReport] = field(default_factory=list)
    stopped: bool = False

    @property
    def ok(self) -> bool:
        return not self.stopped and all(t.error is None for t in self.tables)

    @property
    def error(self) -> str | None:
        """One line naming each failed table, or None."""
        failed = [f"{t.table}: {t.step}: {t.error}" for t in self.tables if t.error]
        if self.stopped:
            failed.append("stopped before the end")
        return "; ".join(failed) or None

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["ok"], data["error"] = self.ok, self.error
        return data


def maintain(config: Config, tables: Sequence[str] | None = None,
             writer_properties: WriterPropertiesFor | None = None,
             progress: Progress | None = None,
             should_stop: Callable[[], bool] | None = None,
             now: Callable[[], datetime] | None = None,
             record: bool = True) -> MaintenanceReport:
    """One maintenance pass over ``tables`` (default: the three audit tables); never raises
    for a table's failure: it is in that table's report (``report.ok`` is False).

    ``should_stop`` is asked between steps and partitions: once it answers True
    the pass ends there (``report.stopped``). ``now`` is the clock retention
    compares with (tests). ``record`` writes the report to
    ``<checkpoint_dir>/router/maintenance.json``. ``writer_properties(table)``
    gives the parquet properties of rewritten files; by default the appends' own
    (:func:`streaming.audit.properties.writer_properties`), so every file of a table has one layout.
    Raises :class:`streaming.audit.storage.StorageError` (and runs no step) when the
    warehouse's settings are missing or its store cannot commit safely.
    """
    storage = storage_options(config.delta)  # StorageError: no pass at all
    check_commit_safety(config.delta)
    clock = now or (lambda: datetime.now(UTC))
    stop = should_stop or (lambda: False)
    report = MaintenanceReport(started_at=_iso(clock()))
    started = time.monotonic()
    for name in tables or AUDIT_TABLE_NAMES:
        if stop():
            report.stopped = True
            break
        path = config.delta.table_path(name)
        if writer_properties is None:
            from streaming.audit.properties import writer_properties as default_properties  # not for status
            writer_properties = default_properties
        props = writer_properties(name)
        table_report = _TablePass(name, path, config.audit, props, progress, stop, clock,
                                  storage).run()
        report.tables.append(table_report)
        if table_report.step == "stopped":
            report.stopped = True
            break
    report.seconds = round(time.monotonic() - started, 3)
    report.finished_at = _iso(clock())
    if record:
        write_report(config, report)
    return report


class _Stopped(Exception):
    pass


class _TablePass:
    def __init__(self, name: str, path: str, audit: AuditConfig, writer_properties,
                 progress: Progress | None, stop: Callable[[], bool],
                 clock: Callable[[], datetime], storage: StorageOptions) -> None:
        self.name, self.path, self.audit = name, path, audit
        self.storage = storage
        self.writer_properties = writer_properties
        self.progress = progress or (lambda table, step, detail: None)
        self.stop, self.clock = stop, clock
        self.report = TableReport(name)
        self.log_dir = delta_log(path, storage)

    def run(self) -> TableReport:
        started = time.monotonic()
        report = self.report
        step = "open"
        try:
            try:
                table = DeltaTable(self.path, storage_options=self.storage)
            except TableNotFoundError:
                report.skipped = "no table yet"
                self.progress(self.name, "skipped", "no table yet")
                return report
            before = table_stats(table, self.log_dir)
            report.files_before, report.bytes_before = before.files, before.bytes
            logs_before = log_entries(self.log_dir)
            for step, action in (("properties", self._properties), ("compact", self._compact),
                                 ("retention", self._retention), ("vacuum", self._vacuum),
                                 ("checkpoint", self._checkpoint),
                                 ("log cleanup", self._log_cleanup)):
                if self.stop():
                    raise _Stopped
                self.progress(self.name, step, "start")
                detail = action(table)
                self.progress(self.name, step, detail)
            table.update_incremental()
            after = table_stats(table, self.log_dir)
            report.files_after, report.bytes_after = after.files, after.bytes
            report.log_entries, report.version = after.log_entries, after.version
            logs_after = log_entries(self.log_dir)
            if logs_before is not None and logs_after is not None:
                # names gone, not the difference: appends add entries meanwhile (and
                # delta-rs's checkpoint may clean expired entries itself)
                report.log_entries_removed = len(logs_before - logs_after)
        except _Stopped:
            report.step, report.error = "stopped", "the pass was stopped"
        except Exception as exc:  # noqa: BLE001 (reported, retried at the next pass)
            report.step, report.error = step, one_line(exc, typed=True)
            self.progress(self.name, step, f"FAILED: {report.error}")
        report.seconds = round(time.monotonic() - started, 3)
        return report

    # --- the steps, each returns its progress detail --------------------------------

    def _properties(self, table: DeltaTable) -> str:
        wanted = table_properties(self.audit)
        current = table.metadata().configuration
        changed = {k: v for k, v in wanted.items() if current.get(k) != v}
        if not changed:
            return "in line"
        table.alter.set_table_properties(changed)
        return "set " + ", ".join(f"{k}={v}" for k, v in changed.items())

    def _compact(self, table: DeltaTable) -> str:
        table.update_incremental()
        columns = table.metadata().partition_columns
        target = self.audit.target_file_size
        for values, files in sorted(small_files_by_partition(table, columns, target).items(),
                                    key=lambda item: str(item[0])):
            if len(files) < self.audit.compact_min_files:
                continue
            if any(v is None for v in values):
                continue  # a null partition value cannot be named in a filter; never written
            if self.stop():
                raise _Stopped
            filters = [(c, "=", str(v)) for c, v in zip(columns, values, strict=True)] or None
            metrics = table.optimize.compact(partition_filters=filters, target_size=target,
                                             max_concurrent_tasks=COMPACT_TASKS,
                                             writer_properties=self.writer_properties)
            self.report.partitions_compacted += 1
            self.report.files_compacted += int(metrics.get("numFilesRemoved", 0))
            self.report.compacted_into += int(metrics.get("numFilesAdded", 0))
            self.progress(self.name, "compact", f"{_partition_text(columns, values)}: "
                          f"{metrics.get('numFilesRemoved', 0)} files into "
                          f"{metrics.get('numFilesAdded', 0)}")
        return (f"{self.report.files_compacted} files into {self.report.compacted_into} in "
                f"{self.report.partitions_compacted} partitions")

    def _retention(self, table: DeltaTable) -> str:
        days = self.audit.retention_days
        if days <= 0:
            return "off (retention_days = 0)"
        table.update_incremental()
        cutoff = self.clock() - timedelta(days=days)
        day_column = _date_partition_column(table)
        if day_column is not None:
            # Whole days, all of whose rows are older than the cutoff: no file rewritten.
            predicate = f"{day_column} < '{cutoff.date().isoformat()}'"
            doomed = _rows_in_partitions_before(table, day_column, cutoff.date())
            if not doomed:
                return f"nothing before {cutoff.date()}"
        else:
            column = TIME_COLUMNS.get(self.name)
            if column is None:
                return f"no time column known for {self.name}: retention skipped"
            predicate = f"{column} < '{cutoff.astimezone(UTC).isoformat()}'"
            doomed = None
        metrics = table.delete(predicate, writer_properties=self.writer_properties)
        deleted = metrics.get("num_deleted_rows")
        self.report.rows_deleted = int(deleted if deleted is not None else doomed or 0)
        return f"{self.report.rows_deleted} rows deleted ({predicate})"

    def _vacuum(self, table: DeltaTable) -> str:
        table.update_incremental()
        # full: also files no commit names (a killed writer's or compaction's), older than
        # the retention like the rest; younger files (an append in flight) are never listed.
        doomed = table.vacuum(dry_run=True, full=True)
        if doomed:
            if self.stop():
                raise _Stopped
            doomed = table.vacuum(dry_run=False, full=True)
        self.report.files_vacuumed = len(doomed)
        return f"{len(doomed)} files deleted"

    def _checkpoint(self, table: DeltaTable) -> str:
        table.update_incremental()
        version = table.version()
        if last_checkpoint_version(self.log_dir) == version:
            self.report.checkpoint_version = version
            return f"v{version} already checkpointed"
        table.create_checkpoint()
        self.report.checkpoint_version = version
        return f"v{version}"

    def _log_cleanup(self, table: DeltaTable) -> str:
        before = log_entries(self.log_dir)
        table.cleanup_metadata()
        after = log_entries(self.log_dir)
        if before is None or after is None:
            return "done"
        return f"{len(before - after)} entries removed, {len(after)} left"


# --- what compaction rewrites ----------------------------------------------------------

def small_files_by_partition(table: DeltaTable, columns: Sequence[str], target: int
                             ) -> dict[tuple, list[str]]:
    """Per partition (a tuple of the partition columns' values; ``()`` unpartitioned), the
    paths of its files smaller than ``SMALL_FRACTION * target``."""
    actions = arrow_table(table.get_add_actions(flatten=True))
    limit = SMALL_FRACTION * target
    paths = actions["path"].to_pylist()
    sizes = actions["size_bytes"].to_pylist()
    values = list(zip(*(actions[f"partition.{c}"].to_pylist() for c in columns), strict=True)) if columns \
        else [()] * len(paths)
    groups: dict[tuple, list[str]] = {}
    for path, size, key in zip(paths, sizes, values, strict=True):
        if size < limit:
            groups.setdefault(tuple(key), []).append(path)
    return groups


# --- the record for status -------------------------------------------------------------

def report_path(config: Config) -> Path:
    return CheckpointLayout.of(config.streaming.checkpoint_dir).maintenance_file


def write_report(config: Config, report: MaintenanceReport) -> None:
    """Replace ``maintenance.json`` atomically with ``report`` (the folder is created)."""
    path = report_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(report.to_json()) + "\n")


def read_report(config: Config) -> dict | None:
    """The last recorded pass as written (``None`` when no pass ran or the file is unreadable)."""
    try:
        return json.loads(report_path(config).read_text())
    except (OSError, ValueError):
        return None


# --- in the router ---------------------------------------------------------------------

class BackgroundMaintenance:
    """A daemon thread running :func:`maintain` every ``audit.maintenance_interval``.

    The first pass runs one interval after :meth:`start`. A failed pass is
    logged as one warning (so at most once per interval) and the next
    pass tries again; nothing here raises into the router. :meth:`stop` asks
    the pass to end at its next step and waits at most :data:`STOP_WAIT_S`:
    a compaction already inside delta-rs is left to finish or to die with the
    process, which leaves the tables as they were (its files unreferenced,
    vacuumed later).
    """

    def __init__(self, config: Config, writer_properties: WriterPropertiesFor | None = None
                 ) -> None:
        self.config = config
        self.writer_properties = writer_properties
        self.listeners: list[Callable[[MaintenanceReport], None]] = []
        """Each is called with every pass's report (the metrics endpoint)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        interval = self.config.audit.maintenance_interval_s
        if self._thread is not None or interval <= 0:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(interval,),
                                        name="bitroute-audit-maintenance", daemon=True)
        self._thread.start()

    def stop(self, wait_s: float = STOP_WAIT_S) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(wait_s)

    def run_once(self) -> MaintenanceReport:
        """One pass now, in the caller's thread, reported like a background one."""
        report = maintain(self.config, writer_properties=self.writer_properties,
                          should_stop=self._stop.is_set)
        if not report.ok and not self._stop.is_set():
            _log.warning(f"audit maintenance failed ({report.error}); retrying in "
                         f"{self.config.audit.maintenance_interval}")
        for listener in self.listeners:
            listener(report)
        return report

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.run_once()
            except Exception as exc:  # noqa: BLE001 (never stops routing)
                _log.warning(f"audit maintenance failed ({one_line(exc, typed=True)}); retrying in "
                             f"{self.config.audit.maintenance_interval}")


# --- small helpers ---------------------------------------------------------------------

def _date_partition_column(table: DeltaTable) -> str | None:
    columns = table.metadata().partition_columns
    for f in table.schema().fields:
        if f.name in columns and str(getattr(f.type, "type", f.type)) == "date":
            return f.name
    return None


def _rows_in_partitions_before(table: DeltaTable, column: str, day: date) -> int:
    actions = arrow_table(table.get_add_actions(flatten=True))
    rows = 0
    for value, records in zip(actions[f"partition.{column}"].to_pylist(),
                              actions["num_records"].to_pylist(), strict=True):
        if value is not None and value < day:
            rows += records or 0
    return rows


def _partition_text(columns: Iterable[str], values: Iterable[object]) -> str:
    text = ", ".join(f"{c}={v}" for c, v in zip(columns, values, strict=True))
    return text or "the table"


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds")

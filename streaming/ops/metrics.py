"""The router's Prometheus metrics endpoint.

Metrics are off by default (``metrics.port = 0``). With a port set, ``bitroute
run`` serves the Prometheus text exposition format (version 0.0.4; OpenMetrics
to a scraper that asks for it) at ``http://<metrics.host>:<metrics.port>/metrics``;
the host must be a loopback address (the configuration refuses any other), so
the endpoint is reachable from the router's machine only. The port is bound
before Spark starts: a port in use stops the command at once with a one-line
error.

Every metric is declared in :data:`METRICS` (name, type, help text, label
names); ``docs/operations.md`` lists the same names, and
``tests/streaming/ops/test_metrics.py`` checks that the two agree and that a live
router exposes every one. Counters count since this process started and end in
``_total``; a restart resets them, as Prometheus's ``rate()`` expects.

The samples, the text format and the HTTP server are
:mod:`streaming.ops.exposition`'s (``prometheus_client``, a batch's updates
seen all or none by a scrape).

Where the values come from (:class:`RouterMetrics`):

- each finished batch's :class:`streaming.router.batch.report.BatchReport`, through
  ``Router.report_listeners``, in the batch's thread: the counters of batches,
  publishes, deliveries, rejected publishes and seconds per stage; the last
  batch's id, time and snapshot version; the live subscriptions;
- a :class:`pyspark.sql.streaming.StreamingQueryListener` on Spark's listener
  thread (:mod:`streaming.ops.query_progress`): whether the query is active,
  its input and processing rates, the last trigger's durations, and the input
  lag;
- the router itself once it started (:meth:`RouterMetrics.router_started`):
  the snapshot version and subscriptions before the first batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from schemas.records import AUDIT_TABLE_NAMES
from streaming.config import STREAMING_MODES, Config, MetricsConfig
from streaming.ops.exposition import Metric, MetricsServer, Registry
from streaming.ops.query_progress import QueryListener, input_lag
from streaming.router.batch.report import ROUTED_IN_DRIVER, ROUTED_IN_EXECUTORS

if TYPE_CHECKING:
    from streaming.audit.maintenance import MaintenanceReport
    from streaming.router.batch.report import BatchReport
    from streaming.router.service import Router

STAGES = ("catch_up", "route", "audit")
"""The stages of a batch (``BatchReport.stages``), present at 0 from the start."""

DEPRECATED_ALIASES = {"bitroute_batches_rerun_total": "bitroute_batches_replayed_total"}
"""Metric -> its former name, still exposed with the same value so that dashboards and
alerts written against it keep working (docs/operations.md, "Deprecated names"); to be removed
in a later release."""

METRICS: tuple[Metric, ...] = (
    Metric("bitroute_start_time_seconds", "gauge",
           "When this router process started serving metrics, in Unix seconds."),
    Metric("bitroute_batches_total", "counter", "Micro-batches the router finished."),
    Metric("bitroute_batches_rerun_total", "counter",
           "Finished micro-batches that were re-runs after a crash (routed with their pinned "
           "snapshot version)."),
    Metric("bitroute_batches_replayed_total", "counter",
           "Deprecated: the same value as bitroute_batches_rerun_total, under its former name."),
    Metric("bitroute_batches_routed_total", "counter",
           "Finished micro-batches by where they were routed: in the driver (small batches on a "
           "local master) or on the executors.", ("routed_in",)),
    Metric("bitroute_publishes_total", "counter", "Publishes read and routed or rejected."),
    Metric("bitroute_deliveries_total", "counter",
           "Deliveries written to subscribers' topics and acknowledged by Kafka."),
    Metric("bitroute_rejected_total", "counter",
           "Publishes rejected with a reason (bitroute.rejected and the messages table)."),
    Metric("bitroute_expired_total", "counter",
           "Publishes whose lifetime (the expiry header) ended before they were routed: "
           "delivered to no one, outcome expired in the messages table."),
    Metric("bitroute_lost_total", "counter",
           "Publishes Kafka deleted (retention, DeleteRecords) before the router read them, "
           "recorded as lost in the messages table."),
    Metric("bitroute_batch_seconds_total", "counter", "Seconds spent in finished micro-batches."),
    Metric("bitroute_batch_stage_seconds_total", "counter",
           "Seconds spent in each stage of finished micro-batches.", ("stage",)),
    Metric("bitroute_last_batch_id", "gauge", "Id of the last finished micro-batch."),
    Metric("bitroute_last_batch_timestamp_seconds", "gauge",
           "When the last micro-batch finished, in Unix seconds."),
    Metric("bitroute_last_batch_seconds", "gauge", "Duration of the last finished micro-batch."),
    Metric("bitroute_snapshot_version", "gauge",
           "Snapshot version the last batch routed with (before the first batch: the router's "
           "version at start)."),
    Metric("bitroute_mode", "gauge",
           "1 for the mode the router runs in (streaming.mode), 0 for the other.", ("mode",)),
    Metric("bitroute_latency_seconds", "gauge",
           "End-to-end latency of the latest publishes: the publish's timestamp to its "
           "deliveries' acknowledgement (micro-batch: every publish whose routed rows reach the "
           "driver, a sample of 64 per routing task that writes its own audit files; realtime: "
           "its routed record, written with its deliveries), as a quantile (0.5, 0.99, 1: max).",
           ("quantile",)),
    Metric("bitroute_subscriptions", "gauge",
           "Live subscriptions in the router's current snapshot."),
    Metric("bitroute_input_lag_records", "gauge",
           "Publishes in Kafka not yet routed, as of the query's last progress event.",
           ("topic",)),
    Metric("bitroute_query_active", "gauge", "1 while the streaming query runs, else 0."),
    Metric("bitroute_query_input_rows_per_second", "gauge",
           "Rate at which publishes arrived, from the query's last progress event."),
    Metric("bitroute_query_processed_rows_per_second", "gauge",
           "Rate at which publishes were processed, from the query's last progress event."),
    Metric("bitroute_query_duration_seconds", "gauge",
           "Duration of each phase of the query's last trigger (Spark's durationMs).",
           ("phase",)),
    Metric("bitroute_audit_table_files", "gauge",
           "Live data files of an audit table, after the last maintenance pass.", ("table",)),
    Metric("bitroute_audit_table_bytes", "gauge",
           "Bytes of the live data files of an audit table, after the last maintenance pass.",
           ("table",)),
    Metric("bitroute_audit_table_log_entries", "gauge",
           "Files in an audit table's _delta_log, after the last maintenance pass.", ("table",)),
    Metric("bitroute_audit_table_version", "gauge",
           "Delta version of an audit table, after the last maintenance pass.", ("table",)),
    Metric("bitroute_audit_maintenance_last_timestamp_seconds", "gauge",
           "When the last audit maintenance pass finished, in Unix seconds (0: none yet)."),
    Metric("bitroute_audit_maintenance_last_seconds", "gauge",
           "Duration of the last audit maintenance pass."),
    Metric("bitroute_audit_maintenance_last_ok", "gauge",
           "1 when the last audit maintenance pass succeeded, else 0."),
    Metric("bitroute_audit_maintenance_passes_total", "counter",
           "Audit maintenance passes finished (succeeded or failed)."),
    Metric("bitroute_audit_maintenance_failures_total", "counter",
           "Audit maintenance passes in which a table's maintenance failed."),
    Metric("bitroute_audit_compacted_files_total", "counter",
           "Small data files rewritten by compaction.", ("table",)),
    Metric("bitroute_audit_vacuumed_files_total", "counter",
           "Data files deleted by vacuum.", ("table",)),
    Metric("bitroute_audit_deleted_rows_total", "counter",
           "Audit rows deleted by retention (audit.retention_days).", ("table",)),
)


class RouterMetrics:
    """The :data:`METRICS` of one router: fed by its batch reports and its query's
    events, served by a :class:`MetricsServer` (see the module docstring)."""

    def __init__(self, config: MetricsConfig, clock: Callable[[], float] = time.time) -> None:
        self.registry = Registry(METRICS)
        self.server = MetricsServer(self.registry, config.host, config.port)
        self._clock = clock
        self._router: Router | None = None
        self.listener = QueryListener(self)
        registry = self.registry
        registry.set("bitroute_start_time_seconds", clock())
        registry.set("bitroute_query_active", 0)
        for name in ("bitroute_batches_total", "bitroute_batches_rerun_total",
                     DEPRECATED_ALIASES["bitroute_batches_rerun_total"],
                     "bitroute_publishes_total", "bitroute_deliveries_total",
                     "bitroute_rejected_total", "bitroute_lost_total", "bitroute_expired_total",
                     "bitroute_batch_seconds_total"):
            registry.inc(name, 0)
        for stage in STAGES:
            registry.inc("bitroute_batch_stage_seconds_total", 0, stage=stage)
        for where in (ROUTED_IN_DRIVER, ROUTED_IN_EXECUTORS):
            registry.inc("bitroute_batches_routed_total", 0, routed_in=where)
        for name in ("bitroute_audit_maintenance_last_timestamp_seconds",
                     "bitroute_audit_maintenance_last_seconds",
                     "bitroute_audit_maintenance_last_ok"):
            registry.set(name, 0)
        for name in ("bitroute_audit_maintenance_passes_total",
                     "bitroute_audit_maintenance_failures_total"):
            registry.inc(name, 0)
        for table in AUDIT_TABLE_NAMES:
            for name in ("bitroute_audit_compacted_files_total",
                         "bitroute_audit_vacuumed_files_total",
                         "bitroute_audit_deleted_rows_total"):
                registry.inc(name, 0, table=table)

    def start(self) -> None:
        """Bind and serve; raises :class:`MetricsError` when the address is not free."""
        self.server.start()

    def observe(self, router: Router) -> None:
        """Feed from ``router``'s batch reports and its Spark session's query events.

        Call before ``router.start()`` so that the query's start is seen.
        """
        self._router = router
        for mode in STREAMING_MODES:
            self.registry.set("bitroute_mode", int(mode == router.config.streaming.mode), mode=mode)
        router.report_listeners.append(self.record_batch)
        router.maintenance.listeners.append(self.record_maintenance)
        router.spark.streams.addListener(self.listener)

    def router_started(self, router: Router) -> None:
        """The router's snapshot version and subscriptions, before its first batch."""
        subscriptions = router.subscriptions
        if subscriptions is None:
            return
        version, count = subscriptions.version, len(subscriptions)
        if self.registry.value("bitroute_snapshot_version") is None:
            self.registry.set("bitroute_snapshot_version", version)
        self.registry.set("bitroute_subscriptions", count)
        self.record_tables(router.config)

    def record_tables(self, config: Config) -> None:
        """The audit tables' sizes now (at start: a pass updates them after each run)."""
        from streaming.audit.table_stats import table_stats

        for table in AUDIT_TABLE_NAMES:
            try:
                stats = table_stats(config.delta.table_path(table))
            except Exception:  # noqa: BLE001 (no table yet, storage away: no sample)
                continue
            with self.registry.atomic() as r:
                r.set("bitroute_audit_table_files", stats.files, table=table)
                r.set("bitroute_audit_table_bytes", stats.bytes, table=table)
                if stats.log_entries is not None:
                    r.set("bitroute_audit_table_log_entries", stats.log_entries, table=table)
                r.set("bitroute_audit_table_version", stats.version, table=table)

    def record_batch(self, report: BatchReport) -> None:
        """Count one finished batch (a ``Router.report_listeners`` entry)."""
        router = self._router
        subscriptions = router.subscriptions if router is not None else None
        live = len(subscriptions) if subscriptions is not None else None
        now = self._clock()

        with self.registry.atomic() as r:
            r.inc("bitroute_batches_total")
            if report.rerun:
                r.inc("bitroute_batches_rerun_total")
                r.inc(DEPRECATED_ALIASES["bitroute_batches_rerun_total"])
            r.inc("bitroute_batches_routed_total", routed_in=report.routed_in)
            r.inc("bitroute_publishes_total", report.rows)
            r.inc("bitroute_deliveries_total", report.deliveries)
            r.inc("bitroute_rejected_total", report.rejected)
            r.inc("bitroute_lost_total", report.lost)
            r.inc("bitroute_expired_total", report.expired)
            r.inc("bitroute_batch_seconds_total", report.seconds)
            for stage, seconds in report.stages.items():
                r.inc("bitroute_batch_stage_seconds_total", seconds, stage=stage)
            r.set("bitroute_last_batch_id", report.batch_id)
            r.set("bitroute_last_batch_timestamp_seconds", now)
            r.set("bitroute_last_batch_seconds", report.seconds)
            r.set("bitroute_snapshot_version", report.snapshot_version)
            if live is not None:
                r.set("bitroute_subscriptions", live)
            latency = router.latency.percentiles() if router is not None else None
            if latency is not None:
                for quantile, key in (("0.5", "p50"), ("0.99", "p99"), ("1", "max")):
                    r.set("bitroute_latency_seconds", latency[key] / 1000, quantile=quantile)

    def record_maintenance(self, report: MaintenanceReport) -> None:
        """One audit maintenance pass (a ``Router.maintenance.listeners`` entry): the tables'
        sizes after it, its time and outcome, the counters of what it did."""
        with self.registry.atomic() as r:
            r.inc("bitroute_audit_maintenance_passes_total")
            if not report.ok:
                r.inc("bitroute_audit_maintenance_failures_total")
            r.set("bitroute_audit_maintenance_last_timestamp_seconds", self._clock())
            r.set("bitroute_audit_maintenance_last_seconds", report.seconds)
            r.set("bitroute_audit_maintenance_last_ok", 1 if report.ok else 0)
            for t in report.tables:
                r.inc("bitroute_audit_compacted_files_total", t.files_compacted, table=t.table)
                r.inc("bitroute_audit_vacuumed_files_total", t.files_vacuumed, table=t.table)
                r.inc("bitroute_audit_deleted_rows_total", t.rows_deleted, table=t.table)
                if t.skipped or t.error:
                    continue
                r.set("bitroute_audit_table_files", t.files_after, table=t.table)
                r.set("bitroute_audit_table_bytes", t.bytes_after, table=t.table)
                if t.log_entries is not None:
                    r.set("bitroute_audit_table_log_entries", t.log_entries, table=t.table)
                if t.version is not None:
                    r.set("bitroute_audit_table_version", t.version, table=t.table)

    def record_progress(self, progress: Mapping[str, Any]) -> None:
        """Rates, durations and input lag from one ``StreamingQueryProgress`` (a dict)."""
        lags = input_lag(progress.get("sources") or [])

        with self.registry.atomic() as r:
            for name, key in (("bitroute_query_input_rows_per_second", "inputRowsPerSecond"),
                              ("bitroute_query_processed_rows_per_second",
                               "processedRowsPerSecond")):
                value = progress.get(key)
                if isinstance(value, (int, float)):
                    r.set(name, value)
            r.clear("bitroute_query_duration_seconds")  # a trigger reports only its phases
            for phase, millis in (progress.get("durationMs") or {}).items():
                if isinstance(millis, (int, float)):
                    r.set("bitroute_query_duration_seconds", millis / 1000, phase=phase)
            for topic, lag in lags.items():
                r.set("bitroute_input_lag_records", lag, topic=topic)

    def record_idle(self) -> None:
        """No new data at the last trigger: nothing is waiting in any known topic."""
        with self.registry.atomic() as r:
            for (topic,) in r.label_values("bitroute_input_lag_records"):
                r.set("bitroute_input_lag_records", 0, topic=topic)

    def set_query_active(self, active: bool) -> None:
        self.registry.set("bitroute_query_active", 1 if active else 0)

    def close(self) -> None:
        """Stop serving (the listener goes with the Spark session)."""
        self.server.stop()

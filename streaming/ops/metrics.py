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

The samples, the text format and the HTTP server are ``prometheus_client``'s
(:class:`Registry` holds one of its metrics per declaration and
:class:`MetricsServer` is its ``start_http_server``). What bitroute adds: a
scrape sees a batch's updates all or none (one lock around updates and
collection), a gauge without a value yet has no sample (rather than a 0 that
would read as, say, batch 0), and no ``_created`` series (the names are exactly
the declared ones).

Where the values come from (:class:`RouterMetrics`):

- each finished batch's :class:`streaming.router.report.BatchReport`, through
  ``Router.report_listeners``, in the batch's thread: the counters of batches,
  publishes, deliveries, rejected publishes and seconds per stage; the last
  batch's id, time and snapshot version; the live subscriptions;
- a :class:`pyspark.sql.streaming.StreamingQueryListener` on Spark's listener
  thread: whether the query is active, its input and processing rates, the
  last trigger's durations, and the input lag;
- the router itself once it started (:meth:`RouterMetrics.router_started`):
  the snapshot version and subscriptions before the first batch.

Input lag is what the last progress event of the query says: per publishes
topic, the sum over partitions of the source's ``latestOffset`` (the end
offsets Kafka reported when that batch was planned) minus its ``endOffset``
(where the batch stopped, e.g. at ``streaming.max_offsets_per_trigger``). An
idle event (no new data at a trigger) sets it to 0. While a batch runs no
event comes: ``bitroute_last_batch_timestamp_seconds`` tells how old the
figure is.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, start_http_server
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import Metric as Family
from prometheus_client.validation import METRIC_LABEL_NAME_RE, METRIC_NAME_RE
from pyspark.sql.streaming.listener import StreamingQueryListener

from schemas.records import AUDIT_TABLE_NAMES
from streaming.config import Config, MetricsConfig
from streaming.errors import BitrouteError
from streaming.router.report import ROUTED_IN_DRIVER, ROUTED_IN_EXECUTORS

if TYPE_CHECKING:
    from streaming.audit.maintenance import MaintenanceReport
    from streaming.router.report import BatchReport
    from streaming.router.service import Router

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
"""The answer's type to a plain ``GET`` (``curl``): text format 0.0.4."""
PATH = "/metrics"
STAGES = ("catch_up", "route", "audit")
"""The stages of a batch (``BatchReport.stages``), present at 0 from the start."""


class MetricsError(BitrouteError):
    """The metrics endpoint could not be served (the message names the address)."""


@dataclass(frozen=True)
class Metric:
    """One metric family: ``kind`` is ``counter`` (name ends in ``_total``) or ``gauge``.

    Names and labels follow Prometheus's classic rules (what every scraper reads);
    a declaration breaking them is a ``ValueError``.
    """

    name: str
    kind: str
    help: str
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not METRIC_NAME_RE.match(self.name):
            raise ValueError(f"metric {self.name!r}: invalid name")
        if self.kind not in ("counter", "gauge"):
            raise ValueError(f"metric {self.name!r}: kind must be counter or gauge")
        if (self.kind == "counter") != self.name.endswith("_total"):
            raise ValueError(f"metric {self.name!r}: counters and only counters end in _total")
        if not all(METRIC_LABEL_NAME_RE.match(label) for label in self.labels):
            raise ValueError(f"metric {self.name!r}: invalid label name")


METRICS: tuple[Metric, ...] = (
    Metric("bitroute_start_time_seconds", "gauge",
           "When this router process started serving metrics, in Unix seconds."),
    Metric("bitroute_batches_total", "counter", "Micro-batches the router finished."),
    Metric("bitroute_batches_replayed_total", "counter",
           "Finished micro-batches that were replays (routed with their pinned snapshot version)."),
    Metric("bitroute_batches_routed_total", "counter",
           "Finished micro-batches by where they were routed: in the driver (small batches on a "
           "local master) or on the executors.", ("routed_in",)),
    Metric("bitroute_publishes_total", "counter", "Publishes read and routed or rejected."),
    Metric("bitroute_deliveries_total", "counter",
           "Deliveries written to subscribers' topics and acknowledged by Kafka."),
    Metric("bitroute_rejected_total", "counter",
           "Publishes rejected with a reason (bitroute.rejected and the messages table)."),
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


class Registry:
    """The declared metrics as ``prometheus_client`` metrics, in their own
    :class:`prometheus_client.CollectorRegistry` (:attr:`collectors`, what the server
    and :meth:`render` read). Thread-safe.

    Every update and every collection take one lock; :meth:`atomic` holds it
    across several updates, so a scrape sees a batch's counters all updated or
    none. A metric is updated with exactly its declared labels, a counter only
    goes up (``ValueError`` otherwise). A gauge without labels has no sample
    until it is first set.
    """

    def __init__(self, metrics: Iterable[Metric]) -> None:
        self._declared: dict[str, Metric] = {}
        self._metrics: dict[str, Counter | Gauge] = {}
        self._unset: set[str] = set()
        for metric in metrics:
            if metric.name in self._declared:
                raise ValueError(f"metric {metric.name!r}: repeated name")
            kind = Counter if metric.kind == "counter" else Gauge
            self._declared[metric.name] = metric
            self._metrics[metric.name] = kind(metric.name, metric.help, metric.labels,
                                              registry=None)
            if metric.kind == "gauge" and not metric.labels:
                self._unset.add(metric.name)
        self._lock = threading.RLock()
        self.collectors = CollectorRegistry()
        self.collectors.register(_Collector(self))

    def inc(self, name: str, amount: float = 1.0, **labels: object) -> None:
        """Add ``amount`` (>= 0) to a counter's sample."""
        if not amount >= 0:  # before the sample exists: a refused update leaves no trace
            raise ValueError(f"{name}: a counter only goes up: inc() needs a non-negative "
                             f"amount, got {amount!r}")
        metric = self._sample(name, "counter", labels)
        with self._lock:
            metric.inc(amount)

    def set(self, name: str, value: float, **labels: object) -> None:
        """Set a gauge's sample."""
        metric = self._sample(name, "gauge", labels)
        with self._lock:
            metric.set(value)
            self._unset.discard(name)

    @contextmanager
    def atomic(self) -> Iterator[Registry]:
        """Hold the lock across several updates: a scrape sees all of them or none."""
        with self._lock:
            yield self

    def clear(self, name: str) -> None:
        """Drop every sample of ``name`` (a family whose label values come and go)."""
        metric = self._family(name)
        with self._lock:
            metric.clear()

    def value(self, name: str, **labels: object) -> float | None:
        """A sample's current value, ``None`` when it has none yet."""
        wanted = {label: str(value) for label, value in labels.items()}
        for sample in self._samples(name):
            if sample.labels == wanted:
                return sample.value
        return None

    def label_values(self, name: str) -> list[tuple[str, ...]]:
        """The label values of every sample ``name`` has now."""
        declared = self._declared[name].labels
        return sorted(tuple(s.labels[label] for label in declared) for s in self._samples(name))

    def render(self) -> str:
        """The text exposition format 0.0.4: per family ``# HELP``, ``# TYPE``, then its
        samples (a family without samples yet has its two comment lines only)."""
        return generate_latest(self.collectors).decode("utf-8")

    def collect(self) -> list[Family]:
        """Every family with its samples now, in declaration order (under the lock)."""
        with self._lock:
            return [self._now(name) for name in self._metrics]

    def _now(self, name: str) -> Family:
        """``name``'s family now: no sample while unset, no ``_created`` series."""
        [family] = self._metrics[name].collect()
        family.samples = [] if name in self._unset else [
            s for s in family.samples if not s.name.endswith("_created")]
        return family

    def _samples(self, name: str) -> list:
        self._family(name)
        with self._lock:
            return self._now(name).samples

    def _family(self, name: str) -> Counter | Gauge:
        metric = self._metrics.get(name)
        if metric is None:
            raise ValueError(f"{name}: not a declared metric")
        return metric

    def _sample(self, name: str, kind: str, labels: Mapping[str, object]) -> Counter | Gauge:
        metric = self._family(name)
        declared = self._declared[name]
        if declared.kind != kind:
            raise ValueError(f"{name}: {'inc' if kind == 'counter' else 'set'}() needs a {kind}")
        if set(labels) != set(declared.labels):
            raise ValueError(f"{name}: labels {sorted(labels)} given, {list(declared.labels)} "
                             "declared")
        return metric.labels(**{k: str(v) for k, v in labels.items()}) if labels else metric


class _Collector:
    """The registry's families, as a ``prometheus_client`` collector."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def collect(self) -> list[Family]:
        return self._registry.collect()

    def describe(self) -> list[Family]:
        return self._registry.collect()


class MetricsServer:
    """``GET /metrics`` over HTTP from a daemon thread, on ``host:port``
    (``prometheus_client.start_http_server``).

    :meth:`start` binds (raising :class:`MetricsError` naming the address when
    it cannot) and returns at once; each request is answered in its own daemon
    thread. Port 0 binds a free port (see :attr:`port`).
    """

    def __init__(self, registry: Registry, host: str, port: int) -> None:
        self._registry = registry
        self._host = host
        self._port = port
        self._server = None

    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`)."""
        return self._server.server_address[1] if self._server is not None else self._port

    @property
    def url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}{PATH}"

    def start(self) -> None:
        try:
            self._server, _ = start_http_server(self._port, self._host,
                                                self._registry.collectors)
        except OSError as exc:
            raise MetricsError(f"cannot serve metrics on {self._host}:{self._port}: "
                               f"{exc.strerror or exc}") from None

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


class RouterMetrics:
    """The :data:`METRICS` of one router: fed by its batch reports and its query's
    events, served by a :class:`MetricsServer` (see the module docstring)."""

    def __init__(self, config: MetricsConfig, clock: Callable[[], float] = time.time) -> None:
        self.registry = Registry(METRICS)
        self.server = MetricsServer(self.registry, config.host, config.port)
        self._clock = clock
        self._router: Router | None = None
        self.listener = _QueryListener(self)
        registry = self.registry
        registry.set("bitroute_start_time_seconds", clock())
        registry.set("bitroute_query_active", 0)
        for name in ("bitroute_batches_total", "bitroute_batches_replayed_total",
                     "bitroute_publishes_total", "bitroute_deliveries_total",
                     "bitroute_rejected_total", "bitroute_batch_seconds_total"):
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
        from streaming.audit.maintenance import table_stats

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
            if report.replayed:
                r.inc("bitroute_batches_replayed_total")
            r.inc("bitroute_batches_routed_total", routed_in=report.routed_in)
            r.inc("bitroute_publishes_total", report.rows)
            r.inc("bitroute_deliveries_total", report.deliveries)
            r.inc("bitroute_rejected_total", report.rejected)
            r.inc("bitroute_batch_seconds_total", report.seconds)
            for stage, seconds in report.stages.items():
                r.inc("bitroute_batch_stage_seconds_total", seconds, stage=stage)
            r.set("bitroute_last_batch_id", report.batch_id)
            r.set("bitroute_last_batch_timestamp_seconds", now)
            r.set("bitroute_last_batch_seconds", report.seconds)
            r.set("bitroute_snapshot_version", report.snapshot_version)
            if live is not None:
                r.set("bitroute_subscriptions", live)

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


def input_lag(sources: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Per Kafka topic, records between a source's ``endOffset`` and ``latestOffset``.

    Offsets are the Kafka source's JSON (``{"topic": {"partition": offset}}``)
    as strings; a source whose offsets are missing or not of that form (the
    first trigger, another kind of source) is left out. A partition absent
    from ``endOffset`` counts from offset 0.
    """
    lags: dict[str, int] = {}
    for source in sources:
        end, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
        if end is None or latest is None:
            continue
        for topic, partitions in latest.items():
            done = end.get(topic, {})
            lags[topic] = lags.get(topic, 0) + sum(max(offset - done.get(p, 0), 0)
                                                   for p, offset in partitions.items())
    return lags


def _offsets(text: object) -> dict[str, dict[str, int]] | None:
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    out: dict[str, dict[str, int]] = {}
    for topic, partitions in value.items():
        if not isinstance(partitions, dict) or not all(
                isinstance(o, int) and not isinstance(o, bool) for o in partitions.values()):
            return None
        out[topic] = dict(partitions)
    return out


class _QueryListener(StreamingQueryListener):
    """Spark calls these on its listener thread, after the events happened."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self._metrics = metrics

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 (pyspark's names)
        self._metrics.set_query_active(True)

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        self._metrics.record_progress(event.progress)

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        self._metrics.record_idle()

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        self._metrics.set_query_active(False)

"""The router: a Structured Streaming query over the publishes topic.

Per micro-batch, in ``foreachBatch`` (:meth:`Router.process_batch`):

a. Pin. The batch's snapshot comes from its one owner,
   :class:`~streaming.router.subscriptions.snapshots.BatchSnapshots`, in one call: a batch id
   seen for the first time catches the subscription changelog up to its end
   offsets (happens-before: a subscription Kafka acknowledged before a
   publish of this batch is applied to it) and records ``batch id -> snapshot
   version`` durably before anything is written; a re-run batch id (after a
   crash) reuses its pinned version. The version comes back broadcast, with
   whether its matcher reads headers.
b. Route. One Spark job: ``mapInArrow`` over the Kafka source rows, where
   each Python worker matches its publishes against the pinned snapshot
   (broadcast once per version), produces every delivery and every rejected
   publish to Kafka with librdkafka and waits for the acks, then writes the
   audit files of its publishes (``messages`` and ``deliveries`` Parquet files
   in the tables' folders, :mod:`streaming.audit.files`) and returns one row:
   its counts and the files' records (:mod:`streaming.router.batch.routing`). So the
   driver receives a few hundred bytes per task, whatever the batch's size. On a
   ``local[...]`` master (``streaming.executor_audit_files = "auto"``) the tasks
   return their routed rows instead (one per publish) and the committer writes
   the files beside the next batch: the files are then off the routing tasks'
   critical path, and the driver's work per publish is the same machine's CPU. A
   batch within the driver's bounds (``streaming.driver_route_max_publishes``
   publishes, its size read from the query's offset log,
   :mod:`streaming.state.offsets_log`, and ``driver_route_max_deliveries``
   deliveries, estimated from the recent batches' fan-out; by default only on
   a ``local[...]`` master, :meth:`streaming.config.StreamingConfig.driver_route_bounds`)
   is routed in the driver instead, in one call for the whole batch (one
   flush), on its rows read from Kafka by the driver itself (the offset log's
   range, :mod:`streaming.router.batch.batch_rows`: no Spark job, no Python workers'
   round trip), and the routed rows are journaled for the committer to write.
   No record can fail this step (bad records are
   rejected with a reason); a failure that is not about a record (Kafka
   unreachable, a worker lost) is retried with backoff, logged at its first
   failure and then at most every 30 s (:mod:`streaming.retry`), never turned
   into rejections.
c. Audit. The batch's audit written durably to the audit journal
   (:mod:`streaming.audit.journal`: the files' records, or the rows routed in
   the driver), after Kafka's acks, so the audit never lists a delivery Kafka
   did not take, and before Spark commits the batch. A background committer
   (:mod:`streaming.audit.committer`) adds the journaled batches to the
   ``messages`` and ``deliveries`` Delta tables every ``audit.commit_interval``,
   a group per transaction keyed by batch ids: exactly once, off the batch's
   critical path. Files a task wrote whose result Spark discarded (a failed or
   speculative attempt) or a batch the driver never journaled (a crash) are
   never committed; the maintenance's vacuum deletes them.
Around a and between a and b, the batch passes through the router's features
(:attr:`Router.features`, each a :class:`~streaming.router.feature.BatchFeature`, in
the order :mod:`streaming.router.features` lists them; the loop names none of them):
at the pin, MQTT retained messages planned for the new subscriptions
(:mod:`streaming.router.retained`) and replays bounded (:mod:`streaming.router.replay`);
then the retained messages delivered, the publishes topic's check
(:mod:`streaming.router.topics.incarnations`: a recreated topic stops the query, which
follows the new one), and its start checked against the earliest offsets Kafka still
holds (:mod:`streaming.router.topics.retention`): publishes deleted before the
router read them are said in one line, recorded as ``lost`` rows in the
audit's ``messages`` with the batch, and counted in its report; or, under
``streaming.on_retention_gap = "stop"``, they stop the router. While no batch
comes, the router applies the changelog itself and hands the features the version
(:meth:`Router._idle_catch_up`).

d. Report. A :class:`~streaming.router.batch.report.BatchReport` to every registered
   listener (:attr:`Router.report_listeners`): ``status.json`` for ``bitroute
   status``, and whatever the caller registered (``bitroute run``'s progress
   line on stdout, the metrics). The library prints no progress itself.

Message id = ``<topic>/<partition>/<offset>``; exchange = the last
``exchange`` header, else ``exchanges.default``.

State: the checkpoint folder (:mod:`streaming.state.checkpoint`): Spark's
checkpoint of the query, the router's snapshots and pins
(:mod:`streaming.router.subscriptions.snapshots`), held by one router at a time
(:mod:`streaming.state.lock`). A router killed at any
point and restarted on the same folders re-runs the unfinished batch with its
pinned version: no delivery lost, Kafka repeats possible, Delta rows exactly
once (a journal a crash left is committed at open, before routing starts).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaException
from deltalake.exceptions import DeltaError
from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from schemas.records import OUTCOME_EXPIRED, OUTCOME_REJECTED
from schemas.tables import ROUTED_PUBLISH, ROUTED_TASK
from streaming.audit.committer import AuditCommitter
from streaming.audit.journal import AuditJournal
from streaming.audit.maintenance import BackgroundMaintenance
from streaming.audit.writer import PUBLISH_TABLES, AuditTables, FileBatch, PublishBatch
from streaming.config import MODE_REALTIME, Config
from streaming.errors import one_line
from streaming.kafka.broker_watch import BrokerWatch
from streaming.kafka.clients import java_access_failure
from streaming.kafka.errors import KafkaAccessError
from streaming.kafka.records import SOURCE_COLUMNS
from streaming.kafka.topics import admin_client, ensure_router_topics
from streaming.retry import RetryAbandoned, retry
from streaming.router.batch.batch_rows import BatchRows
from streaming.router.batch.delivery import DeliveryUnavailable, ProducerSettings
from streaming.router.batch.report import (
    ROUTED_IN_DRIVER,
    ROUTED_IN_EXECUTORS,
    BatchReport,
    LatencyWindow,
    ReportListener,
    StatusFile,
)
from streaming.router.batch.routing import (
    ROUTED_ARROW,
    RoutePartitions,
    RouteSettings,
    TaskAudit,
    write_task_audit,
)
from streaming.router.errors import RouterModeError, RouterStopping
from streaming.router.feature import (
    STOP_RECREATED,
    STOP_RETENTION_GAP,
    BatchFeature,
    BatchPin,
    BatchStep,
    IdleCatchUp,
    RouterContext,
    StopReason,
)
from streaming.router.features import FEATURES, FeatureFactory
from streaming.router.restore import open_audit
from streaming.router.retained import RetainSettings
from streaming.router.subscriptions.changelog import ChangelogError, Subscriptions
from streaming.router.subscriptions.snapshots import BatchSnapshot, BatchSnapshots, SnapshotStore
from streaming.router.subscriptions.subscription_sync import SubscriptionSync
from streaming.router.topics.incarnations import IncarnationWatch, follow_incarnation
from streaming.router.topics.retention import gap_rows
from streaming.state.checkpoint import CheckpointLayout
from streaming.state.lease import RouterLease
from streaming.state.lock import RouterLock
from streaming.state.offsets_log import batch_end, batch_start, last_planned_batch, records_between

if TYPE_CHECKING:
    from streaming.realtime.service import RealtimeRouting

_log = logging.getLogger(__name__)

REPORTS_KEPT = 100
"""Progress reports of recent batches kept in memory (:attr:`Router.reports`)."""
FANOUT_BATCHES = 10
"""A batch's deliveries are estimated, before routing, as its publishes times the most
deliveries per publish of this many recent batches (the driver's deliveries bound)."""
STOP_COMMIT_TIMEOUT_S = 30.0
"""On a stop request, how long to wait for Spark to commit the batch that just finished."""
RETRIED_ERRORS = (PySparkException, Py4JError, ChangelogError, DeliveryUnavailable, KafkaException,
                  KafkaAccessError, DeltaError, OSError)
"""Failures of a batch's steps that are retried (none of them is about a record), with
:func:`streaming.retry.retry`'s backoff and reporting."""
IDLE_CATCH_UP_S = 1.0
"""With no batch for this long, the router applies the changelog itself when a feature's
thread asks (:meth:`Router._idle_catch_up`): a replay asked for on a quiet topic starts at once."""
T = TypeVar("T")
F = TypeVar("F", bound=BatchFeature)


class Router:
    """One router: ``start()``, then ``process_all_available()`` or wait, then ``stop()``.

    ``open()`` (called by ``start()``) takes the state folder's lock, unless
    the ``lock`` given is held already (``bitroute run`` takes it before Spark
    starts, and hands it over: it is taken once), and prepares everything but
    the query: topics, audit tables, the rebuilt subscription index; tests
    drive :meth:`process_batch` directly after it. The router releases the
    lock at :meth:`stop`.

    ``features``: the factories of its features, in order (:mod:`streaming.router.features`,
    the default; a test may add its own).
    """

    def __init__(self, config: Config, spark: SparkSession, lock: RouterLock | None = None,
                 accept_retention_gap: bool = False,
                 features: Sequence[FeatureFactory] = FEATURES) -> None:
        self.config = config
        self.spark = spark
        self.layout = CheckpointLayout.of(config.streaming.checkpoint_dir)
        self.lock = lock if lock is not None else RouterLock(self.layout.root)
        self.lease = RouterLease(config)
        """One router per publishes topic and warehouse (:mod:`streaming.state.lease`)."""
        self._accept_retention_gap = accept_retention_gap
        """``bitroute run --accept-retention-gap`` (realtime mode's; micro-batch's is its
        :class:`RetentionWatch`'s)."""
        self.reports: deque[BatchReport] = deque(maxlen=REPORTS_KEPT)
        self.query: StreamingQuery | None = None
        self.subscription_sync: SubscriptionSync | None = None
        self._snapshots: BatchSnapshots | None = None
        self._audit: AuditTables | None = None
        self._committer: AuditCommitter | None = None
        self._partitioned: frozenset[str] = frozenset(PUBLISH_TABLES)
        master = spark.sparkContext.master
        if master is None:  # pyspark types it optional; a started context has one
            raise RuntimeError("the Spark context has no master")
        self.driver_bounds = config.streaming.driver_route_bounds(master)
        """(publishes, deliveries): the largest batch routed in the driver, for the master
        Spark runs (:meth:`streaming.config.StreamingConfig.driver_route_bounds`)."""
        self.task_audit_files = config.streaming.task_audit_files(master)
        """Whether the executors' routing tasks write their audit files themselves, for the
        master Spark runs (:meth:`streaming.config.StreamingConfig.task_audit_files`)."""
        self.maintenance = BackgroundMaintenance(config)
        """The audit tables' upkeep, in its own thread while the router is open
        (:mod:`streaming.audit.maintenance`): never on a batch's path."""
        self._batch_done = threading.Condition()
        self._in_batch = False
        self._pin_lock = threading.Lock()
        """Held while a batch pins its version, and by an idle catch-up (:meth:`_idle_catch_up`)."""
        self._last_batch_at = time.monotonic()
        self._stopping = threading.Event()
        self.broker_watch = BrokerWatch(config.kafka.client_settings)
        self._status = StatusFile(self.layout.status_file, self._status_figures)
        self.report_listeners: list[ReportListener] = [self._status]
        """Each is called with every finished batch's report, in this order
        (:mod:`streaming.router.batch.report`); ``status.json`` is the first."""
        self.catch_up_progress: Callable[[], Callable[[int, int], None]] | None = None
        """Makes the progress callback of each changelog catch-up (``bitroute run``'s lines)."""
        self.incarnation = IncarnationWatch(config.kafka.client_settings,
                                            config.kafka.publishes_topic)
        """The publishes topic's incarnation the router reads
        (:mod:`streaming.router.topics.incarnations`)."""
        self._feature_factories = tuple(features)
        self.features: list[BatchFeature] = []
        """The router's features, in order (:mod:`streaming.router.feature`), made at its
        first open by the factories it was given and kept while it lives."""
        self.batch_rows = BatchRows(config.kafka.client_settings, config.kafka.publishes_topic)
        """Reads a driver batch's publishes from Kafka (:mod:`streaming.router.batch.batch_rows`)."""
        self.lost_total = 0
        """Publishes recorded lost to retention since this router started."""
        self.expired_total = 0
        """Publishes expired before routing since this router started."""
        self.latency = LatencyWindow()
        """End-to-end latency of the latest publishes, in either mode (status, metrics)."""
        self.realtime: RealtimeRouting | None = None
        """Realtime mode's view, routing and audit queries while they run
        (:class:`streaming.realtime.service.RealtimeRouting`), else None."""

    def open(self) -> None:
        """Lock the state folder, create missing topics and tables, rebuild the index and
        catch up the changelog. Raises :class:`streaming.state.lock.RouterLockedError` when
        another router holds the folder, or (:class:`streaming.state.lease.LeaseHeldError`)
        the publishes topic and warehouse."""
        if self.subscription_sync is not None:
            return
        if not self.lock.held:
            self.lock.acquire()
        try:
            store = SnapshotStore(self.layout)  # writable: only with the lock held
            if not self.lease.held:
                self.lease.acquire(store.router_id)  # before anything is written or routed
            self._open_state(store)
        except BaseException:
            self.lease.release()
            self.lock.release()
            raise

    def _open_state(self, store: SnapshotStore) -> None:
        """Everything :meth:`open` prepares once the lock and lease are held."""
        journal = AuditJournal(self.layout.audit_journal)
        ensure_router_topics(self.config)
        if self.config.streaming.mode == MODE_REALTIME:
            from streaming.realtime.incarnation import refuse_recreated_topic

            refuse_recreated_topic(self.config, self.layout, store, admin_client(self.config))
        self.incarnation.topic_id, self.incarnation.number = follow_incarnation(
            self.config, self.layout, admin_client(self.config))
        if store.has_pins() and not self.layout.offsets.is_dir():
            # Pins of batches of a checkpoint that is gone (or of a deleted incarnation of
            # the publishes topic): the new query's batch ids start again at 0 and must not
            # meet them, nor the journal's (committed first, under the old router id).
            previous = self._committer_for(store, journal)
            previous.recover()
            previous.tables.close()
            store.forget_batches()
        # A restored (older) state folder is found and made safe here.
        self._committer = open_audit(self.layout, store,
                                     lambda: self._committer_for(store, journal),
                                     self._realtime_restored(store))
        self._audit = self._committer.tables
        unpartitioned = self._audit.unpartitioned()
        self._partitioned = frozenset(n for n in PUBLISH_TABLES if n not in unpartitioned)
        for name in unpartitioned:
            _log.warning(f"the audit table {name} ({self._audit.path(name)}) has an "
                         "earlier version's layout (not partitioned by day): it is appended "
                         "to as it is; `bitroute audit migrate` (router stopped) "
                         "partitions it")
        self._committer.recover()  # a crash's leftovers, before routing starts
        self._committer.start()
        self._snapshots = BatchSnapshots(store, self.spark.sparkContext,
                                         prune_at_commit=self.config.streaming.mode == MODE_REALTIME)
        self.subscription_sync = SubscriptionSync.open(self.config, self._snapshots, self._audit,
                                                       self.broker_watch.on_error)
        self._store = store
        context = RouterContext(
            config=self.config, spark=self.spark, layout=self.layout, store=store,
            router_id=store.router_id(), snapshots=self._snapshots,
            subscription_sync=self.subscription_sync, audit=self._audit,
            incarnation=self.incarnation, accept_retention_gap=self._accept_retention_gap,
            stopping=self._stopping, on_error=self.broker_watch.on_error,
            audit_committed=self._audit_committed, idle_catch_up=self._idle_catch_up)
        if not self.features:
            made = (factory(context) for factory in self._feature_factories)
            self.features = [feature for feature in made if feature is not None]
        for feature in self.features:
            feature.open(context)
        self.subscription_sync.catch_up(self._catch_up_progress())
        self.maintenance.start()
        for feature in self.features:
            feature.start()

    def _realtime_restored(self, store: SnapshotStore) -> Callable[[], list[str]]:
        """Realtime mode's signs of a restored state folder (:mod:`streaming.realtime.restored`)."""
        if self.config.streaming.mode != MODE_REALTIME:
            return list
        from streaming.realtime.restored import realtime_restored

        return lambda: realtime_restored(self.config, self.layout, store)

    def _committer_for(self, store: SnapshotStore, journal: AuditJournal) -> AuditCommitter:
        """The audit tables (created if missing) under the current router id, with a committer."""
        tables = AuditTables(self.config, store.router_id(), store.snapshot_audit_id())
        tables.ensure()
        return AuditCommitter(tables, journal, self.config.audit.commit_interval_s,
                              self.config.audit.max_pending_batches, stopping=self._stopping,
                              on_commit=self._status.refresh)

    def start(self) -> StreamingQuery:
        """Open, then start the streaming query (it resumes from its checkpoint): the
        micro-batch query, or realtime mode's routing query (:mod:`streaming.realtime`)."""
        self.open()
        if self.config.streaming.mode == MODE_REALTIME:
            return self._start_realtime()
        if self.layout.realtime_routing.is_dir():
            raise RouterModeError(
                f"the state folder {self.layout.root} was last routed in realtime mode "
                f"({self.layout.realtime_routing}): micro-batch mode would route its publishes "
                "again. Run it with streaming.mode = \"realtime\", or give micro-batch mode a "
                "new streaming.checkpoint_dir")
        kafka, streaming = self.config.kafka, self.config.streaming
        source = (self.spark.readStream.format("kafka")
                  .options(**kafka.client_settings.spark_options())
                  .option("subscribe", kafka.publishes_topic)
                  .option("startingOffsets", "earliest")
                  .option("includeHeaders", "true")
                  # Lost publishes are the router's to find and record, per batch
                  # (streaming.router.topics.retention); Spark's own check fails the batch forever.
                  .option("failOnDataLoss", "false")
                  .option("maxOffsetsPerTrigger", str(streaming.max_offsets_per_trigger))
                  .load())
        self.query = (source.writeStream
                      .foreachBatch(self._foreach_batch)
                      .trigger(processingTime=streaming.trigger_interval)
                      .option("checkpointLocation", str(self.layout.query))
                      .start())
        return self.query

    def _start_realtime(self) -> StreamingQuery:
        from streaming.realtime.service import RealtimeRouting

        sync, snapshots = self._require_open()
        self.realtime = RealtimeRouting(self.config, self.spark, self.layout, self._store, sync,
                                        snapshots, self._pin_lock, self.incarnation.number,
                                        on_commit=self._status.refresh, on_report=self._report,
                                        latency=self.latency, describe=self.failure_line,
                                        on_routing_query=self._routing_query_started,
                                        topic_id=self.incarnation.topic_id,
                                        accept_retention_gap=self._accept_retention_gap)
        try:
            self.query = self.realtime.start()
        except BaseException:
            self.realtime.stop()
            self.realtime = None
            raise
        return self.query

    def _routing_query_started(self, query: StreamingQuery) -> None:
        """Realtime mode started its routing query again (after a failure): it is the
        router's query now."""
        self.query = query

    def feature(self, kind: type[F]) -> F:
        """The router's feature of class ``kind`` (made at its first open); LookupError
        when it has none."""
        for feature in self.features:
            if isinstance(feature, kind):
                return feature
        raise LookupError(f"the router has no {kind.__name__} (streaming.router.features)")

    @property
    def stop_reason(self) -> StopReason | None:
        """Why a feature stopped the query, when one did (:mod:`streaming.router.feature`)."""
        return next((f.stop_reason for f in self.features if f.stop_reason is not None), None)

    @property
    def recreated(self) -> str | None:
        """Why the query stopped on a recreated publishes topic (the line), when it did:
        :meth:`follow_recreated_topic` follows it."""
        reason = self.stop_reason
        return reason.line if reason is not None and reason.kind == STOP_RECREATED else None

    @property
    def retention_stop(self) -> str | None:
        """Why the router stopped on a retention gap (the one line), when it did."""
        reason = self.stop_reason
        return reason.line if reason is not None and reason.kind == STOP_RETENTION_GAP else None

    @property
    def subscriptions(self) -> Subscriptions | None:
        """The subscription state (index, version, offsets) while the router is open."""
        return self.subscription_sync.subscriptions if self.subscription_sync is not None else None

    def process_all_available(self) -> None:
        """Block until every publish available now has been processed (raises if the query failed)."""
        self._require_query().processAllAvailable()

    def stop(self) -> None:
        """Stop the query (an unfinished batch is re-run at the next start) and release resources."""
        self._stopping.set()
        try:
            if self.realtime is not None:
                self.realtime.stop()
                self.realtime = None
            elif self.query is not None:
                self.query.stop()
        finally:
            self._close_state()
            self.broker_watch.stop()
            self.lease.release()
            self.lock.release()

    def _close_state(self) -> None:
        """Undo :meth:`_open_state` (the lock and lease stay)."""
        self.maintenance.stop()
        for feature in reversed(self.features):  # their threads end before what they use closes
            feature.close()
        if self._snapshots is not None:
            self._snapshots.close()
            self._snapshots = None
        if self._committer is not None:
            self._committer.stop()
            self._committer = None
        if self._audit is not None:
            self._audit.close()
        if self.subscription_sync is not None:
            self.subscription_sync.close()
            self.subscription_sync = None
        self.batch_rows.close()

    def follow_recreated_topic(self) -> StreamingQuery:
        """After the query stopped on a recreated publishes topic (:attr:`recreated`):
        commit the old incarnation's audit, close the state and open it again (the old
        checkpoint moved aside, a new router id: :mod:`streaming.router.topics.incarnations`),
        and start the query on the new topic from its earliest offset."""
        if self._committer is not None:
            self._committer.flush()  # under the old router id, before it is forgotten
        self._close_state()
        self.query = None
        for feature in self.features:
            feature.stop_reason = None
        with self._batch_done:
            self.reports.clear()
        self._open_state(SnapshotStore(self.layout))
        return self.start()

    def stop_after_current_batch(self) -> None:
        """Wait for the batch in progress, if any, and for Spark to commit it; then stop.

        A batch waiting to retry a failure gives up at once (it is re-run at
        the next start). In realtime mode there is no batch to wait for: the stop lets
        the audit batch in progress end (:meth:`streaming.realtime.service.RealtimeRouting.stop`).
        """
        if self.realtime is not None:
            self.stop()
            return
        self._stopping.set()
        with self._batch_done:
            self._batch_done.wait_for(lambda: not self._in_batch)
            last = self.reports[-1].batch_id if self.reports else None
        query = self.query
        if query is not None and last is not None:
            deadline = time.monotonic() + STOP_COMMIT_TIMEOUT_S
            while query.isActive and time.monotonic() < deadline:
                progress = query.lastProgress
                if progress is not None and progress.batchId >= last:
                    break
                time.sleep(0.1)
        self.stop()

    def _foreach_batch(self, batch: DataFrame, batch_id: int) -> None:
        self.process_batch(batch, batch_id)

    def process_batch(self, batch: DataFrame, batch_id: int) -> BatchReport:
        """The ``foreachBatch`` function: steps a-d of the module docstring."""
        with self._batch_done:
            self._in_batch = True
        try:
            report = self._process(batch, batch_id)
        finally:
            with self._batch_done:
                self._in_batch = False
                self._batch_done.notify_all()
        return report

    def _route_function(self, snapshot: BatchSnapshot, routed_at: datetime,
                        audit: TaskAudit | None = None) -> RoutePartitions:
        """The ``mapInArrow`` function that routes a batch against ``snapshot`` at
        ``routed_at`` (the publishes' expiry; with ``audit``: each task writes its audit
        files)."""
        kafka = self.config.kafka
        return RoutePartitions(snapshot.broadcast, snapshot.key, RouteSettings(
            default_exchange=self.config.exchanges.default,
            layout=kafka.layout,
            rejected_topic=kafka.rejected_topic,
            snapshot_version=snapshot.version,
            with_headers=snapshot.reads_headers,
            producer=ProducerSettings.of(kafka),
            audit=audit,
            incarnation=self.incarnation.number,
            retain=RetainSettings.of(self.config),
            now_ms=int(routed_at.timestamp() * 1000),
            alternates=dict(self.config.exchanges.alternates),
        ))

    def _routes_in_driver(self, publishes: int | None) -> bool:
        return within_driver_bounds(publishes, self.driver_bounds,
                                    list(self.reports)[-FANOUT_BATCHES:])

    def _process(self, batch: DataFrame, batch_id: int) -> BatchReport:
        started = time.monotonic()
        self.lease.check()  # a router whose lease was taken over routes nothing more
        sync, snapshots = self._require_open()
        committer = self._require_committer()
        attempts = [0]
        topic = self.config.kafka.publishes_topic
        start, end = batch_start(self.layout, batch_id, topic), batch_end(self.layout, batch_id, topic)
        with self._pin_lock:
            snapshot = snapshots.for_batch(batch_id, lambda: self._retrying(
                batch_id, "the changelog catch-up",
                lambda: self._catch_up_before_pin(sync, batch_id, start), attempts))
            pin = BatchPin(batch_id, snapshot.version, start)
            for feature in self.features:
                feature.pinned(pin)
        step = BatchStep(batch_id, start, end,
                         lambda stage, work: self._retrying(batch_id, stage, work, attempts))
        for feature in self.features:
            feature.step(step)
        gaps = step.gaps
        caught_up = time.monotonic()
        routed_at = datetime.now(UTC)
        source = batch.select(*SOURCE_COLUMNS)
        # Batch 0's start is the query's first offsets: its size stays unknown (distributed).
        records = records_between(start, end) if batch_id >= 1 else None
        audit: PublishBatch | FileBatch | None
        if self._routes_in_driver(records):
            # A small batch: the same routing function, run in this process on
            # the rows it reads from Kafka itself, skips the Python workers' round trip.
            routed_in = ROUTED_IN_DRIVER
            route = self._route_function(snapshot, routed_at)
            routed = self._retrying(batch_id, "routing", lambda: self._route_in_driver(
                lambda: self.batch_rows.read(start, end), source, route), attempts)
            publishes = routed.num_rows
            deliveries = pc.sum(pc.list_value_length(routed["deliveries"])).as_py() or 0
            self.latency.add(publish_latencies_ms(routed, time.time()))
            rejected = pc.sum(pc.equal(routed["outcome"], OUTCOME_REJECTED)).as_py() or 0
            expired = pc.sum(pc.equal(routed["outcome"], OUTCOME_EXPIRED)).as_py() or 0
            if gaps:
                routed = pa.concat_tables([routed, gap_rows(gaps)])
            audit = PublishBatch(batch_id, snapshot.version, routed_at, routed, start, end)
        elif not self.task_audit_files:
            # The executors route; their routed rows come back to be journaled, and the
            # committer writes the files beside the next batch (a local master).
            routed_in = ROUTED_IN_EXECUTORS
            route = self._route_function(snapshot, routed_at)
            routed = self._retrying(batch_id, "routing",
                                    source.mapInArrow(route, ROUTED_PUBLISH).toArrow, attempts)
            publishes = routed.num_rows
            deliveries = pc.sum(pc.list_value_length(routed["deliveries"])).as_py() or 0
            self.latency.add(publish_latencies_ms(routed, time.time()))
            rejected = pc.sum(pc.equal(routed["outcome"], OUTCOME_REJECTED)).as_py() or 0
            expired = pc.sum(pc.equal(routed["outcome"], OUTCOME_EXPIRED)).as_py() or 0
            if gaps:
                routed = pa.concat_tables([routed.cast(ROUTED_ARROW), gap_rows(gaps)])
            audit = PublishBatch(batch_id, snapshot.version, routed_at, routed, start, end)
        else:
            # The executors route and write the audit files; the driver gets a row per task.
            routed_in = ROUTED_IN_EXECUTORS
            task_audit = TaskAudit(self.config.delta, batch_id, routed_at, self._partitioned)
            route = self._route_function(snapshot, routed_at, task_audit)
            tasks = self._retrying(batch_id, "routing",
                                   source.mapInArrow(route, ROUTED_TASK).toArrow, attempts)
            if gaps:
                lost = write_task_audit(gap_rows(gaps), route.settings)
                tasks = pa.concat_tables([tasks, pa.Table.from_batches([lost])])
            publishes = pc.sum(tasks["publishes"]).as_py() or 0
            deliveries = pc.sum(tasks["deliveries"]).as_py() or 0
            self.latency.add(pc.list_flatten(tasks["latency_ms"]).to_pylist())
            rejected = pc.sum(tasks["rejected"]).as_py() or 0
            expired = pc.sum(tasks["expired"]).as_py() or 0
            files = pa.Table.from_struct_array(pc.list_flatten(tasks["files"]).combine_chunks())
            audit = FileBatch(batch_id, snapshot.version, routed_at, files, publishes, start, end)
        route_done = time.monotonic()
        if publishes or gaps:
            self._retrying(batch_id, "the audit journal write",
                           lambda: committer.submit(audit), attempts)
        audited = time.monotonic()
        report = BatchReport(batch_id, publishes, deliveries, rejected, snapshot.version,
                             audited - started, snapshot.rerun,
                             {"catch_up": caught_up - started, "route": route_done - caught_up,
                              "audit": audited - route_done}, attempts[0], routed_in,
                             lost=sum(g.records for g in gaps), expired=expired)
        self._last_batch_at = time.monotonic()
        self._report(report)
        return report

    def _catch_up_before_pin(self, sync: SubscriptionSync, batch_id: int,
                             start: dict[int, int] | None) -> None:
        """A new batch's changelog catch-up, then each feature's part of it before the pin
        (:meth:`BatchFeature.prepare`): retried as one."""
        pin = BatchPin(batch_id, sync.catch_up(self._catch_up_progress()), start)
        for feature in self.features:
            feature.prepare(pin)

    def _report(self, report: BatchReport) -> None:
        """Keep ``report`` (and count its lost and expired publishes) and hand it to every listener
        (a micro-batch's, or realtime mode's audit batch's)."""
        self.expired_total += report.expired
        self.reports.append(report)
        self.lost_total += report.lost
        for listener in self.report_listeners:
            listener(report)

    @staticmethod
    def _route_in_driver(read: Callable[[], pa.RecordBatch | None], source: DataFrame,
                         route: RoutePartitions) -> pa.Table:
        """Route a small batch in this process, in ONE routing call.

        Its rows are ``read()`` from Kafka by this process (the batch's offset range,
        :mod:`streaming.router.batch.batch_rows`: no Spark job, the largest fixed cost of a
        light batch after Spark's trigger), or, when that returns None, ``source``'s
        rows through a Spark job (``toArrow``).

        ``toArrow`` hands back a record batch per Kafka partition, and every
        routing call ends with a flush, which sends a Produce request to each
        delivery partition the call wrote to: one call per batch instead of one
        per publishes partition halves a batch's flushes and its requests
        (docs/benchmarks-history.md, "The batch cycle").
        """
        rows = read()
        batches = [rows] if rows is not None else source.toArrow().combine_chunks().to_batches()
        return pa.Table.from_batches(route(iter(batches)), ROUTED_ARROW)

    def _catch_up_progress(self) -> Callable[[int, int], None] | None:
        return self.catch_up_progress() if self.catch_up_progress is not None else None

    def _retrying(self, batch_id: int, stage: str, step: Callable[[], T], attempts: list[int]) -> T:
        """``step()``, retried with backoff while it fails for a reason that is not about a record.

        Record problems never get here (routing rejects them), so what does is
        the cluster, the disk or a lost worker: the batch waits for them, and
        logs so (:func:`streaming.retry.retry`: at its first failure, then at
        most every 30 s, and once it succeeds). A stop request
        ends the wait with :class:`RouterStopping` (the batch is re-run at
        the next start).
        """
        def counted() -> T:
            attempts[0] += 1
            return step()

        try:
            return retry(counted, retried=RETRIED_ERRORS, what=f"batch {batch_id}: {stage}",
                         log=_log, give_up=self._stopping.is_set, wake=self._stopping,
                         describe=self.failure_line)
        except RetryAbandoned:
            raise RouterStopping(f"batch {batch_id} left for a re-run: the router is "
                                 "stopping") from None

    def failure_line(self, failure: BaseException) -> str:
        """One line for ``failure``: Kafka's refusal of the router's principal (the Spark
        Kafka source's included) as what to grant, else the innermost message."""
        refused = java_access_failure(self.config.kafka.client_settings, failure,
                                      self.config.kafka.publishes_topic)
        return str(refused) if refused is not None else one_line(failure)

    def flush_audit(self, timeout: float | None = None) -> bool:
        """Commit the journaled audit to Delta now; True when nothing is pending within
        ``timeout`` (tests and benchmarks that read the tables right after a batch)."""
        return self._committer.flush(timeout) if self._committer is not None else True

    def _status_figures(self) -> dict[str, object]:
        """What ``status.json`` holds besides the report (:class:`StatusFile`)."""
        query, committer, subscriptions = self.query, self._committer, self.subscriptions
        return {
            "query_id": str(query.id) if query is not None else None,
            "run_id": str(query.runId) if query is not None else None,
            "subscriptions": len(subscriptions) if subscriptions is not None else 0,
            "audit_pending_batches": committer.pending_batches if committer is not None else 0,
            "audit_lag_seconds": round(committer.lag_seconds, 3) if committer is not None else 0.0,
            "lost_total": self.lost_total,
            "expired_total": self.expired_total,
            "mode": self.config.streaming.mode,
            "latency_ms": self.latency.percentiles(),
            **({"realtime": self.realtime.status()} if self.realtime is not None else {}),
        }

    def _idle_catch_up(self) -> None:
        """While no batch runs (no publishes arrive), apply the changelog and hand the
        version to each feature (:meth:`BatchFeature.idle`), so that a new MQTT
        subscription gets its retained messages and a subscription asking for a replay is
        applied and its replay bounded without waiting for the next publish. The pin lock
        is held throughout: their boundary is the next batch
        (:attr:`IdleCatchUp.next_batch`), which waits for it. Called by a feature's thread
        (the replays'); does nothing while the router is not idle."""
        if (self.query is None or self.realtime is not None or self._stopping.is_set()
                or time.monotonic() - self._last_batch_at < IDLE_CATCH_UP_S):
            return
        if not self._pin_lock.acquire(blocking=False):
            return
        try:
            if self._in_batch:
                return
            sync, _ = self._require_open()
            idle = IdleCatchUp(sync.catch_up(), self.layout, self.config.kafka.publishes_topic,
                               last_planned_batch(self.layout))
            for feature in self.features:
                feature.idle(idle)
        finally:
            self._pin_lock.release()

    def _audit_committed(self, batch_id: int) -> bool:
        """Whether every batch up to ``batch_id`` that has audit rows is in Delta."""
        committer = self._committer
        return committer is not None and all(b > batch_id for b in committer.journal.pending())

    def _require_open(self) -> tuple[SubscriptionSync, BatchSnapshots]:
        if self.subscription_sync is None or self._snapshots is None:
            raise RuntimeError("the router is not open: call open() or start() first")
        return self.subscription_sync, self._snapshots

    def _require_committer(self) -> AuditCommitter:
        if self._committer is None:
            raise RuntimeError("the router is not open: call open() or start() first")
        return self._committer

    def _require_query(self) -> StreamingQuery:
        if self.query is None:
            raise RuntimeError("the router's query is not started: call start() first")
        return self.query


def publish_latencies_ms(routed: pa.Table, acked_at: float):
    """Each routed publish's end-to-end latency (ms): its publish timestamp to ``acked_at``
    (Unix seconds: when its deliveries were acknowledged)."""
    published = pc.cast(routed["published_at"], pa.timestamp("ms", tz="UTC"),
                        safe=False).cast(pa.int64())
    return (acked_at * 1000 - pc.drop_null(published).to_numpy(zero_copy_only=False)).tolist()


def within_driver_bounds(publishes: int | None, bounds: tuple[int, int],
                         recent: list[BatchReport]) -> bool:
    """Whether a batch of ``publishes`` (None: unknown) is routed in the driver under
    ``bounds`` (publishes, deliveries; a bound of 0 publishes: never): its deliveries
    are estimated as ``publishes`` times the most deliveries per publish of the ``recent``
    batches (at least 1)."""
    max_publishes, max_deliveries = bounds
    if publishes is None or publishes > max_publishes or max_publishes == 0:
        return False
    fanout = max((r.deliveries / r.rows for r in recent if r.rows), default=1.0)
    return publishes * max(fanout, 1.0) <= max_deliveries


"""Realtime mode (``streaming.mode = "realtime"``): the parts :class:`RealtimeRouting`
runs beside the router's shared state.

The :class:`~streaming.router.service.Router` opens the state as in micro-batch mode
(the lock, the lease, the audit tables and their leftovers, the snapshot versions
and the changelog catch-up); then, instead of the ``foreachBatch`` query, it starts
this:

1. the routing view (:mod:`streaming.realtime.view`): the current subscriptions
   written whole, then every catch-up's changes, kept current by a driver thread
   woken by a changelog change, at least every 100 ms;
2. the routing query (:mod:`streaming.realtime.query`): Spark's Real-Time Mode, one
   long task per publishes partition, matching in the JVM on the Rust kernel;
3. the audit query (:mod:`streaming.realtime.audit`) over the routed records, with
   its own journal and group commit into the same Delta tables;
4. a supervisor per query (:mod:`streaming.realtime.supervisor`): a query that fails
   (Real-Time Mode does not retry a task: one failed task fails the routing query)
   is started again from its checkpoint with backoff, while the view thread retries
   on its own (both background workers: :mod:`streaming.worker`).

The state folder keeps the mode it was last routed in: a folder routed in micro-batch
mode starts its realtime routing query where the micro-batch query committed; a
folder routed in realtime mode is refused by micro-batch mode (one line says so)
rather than routing its publishes again.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from schemas.records import MESSAGES
from streaming.audit.committer import AuditCommitter
from streaming.audit.journal import AuditJournal
from streaming.config import Config, duration_seconds
from streaming.errors import RetryAbandoned, one_line
from streaming.kafka.errors import KAFKA_TIMEOUT_S
from streaming.realtime.audit import RoutedAudit
from streaming.realtime.delivery_topics import recreate_missing_delivery_topics
from streaming.realtime.errors import RealtimeSlotsError
from streaming.realtime.incarnation import PublishesTopicWatch
from streaming.realtime.query import (
    cancel_noise_quieted,
    register_route_function,
    start_routing_query,
)
from streaming.realtime.restored import realtime_tables
from streaming.realtime.retention import skip_deleted
from streaming.realtime.supervisor import QuerySupervisor, recovery_s
from streaming.realtime.view import ChangelogWatch, RoutingViewPublisher, ViewFollower
from streaming.router.batch.report import BatchReport, LatencyWindow
from streaming.router.subscriptions.snapshots import BatchSnapshots, SnapshotStore
from streaming.router.subscriptions.subscription_sync import SubscriptionSync
from streaming.state.checkpoint import CheckpointLayout
from streaming.state.offsets_log import batch_end, last_committed_batch

_log = logging.getLogger(__name__)



AUDIT_STOP_WAIT_S = 30.0
"""How long a stopping router waits for the audit batch in progress before it stops the query."""

SLOTS_POLL_S = 0.5
"""How often the slot check counts a cluster's slots again while executors register."""
REGISTRATION_WINDOW = "spark.scheduler.maxRegisteredResourcesWaitingTime"
"""Spark's setting for how long executors may take to register: the slot check waits as long."""
SUPERVISOR_STOP_WAIT_S = 30.0
"""How long a stopping router waits for a supervisor's restart in progress."""
ENDED_POLL_S = 0.1
"""How often :meth:`RealtimeRouting.ended` looks at the supervisors and the topic watch."""


def task_slots(spark: SparkSession) -> int:
    """The tasks Spark can run at once on the executors registered now (its scheduler's own
    count, ``SparkContext.maxNumConcurrentTasks``, the one barrier stages are checked
    against). Not ``defaultParallelism``: bitroute sets ``spark.default.parallelism``, which
    that returns whatever the cores."""
    context = spark.sparkContext._jsc.sc()
    return context.maxNumConcurrentTasks(context.resourceProfileManager().defaultResourceProfile())


class RealtimeRouting:
    """Realtime mode's view, routing query and audit query (module docstring).

    ``catch_up_lock`` is the router's lock around a changelog catch-up (held by each
    catch-up here); ``incarnation`` the publishes topic's incarnation number;
    ``describe`` tells a query's failure in one line (Kafka's refusal as what to grant);
    ``on_routing_query`` is told each routing query started (the first and each restart);
    ``topic_id`` is the publishes topic's Kafka id the router opened: another one found
    while running ends the routing (:mod:`streaming.realtime.incarnation`);
    ``accept_retention_gap``: the first start of the routing query moves past a retention
    gap even under ``streaming.on_retention_gap = "stop"`` (:mod:`streaming.realtime.retention`).
    """

    def __init__(self, config: Config, spark: SparkSession, layout: CheckpointLayout,
                 store: SnapshotStore, sync: SubscriptionSync, snapshots: BatchSnapshots,
                 catch_up_lock: threading.Lock, incarnation: int,
                 on_commit: Callable[[], None] | None = None,
                 on_report: Callable[[BatchReport], None] | None = None,
                 latency: LatencyWindow | None = None,
                 describe: Callable[[BaseException], str] | None = None,
                 on_routing_query: Callable[[StreamingQuery], None] | None = None,
                 topic_id: str | None = None, accept_retention_gap: bool = False) -> None:
        self._config = config
        self._spark = spark
        self._layout = layout
        self._sync = sync
        self._snapshots = snapshots
        self._catch_up_lock = catch_up_lock
        self._incarnation = incarnation
        self._on_report = on_report
        self._latency = latency
        self._stopping = threading.Event()
        self.view = RoutingViewPublisher(config)
        self._watch: ChangelogWatch | None = None
        self._follower = ViewFollower(self._follow, self._stopping, self._wait_for_change)
        self.tables = realtime_tables(config, store)
        self.committer = AuditCommitter(self.tables, AuditJournal(layout.realtime_audit_journal),
                                        config.audit.commit_interval_s,
                                        config.audit.max_pending_batches,
                                        stopping=self._stopping, on_commit=on_commit)
        self.audit: RoutedAudit | None = None
        self.routing_query: StreamingQuery | None = None
        self.audit_query: StreamingQuery | None = None
        self._describe = describe
        self._on_routing_query = on_routing_query
        self._accept_retention_gap = accept_retention_gap
        self._queries_lock = threading.Lock()
        """Held around each query's start and while :meth:`stop` stops them."""
        self.supervisors: list[QuerySupervisor] = []
        self.topic_watch = PublishesTopicWatch(config.kafka.client_settings,
                                               config.kafka.publishes_topic, topic_id, layout,
                                               self._stopping, self._stop_routing)
        """Ends the routing when the publishes topic is recreated (:meth:`ended` says so)."""

    def start(self) -> StreamingQuery:
        """Publish the view, start the audit and the routing query; return the routing
        query (the router's query: its end is the router's)."""
        self._check_slots()
        register_route_function(self._spark, self._config, self._incarnation)
        self._layout.realtime.mkdir(parents=True, exist_ok=True)
        self.tables.ensure()
        self.committer.recover()  # a crash's leftovers, before the audit query resumes
        self.committer.start()
        mark = self.tables.latest_mark(MESSAGES)
        self.audit = RoutedAudit(self._config, self.committer,
                                 dict(mark.offsets) if mark is not None else {},
                                 self._layout.realtime_routing, self._stopping, self._on_report,
                                 self._latency, incarnation=self._incarnation)
        with self._catch_up_lock:
            self._sync.catch_up()
            self.view.reset(self._current_snapshot(), self._sync.subscriptions.offsets)
            self._snapshots.commit_listeners.append(self.view.note)
            self._sync.on_committed = self._publish_committed
        self._follower.start()
        with self._queries_lock:
            self.audit_query = self._start_audit()
            self.routing_query = self._start_routing()
        _log.info(f"realtime mode: routing {self._config.kafka.publishes_topic} with the "
                  f"routing view at version {self.view.published_version}")
        recovered = recovery_s(duration_seconds(self._config.streaming.realtime_checkpoint_interval))
        options: dict[str, Any] = {"recovered_after_s": recovered}
        if self._describe is not None:
            options["describe"] = self._describe
        self.supervisors = [
            QuerySupervisor("routing", self.routing_query, self._start_routing, self._stopping,
                            self._queries_lock, on_start=self._routing_started,
                            on_failure=lambda failure: recreate_missing_delivery_topics(
                                self._config, failure), **options).start(),
            QuerySupervisor("audit", self.audit_query, self._start_audit, self._stopping,
                            self._queries_lock, on_start=self._audit_started, **options).start(),
        ]
        self.topic_watch.start()
        return self.routing_query

    def _start_routing(self) -> StreamingQuery:
        """Start the routing query: it resumes from its checkpoint, or starts where
        :meth:`_starting_offsets` says, or past a retention gap below its checkpoint
        (:mod:`streaming.realtime.retention`; under ``on_retention_gap = "stop"`` the gap
        raises :class:`~streaming.router.errors.RetentionGapError`, unless this first start
        acknowledges it). Not once the publishes topic was recreated."""
        if self.topic_watch.end is not None:
            raise RetryAbandoned(self.topic_watch.end)
        kafka = self._config.kafka
        accept, self._accept_retention_gap = self._accept_retention_gap, False
        past_gap = skip_deleted(kafka.client_settings, kafka.publishes_topic,
                                self._layout.realtime_routing,
                                stop=self._config.streaming.on_retention_gap == "stop"
                                and not accept)
        return start_routing_query(self._spark, self._config, self._layout.realtime_routing,
                                   past_gap or self._starting_offsets())

    def _start_audit(self) -> StreamingQuery:
        if self.audit is None:
            raise RuntimeError("the realtime audit is not open: start() opens it")
        return self.audit.start(self._spark, self._layout.realtime_audit)

    def _routing_started(self, query: StreamingQuery) -> None:
        self.routing_query = query
        if self._on_routing_query is not None:
            self._on_routing_query(query)

    def _stop_routing(self) -> None:
        """The publishes topic was recreated: stop routing at once, so that nothing of the
        new topic is routed under the old incarnation's ids (:meth:`ended` then says why;
        the audit goes on until the router stops)."""
        with self._queries_lock:
            if self.routing_query is not None and not self._stopping.is_set():
                try:
                    self.routing_query.stop()
                except Exception as exc:  # noqa: BLE001 - the router stops it again
                    _log.warning(f"could not stop the routing query: {one_line(exc)}")

    def _audit_started(self, query: StreamingQuery) -> None:
        self.audit_query = query

    def ended(self, timeout: float) -> str | None:
        """Wait up to ``timeout`` for a query to end for good (the JVM gone, a query stopped
        from outside: :mod:`streaming.realtime.supervisor`; the publishes topic recreated:
        :mod:`streaming.realtime.incarnation`); why, else None. A failed query is no end:
        it is started again."""
        deadline = time.monotonic() + timeout
        while True:
            # The recreated topic's line first: its stop of the routing query is no end.
            for end in (self.topic_watch.ended(), *(s.ended(0) for s in self.supervisors)):
                if end is not None:
                    return self.topic_watch.ended() or end
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(left, ENDED_POLL_S))

    def stop(self) -> None:
        """Stop both queries and the view thread, then commit what the audit journaled;
        Spark's lines of the tasks it cancels are quieted meanwhile
        (:func:`~streaming.realtime.query.cancel_noise_quieted`)."""
        with cancel_noise_quieted(self._spark):
            self._stop()

    def _stop(self) -> None:
        self._stopping.set()
        for supervisor in self.supervisors:
            supervisor.stop(SUPERVISOR_STOP_WAIT_S)
        self.topic_watch.stop(SUPERVISOR_STOP_WAIT_S)
        with self._queries_lock:  # no restart from here on
            for query in (self.routing_query, self.audit_query):
                if query is None:
                    continue
                if query is self.audit_query and self.audit is not None:
                    self.audit.wait_idle(AUDIT_STOP_WAIT_S)
                try:
                    query.stop()
                except Exception as exc:  # noqa: BLE001 - stopping anyway
                    _log.warning(f"could not stop {query.name}: {one_line(exc)}")
        self._follower.stop()
        if self._watch is not None:
            self._watch.close()
        self._sync.on_committed = None
        if self.view.note in self._snapshots.commit_listeners:
            self._snapshots.commit_listeners.remove(self.view.note)
        self.committer.stop()
        self.view.close()
        self.tables.close()

    def status(self) -> dict[str, object]:
        """What ``bitroute status`` shows of realtime mode."""
        audit = self.audit
        supervisors = {s.name: s for s in self.supervisors}
        routing, audit_query = supervisors.get("routing"), supervisors.get("audit")
        return {
            "view_version": self.view.published_version,
            "view_failure": self._follower.failure,
            "routing_failure": routing.failure if routing is not None else None,
            "routing_restarts": routing.restarts if routing is not None else 0,
            "audit_failure": audit_query.failure if audit_query is not None else None,
            "audit_restarts": audit_query.restarts if audit_query is not None else 0,
            "audited_publishes": audit.publishes if audit is not None else 0,
            "audited_deliveries": audit.deliveries if audit is not None else 0,
            "audit_repeats": audit.repeats if audit is not None else 0,
            "audit_pending_batches": self.committer.pending_batches,
        }

    def _check_slots(self) -> None:
        """Refuse to start when Spark has fewer task slots than Real-Time Mode holds (one
        per publishes partition, for as long as the query runs) plus one for the audit.

        On a cluster, executors register a while after the application starts (their JVMs
        start, then fetch the application's files): short of slots, the check waits for
        more for as long as Spark's own registration window
        (``spark.scheduler.maxRegisteredResourcesWaitingTime``, 30 s by default), so a
        cluster that has too few is refused that much later."""
        from streaming.kafka.topics import admin_client

        topic = self._config.kafka.publishes_topic
        metadata = admin_client(self._config).list_topics(topic, timeout=KAFKA_TIMEOUT_S)
        partitions = len(metadata.topics[topic].partitions)
        context = self._spark.sparkContext
        slots = task_slots(self._spark)
        if slots < partitions + 1 and not (context.master or "").startswith("local"):
            window_ms = context._jsc.sc().conf().getTimeAsMs(REGISTRATION_WINDOW, "30s")
            deadline = time.monotonic() + window_ms / 1000
            while slots < partitions + 1 and time.monotonic() < deadline:
                time.sleep(SLOTS_POLL_S)
                slots = task_slots(self._spark)
        if slots < partitions + 1:
            raise RealtimeSlotsError(
                f"realtime mode needs a task slot per partition of {topic} ({partitions}) "
                f"plus one for the audit, and Spark has {slots} ({context.master}): give "
                "Spark more cores (spark.master local[N], or executors' cores on a cluster), "
                "or run streaming.mode = \"microbatch\", which needs none")

    def _publish_committed(self, version: int, offsets: dict[int, int]) -> None:
        """A new version, persisted: to the view at once, before its Delta audit append (a
        failure is the follower's to retry: the records stay pending)."""
        try:
            self.view.publish(version, offsets)
        except Exception as exc:  # noqa: BLE001 - retried by the view thread's next round
            _log.debug(f"the routing view waits for the next round: {exc}")

    def _wait_for_change(self, timeout: float) -> None:
        """The view thread's wait: until the changelog changes, or ``timeout``."""
        if self._watch is None:
            self._watch = ChangelogWatch(self._config)  # here: a failure is the thread's to retry
        self._watch.wait(timeout)

    def _follow(self) -> None:
        """One round of the view thread: catch the changelog up and publish what changed."""
        with self._catch_up_lock:
            version = self._sync.catch_up()
            self.view.publish(version, self._sync.subscriptions.offsets)

    def _current_snapshot(self):
        from compiler import Snapshot

        return Snapshot.from_bytes(self._snapshots.committed().data)

    def _starting_offsets(self) -> str:
        """Where a new routing query starts: where the micro-batch query of this state
        folder committed, else the earliest offsets (a checkpoint that exists resumes)."""
        committed = last_committed_batch(self._layout)
        topic = self._config.kafka.publishes_topic
        end = batch_end(self._layout, committed, topic) if committed is not None else None
        if not end:
            return "earliest"
        return json.dumps({topic: {str(p): o for p, o in end.items()}})

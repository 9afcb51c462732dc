"""The router: a Structured Streaming query over the publishes topic.

Per micro-batch, in ``foreachBatch`` (:meth:`Router.process_batch`):

a. Pin. A batch id seen for the first time catches the subscription
   changelog up to its end offsets (happens-before: a subscription Kafka
   acknowledged before a publish of this batch is applied to it) and records
   ``batch id -> snapshot version`` durably before anything is written. A
   replayed batch id (after a crash) reuses its pinned version.
b. Match. The batch is cached and matched with ``mapInPandas`` against the
   pinned snapshot, broadcast once per version: one row per publish.
c. Kafka. Deliveries to the per-subscriber topics and bad publishes to the
   rejected topic, in one Kafka batch write: at least once.
d. Delta. ``deliveries`` and ``messages`` rows, each an idempotent append
   keyed by the batch id: exactly once. After Kafka, so the audit never
   lists a delivery that was not written; the two tables are appended
   concurrently (each commit is mostly fixed cost: a third of a small batch).
e. One progress line on stdout.

Message id = ``<topic>/<partition>/<offset>``; exchange = the ``exchange``
header, else ``exchanges.default``. A bad publish (unknown exchange, routing
key invalid in the exchange's dialect or null) is a row with a reason, never
an error of the batch.

State: the Spark checkpoint in ``<checkpoint_dir>/publishes``, the router's
snapshots and pins in ``<checkpoint_dir>/router`` (:mod:`streaming.snapshots`).
A router killed at any point and restarted on the same folders replays the
unfinished batch with its pinned version: no delivery lost, Kafka repeats
possible, Delta rows exactly once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.util import inheritable_thread_target

from streaming import matching, sinks
from streaming.changelog import ChangelogError, Subscriptions
from streaming.config import Config
from streaming.delta_sink import AuditTables
from streaming.snapshots import SnapshotStore, SnapshotStoreError
from streaming.topics import TopicError, ensure_router_topics

REPORTS_KEPT = 100
"""Progress reports of recent batches kept in memory (:attr:`Router.reports`)."""
STOP_COMMIT_TIMEOUT_S = 30.0
"""On a stop request, how long to wait for Spark to commit the batch that just finished."""


@dataclass(frozen=True)
class BatchReport:
    """What one micro-batch did."""

    batch_id: int
    rows: int
    deliveries: int
    rejected: int
    snapshot_version: int
    seconds: float
    replayed: bool

    def line(self) -> str:
        replay = " (replayed with its pinned version)" if self.replayed else ""
        return (f"batch {self.batch_id}: {self.rows} publishes, {self.deliveries} deliveries, "
                f"{self.rejected} rejected, snapshot v{self.snapshot_version}, "
                f"{self.seconds:.2f}s{replay}")


class Router:
    """One router: ``start()``, then ``process_all_available()`` or wait, then ``stop()``.

    ``open()`` (called by ``start()``) prepares everything but the query:
    topics, audit tables, the rebuilt subscription index; tests drive
    :meth:`process_batch` directly after it.
    """

    def __init__(self, config: Config, spark: SparkSession) -> None:
        self.config = config
        self.spark = spark
        checkpoints = Path(config.streaming.checkpoint_dir).absolute()
        self.query_checkpoint = checkpoints / "publishes"
        self.store = SnapshotStore(checkpoints / "router")
        self.reports: deque[BatchReport] = deque(maxlen=REPORTS_KEPT)
        self.query: StreamingQuery | None = None
        self.subscriptions: Subscriptions | None = None
        self._audit: AuditTables | None = None
        self._broadcasts = matching.SnapshotBroadcasts(spark.sparkContext)
        self._batch_done = threading.Condition()
        self._in_batch = False
        self._audit_threads: ThreadPoolExecutor | None = None

    def open(self) -> None:
        """Create missing topics and tables, rebuild the index and catch up the changelog."""
        if self.subscriptions is not None:
            return
        if self.store.has_pins() and not (self.query_checkpoint / "offsets").is_dir():
            # Pins of batches of a checkpoint that is gone: the new query's
            # batch ids start again at 0 and must not meet them.
            self.store.forget_batches()
        ensure_router_topics(self.config)
        self._audit_threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="bitroute-audit")
        self._audit = AuditTables(self.spark, self.config, self.store.router_id())
        self._audit.ensure()
        self.subscriptions = Subscriptions.open(self.config, self.store, self._audit)
        self.subscriptions.catch_up()

    def start(self) -> StreamingQuery:
        """Open, then start the streaming query (it resumes from its checkpoint)."""
        self.open()
        kafka = self.config.kafka
        source = (self.spark.readStream.format("kafka")
                  .option("kafka.bootstrap.servers", kafka.bootstrap)
                  .option("subscribe", kafka.publishes_topic)
                  .option("startingOffsets", "earliest")
                  .option("includeHeaders", "true")
                  .option("maxOffsetsPerTrigger", str(self.config.streaming.max_offsets_per_trigger))
                  .load())
        self.query = (source.writeStream
                      .foreachBatch(self.process_batch)
                      .trigger(processingTime=self.config.streaming.trigger_interval)
                      .option("checkpointLocation", str(self.query_checkpoint))
                      .start())
        return self.query

    def process_all_available(self) -> None:
        """Block until every publish available now has been processed (raises if the query failed)."""
        self._require_query().processAllAvailable()

    def stop(self) -> None:
        """Stop the query (an unfinished batch is replayed at the next start) and release resources."""
        try:
            if self.query is not None:
                self.query.stop()
        finally:
            self._broadcasts.close()
            if self._audit_threads is not None:
                self._audit_threads.shutdown(wait=True)
            if self.subscriptions is not None:
                self.subscriptions.close()
                self.subscriptions = None

    def stop_after_current_batch(self) -> None:
        """Wait for the batch in progress, if any, and for Spark to commit it; then stop."""
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

    def process_batch(self, batch: DataFrame, batch_id: int) -> BatchReport:
        """The ``foreachBatch`` function: steps a-e of the module docstring."""
        with self._batch_done:
            self._in_batch = True
        try:
            report = self._process(batch, batch_id)
        finally:
            with self._batch_done:
                self._in_batch = False
                self._batch_done.notify_all()
        return report

    def _process(self, batch: DataFrame, batch_id: int) -> BatchReport:
        started = time.monotonic()
        subscriptions = self._require_open()
        version = self.store.pinned(batch_id)
        replayed = version is not None
        if version is None:
            version = subscriptions.catch_up()
            self.store.pin(batch_id, version)
            self.store.prune()
        function = self._broadcasts.function(version, lambda: subscriptions.data(version))

        publishes = matching.publishes(batch, self.config).persist()
        routed = matching.route(publishes, function, subscriptions.reads_headers(version)).persist()
        try:
            counts = routed.agg(
                F.count(F.lit(1)).alias("rows"),
                F.coalesce(F.sum(F.size("deliveries")), F.lit(0)).alias("deliveries"),
                F.count("error").alias("rejected"),
            ).first()
            if counts["rows"]:
                sinks.write_kafka(sinks.kafka_records(routed, self.config, version), self.config)
                audits = [self._audit_threads.submit(inheritable_thread_target(self.spark)(append),
                                                     routed, version, batch_id)
                          for append in (self._audit.append_deliveries, self._audit.append_messages)]
                wait(audits)  # both done before ``routed`` is released, even if one failed
                for audit in audits:
                    audit.result()
        finally:
            routed.unpersist()
            publishes.unpersist()
        report = BatchReport(batch_id, counts["rows"], counts["deliveries"], counts["rejected"],
                             version, time.monotonic() - started, replayed)
        self.reports.append(report)
        print(report.line(), flush=True)
        return report

    def _require_open(self) -> Subscriptions:
        if self.subscriptions is None:
            raise RuntimeError("the router is not open: call open() or start() first")
        return self.subscriptions

    def _require_query(self) -> StreamingQuery:
        if self.query is None:
            raise RuntimeError("the router's query is not started: call start() first")
        return self.query


def serve(config: Config) -> int:
    """``bitroute run``: start the router and route until SIGINT or SIGTERM.

    With ``broker.embedded`` the embedded broker is started first (or reused).
    A signal stops the query after the batch in progress has finished; the
    exit status is 0 then, 1 when the query failed. A second signal ends the
    process at once (status 1), as a kill would: the interrupted batch is
    replayed at the next start with its pinned version.
    """
    from streaming.broker import BrokerError, EmbeddedBroker
    from streaming.session import spark_session

    if config.broker.embedded:
        broker = EmbeddedBroker.from_config(config.broker)
        try:
            broker.start()
        except BrokerError as exc:
            print(f"bitroute: error: {exc}", file=sys.stderr)
            return 1
        if broker.bootstrap != config.kafka.bootstrap:
            print(f"bitroute: warning: the embedded broker listens on {broker.bootstrap} but "
                  f"kafka.bootstrap is {config.kafka.bootstrap}", file=sys.stderr)

    stop_requested = threading.Event()

    def request_stop(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if stop_requested.is_set():
            # Raising here could cut a py4j call in half; end the process the
            # way a kill does, which the checkpoints and pins are made for.
            print(f"bitroute: {name} again: exiting without waiting for the current batch",
                  file=sys.stderr, flush=True)
            os._exit(1)
        print(f"bitroute: {name}: stopping after the current batch (again to stop now)", flush=True)
        stop_requested.set()

    spark = spark_session(config)
    # After the session: creating a SparkContext installs pyspark's own SIGINT
    # handler, which cancels jobs through py4j from inside the signal and breaks
    # the call the main thread is making.
    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _route_until_stopped(Router(config, spark), stop_requested)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        spark.stop()


def _route_until_stopped(router: Router, stop_requested: threading.Event) -> int:
    try:
        query = router.start()
    except (TopicError, ChangelogError, SnapshotStoreError, KafkaException) as exc:
        router.stop()
        print(f"bitroute: error: cannot start the router: {_first_line(exc)}", file=sys.stderr)
        return 1
    _announce(router)
    try:
        while not stop_requested.is_set() and not query.awaitTermination(1):
            pass
    except StreamingQueryException as exc:
        router.stop()
        print(f"bitroute: error: the router's query failed: {_first_line(exc)}", file=sys.stderr)
        return 1
    if not stop_requested.is_set():
        router.stop()
        print("bitroute: error: the router's query was stopped from outside", file=sys.stderr)
        return 1
    router.stop_after_current_batch()
    print("bitroute: stopped", flush=True)
    return 0


def _announce(router: Router) -> None:
    config = router.config
    kafka = config.kafka
    subscriptions = router.subscriptions
    for line in (
        f"reading publishes from {kafka.publishes_topic} and subscriptions from "
        f"{kafka.subscriptions_topic} at {kafka.bootstrap}",
        f"writing deliveries to {kafka.deliveries_topic_prefix}<subscriber>, rejected to "
        f"{kafka.rejected_topic}",
        f"audit tables in {config.delta.warehouse}, checkpoints in {config.streaming.checkpoint_dir}",
        f"snapshot v{subscriptions.version} with {len(subscriptions)} subscriptions; "
        "Ctrl-C stops after the current batch",
    ):
        print(f"bitroute: {line}", flush=True)


def _first_line(failure: object) -> str:
    text = str(failure) if failure is not None else "no reason given"
    return text.strip().splitlines()[0] if text.strip() else "no reason given"

"""Realtime mode's audit: the routed records, read back and appended to Delta exactly once.

Real-Time Mode refuses Delta and ``foreachBatch``, so the routing query writes one
*routed record* per publish to ``kafka.routed_topic`` beside its deliveries
(``RouteUdf``: message id, publishes partition and offset, exchange, routing key,
outcome, reason, the deliveries by subscriber, headers, payload size, publish time,
snapshot version). This module's query, an ordinary micro-batch query over that
topic, turns them into the same ``messages`` and ``deliveries`` rows as micro-batch
mode, through the same journal and background group commit
(:mod:`streaming.audit.committer`), under its own Delta app id
(``<router id>-realtime-publishes``).

Two rules keep the audit exact:

- **Only what Spark committed.** The Kafka sink is at least once, and a routing task
  that fails is not retried: the query restarts from its last checkpoint and routes
  those publishes again. So a batch of routed records waits until the routing
  query's latest committed epoch ends past every publish in it: by then Kafka
  acknowledged their deliveries. The audit therefore trails the deliveries by up to
  ``streaming.realtime_checkpoint_interval`` plus ``audit.commit_interval``.
- **Once per publish.** Routing a publish again writes its routed record again. The
  routing tasks read each publishes partition in offset order and the routed topic
  has one partition, so per publishes partition the records arrive in offset order:
  a record at or below the highest offset audited (the tables' audited mark, then
  this query's own progress) is a repeat and is left out.

Where the per-record work runs (:mod:`streaming.realtime.audit_batch`): under
``streaming.executor_audit_files`` (the same policy as micro-batch mode's routing
tasks, :meth:`streaming.config.StreamingConfig.task_audit_files`), one Spark task
per batch filters the routed records, makes the ``messages`` and ``deliveries``
rows and writes them as audit files, and the driver receives one row (counts, the
files' records, per publishes partition the offsets seen) and journals a
:class:`~streaming.audit.writer.FileBatch`; otherwise (a ``local[...]`` master by
default, where both run on the same cores and the driver's path is the faster,
docs/benchmarks.md) the driver collects the records (``toArrow``) and journals a
:class:`~streaming.audit.writer.PublishBatch`. Files a task wrote for a batch that
is never journaled (a crash, a failed wait) are never added to a table: the
maintenance's vacuum deletes them.

Retention gaps: publishes Kafka deleted before the routing query read them (it
starts again past them, :mod:`streaming.realtime.retention`) are found here, per
publishes partition, where the offsets audited jump past the next offset the audit
lacks and Kafka's earliest offset lies past the jump, and recorded as ``lost`` rows
of ``messages`` as micro-batch mode records them (:mod:`streaming.router.topics.retention`),
logged in one line and counted in the batch's report (``lost``, ``lost_total``).
Under ``streaming.on_retention_gap = "stop"`` the routing query does not move past a
gap (the router stops: :mod:`streaming.realtime.retention`) unless the run acknowledged
it, so a gap found here is one the router was told to pass.
"""



from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from streaming.audit.committer import AuditCommitter
from streaming.audit.writer import PUBLISH_TABLES, AuditBatch, FileBatch, PublishBatch
from streaming.config import Config
from streaming.kafka import clients
from streaming.realtime.audit_batch import (
    AUDIT_TASK,
    AuditTask,
    AuditTaskSettings,
    BatchAudit,
    audit_batch,
    task_result,
)
from streaming.realtime.errors import AuditWaitInterrupted
from streaming.realtime.retention import committed_offsets, earliest_offsets
from streaming.router.batch.report import BatchReport, LatencyWindow
from streaming.router.topics.retention import gaps_line

_log = logging.getLogger(__name__)

ROUTED_RECORD_DDL = (
    "message_id STRING, partition INT, offset BIGINT, exchange STRING, routing_key STRING, "
    "outcome STRING, reason STRING, "
    "deliveries ARRAY<STRUCT<subscriber: STRING, subscription_ids: ARRAY<STRING>>>, "
    "headers MAP<STRING, STRING>, payload_bytes INT, published_at BIGINT, "
    "snapshot_version BIGINT, alternate_exchange STRING")
"""The routed record's JSON value, as Spark parses it (``from_json``)."""

COMMIT_WAIT_POLL_S = 0.1


class RoutedAudit:
    """The audit query of realtime mode (module docstring).

    ``audited``: per publishes partition, the next offset the tables' audit lacks (their
    mark, read after the journal's leftovers were committed). ``routing_checkpoint``: the
    routing query's checkpoint folder, whose offset log says what Spark committed.
    ``incarnation``: the publishes topic's, in the message ids of ``lost`` rows.
    """

    def __init__(self, config: Config, committer: AuditCommitter, audited: dict[int, int],
                 routing_checkpoint: Path, stopping: threading.Event,
                 on_report: Callable[[BatchReport], None] | None = None,
                 latency: LatencyWindow | None = None, incarnation: int = 0) -> None:
        self._config = config
        self._committer = committer
        self._next = dict(audited)
        self._routing_checkpoint = routing_checkpoint
        self._stopping = stopping
        self._on_report = on_report
        self._incarnation = incarnation
        self._admin: clients.BitrouteAdmin | None = None
        self._idle = threading.Condition()
        self._busy = False
        self._in_tasks: bool | None = None  # streaming.executor_audit_files, for this master
        self._partitioned: frozenset[str] | None = None
        self.latency = latency if latency is not None else LatencyWindow()
        """End-to-end latency: publish timestamp to its routed record's."""
        self._lock = threading.Lock()
        self.publishes = 0
        self.deliveries = 0
        self.rejected = 0
        self.lost = 0
        """Publishes recorded ``lost`` (deleted by Kafka before they were routed)."""
        self.expired = 0
        self.repeats = 0
        """Routed records left out as repeats of an audited publish."""
        self.snapshot_version: int | None = None
        self.waiting_s = 0.0
        """How long the latest batch waited for the routing query's checkpoint."""

    def start(self, spark, checkpoint: Path):
        """Start the audit query (it resumes from ``checkpoint``)."""
        kafka = self._config.kafka
        if self._in_tasks is None:
            self._in_tasks = self._config.streaming.task_audit_files(spark.sparkContext.master)
        return (spark.readStream.format("kafka")
                .options(**kafka.client_settings.spark_options())
                .option("subscribe", kafka.routed_topic)
                .option("startingOffsets", "earliest")
                .option("failOnDataLoss", "false")
                .option("maxOffsetsPerTrigger", str(self._config.streaming.max_offsets_per_trigger))
                .load()
                .selectExpr(f"from_json(CAST(value AS STRING), '{ROUTED_RECORD_DDL}') AS r",
                            "timestamp AS routed_at")
                .selectExpr("r.*", "routed_at")
                .writeStream
                .queryName("bitroute-realtime-audit")
                .foreachBatch(self.process)
                .trigger(processingTime=self._config.audit.commit_interval)
                .option("checkpointLocation", str(checkpoint))
                .start())

    @property
    def in_tasks(self) -> bool:
        """Whether a Spark task writes each batch's audit files (module docstring)."""
        return bool(self._in_tasks)

    def process(self, batch, batch_id: int) -> None:
        """The ``foreachBatch`` function: journal one batch of routed records, then report
        it (:class:`~streaming.router.batch.report.BatchReport`: ``bitroute run``'s line,
        ``status.json``, the metrics)."""
        if self._stopping.is_set():
            raise AuditWaitInterrupted("the router is stopping: this batch is audited at the "
                                       "next start")
        with self._idle:
            self._busy = True
        try:
            self._process(batch, batch_id)
        finally:
            with self._idle:
                self._busy = False
                self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no batch is being audited (a stopping router lets the batch in progress
        end, or raise, before it stops the query: a Spark job cancelled under a batch fails
        it with a stack of errors instead); False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._busy, timeout)

    def _process(self, batch, batch_id: int) -> None:
        started = time.monotonic()
        routed_at = datetime.now(UTC)
        topic = self._config.kafka.publishes_topic
        if self.in_tasks:
            audit = self._audit_in_task(batch, batch_id, routed_at)
        else:
            rows = batch.toArrow()
            audit, audited = audit_batch(rows, dict(self._next), self._earliest, topic,
                                         self._incarnation)
            audit.routed = audited
        if not audit.seen_end:
            return
        self._await_committed(audit.seen_end)
        if audit.lost:
            _log.warning(f"realtime audit batch {batch_id}: {gaps_line(audit.lost)}; recorded "
                         "in the audit (messages, outcome 'lost')")
        version = int(audit.snapshot_version or 0)
        if audit.publishes or audit.lost:
            journaled: AuditBatch
            if audit.routed is not None:
                journaled = PublishBatch(batch_id, version, routed_at, audit.routed,
                                         audit.start, audit.end)
            else:
                journaled = FileBatch(batch_id, version, routed_at, audit.files,
                                      audit.publishes + len(audit.lost), audit.start, audit.end)
            self._committer.submit(journaled)
            self._next.update(audit.end)
        lost = sum(g.records for g in audit.lost)
        with self._lock:
            self.latency.add(audit.latency_ms)
            self.publishes += audit.publishes
            self.deliveries += audit.deliveries
            self.rejected += audit.rejected
            self.expired += audit.expired
            self.repeats += audit.repeats
            self.lost += lost
            if audit.snapshot_version is not None:
                self.snapshot_version = version
        if self._on_report is not None:
            self._on_report(BatchReport(
                batch_id, audit.publishes, audit.deliveries, audit.rejected, version,
                time.monotonic() - started, False,
                {"await_checkpoint": self.waiting_s,
                 "audit": time.monotonic() - started - self.waiting_s}, lost=lost,
                 expired=audit.expired))

    def _audit_in_task(self, batch, batch_id: int, routed_at: datetime) -> BatchAudit:
        """One Spark task audits the batch and writes its files (module docstring); the
        driver asks Kafka's earliest offsets first, for the task's retention check."""
        topic = self._config.kafka.publishes_topic
        committed = committed_offsets(self._routing_checkpoint, topic) or {}
        settings = AuditTaskSettings(
            delta=self._config.delta, layout=self._config.kafka.layout, batch_id=batch_id,
            routed_at=routed_at, partitioned=self._publish_tables_partitioned(),
            floor=dict(self._next), earliest=dict(self._earliest(sorted(
                set(committed) | set(self._next)))),
            topic=topic, incarnation=self._incarnation)
        rows = batch.coalesce(1).mapInArrow(AuditTask(settings), AUDIT_TASK).toArrow()
        return task_result(rows, topic, self._incarnation)

    def _publish_tables_partitioned(self) -> frozenset[str]:
        if self._partitioned is None:
            unpartitioned = set(self._committer.tables.unpartitioned())
            self._partitioned = frozenset(n for n in PUBLISH_TABLES if n not in unpartitioned)
        return self._partitioned

    def _earliest(self, partitions: list[int]) -> Mapping[int, int]:
        """Kafka's earliest offsets of the publishes ``partitions`` (one ListOffsets request)."""
        if self._admin is None:
            self._admin = clients.admin(self._config.kafka.client_settings)
        try:
            return earliest_offsets(self._admin, self._config.kafka.publishes_topic, partitions)
        except Exception:
            self._admin = None  # a broker restarted under it: the batch's retry makes another
            raise

    def _await_committed(self, needed: Mapping[int, int]) -> None:
        """Wait until the routing query committed every publish up to ``needed`` (per
        partition, exclusive; module docstring)."""
        topic = self._config.kafka.publishes_topic
        started = time.monotonic()
        while True:
            committed = committed_offsets(self._routing_checkpoint, topic) or {}
            if all(committed.get(p, 0) >= end for p, end in needed.items()):
                self.waiting_s = time.monotonic() - started
                return
            if self._stopping.is_set():
                raise AuditWaitInterrupted("the router is stopping: the batch is audited at "
                                           "the next start")
            time.sleep(COMMIT_WAIT_POLL_S)

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
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.records import OUTCOME_EXPIRED, OUTCOME_REJECTED
from schemas.tables import ROUTED_PUBLISH, arrow_schema
from streaming.audit.committer import AuditCommitter
from streaming.audit.writer import ROUTED_VERSION_COLUMN, PublishBatch
from streaming.config import Config
from streaming.realtime.errors import AuditWaitInterrupted
from streaming.router.offsets_log import read_offsets
from streaming.router.report import BatchReport, LatencyWindow

_log = logging.getLogger(__name__)

ROUTED_RECORD_DDL = (
    "message_id STRING, partition INT, offset BIGINT, exchange STRING, routing_key STRING, "
    "outcome STRING, reason STRING, "
    "deliveries ARRAY<STRUCT<subscriber: STRING, subscription_ids: ARRAY<STRING>>>, "
    "headers MAP<STRING, STRING>, payload_bytes INT, published_at BIGINT, "
    "snapshot_version BIGINT")
"""The routed record's JSON value, as Spark parses it (``from_json``)."""

COMMIT_WAIT_POLL_S = 0.1

_ROUTED_ARROW = arrow_schema(ROUTED_PUBLISH)


def committed_offsets(query_checkpoint: Path, topic: str) -> dict[int, int] | None:
    """The routing query's committed boundary: the end offsets of its latest committed
    epoch (Real-Time Mode writes an epoch's end offsets to the offset log when the epoch
    ends, after its tasks flushed their deliveries, then commits it), below which
    Kafka acknowledged every publish's deliveries; None before the first commit."""
    commits = query_checkpoint / "commits"
    if not commits.is_dir():
        return None
    ids = [int(name) for name in (p.name for p in commits.iterdir()) if name.isdigit()]
    if not ids:
        return None
    return read_offsets(query_checkpoint / "offsets" / str(max(ids))).get(topic)


class RoutedAudit:
    """The audit query of realtime mode (module docstring).

    ``audited``: per publishes partition, the next offset the tables' audit lacks (their
    mark, read after the journal's leftovers were committed). ``routing_checkpoint``: the
    routing query's checkpoint folder, whose offset log says what Spark committed.
    """

    def __init__(self, config: Config, committer: AuditCommitter, audited: dict[int, int],
                 routing_checkpoint: Path, stopping: threading.Event,
                 on_report: Callable[[BatchReport], None] | None = None,
                 latency: LatencyWindow | None = None) -> None:
        self._config = config
        self._committer = committer
        self._next = dict(audited)
        self._routing_checkpoint = routing_checkpoint
        self._stopping = stopping
        self._on_report = on_report
        self._idle = threading.Condition()
        self._busy = False
        self.latency = latency if latency is not None else LatencyWindow()
        """End-to-end latency: publish timestamp to its routed record's."""
        self._lock = threading.Lock()
        self.publishes = 0
        self.deliveries = 0
        self.rejected = 0
        self.expired = 0
        self.repeats = 0
        """Routed records left out as repeats of an audited publish."""
        self.snapshot_version: int | None = None
        self.waiting_s = 0.0
        """How long the latest batch waited for the routing query's checkpoint."""

    def start(self, spark, checkpoint: Path):
        """Start the audit query (it resumes from ``checkpoint``)."""
        kafka = self._config.kafka
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

    def process(self, batch, batch_id: int) -> None:
        """The ``foreachBatch`` function: journal one batch of routed records, then report
        it (:class:`~streaming.router.report.BatchReport`: ``bitroute run``'s line,
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
        rows = batch.toArrow()
        if not rows.num_rows:
            return
        self._await_committed(rows)
        rows = self._first_routings(rows)
        if not rows.num_rows:
            return
        published_ms = rows["published_at"]
        routed = pa.table({
            **{f.name: rows[f.name] for f in _ROUTED_ARROW if f.name != "published_at"},
            "published_at": pc.cast(published_ms, pa.timestamp("ms", tz="UTC")),
            ROUTED_VERSION_COLUMN: rows["snapshot_version"],
        })
        routed = routed.select([*[f.name for f in _ROUTED_ARROW], ROUTED_VERSION_COLUMN])
        routed = routed.cast(pa.schema([*_ROUTED_ARROW, pa.field(ROUTED_VERSION_COLUMN, pa.int64())]))
        partitions = rows["partition"].to_numpy(zero_copy_only=False)
        offsets = rows["offset"].to_numpy(zero_copy_only=False)
        start = {int(p): int(offsets[partitions == p].min()) for p in np.unique(partitions)}
        end = {int(p): int(offsets[partitions == p].max()) + 1 for p in np.unique(partitions)}
        version = int(pc.max(rows["snapshot_version"]).as_py() or 0)
        self._committer.submit(PublishBatch(batch_id, version, datetime.now(timezone.utc),
                                            routed, start, end))
        self._next.update(end)
        routed_ms = pc.cast(rows["routed_at"], pa.timestamp("ms", tz="UTC"),
                            safe=False).cast(pa.int64())
        latency = pc.drop_null(pc.subtract(routed_ms, published_ms)).to_numpy(zero_copy_only=False)
        deliveries = pc.sum(pc.list_value_length(rows["deliveries"])).as_py() or 0
        rejected = pc.sum(pc.equal(rows["outcome"], OUTCOME_REJECTED)).as_py() or 0
        expired = pc.sum(pc.equal(rows["outcome"], OUTCOME_EXPIRED)).as_py() or 0
        with self._lock:
            self.latency.add(latency.tolist())
            self.publishes += rows.num_rows
            self.deliveries += deliveries
            self.rejected += rejected
            self.expired += expired
            self.snapshot_version = version
        if self._on_report is not None:
            self._on_report(BatchReport(
                batch_id, rows.num_rows, deliveries, rejected, version,
                time.monotonic() - started, False,
                {"await_checkpoint": self.waiting_s,
                 "audit": time.monotonic() - started - self.waiting_s}, expired=expired))

    def _await_committed(self, rows: pa.Table) -> None:
        """Wait until the routing query committed every publish of ``rows`` (module docstring)."""
        needed = self._ends(rows)
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

    @staticmethod
    def _ends(rows: pa.Table) -> dict[int, int]:
        partitions = rows["partition"].to_numpy(zero_copy_only=False)
        offsets = rows["offset"].to_numpy(zero_copy_only=False)
        return {int(p): int(offsets[partitions == p].max()) + 1 for p in np.unique(partitions)}

    def _first_routings(self, rows: pa.Table) -> pa.Table:
        """``rows`` without repeats: each publish's first routed record, above the audit's
        reach, in (partition, offset) order."""
        partitions = rows["partition"].to_numpy(zero_copy_only=False).astype(np.int64)
        offsets = rows["offset"].to_numpy(zero_copy_only=False).astype(np.int64)
        floor = np.array([self._next.get(int(p), 0) for p in partitions], dtype=np.int64)
        order = np.lexsort((np.arange(len(rows)), offsets, partitions))
        ordered_p, ordered_o = partitions[order], offsets[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = (ordered_p[1:] != ordered_p[:-1]) | (ordered_o[1:] != ordered_o[:-1])
        kept = order[first & (ordered_o >= floor[order])]
        self.repeats += len(rows) - len(kept)
        return rows.take(pa.array(kept, pa.int64()))


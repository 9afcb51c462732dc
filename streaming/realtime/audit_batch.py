"""One batch of realtime mode's routed records, made into audit rows: the per-record work.

:mod:`streaming.realtime.audit` runs this either in the driver (the batch's routed
records collected, ``toArrow``) or in one Spark task (:class:`AuditTask`, the
``mapInArrow`` function over the batch), as ``streaming.executor_audit_files``
says (:meth:`streaming.config.StreamingConfig.task_audit_files`: the task on a
cluster, the driver on a ``local[...]`` master). Either way the same functions
do the same work on the same Arrow columns:

1. **Repeats left out** (:func:`select`): per publishes partition, a routed record
   below the audited mark (``floor``: the next offset the audit lacks) or after an
   earlier record of the same offset is a repeat (a routing epoch re-run).
2. **Retention gaps found** (:func:`lost_ranges`): per publishes partition, the
   offsets between the audited mark and the first routed record kept, and between
   two records kept, that Kafka no longer holds (below its earliest offset) were
   deleted before the routing query read them (it starts again past them,
   :mod:`streaming.realtime.retention`): each range becomes one ``lost`` row of ``messages``, as micro-batch
   mode records them (:func:`streaming.router.topics.retention.gap_rows`). Offsets still in
   the log are gaps for another reason (a transaction marker, compaction) and are
   not lost. Kafka is asked (``earliest``) only when a batch has a gap; gaps
   after the last record kept are found by the batch that brings the next record.
3. **Rows made** (:func:`routed_rows`): the records kept, in ``ROUTED_PUBLISH`` columns
   with each one's ``snapshot_version``, for :func:`streaming.audit.writer.messages_rows`
   and :func:`~streaming.audit.writer.deliveries_rows`.

In the task the rows are written as audit files (:mod:`streaming.audit.files`) and
the task returns one row (:data:`AUDIT_TASK`): counts, the files' records, a latency
sample, and per publishes partition the offsets it saw, so the driver receives no
per-record row. The routed topic has one partition and the batch is coalesced into
one task, so a task sees every record of its batch (repeats included, in the order
they were written).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    LongType,
    StructField,
    StructType,
    TimestampType,
)

from schemas.records import OUTCOME_EXPIRED, OUTCOME_REJECTED, PARTITION_COLUMNS
from schemas.tables import AUDIT_FILE, ROUTED_PUBLISH, arrow_schema
from streaming.audit.files import AuditFile, write_table_files
from streaming.audit.storage import warehouse_filesystem
from streaming.audit.writer import (
    PUBLISH_TABLES,
    ROUTED_VERSION_COLUMN,
    deliveries_rows,
    messages_rows,
)
from streaming.config import DeltaConfig
from streaming.kafka.layout import DeliveryLayout
from streaming.router.batch.routing import LATENCY_SAMPLE
from streaming.router.topics.retention import RetentionGap, gap_rows

ROUTED_ARROW = arrow_schema(ROUTED_PUBLISH)
AUDITED_ARROW = pa.schema([*ROUTED_ARROW, pa.field(ROUTED_VERSION_COLUMN, pa.int64())])
"""The rows of the records kept: ``ROUTED_PUBLISH`` and each one's snapshot version."""

_OFFSETS = StructType([
    StructField("partition", IntegerType(), False),
    StructField("seen_end", LongType(), False),  # past the highest offset of any record
    StructField("first", LongType(), True),  # the lowest offset audited (kept or lost)
    StructField("end", LongType(), True),  # past the highest offset audited
])
_LOST = StructType([
    StructField("partition", IntegerType(), False),
    StructField("first", LongType(), False),
    StructField("end", LongType(), False),
    StructField("lost_before", TimestampType(), True),
])

#: What an :class:`AuditTask` returns: one row for its batch.
AUDIT_TASK = StructType([
    StructField("publishes", LongType(), False),
    StructField("deliveries", LongType(), False),
    StructField("rejected", LongType(), False),
    StructField("repeats", LongType(), False),
    StructField("snapshot_version", LongType(), True),
    StructField("files", ArrayType(AUDIT_FILE, False), False),
    StructField("latency_ms", ArrayType(LongType(), False), False),
    StructField("offsets", ArrayType(_OFFSETS, False), False),
    StructField("lost", ArrayType(_LOST, False), False),
    # Its publishes whose lifetime (the expiry header) ended before they were routed.
    StructField("expired", LongType(), True),
])
AUDIT_TASK_ARROW = arrow_schema(AUDIT_TASK)


@dataclass
class BatchAudit:
    """What one batch of routed records gives the audit (both paths).

    ``seen_end``: per publishes partition, past the highest offset of any record of the
    batch (repeats included): the routing query's commit must pass it before the batch
    is journaled. ``start``/``end``: per partition, the offsets audited (records kept
    and lost ranges), the batch's span for :class:`~streaming.audit.writer.PublishBatch`.
    """

    publishes: int = 0
    deliveries: int = 0
    rejected: int = 0
    repeats: int = 0
    expired: int = 0
    snapshot_version: int | None = None
    seen_end: dict[int, int] = field(default_factory=dict)
    start: dict[int, int] = field(default_factory=dict)
    end: dict[int, int] = field(default_factory=dict)
    lost: list[RetentionGap] = field(default_factory=list)
    latency_ms: list[int] = field(default_factory=list)
    routed: pa.Table | None = None
    """The audit rows to journal (``AUDITED_ARROW``, lost rows included): the driver's path."""
    files: pa.Table | None = None
    """The audit files' records (``AUDIT_FILE`` columns): the task's path."""


Earliest = Callable[[list[int]], Mapping[int, int]]
"""Kafka's earliest offsets of the given publishes partitions (asked only for a gap)."""


def select(partitions: np.ndarray, offsets: np.ndarray,
           floor: Mapping[int, int]) -> np.ndarray:
    """The indices of the records to audit, in (partition, offset) order: each publish's
    first routed record at or above ``floor`` (per partition, the next offset the audit
    lacks; a partition without one has none)."""
    below = np.array([floor.get(int(p), 0) for p in partitions], dtype=np.int64) \
        if len(floor) else np.zeros(len(partitions), dtype=np.int64)
    order = np.lexsort((np.arange(len(partitions)), offsets, partitions))
    ordered_p, ordered_o = partitions[order], offsets[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = (ordered_p[1:] != ordered_p[:-1]) | (ordered_o[1:] != ordered_o[:-1])
    return order[first & (ordered_o >= below[order])]


def lost_ranges(partitions: np.ndarray, offsets: np.ndarray, published_ms: np.ndarray,
                floor: Mapping[int, int], earliest: Earliest) -> list[tuple[int, int, int, int | None]]:
    """The retention gaps of the records kept (``partitions``/``offsets`` sorted by
    partition then offset, without repeats; ``published_ms`` their publish times):
    ``(partition, first, end, lost_before_ms)`` for each run of offsets missing between
    ``floor`` (or the previous record kept) and a record kept that lies below Kafka's
    earliest offset (module docstring). ``lost_before_ms``: the publish time of the record
    after the gap (None: unknown)."""
    if not len(offsets):
        return []
    previous = np.empty(len(offsets), dtype=np.int64)
    previous[1:] = offsets[:-1] + 1
    starts = np.ones(len(offsets), dtype=bool)
    starts[1:] = partitions[1:] != partitions[:-1]
    # A partition's first record follows its floor; without one, itself (no gap known).
    previous[starts] = [floor.get(int(p), int(o)) for p, o in zip(partitions[starts],
                                                                  offsets[starts], strict=True)]
    gaps = np.nonzero(offsets > previous)[0]
    if not len(gaps):
        return []
    kafka = earliest(sorted({int(p) for p in partitions[gaps]}))
    lost = []
    for i in gaps:
        p, first = int(partitions[i]), int(previous[i])
        end = min(int(offsets[i]), int(kafka.get(p, 0)))
        if end > first:
            when = published_ms[i]
            lost.append((p, first, end, None if when is None or when != when else int(when)))
    return lost


def routed_rows(rows: pa.Table) -> pa.Table:
    """The audit query's parsed routed records (``ROUTED_RECORD_DDL`` columns, publish
    time in epoch ms) as ``AUDITED_ARROW`` rows."""
    columns = {f.name: rows[f.name] for f in ROUTED_ARROW if f.name != "published_at"}
    columns["published_at"] = pc.cast(rows["published_at"], pa.timestamp("ms", tz="UTC"))
    columns[ROUTED_VERSION_COLUMN] = rows["snapshot_version"]
    return pa.table([columns[f.name] for f in AUDITED_ARROW],
                    names=AUDITED_ARROW.names).cast(AUDITED_ARROW)


def audit_batch(rows: pa.Table, floor: Mapping[int, int], earliest: Earliest, topic: str,
                incarnation: int) -> tuple[BatchAudit, pa.Table]:
    """The audit of one batch of parsed routed records (plus their Kafka ``routed_at``
    timestamp): its figures and its ``AUDITED_ARROW`` rows (records kept, then the lost
    rows of its retention gaps)."""
    audit = BatchAudit()
    if not rows.num_rows:
        return audit, AUDITED_ARROW.empty_table()
    partitions = rows["partition"].to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = rows["offset"].to_numpy(zero_copy_only=False).astype(np.int64)
    audit.seen_end = _ends(partitions, offsets)
    kept_at = select(partitions, offsets, floor)
    audit.repeats = len(rows) - len(kept_at)
    kept = rows.take(pa.array(kept_at, pa.int64()))
    published_ms = kept["published_at"].to_numpy(zero_copy_only=False)
    ranges = lost_ranges(partitions[kept_at], offsets[kept_at], published_ms, floor, earliest)
    audited = routed_rows(kept)
    audit.publishes = kept.num_rows
    audit.deliveries = pc.sum(pc.list_value_length(kept["deliveries"])).as_py() or 0
    audit.rejected = pc.sum(pc.equal(kept["outcome"], OUTCOME_REJECTED)).as_py() or 0
    audit.expired = pc.sum(pc.equal(kept["outcome"], OUTCOME_EXPIRED)).as_py() or 0
    audit.snapshot_version = pc.max(kept["snapshot_version"]).as_py()
    audit.start = _starts(partitions[kept_at], offsets[kept_at])
    audit.end = _ends(partitions[kept_at], offsets[kept_at])
    audit.latency_ms = _latencies(kept, published_ms)
    if ranges:
        audit.lost = [RetentionGap(topic, p, first, end, _moment(when), incarnation)
                      for p, first, end, when in ranges]
        for gap in audit.lost:
            p = gap.partition
            audit.start[p] = min(audit.start.get(p, gap.first_offset), gap.first_offset)
            audit.end[p] = max(audit.end.get(p, gap.end_offset), gap.end_offset)
        lost = gap_rows(audit.lost).cast(ROUTED_ARROW)
        lost = lost.append_column(ROUTED_VERSION_COLUMN, pa.array(
            [audit.snapshot_version or 0] * lost.num_rows, pa.int64())).cast(AUDITED_ARROW)
        audited = pa.concat_tables([audited, lost])
    return audit, audited


@dataclass(frozen=True)
class AuditTaskSettings:
    """What an :class:`AuditTask` needs (picklable): the batch, the audited marks and
    Kafka's earliest offsets (asked by the driver before the job, see :class:`AuditTask`)."""

    delta: DeltaConfig
    layout: DeliveryLayout
    batch_id: int
    routed_at: datetime
    partitioned: frozenset[str]
    floor: dict[int, int]
    earliest: dict[int, int]
    topic: str
    incarnation: int = 0


class AuditTask:
    """The ``mapInArrow`` function of one audit batch (module docstring): the batch's
    routed records in, one :data:`AUDIT_TASK` row out, its audit files written.

    A task cannot ask Kafka and then wait for the driver, so the driver asks Kafka's
    earliest offsets once per batch before the job (one ListOffsets request): a publish
    skipped because it was deleted was skipped before the record after it was routed,
    so before this batch was planned, and lies below the offsets asked after.
    """

    def __init__(self, settings: AuditTaskSettings) -> None:
        self.settings = settings

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        s = self.settings
        nonempty = [b for b in batches if b.num_rows]
        if not nonempty:
            return
        rows = pa.Table.from_batches(nonempty)
        audit, audited = audit_batch(rows, s.floor, lambda _: s.earliest, s.topic,
                                     s.incarnation)
        files = write_audit_files(audited, s) if audited.num_rows else []
        yield pa.RecordBatch.from_pylist([{
            "publishes": audit.publishes, "deliveries": audit.deliveries,
            "rejected": audit.rejected, "repeats": audit.repeats,
            "snapshot_version": audit.snapshot_version,
            "files": [f.as_row() for f in files],
            "latency_ms": audit.latency_ms,
            "offsets": [{"partition": p, "seen_end": seen, "first": audit.start.get(p),
                         "end": audit.end.get(p)} for p, seen in audit.seen_end.items()],
            "lost": [{"partition": g.partition, "first": g.first_offset, "end": g.end_offset,
                      "lost_before": g.lost_before} for g in audit.lost],
            "expired": audit.expired,
        }], schema=AUDIT_TASK_ARROW)


def task_result(rows: pa.Table, topic: str, incarnation: int) -> BatchAudit:
    """The :class:`BatchAudit` of an :class:`AuditTask`'s row (none: an empty batch)."""
    audit = BatchAudit(files=pa.Table.from_pylist([], schema=arrow_schema(AUDIT_FILE)))
    for task in rows.to_pylist():  # one row: a few hundred bytes per file and partition
        audit.publishes += task["publishes"]
        audit.deliveries += task["deliveries"]
        audit.rejected += task["rejected"]
        audit.repeats += task["repeats"]
        audit.expired += task["expired"] or 0
        if task["snapshot_version"] is not None:
            audit.snapshot_version = max(audit.snapshot_version or 0, task["snapshot_version"])
        audit.latency_ms += task["latency_ms"]
        for o in task["offsets"]:
            audit.seen_end[o["partition"]] = o["seen_end"]
            if o["first"] is not None:
                audit.start[o["partition"]], audit.end[o["partition"]] = o["first"], o["end"]
        audit.lost += [RetentionGap(topic, g["partition"], g["first"], g["end"],
                                    g["lost_before"], incarnation) for g in task["lost"]]
        audit.files = pa.concat_tables([audit.files, pa.Table.from_pylist(
            task["files"], schema=arrow_schema(AUDIT_FILE))])
    return audit


def write_audit_files(audited: pa.Table, s: AuditTaskSettings) -> list[AuditFile]:
    """Write the ``messages`` and ``deliveries`` files of ``audited`` (``AUDITED_ARROW``)."""
    filesystem, root = _warehouse(s.delta)
    label = f"b{s.batch_id:010d}-rt-{_task_label()}"
    files: list[AuditFile] = []
    for name in PUBLISH_TABLES:
        if name == "messages":
            table = messages_rows(audited, 0, s.batch_id, s.routed_at)
        else:
            table = deliveries_rows(audited, 0, s.batch_id, s.routed_at, s.layout)
        partition = PARTITION_COLUMNS[name] if name in s.partitioned else None
        if partition is None:
            table = table.drop_columns([PARTITION_COLUMNS[name]])
        files += write_table_files(filesystem, f"{root}/{name}", name, table, partition, label)
    return files


@functools.lru_cache(maxsize=4)
def _warehouse(delta: DeltaConfig):
    """The warehouse's filesystem, made once per Python worker (an object store's client)."""
    return warehouse_filesystem(delta)


def _task_label() -> str:
    from pyspark import TaskContext

    task = TaskContext.get()
    return "driver" if task is None else f"t{task.partitionId():05d}-a{task.attemptNumber()}"


def _ends(partitions: np.ndarray, offsets: np.ndarray) -> dict[int, int]:
    return {int(p): int(offsets[partitions == p].max()) + 1 for p in np.unique(partitions)}


def _starts(partitions: np.ndarray, offsets: np.ndarray) -> dict[int, int]:
    return {int(p): int(offsets[partitions == p].min()) for p in np.unique(partitions)}


def _latencies(kept: pa.Table, published_ms: np.ndarray) -> list[int]:
    """At most :data:`LATENCY_SAMPLE` end-to-end latencies (publish to routed record) in ms,
    evenly spaced over the records kept."""
    routed_ms = pc.cast(kept["routed_at"], pa.timestamp("ms", tz="UTC"),
                        safe=False).cast(pa.int64()).to_numpy(zero_copy_only=False)
    latency = (routed_ms.astype(np.float64) - published_ms.astype(np.float64))
    latency = latency[~np.isnan(latency)]
    if not len(latency):
        return []
    picked = latency[np.linspace(0, len(latency) - 1,
                                 min(len(latency), LATENCY_SAMPLE)).astype(np.int64)]
    return [int(v) for v in picked]


def _moment(millis: int | None) -> datetime | None:
    return None if millis is None else datetime.fromtimestamp(millis / 1000, UTC)

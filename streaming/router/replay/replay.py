"""Replay: a new subscription's view of the retained past (``bitroute subscribe --since T``).

A changelog record that creates a subscription with ``since``
(:mod:`streaming.router.replay.requests`) asks the router for every retained
publish at or after T that the subscription matches, then the live stream, with
no gap and no duplicate at the boundary. The boundary is the micro-batch the
subscription was first pinned in (:meth:`Replays.on_batch`, called by the
router right after the batch's pin): that batch and every later one route the
subscription live, as always; the publishes before it, from Kafka's
``offsets_for_times(T)`` up to the batch's start offsets (Spark's offset log,
:mod:`streaming.state.offsets_log`), are replayed here.

The replay runs beside live routing in the same Spark application, in one
driver thread (:class:`Replays`), which never holds a live batch: it reads the
publishes in bounded chunks (``spark.read.format("kafka")`` with
``startingOffsets``/``endingOffsets`` per partition, jobs in the Spark
scheduler pool :data:`SCHEDULER_POOL`), matches each chunk against the
replayed subscriptions only, produces the deliveries with the routing
process's producer (the live record contract plus the header
:data:`schemas.records.REPLAYED_HEADER`), waits for Kafka's acks, then
appends the chunk's ``deliveries`` audit rows (``replayed = true``) in one
Delta transaction keyed by ``bitroute-<router id>-replay`` and the chunk's
number, and only then records its progress (``router/replays.json``, written
atomically). A router killed at any point resumes the replay at the first
chunk not recorded: the chunk is produced again (at least once, as for a live
batch), and its audit rows are added once.

Several replays share their reads: each chunk reads, per partition, from the
lowest position of the replays still reading it, and each of the chunk's
publishes is matched only for the replays whose range holds it.

One delivery per (message, subscriber), live or replayed: a replayed publish
goes to a subscriber only if the ``deliveries`` audit has no row for that
message and subscriber (it got it live through another subscription, or from
an earlier replay); the rows are read once a replay starts, after the live
audit is committed up to its boundary. Within one chunk a subscriber whose
several replayed subscriptions match a publish gets it once, listing them all.

A replay is cancelled by removing or replacing its subscription (the next
chunk leaves it out). ``bitroute status`` shows the replays in progress.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import TopicPartition

from compiler import Dialect, Matcher, RoutingIndex
from schemas.records import DELIVERIES, REPLAYED_HEADER, REPLAYED_VALUE
from streaming.atomic import write_atomically
from streaming.config import Config
from streaming.kafka.clients import consumer
from streaming.kafka.errors import KAFKA_TIMEOUT_S
from streaming.kafka.records import subscription_ids_json
from streaming.router.batch.delivery import BinaryColumn, DeliveryProducer, ProducerSettings
from streaming.router.batch.routing import (
    RouteSettings,
    _recreated,
    _refused,
    _routed_rows,
    delivery_columns,
    kept_header_columns,
    plan_batch,
)
from streaming.router.replay.requests import ReplayRequest, ms_text
from streaming.router.subscriptions.changelog import PendingVersion
from streaming.state.checkpoint import CheckpointLayout

if TYPE_CHECKING:
    from streaming.audit.writer import AuditTables

_log = logging.getLogger(__name__)

SCHEDULER_POOL = "bitroute-replay"
"""The Spark scheduler pool of the replay's reads (under ``spark.scheduler.mode = FAIR``,
they share the executors with the live batches instead of queueing them)."""
TASK_PUBLISHES = 2_000
"""Publishes one Spark task of a replay's read holds, about: the executors' slots free up
this often for the live batches' tasks (a FAIR pool shares slots, it does not preempt)."""
FINISHED_KEPT = 10
"""Finished replays the ledger remembers (the latest), for ``bitroute status`` and benchmarks."""
SOURCE_COLUMNS = ("topic", "partition", "offset", "key", "value", "headers", "timestamp")


def state_path(layout: CheckpointLayout) -> Path:
    """Where a router's replays are recorded (``router/replays.json``)."""
    return layout.replays_file


@dataclass
class Replay:
    """One subscription's replay: publishes ``start[p] <= offset < end[p]`` of each
    publishes partition ``p``, done up to ``position[p]``."""

    request: ReplayRequest
    version: int
    """The snapshot version that applied the subscription."""
    boundary: int | None = None
    """The batch it was first pinned in (None: not yet)."""
    start: dict[int, int] = field(default_factory=dict)
    end: dict[int, int] = field(default_factory=dict)
    position: dict[int, int] = field(default_factory=dict)
    note: str | None = None
    """What the replay has to say (``since`` before the retained start)."""
    delivered: int = 0
    started_at: float | None = None
    cancelled: bool = False
    rate: float | None = None
    """Deliveries per second of its last chunk."""

    @property
    def total(self) -> int:
        return sum(max(0, self.end.get(p, 0) - s) for p, s in self.start.items())

    @property
    def done(self) -> int:
        return sum(max(0, min(self.position.get(p, s), self.end.get(p, 0)) - s)
                   for p, s in self.start.items())

    @property
    def finished(self) -> bool:
        return self.boundary is not None and self.started_at is not None and all(
            self.position.get(p, s) >= self.end.get(p, 0) for p, s in self.start.items())

    def to_json(self) -> dict:
        return {"request": self.request.to_json(), "version": self.version,
                "boundary": self.boundary, "start": self.start, "end": self.end,
                "position": self.position, "note": self.note, "delivered": self.delivered,
                "started_at": self.started_at, "cancelled": self.cancelled, "rate": self.rate}

    @classmethod
    def from_json(cls, obj: dict) -> Replay:
        return cls(ReplayRequest.from_json(obj["request"]), obj["version"], obj.get("boundary"),
                   _int_keys(obj.get("start")), _int_keys(obj.get("end")), _int_keys(obj.get("position")),
                   obj.get("note"), obj.get("delivered", 0), obj.get("started_at"),
                   obj.get("cancelled", False), obj.get("rate"))


def _int_keys(offsets: dict | None) -> dict[int, int]:
    """A JSON object of partition -> offset (keys are strings in JSON) as ints."""
    return {int(k): int(v) for k, v in (offsets or {}).items()}


@dataclass
class ReplayLedger:
    """Everything recorded about the replays (``router/replays.json``): the replays not
    finished, the next chunk number (the audit's ``txn`` version), and per changelog
    partition the last record that asked for a replay (a record read again asks for
    nothing new). Finished and cancelled replays are dropped, so the file stays as small
    as the replays in progress."""

    replays: list[Replay] = field(default_factory=list)
    next_chunk: int = 0
    asked: dict[int, int] = field(default_factory=dict)
    finished: list[dict] = field(default_factory=list)
    """The last :data:`FINISHED_KEPT` replays finished: subscription, publishes, delivered,
    started_at, finished_at (Unix seconds)."""

    @classmethod
    def load(cls, path: Path) -> ReplayLedger:
        try:
            obj = json.loads(path.read_bytes())
        except FileNotFoundError:
            return cls()
        return cls([Replay.from_json(r) for r in obj.get("replays", [])],
                   int(obj.get("next_chunk", 0)),
                   {int(k): int(v) for k, v in obj.get("asked", {}).items()},
                   list(obj.get("finished", [])))

    def save(self, path: Path) -> None:
        write_atomically(path, json.dumps({
            "replays": [r.to_json() for r in self.replays], "next_chunk": self.next_chunk,
            "asked": self.asked, "finished": self.finished[-FINISHED_KEPT:],
            "saved_at": time.time()}).encode())


class Replays:
    """The router's replays: recorded as the changelog asks for them, bounded at the
    batch that first applies them, served by one driver thread (module docstring).

    ``requested`` and ``on_batch`` are called from the batch thread; the serving thread
    (:meth:`start`) takes its work from the ledger under a lock.
    """

    def __init__(self, config: Config, spark, layout: CheckpointLayout, router_id: str,
                 audit_committed: Callable[[int], bool], stopping: threading.Event,
                 idle: Callable[[], None] | None = None,
                 incarnation: Callable[[], int] = lambda: 0) -> None:
        self.config = config
        self.spark = spark
        self.layout = layout
        self.path = state_path(layout)
        self.router_id = router_id
        self.chunk_records = config.streaming.replay_chunk_publishes
        self._audit_committed = audit_committed
        self._stopping = stopping
        self._idle = idle
        self._incarnation = incarnation
        """The publishes topic's incarnation (its message ids: streaming.router.topics.incarnations)."""
        """Called between chunks and while waiting: the router's idle catch-up."""
        self._lock = threading.Condition()
        self.ledger = ReplayLedger.load(self.path)
        self._thread: threading.Thread | None = None
        self._delivered: set[tuple[str, str]] | None = None
        self._delivered_for: frozenset[str] = frozenset()
        self._tables: AuditTables | None = None
        self._producer: DeliveryProducer | None = None
        self.failure: str | None = None
        self.pause = threading.Event()
        """Set: the serving thread waits before its next chunk (tests: a kill mid-replay)."""

    # --- the batch thread ---------------------------------------------------------------
    def requested(self, pending: PendingVersion) -> None:
        """Record durably the replays ``pending`` asks for, and cancel the replays whose
        subscription it removes or replaces: before the version is persisted
        (:attr:`streaming.router.subscriptions.subscription_sync.SubscriptionSync.on_version`)."""
        with self._lock:
            ledger = self.ledger
            changed = False
            new = [r for r in pending.replays
                   if r.changelog_offset > ledger.asked.get(r.changelog_partition, -1)]
            for request in new:
                ledger.replays.append(Replay(request, pending.version))
                ledger.asked[request.changelog_partition] = request.changelog_offset
                changed = True
            # The latest change of each id: a replay whose own record is not it (removed or
            # replaced since, in this version or a later one) is cancelled.
            touched = {c.subscription_id: (c.changelog_partition, c.changelog_offset)
                       for c in pending.changes}
            for replay in ledger.replays:
                where = touched.get(replay.request.subscription_id)
                if where is not None and where != (replay.request.changelog_partition,
                                                   replay.request.changelog_offset):
                    if not replay.cancelled:
                        _log.info(f"replay of subscription {replay.request.subscription_id!r} "
                                  "cancelled: the subscription was removed or replaced")
                    replay.cancelled = changed = True
            if changed:
                ledger.replays = [r for r in ledger.replays if not r.cancelled]
                ledger.save(self.path)
                self._lock.notify_all()

    def on_batch(self, batch_id: int, version: int, start: dict[int, int] | None) -> None:
        """Batch ``batch_id`` (starting at ``start``) routes with snapshot ``version``: the
        replays applied by that version or an earlier one and not bounded yet have their
        boundary here. Called after the batch's pin, before it writes anything."""
        with self._lock:
            todo = [r for r in self.ledger.replays if r.boundary is None and r.version <= version]
            if not todo:
                return
            for replay in todo:
                replay.boundary = batch_id
                replay.end = dict(start or {})
                if start is None:
                    replay.note = (f"the start offsets of batch {batch_id} are unknown: "
                                   "nothing to replay")
            self.ledger.save(self.path)
            self._lock.notify_all()


    def unbounded(self) -> bool:
        """Whether some replay waits for its boundary batch."""
        with self._lock:
            return any(r.boundary is None for r in self.ledger.replays)

    # --- the serving thread --------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="bitroute-replay", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        with self._lock:
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", SCHEDULER_POOL)
        self.spark.sparkContext.setJobGroup("bitroute-replay", "bitroute replay (subscribe --since)",
                                            interruptOnCancel=False)
        failures = 0
        while not self._stopping.is_set():
            try:
                self._idle_catch_up()
                if not self._step():
                    with self._lock:
                        self._lock.wait(0.5)
                failures = 0
                self.failure = None
            except Exception as exc:  # noqa: BLE001 - not about a record: retried with backoff
                failures += 1
                self.failure = f"{type(exc).__name__}: {exc}"
                if failures == 1 or failures % 10 == 0:
                    _log.warning(f"replay: {self.failure} (retrying)", exc_info=failures == 1)
                self._stopping.wait(min(30.0, 0.5 * 2 ** min(failures, 6)))

    def _idle_catch_up(self) -> None:
        """The router's idle catch-up; its failure (the changelog unreadable) is the next
        batch's to report and retry, and does not hold the replays in progress."""
        if self._idle is None:
            return
        try:
            self._idle()
        except Exception as exc:  # noqa: BLE001 - retried at the next turn or by the batch
            _log.debug(f"idle changelog catch-up: {type(exc).__name__}: {exc}")

    def _step(self) -> bool:
        """Start the replays that have their boundary, then serve one chunk; False when there
        was nothing to do."""
        if self.pause.is_set():
            return False
        with self._lock:
            waiting = [r for r in self.ledger.replays
                       if r.boundary is not None and r.started_at is None]
        for replay in waiting:
            self._begin(replay)
        with self._lock:
            active = [r for r in self.ledger.replays if r.started_at is not None
                      and not r.finished and not r.cancelled]
            finished = [r for r in self.ledger.replays if r.finished]
            if finished:
                for r in finished:
                    _log.info(f"replay of subscription {r.request.subscription_id!r} done: "
                              f"{r.delivered} deliveries of {r.total} publishes")
                    self.ledger.finished.append({
                        "subscription": r.request.subscription_id, "publishes": r.total,
                        "delivered": r.delivered, "started_at": r.started_at,
                        "finished_at": time.time()})
                self.ledger.replays = [r for r in self.ledger.replays if not r.finished]
                self.ledger.save(self.path)
            chunk = self.ledger.next_chunk
        if not active:
            return bool(waiting)
        if self.pause.is_set():
            return False
        started = time.monotonic()
        self._chunk(active, chunk)
        share = self.config.streaming.replay_share
        if share < 100:  # leave the live batches their share of the machine
            self._stopping.wait((time.monotonic() - started) * (100 - share) / share)
        return True

    def _begin(self, replay: Replay) -> None:
        """Fix where ``replay`` starts (Kafka's ``offsets_for_times``), once the live audit is
        committed up to its boundary; record it."""
        if replay.boundary is None or not self._audit_committed(replay.boundary - 1):
            return
        topic = self.config.kafka.publishes_topic
        request = replay.request
        client = consumer(self.config.kafka.client_settings, "bitroute-router-replay")
        try:
            parts = sorted(replay.end)
            found = client.offsets_for_times(
                [TopicPartition(topic, p, request.since_ms) for p in parts], KAFKA_TIMEOUT_S)
            start, early = {}, []
            for tp in found:
                low, _ = client.get_watermark_offsets(TopicPartition(topic, tp.partition),
                                                      timeout=KAFKA_TIMEOUT_S, cached=False)
                end = replay.end[tp.partition]
                start[tp.partition] = min(end, tp.offset if tp.offset >= 0 else end)
                if low > 0 and tp.offset >= 0 and tp.offset <= low:
                    early.append((tp.partition, low))
                start[tp.partition] = max(start[tp.partition], min(low, end))
        finally:
            client.close()
        note = None
        if early:
            note = (f"since {ms_text(request.since_ms)} is before the retained start of "
                    f"{topic} (partition/offset " + ", ".join(f"{p}/{o}" for p, o in early)
                    + "): replaying from the retained start")
            _log.warning(f"replay of subscription {request.subscription_id!r}: {note}")
        with self._lock:
            if replay.cancelled or replay not in self.ledger.replays:
                return
            replay.start, replay.position = start, dict(start)
            replay.note = replay.note or note
            replay.started_at = time.time()
            self.ledger.save(self.path)
        self._delivered = None  # read again: a new replay's subscriber may have rows
        _log.info(f"replaying subscription {request.subscription_id!r} ({request.filter!r} for "
                  f"{request.subscriber}) from {ms_text(request.since_ms)} up to batch "
                  f"{replay.boundary}: {replay.total} publishes to read")

    def _chunk(self, active: list[Replay], chunk: int) -> None:
        """Read one chunk shared by ``active``, deliver, audit, record (module docstring)."""
        windows: dict[int, tuple[int, int]] = {}
        reading = {p: [r for r in active if r.position.get(p, 0) < r.end.get(p, 0)]
                   for p in sorted({p for r in active for p in r.start})}
        reading = {p: readers for p, readers in reading.items() if readers}
        share = max(1, self.chunk_records // max(1, len(reading)))
        for p, readers in reading.items():
            low = min(r.position[p] for r in readers)
            high = max(r.end[p] for r in readers)
            windows[p] = (low, low + min(high - low, share))
        started = time.monotonic()
        rows = self._read(windows)
        delivered = self._deliver(active, rows, chunk) if rows.num_rows else {}
        with self._lock:
            for r in active:
                for p, (_, high) in windows.items():
                    if p in r.position and r.position[p] < r.end.get(p, 0):
                        r.position[p] = max(r.position[p], min(high, r.end[p]))
            seconds = max(time.monotonic() - started, 1e-6)
            for r in active:
                n = delivered.get(r.request.subscription_id, 0) if delivered else 0
                r.delivered += n
                r.rate = round(n / seconds, 1)
            self.ledger.next_chunk = chunk + 1
            self.ledger.save(self.path)

    def _read(self, windows: dict[int, tuple[int, int]]) -> pa.Table:
        topic = self.config.kafka.publishes_topic
        if not windows:
            return pa.table({})
        kafka = self.config.kafka
        frame = (self.spark.read.format("kafka")
                 .options(**kafka.client_settings.spark_options())
                 .option("assign", json.dumps({topic: sorted(windows)}))
                 .option("startingOffsets", json.dumps(
                     {topic: {str(p): low for p, (low, _) in windows.items()}}))
                 .option("endingOffsets", json.dumps(
                     {topic: {str(p): high for p, (_, high) in windows.items()}}))
                 .option("includeHeaders", "true")
                 .option("failOnDataLoss", "false")
                 # Short tasks: a live batch's job waits for a free slot at most one of them.
                 .option("minPartitions", str(max(1, sum(h - low for low, h in windows.values())
                                                  // TASK_PUBLISHES)))
                 .load().select(*SOURCE_COLUMNS))
        return frame.toArrow()

    def _matcher(self, active: list[Replay]) -> Matcher:
        exchanges = {name: Dialect(d) for name, d in self.config.exchanges.dialects.items()}
        index = RoutingIndex(exchanges)
        for r in active:
            index.upsert(r.request.subscription())
        return Matcher(index.snapshot(1, {}))

    def _already_delivered(self, active: list[Replay]) -> set[tuple[str, str]]:
        """(message id, subscriber) of the audit's deliveries to ``active``'s subscribers."""
        subscribers = frozenset(r.request.subscriber for r in active)
        if self._delivered is not None and subscribers <= self._delivered_for:
            return self._delivered
        import pyarrow.dataset as ds
        from deltalake import DeltaTable

        from streaming.audit.storage import storage_options

        since = min(r.request.since_ms for r in active)
        day = datetime.fromtimestamp(since / 1000 - 86_400, UTC).date()
        table = DeltaTable(self.config.delta.table_path(DELIVERIES),
                           storage_options=storage_options(self.config.delta))
        dataset = table.to_pyarrow_dataset()
        condition = ds.field("subscriber").isin(sorted(subscribers))
        if "routed_date" in dataset.schema.names:
            condition = condition & (ds.field("routed_date") >= pa.scalar(day, pa.date32()))
        found = dataset.to_table(columns=["message_id", "subscriber"], filter=condition)
        self._delivered = set(zip(found["message_id"].to_pylist(),
                                  found["subscriber"].to_pylist(), strict=True))
        self._delivered_for = subscribers
        return self._delivered

    def _deliver(self, active: list[Replay], rows: pa.Table, chunk: int) -> dict[str, int]:
        """Match ``rows`` for ``active``, produce, audit; per subscription id the deliveries."""
        kafka = self.config.kafka
        newest = max(active, key=lambda r: r.version)
        if newest.boundary is None:
            raise RuntimeError(f"replay {newest.request.subscription_id}: delivering before its boundary batch")
        settings = RouteSettings(default_exchange=self.config.exchanges.default,
                                 layout=kafka.layout, rejected_topic=kafka.rejected_topic,
                                 snapshot_version=newest.version,
                                 # No Local reads the publisher header too.
                                 with_headers=any(r.request.headers or r.request.subscription()
                                                  .options.no_local for r in active),
                                 producer=ProducerSettings.of(kafka),
                                 incarnation=self._incarnation())
        matcher = self._matcher(active)
        batch = rows.combine_chunks().to_batches()[0]
        if not settings.with_headers:
            batch = self._matching_keys_only(matcher, batch)
            if not batch.num_rows:
                return {}
        plan = plan_batch(matcher, batch, settings)
        plan = self._only_in_range(plan, active, batch)
        if not len(plan.send):
            return {}
        if self._producer is None:  # its own: the driver's batches flush theirs meanwhile
            self._producer = DeliveryProducer(settings.producer)
        producer = self._producer
        columns = _replayed(delivery_columns(plan, settings), plan)
        producer.produce_deliveries(columns)
        failed = _recreated(producer, settings, _refused(producer, producer.flush(), columns),
                            columns)
        acked = np.ones(len(plan.owner), dtype=bool)
        if failed:
            for failure in failed:
                _log.warning(f"replay: Kafka refused a delivery to {failure.topic}: "
                             f"{failure.reason} (left out)")
            acked[plan.send[sorted({f.tag for f in failed})]] = False
        routed = pa.Table.from_batches([_routed_rows(plan.publishes, [None] * plan.publishes.n,
                                                     plan.deliveries, plan.entries, plan.owner,
                                                     acked)])
        from streaming.audit.writer import deliveries_rows

        audit = deliveries_rows(routed, newest.version, newest.boundary, datetime.now(UTC),
                                kafka.layout, replayed=True)
        self._audit_tables().append_replayed(audit, chunk)
        ids = pc.list_flatten(audit["subscription_ids"]).to_pylist()
        counts: dict[str, int] = {}
        for sub_id in ids:
            counts[sub_id] = counts.get(sub_id, 0) + 1
        delivered = self._delivered
        if delivered is not None:
            delivered.update(zip(audit["message_id"].to_pylist(), audit["subscriber"].to_pylist(), strict=True))
        return counts

    def _matching_keys_only(self, matcher: Matcher, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The rows of ``batch`` whose routing key some replayed subscription's filter matches
        in some exchange: each distinct key matched once, so that the per-row work of
        routing (:func:`plan_batch`) is paid by the matching rows only (a replay of a
        filter matching one publish in ten reads ten). Without header criteria only: a
        superset of the rows that make deliveries, which :func:`plan_batch` decides."""
        keys = batch.column(batch.schema.get_field_index("key"))
        distinct = pc.unique(keys).drop_null()
        if not len(distinct):
            return batch.slice(0, 0)
        listed = distinct.to_pylist()
        hit = np.zeros(len(listed), dtype=bool)
        for exchange in self.config.exchanges.dialects:
            deliveries, _ = matcher.match_columns([""] * len(listed), [exchange] * len(listed),
                                                  listed)
            hit |= pc.list_value_length(deliveries).to_numpy(zero_copy_only=False) > 0
        if hit.all():
            return batch
        return batch.filter(pc.is_in(keys, value_set=distinct.filter(pa.array(hit))))

    def _audit_tables(self):
        if self._tables is None:
            from streaming.audit.writer import AuditTables

            self._tables = AuditTables(self.config, self.router_id)
        return self._tables

    def _only_in_range(self, plan, active: list[Replay], batch: pa.RecordBatch):
        """``plan`` with each delivery's subscription ids cut to the replays whose range holds
        its publish, deliveries left without one dropped, those of publishes delivered to
        no one dropped (rejected, clearing a retained message, or expired at the replay's
        time), and deliveries the subscriber
        had already (the audit) dropped; every publish's rejection forgotten (a replay
        rejects nothing: the live routing did)."""
        entries = plan.entries
        n = len(entries)
        if not n:
            return plan
        ids_lists = entries.field("subscription_ids")
        flat = pc.list_flatten(ids_lists)
        parent = pc.list_parent_indices(ids_lists).to_numpy(zero_copy_only=False)
        row = plan.owner[parent]
        partitions = batch.column(batch.schema.get_field_index("partition")).to_numpy(
            zero_copy_only=False)[row]
        offsets = batch.column(batch.schema.get_field_index("offset")).to_numpy(
            zero_copy_only=False)[row]
        names = [r.request.subscription_id for r in active]
        which = pc.index_in(flat, pa.array(names, pa.string())).to_numpy(zero_copy_only=False)
        keep_id = np.zeros(len(flat), dtype=bool)
        size = int(partitions.max()) + 1 if len(partitions) else 0
        for i, r in enumerate(active):
            mine = which == i
            if not mine.any():
                continue
            low, high = np.full(size, 1 << 62, np.int64), np.zeros(size, np.int64)
            for p, at in r.position.items():
                if p < size:
                    low[p], high[p] = at, r.end.get(p, 0)
            keep_id[mine] = ((offsets[mine] >= low[partitions[mine]])
                             & (offsets[mine] < high[partitions[mine]]))
        counts = np.bincount(parent[keep_id], minlength=n)
        wanted = counts > 0
        # Delivered to no one: a publish the live routing rejected or that cleared its
        # retained message, and one whose lifetime ended before the replay reached it.
        wanted &= plan.ok[plan.owner]
        delivered = self._already_delivered(active)
        if delivered:
            # Only a subscriber with audit rows costs a look-up per delivery.
            subscribers, message_ids = plan.subscribers.to_pylist(), plan.message_ids
            for d in np.flatnonzero(wanted).tolist():
                if (message_ids[plan.owner[d]], subscribers[d]) in delivered:
                    wanted[d] = False
        keep = np.flatnonzero(wanted)
        kept_ids = pa.ListArray.from_arrays(
            pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)),
            flat.filter(pa.array(keep_id))).take(pa.array(keep, pa.int64()))
        subscriber_array = plan.subscribers.take(pa.array(keep, pa.int64()))
        new_entries = pa.StructArray.from_arrays([subscriber_array, kept_ids],
                                                 fields=list(entries.type))
        owner = plan.owner[keep]
        return dataclasses.replace(
            plan, entries=new_entries, subscribers=subscriber_array, owner=owner,
            ids_json=subscription_ids_json(kept_ids), send=np.arange(len(keep), dtype=np.int64),
            reasons=[None] * plan.publishes.n, ok=np.ones(plan.publishes.n, dtype=bool))


def _replayed(columns, plan):
    """``columns`` with :data:`REPLAYED_HEADER` after each publish's own headers."""
    offsets, names, values = kept_header_columns(plan)
    n = len(offsets) - 1
    total = len(names) + n
    new_offsets = (offsets + np.arange(n + 1)).astype(np.int32)
    inserted = np.zeros(total, dtype=bool)
    inserted[new_offsets[1:] - 1] = True
    index = np.empty(total, dtype=np.int64)
    index[~inserted] = np.arange(len(names))
    index[inserted] = len(names)
    names = pa.concat_arrays([names.cast(pa.string()), pa.array([REPLAYED_HEADER], pa.string())])
    values = pa.concat_arrays([values.cast(pa.binary()), pa.array([REPLAYED_VALUE], pa.binary())])
    take = pa.array(index, pa.int64())
    return dataclasses.replace(columns, header_offsets=new_offsets,
                               header_names=BinaryColumn.of(names.take(take)),
                               header_values=BinaryColumn.of(values.take(take)))

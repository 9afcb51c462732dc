"""Replay: a new subscription's view of the past Kafka keeps (``bitroute subscribe --since T``).

A changelog record that creates a subscription with ``since``
(:mod:`streaming.router.replay.requests`) asks the router for every publish
Kafka keeps at or after T that the subscription matches, then the live stream,
with no gap and no duplicate at the boundary. The boundary is the micro-batch the
subscription was first pinned in (:meth:`Replays.on_batch`, called right
after the batch's pin): that batch and every later one route the
subscription live, as always; the publishes before it, from Kafka's
``offsets_for_times(T)`` up to the batch's start offsets (Spark's offset log,
:mod:`streaming.state.offsets_log`), are replayed here.

The replay runs beside live routing in the same Spark application, driven by
one driver thread (:class:`Replays`), which never holds a live batch and does
not match, filter or produce a record: each chunk is one Spark job
(``spark.read.format("kafka")`` with ``startingOffsets``/``endingOffsets`` per
partition, in the Spark scheduler pool :data:`SCHEDULER_POOL`) whose tasks run
the live batches' routing function
(:class:`streaming.router.batch.routing.RoutePartitions`) on the executors,
against a snapshot of the replayed subscriptions only (broadcast once per set
of replays) and narrowed to the replays' ranges
(:class:`streaming.router.replay.scope.ReplayScope`): they match, produce the
deliveries (the live record contract plus the header
:data:`schemas.records.REPLAYED_HEADER`), wait for Kafka's acks, and write the
chunk's ``deliveries`` audit file (``replayed = true``) where the live
batches' tasks write theirs (``streaming.executor_audit_files``; else they
return their routed rows and the driver writes it). The driver then adds the
chunk's audit in one Delta transaction keyed by ``bitroute-<router id>-replay``
and the chunk's number, and only then records its progress
(``router/replays.json``, written atomically). A failure (Kafka, Spark, Delta)
is retried with the router's backoff (:mod:`streaming.worker`). A router
killed at any point resumes the replay at the first chunk not recorded: the
chunk is produced again (at least once, as for a live batch), and its audit
rows are added once (files of a chunk already committed stay untracked, and
the maintenance's vacuum deletes them).

Several replays share their reads: each chunk reads, per partition, from the
lowest position of the replays still reading it, and each of the chunk's
publishes is matched only for the replays whose range holds it.

One delivery per (message, subscriber), live or replayed: a replayed publish
goes to a subscriber only if the ``deliveries`` audit has no row for that
message and subscriber (it got it live through another subscription, or from
an earlier replay); the rows are read (:func:`streaming.audit.queries.delivered`)
once a replay starts, after the live audit is committed up to its boundary, and
broadcast to each chunk's tasks (released after the chunk). Within one chunk a subscriber whose
several replayed subscriptions match a publish gets it once, listing them all.

A replay is cancelled by removing or replacing its subscription (the next
chunk leaves it out). ``bitroute status`` shows the replays in progress.

The router reaches the replays only as a feature of its batch loop
(:class:`ReplayFeature`, :mod:`streaming.router.feature`): their record of each
pending version's requests, their boundary at a batch's pin or at an idle catch-up
(which their serving thread runs for the router), their thread's start and stop.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import TopicPartition
from pyspark import Broadcast

from compiler import Dialect, RoutingIndex
from schemas.records import DELIVERIES
from schemas.tables import ROUTED_PUBLISH, ROUTED_TASK
from streaming.atomic import write_atomically
from streaming.audit.files import audit_files
from streaming.audit.writer import AuditTables, deliveries_rows
from streaming.config import MODE_REALTIME, Config
from streaming.errors import one_line
from streaming.kafka.clients import consumer
from streaming.kafka.errors import KAFKA_TIMEOUT_S
from streaming.kafka.records import SOURCE_COLUMNS
from streaming.router.batch.delivery import ProducerSettings
from streaming.router.batch.routing import RoutePartitions, RouteSettings, TaskAudit
from streaming.router.feature import BatchFeature, BatchPin, IdleCatchUp, RouterContext
from streaming.router.replay.requests import ReplayRequest, ms_text
from streaming.router.replay.scope import ReplayScope, delivered_pairs
from streaming.router.retained import RetainSettings
from streaming.router.subscriptions.changelog import PendingVersion
from streaming.state.checkpoint import CheckpointLayout
from streaming.worker import Worker

_log = logging.getLogger(__name__)

SCHEDULER_POOL = "bitroute-replay"
"""The Spark scheduler pool of the replay's reads (under ``spark.scheduler.mode = FAIR``,
they share the executors with the live batches instead of queueing them)."""
TASK_PUBLISHES = 2_000
"""Publishes one Spark task of a replay's read holds, about: the executors' slots free up
this often for the live batches' tasks (a FAIR pool shares slots, it does not preempt)."""
FINISHED_KEPT = 10
"""Finished replays the ledger remembers (the latest), for ``bitroute status`` and benchmarks."""


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
    """What the replay has to say (``since`` before the retention start)."""
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
        self._worker = Worker("replay", self._turn, what="replay", log=_log,
                              interrupt=self._wake, on_end=self._release_snapshot,
                              describe=lambda exc: one_line(exc, typed=True))
        """Serves the replays (:mod:`streaming.worker`): a failure, not about a record, is
        retried with backoff; the snapshot's broadcast is released when it ends."""
        self._scheduled: threading.Thread | None = None
        self._delivered: pa.Array | None = None
        """The audit's deliveries to the replays' subscribers (:func:`delivered_pairs`)."""
        self._delivered_for: frozenset[str] = frozenset()
        self._tables: AuditTables | None = None
        self._deliveries_partitioned: bool | None = None
        self._snapshot: tuple[tuple, Broadcast, str] | None = None
        """(the replays it holds, its broadcast, its key): the replayed subscriptions'
        snapshot on the executors."""
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
    @property
    def failure(self) -> str | None:
        """The serving thread's latest failure while it keeps failing, else None."""
        return self._worker.failure

    def start(self) -> None:
        self._worker.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._worker.stop(timeout)

    def _wake(self) -> None:
        with self._lock:
            self._lock.notify_all()

    def _turn(self) -> float | None:
        """One turn of the serving thread: the idle catch-up, then :meth:`_step`; None
        once the router stops. Any failure here is not about a record (a task's record
        errors are its own): Kafka, Spark or Delta unreachable, waited out like a batch's."""
        if self._stopping.is_set():
            return None
        if self._scheduled is not threading.current_thread():  # Spark's properties are per thread
            self._scheduled = threading.current_thread()
            self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", SCHEDULER_POOL)
            self.spark.sparkContext.setJobGroup("bitroute-replay",
                                                "bitroute replay (subscribe --since)",
                                                interruptOnCancel=False)
        self._idle_catch_up()
        if not self._step():
            with self._lock:
                self._lock.wait(0.5)
        return 0.0

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
            note = (f"since {ms_text(request.since_ms)} is before the retention start of "
                    f"{topic} (partition/offset " + ", ".join(f"{p}/{o}" for p, o in early)
                    + "): replaying from the retention start")
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
        delivered = self._deliver(active, windows, chunk) if windows else {}
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

    def _source(self, windows: dict[int, tuple[int, int]]):
        """The publishes of ``windows`` (partition: [low, high)) as a Spark DataFrame of the
        Kafka source's columns, read in short tasks."""
        topic = self.config.kafka.publishes_topic
        kafka = self.config.kafka
        return (self.spark.read.format("kafka")
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

    def _broadcast(self, active: list[Replay]) -> tuple[Broadcast, str]:
        """The broadcast snapshot of ``active``'s subscriptions and its key in the routing
        processes' matcher cache, made again only when the replays in progress change."""
        held = tuple(sorted((r.request.subscription_id, r.request.changelog_partition,
                             r.request.changelog_offset) for r in active))
        if self._snapshot is not None and self._snapshot[0] == held:
            return self._snapshot[1], self._snapshot[2]
        self._release_snapshot()
        exchanges = {name: Dialect(d) for name, d in self.config.exchanges.dialects.items()}
        index = RoutingIndex(exchanges)
        for r in active:
            index.upsert(r.request.subscription())
        version = max(r.version for r in active)
        broadcast = self.spark.sparkContext.broadcast(index.snapshot(version, {}).to_bytes())
        self._snapshot = (held, broadcast, f"replay-{uuid.uuid4().hex}")
        return broadcast, self._snapshot[2]

    def _release_snapshot(self) -> None:
        if self._snapshot is not None:
            try:
                self._snapshot[1].destroy()
            except Exception as exc:  # noqa: BLE001 - a stopped context took it already
                _log.debug(f"replay: the snapshot's broadcast: {one_line(exc)}")
            self._snapshot = None

    def _already_delivered(self, active: list[Replay]) -> pa.Array:
        """(message id, subscriber) of the audit's deliveries to ``active``'s subscribers
        (:func:`delivered_pairs`), read once per set of subscribers."""
        subscribers = frozenset(r.request.subscriber for r in active)
        if self._delivered is not None and subscribers <= self._delivered_for:
            return self._delivered
        from streaming.audit.queries import delivered

        since = min(r.request.since_ms for r in active)
        found = delivered(self.config, sorted(subscribers),
                          datetime.fromtimestamp(since / 1000 - 86_400, UTC))
        self._delivered = delivered_pairs(found["message_id"].combine_chunks(),
                                          found["subscriber"].combine_chunks())
        self._delivered_for = subscribers
        return self._delivered

    def _scope(self, active: list[Replay]) -> ReplayScope:
        """What the chunk's tasks deliver for ``active`` (their ranges from their positions)."""
        size = 1 + max((p for r in active for p in r.start), default=0)
        low = np.full((len(active), size), 1 << 62, np.int64)
        high = np.zeros((len(active), size), np.int64)
        for i, r in enumerate(active):
            for p, at in r.position.items():
                low[i, p], high[i, p] = at, r.end.get(p, 0)
        return ReplayScope(tuple(r.request.subscription_id for r in active), low, high,
                           self._already_delivered(active),
                           tuple(self.config.exchanges.dialects))

    def _deliver(self, active: list[Replay], windows: dict[int, tuple[int, int]],
                 chunk: int) -> dict[str, int]:
        """Route the chunk ``windows`` for ``active`` on the executors, then audit its
        deliveries in one transaction; per subscription id the deliveries made.

        Who writes the audit's file follows the live batches
        (``streaming.executor_audit_files``): each task its own (a cluster), or the driver
        from the rows the tasks return (a ``local[...]`` master)."""
        kafka = self.config.kafka
        newest = max(active, key=lambda r: r.version)
        if newest.boundary is None:
            raise RuntimeError(f"replay {newest.request.subscription_id}: delivering before its boundary batch")
        tables = self._audit_tables()
        routed_at = datetime.now(UTC)
        in_tasks = self.config.streaming.task_audit_files(self.spark.sparkContext.master)
        scope = self._scope(active).shipped(self.spark.sparkContext)
        settings = RouteSettings(default_exchange=self.config.exchanges.default,
                                 layout=kafka.layout, rejected_topic=kafka.rejected_topic,
                                 snapshot_version=newest.version,
                                 # No Local reads the publisher header too.
                                 with_headers=any(r.request.headers or r.request.subscription()
                                                  .options.no_local for r in active),
                                 producer=ProducerSettings.of(kafka),
                                 audit=TaskAudit(self.config.delta, newest.boundary, routed_at,
                                                 self._partitioned(tables), chunk)
                                 if in_tasks else None,
                                 incarnation=self._incarnation(),
                                 # Decides what the live routing cleared or rejected; a
                                 # replay writes no retained message.
                                 retain=RetainSettings.of(self.config),
                                 replay=scope)
        broadcast, key = self._broadcast(active)
        source = self._source(windows)
        route = RoutePartitions(broadcast, key, settings)
        try:
            return self._route(source, route, tables, (newest.version, newest.boundary),
                               routed_at, chunk, in_tasks)
        finally:
            scope.release()  # the audit's pairs, on the executors for this chunk's job only

    def _route(self, source, route: RoutePartitions, tables: AuditTables,
               version_boundary: tuple[int, int], routed_at: datetime, chunk: int,
               in_tasks: bool) -> dict[str, int]:
        """Run the chunk's job and add its audit (:meth:`_deliver`); per subscription id the
        deliveries made."""
        if in_tasks:
            tasks = source.mapInArrow(route, ROUTED_TASK).toArrow()
            tables.append_replayed_files(audit_files(pc.list_flatten(tasks["files"])), chunk)
            counts: dict[str, int] = {}
            for entries in tasks["subscriptions"].to_pylist():  # a few per task
                for sub_id, n in entries or []:
                    counts[sub_id] = counts.get(sub_id, 0) + n
            return counts
        routed = source.mapInArrow(route, ROUTED_PUBLISH).toArrow()
        if not routed.num_rows:
            return {}
        rows = deliveries_rows(routed, *version_boundary, routed_at, self.config.kafka.layout,
                               replayed=True)
        tables.append_replayed(rows, chunk)
        found = pc.value_counts(pc.list_flatten(rows["subscription_ids"]).combine_chunks())
        return dict(zip(found.field("values").to_pylist(), found.field("counts").to_pylist(),
                        strict=True))

    def _partitioned(self, tables: AuditTables) -> frozenset[str]:
        """``{"deliveries"}`` when the table has day partitions (this version's layout)."""
        if self._deliveries_partitioned is None:
            self._deliveries_partitioned = DELIVERIES not in tables.unpartitioned()
        return frozenset({DELIVERIES}) if self._deliveries_partitioned else frozenset()

    def _audit_tables(self) -> AuditTables:
        if self._tables is None:
            self._tables = AuditTables(self.config, self.router_id)
        return self._tables


class ReplayFeature(BatchFeature):
    """Replays as a feature of the batch loop (:mod:`streaming.router.feature`; micro-batch
    mode only): at each open, the replays read from their ledger and their durable record of
    each pending version's requests registered (:meth:`Replays.requested`); their serving
    thread started once the open caught the changelog up (it runs the router's idle
    catch-up); each batch's pin bounds the replays its version applied
    (:meth:`Replays.on_batch`), and so does an idle catch-up, at the next batch."""

    name = "replay"

    def __init__(self) -> None:
        self.replays: Replays | None = None
        """The router's replays while it is open."""

    @classmethod
    def of(cls, router: RouterContext) -> ReplayFeature | None:
        """The feature, in micro-batch mode (realtime mode serves no replay)."""
        return None if router.config.streaming.mode == MODE_REALTIME else cls()

    def open(self, router: RouterContext) -> None:
        incarnation = router.incarnation
        self.replays = Replays(router.config, router.spark, router.layout, router.router_id,
                               router.audit_committed, router.stopping, router.idle_catch_up,
                               lambda: incarnation.number)
        router.subscription_sync.on_version = self.replays.requested

    def start(self) -> None:
        self._open().start()

    def pinned(self, pin: BatchPin) -> None:
        self._open().on_batch(pin.batch_id, pin.version, pin.start)

    def idle(self, idle: IdleCatchUp) -> None:
        replays = self._open()
        if not replays.unbounded():
            return
        start = idle.next_start
        if start is not None:  # None: no batch planned yet, whose first one bounds them
            replays.on_batch(idle.next_batch, idle.version, start)

    def close(self) -> None:
        if self.replays is not None:
            self.replays.stop()

    def _open(self) -> Replays:
        if self.replays is None:
            raise RuntimeError("the router is not open: call open() or start() first")
        return self.replays

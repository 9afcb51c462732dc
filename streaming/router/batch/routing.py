"""Routing one micro-batch, in a Python worker (or the driver): match, validate, deliver, report.

:class:`RoutePartitions` is the ``mapInArrow`` function of a batch. For each
Arrow batch of Kafka source rows (:class:`streaming.kafka.records.PublishColumns`)
a task, in one pass:

1. reads the publishes: message id, exchange (last ``exchange`` header, else
   the default; not UTF-8 = rejected), routing key, headers;
2. matches them against the pinned snapshot (``Matcher.match_columns``), which
   turns every bad field it reads into a reason, never an error; a publish its own
   exchange routes to no one is matched once against its exchange's alternate, if it
   names one (:func:`compiler.alternates.match_alternates`; the row names the alternate);
   then decides each publish's expiry at the batch's routing time (``RouteSettings.now_ms``;
   :func:`plan_expiry`, the Rust core's rule): expired publishes are delivered to no one
   (outcome ``expired``), live ones' deliveries carry the interval left
   (:func:`kept_header_columns`), a bad ``expiry`` header is a reason;
3. checks every delivery's size against ``kafka.max_delivery_bytes`` (the
   broker would refuse a larger record, and would refuse it forever);
4. produces each delivery to its subscriber's topic (as the delivery layout,
   :class:`streaming.kafka.layout.DeliveryLayout`, says) and each rejected publish
   to the rejected topic, with the routing process's producers, and waits for
   Kafka's acknowledgements (:mod:`streaming.router.batch.delivery`);
5. returns one row per publish (``schemas.tables.ROUTED_PUBLISH``): its
   outcome, reason and the deliveries Kafka acknowledged, for the audit; or,
   when the task writes its audit itself (``RouteSettings.audit``: a batch
   routed on the executors), writes the ``messages`` and ``deliveries`` files
   of those rows into the tables' folders (:mod:`streaming.audit.files`) and
   returns one row for the whole task (``schemas.tables.ROUTED_TASK``): its
   counts and the files' records, which the driver journals and commits.

No single record can fail the task (the poison-pill rule): a delivery Kafka
refuses for a reason of the record's own (too large, invalid) rejects its
publish, with Kafka's reason, and the rest is routed; and should the batch
still raise on something unforeseen, :func:`route_safely` splits it in halves
until the record(s) responsible are alone, rejects them with the error as the
reason and routes the others. A batch whose deliveries overflow Arrow's
32-bit offsets (the kernel's ``ColumnOverflowError``) is routed in halves.
Only failures that are not about a record fail the task
(:data:`NOT_ABOUT_A_RECORD`): bitroute's own errors
(:class:`~streaming.router.batch.delivery.DeliveryUnavailable`: Kafka down;
:class:`~streaming.kafka.errors.KafkaAccessError`: credentials refused), the
kernel's other errors (``KernelError``: inconsistent tables or columns, a
bug), a Kafka client's failure, the disk's, memory; the router retries the
batch with backoff and reports it, and never turns such a failure into
rejections.

Delivery semantics: a returned task has every listed delivery acknowledged
by Kafka (at least once: a retried or re-run batch writes them again, with
the same message id header).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from bitroute_kernel import ColumnOverflowError, KernelError, expiry_states
from confluent_kafka import KafkaException
from pyspark import Broadcast, TaskContext

from compiler import Matcher
from compiler.alternates import match_alternates
from schemas.records import (
    ALTERNATE_EXCHANGE_HEADER,
    DELIVERIES,
    DELIVERY_ROUTER_HEADERS,
    EXPIRY_HEADER,
    MESSAGES,
    OUTCOME_CLEARED,
    OUTCOME_EXPIRED,
    OUTCOME_REJECTED,
    OUTCOME_ROUTED,
    OUTCOME_UNROUTABLE,
    PARTITION_COLUMNS,
    REPLAYED_HEADER,
    REPLAYED_VALUE,
    RETAIN_HEADER,
    SOURCE_PUBLISH,
    message_id,
)
from schemas.tables import ROUTED_PUBLISH, ROUTED_TASK, arrow_schema
from streaming.audit.files import AuditFile, write_table_files
from streaming.audit.storage import warehouse_filesystem
from streaming.audit.writer import PUBLISH_TABLES, deliveries_rows, messages_rows
from streaming.config import DeltaConfig
from streaming.errors import BitrouteError, KafkaAccessError
from streaming.kafka.errors import BATCH_ERRORS, MISSING_TOPIC_ERRORS
from streaming.kafka.layout import DeliveryLayout
from streaming.kafka.records import (
    PublishColumns,
    header_size,
    kept_headers,
    record_sizes,
    subscription_ids_json,
    text,
)
from streaming.kafka.topics import TopicCreationError, recreate_delivery_topic
from streaming.router.batch.delivery import (
    DeliveryColumns,
    DeliveryProducer,
    FailedRecord,
    ProducerSettings,
    cached_producer,
    delivery_records,
)
from streaming.router.batch.matching import cached_matcher
from streaming.router.batch.rejected import BadRecord, write_rejected
from streaming.router.replay.scope import ReplayScope
from streaming.router.retained import RetainPlan, RetainSettings, plan_retained, write_retained

ROUTED_ARROW = arrow_schema(ROUTED_PUBLISH)
"""Arrow schema of the rows :class:`RoutePartitions` returns (without ``RouteSettings.audit``)."""
ROUTED_TASK_ARROW = arrow_schema(ROUTED_TASK)
"""Arrow schema of the row a task returns when it writes its audit (``RouteSettings.audit``)."""

_ROUTER_HEADERS_SIZE = sum(header_size(n) for n in DELIVERY_ROUTER_HEADERS)
"""The router's headers' framing and names (their values are counted per delivery)."""
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskAudit:
    """What a routing task needs to write its batch's audit files (picklable).

    ``partitioned``: the publish tables in this version's layout (day partitions);
    a table an earlier version created unpartitioned gets files without the column.
    """

    delta: DeltaConfig
    batch_id: int
    routed_at: datetime
    partitioned: frozenset[str]
    replay_chunk: int | None = None
    """Set: the task routes this chunk of a replay (``RouteSettings.replay``) and writes
    only its ``deliveries`` file, rows marked ``replayed`` (``batch_id``: the replays'
    boundary batch)."""


@dataclass(frozen=True)
class RouteSettings:
    """Everything a routing task needs besides the snapshot (picklable).

    ``layout`` says where each delivery goes and how it is keyed; in the shared
    layout ``producer.keyed_partitions`` must be set, so that Kafka's default
    partitioner places the records (a ``ValueError`` says so otherwise).
    """

    default_exchange: str
    layout: DeliveryLayout
    rejected_topic: str
    snapshot_version: int
    with_headers: bool
    producer: ProducerSettings
    audit: TaskAudit | None = None
    """Set: each task writes its audit files and returns one ``ROUTED_TASK`` row."""
    incarnation: int = 0
    """The publishes topic's incarnation the batch reads, in its message ids
    (:mod:`streaming.router.topics.incarnations`)."""
    retain: RetainSettings | None = None
    """Set: MQTT retained publishes are written to the retained topic
    (:mod:`streaming.router.retained`)."""
    now_ms: int | None = None
    """The routing time (epoch ms) the publishes' expiry is decided at (None: the clock's,
    when the batch is planned)."""
    replay: ReplayScope | None = None
    """Set: the rows are a replay's chunk (:mod:`streaming.router.replay.scope`): only the
    replay's deliveries are made, marked :data:`schemas.records.REPLAYED_HEADER`, nothing is
    rejected or retained, and only the publishes with deliveries are returned."""
    alternates: Mapping[str, str] = field(default_factory=dict)
    """Each exchange's alternate exchange (``[exchanges.alternates]``): a publish its own
    exchange routes to no one is matched once on it. Empty (a replay's): none."""

    def __post_init__(self) -> None:
        if self.layout.shared and not self.producer.keyed_partitions:
            raise ValueError("the shared delivery layout needs ProducerSettings.keyed_partitions "
                             "(records keyed by subscriber, placed by Kafka's default partitioner)")


class RoutePartitions:
    """The ``mapInArrow`` function of one batch: see the module docstring.

    A module-level class, so that it pickles by reference and its calls reach the
    routing process's (a Python worker's, or the driver's) matcher and producer caches.
    """

    def __init__(self, broadcast: Broadcast, key: str, settings: RouteSettings) -> None:
        self._broadcast = broadcast
        self._key = key
        self.settings = settings

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        matcher = cached_matcher(self._key, lambda: self._broadcast.value)
        producer = cached_producer(self.settings.producer)
        if self.settings.audit is None:
            for batch in batches:
                yield route_safely(matcher, producer, batch, self.settings)
            return
        routed = [route_safely(matcher, producer, batch, self.settings) for batch in batches]
        if routed:
            yield write_task_audit(pa.Table.from_batches(routed, ROUTED_ARROW), self.settings)


def write_task_audit(routed: pa.Table, settings: RouteSettings) -> pa.RecordBatch:
    """Write the ``messages`` and ``deliveries`` files of a task's routed rows (every
    delivery in them acknowledged by Kafka); return the task's ``ROUTED_TASK_ARROW`` row."""
    audit = settings.audit
    if audit is None:
        raise ValueError("write_task_audit: the route settings carry no task audit (settings.audit)")
    filesystem, root = _warehouse(audit.delta)
    label = _task_label(audit)
    replayed = audit.replay_chunk is not None
    files: list[AuditFile] = []
    subscriptions = None
    for name in (DELIVERIES,) if replayed else PUBLISH_TABLES:
        if name == MESSAGES:
            rows = messages_rows(routed, settings.snapshot_version, audit.batch_id, audit.routed_at)
        else:
            rows = deliveries_rows(routed, settings.snapshot_version, audit.batch_id,
                                   audit.routed_at, settings.layout, replayed=replayed)
            if replayed:
                counts = pc.value_counts(pc.list_flatten(rows["subscription_ids"]).combine_chunks())
                subscriptions = list(zip(counts.field("values").to_pylist(),
                                         counts.field("counts").to_pylist(), strict=True))
        partition = PARTITION_COLUMNS[name] if name in audit.partitioned else None
        if partition is None:
            rows = rows.drop_columns([PARTITION_COLUMNS[name]])
        files += write_table_files(filesystem, f"{root}/{name}", name, rows, partition, label)
    deliveries = pc.sum(pc.list_value_length(routed["deliveries"])).as_py() or 0
    rejected = pc.sum(pc.equal(routed["outcome"], OUTCOME_REJECTED)).as_py() or 0
    expired = pc.sum(pc.equal(routed["outcome"], OUTCOME_EXPIRED)).as_py() or 0
    return pa.RecordBatch.from_pylist(
        [{"publishes": routed.num_rows, "deliveries": deliveries, "rejected": rejected,
          "files": [f.as_row() for f in files],
          "latency_ms": [] if replayed else latency_sample(routed), "expired": expired,
          "subscriptions": subscriptions}],
        schema=ROUTED_TASK_ARROW)


LATENCY_SAMPLE = 64
"""The most end-to-end latencies a routing task returns (evenly spaced over its publishes):
a few hundred bytes per task, whatever its size."""


def latency_sample(routed: pa.Table) -> list[int]:
    """At most :data:`LATENCY_SAMPLE` of ``routed``'s publishes' latencies in ms, publish
    timestamp to now (their deliveries are acknowledged)."""
    published = pc.drop_null(pc.cast(routed["published_at"], pa.timestamp("ms", tz="UTC"),
                                     safe=False).cast(pa.int64())).to_numpy(zero_copy_only=False)
    if not len(published):
        return []
    picked = published[np.linspace(0, len(published) - 1,
                                    min(len(published), LATENCY_SAMPLE)).astype(np.int64)]
    return (int(time.time() * 1000) - picked).tolist()


NOT_ABOUT_A_RECORD = (BitrouteError, KernelError, KafkaException, OSError, MemoryError)
"""What :func:`route_safely` lets fail the task instead of bisecting the batch into
rejections: failures of the cluster, the disk, the process or the kernel (a bug), none of
them the fault of a record. Anything else a batch raises is the poison-pill net's."""


@functools.lru_cache(maxsize=4)
def _warehouse(delta: DeltaConfig):
    """The warehouse's filesystem, made once per routing process (an object store's client)."""
    return warehouse_filesystem(delta)


def _task_label(audit: TaskAudit) -> str:
    """``b<batch>-t<partition>-a<attempt>`` in a Spark task (``r<chunk>-...`` for a replay's
    chunk); ``b<batch>-driver`` elsewhere."""
    who = (f"b{audit.batch_id:010d}" if audit.replay_chunk is None
           else f"r{audit.replay_chunk:010d}")
    task = TaskContext.get()
    if task is None:
        return f"{who}-driver"
    return f"{who}-t{task.partitionId():05d}-a{task.attemptNumber()}"


def route_safely(matcher: Matcher, producer: DeliveryProducer, batch: pa.RecordBatch,
                 settings: RouteSettings) -> pa.RecordBatch:
    """:func:`route_batch`, bisecting around records that make it raise (see module docstring)."""
    try:
        return route_batch(matcher, producer, batch, settings)
    except ColumnOverflowError:
        if batch.num_rows <= 1:
            raise  # one publish cannot fill Arrow's 32-bit offsets: a kernel bug
        half = batch.num_rows // 2
        return pa.concat_batches([route_safely(matcher, producer, batch.slice(0, half), settings),
                                  route_safely(matcher, producer, batch.slice(half), settings)])
    except NOT_ABOUT_A_RECORD:
        raise  # the task fails, the batch is retried and reported
    except Exception as exc:  # noqa: BLE001 - the poison-pill net: any error of a record
        if batch.num_rows <= 1:
            if settings.replay is not None:  # the live routing rejected it, or delivered it
                _log.warning("replay: leaving out one publish that failed routing: %s: %s",
                             type(exc).__name__, exc)
                return pa.RecordBatch.from_pylist([], schema=ROUTED_ARROW)
            return _unroutable_record(producer, batch, settings, exc)
        half = batch.num_rows // 2
        _log.warning("routing %d publishes raised %s; splitting the batch to find the record",
                     batch.num_rows, type(exc).__name__)
        return pa.concat_batches([route_safely(matcher, producer, batch.slice(0, half), settings),
                                  route_safely(matcher, producer, batch.slice(half), settings)])


@dataclass
class BatchPlan:
    """What a batch's publishes become, decided before anything is written.

    ``reasons[row]`` is why publish ``row`` is rejected (None: it is routed or
    unroutable); ``deliveries`` are the matcher's, ``owner[i]`` the publish of
    flattened delivery ``i``, ``send`` the deliveries to write (those of
    publishes that are not rejected).
    """

    publishes: PublishColumns
    reasons: list[str | None]
    deliveries: pa.ListArray
    entries: pa.StructArray
    subscribers: pa.Array
    owner: np.ndarray
    ids_json: pa.Array
    ok: np.ndarray
    send: np.ndarray
    message_ids: list[str]
    keys: list[bytes | None]
    values: list[bytes | None]
    kept: list
    version: bytes
    retain: RetainPlan | None = None
    """The batch's retained publishes (``ok`` is False for those that clear: they are
    delivered to no one)."""
    retain_as_published: frozenset[str] = frozenset()
    """The snapshot's subscriptions with Retain As Published (:mod:`compiler.options`)."""
    expiry: ExpiryPlan | None = None
    """The batch's publishes with an expiry header (``ok`` is False for the expired)."""
    via: list[str | None] | None = None
    """Per publish, the alternate exchange whose subscriptions its deliveries are (None:
    its own exchange's; the list None when no publish of the batch went through one)."""


@dataclass(frozen=True)
class ExpiryPlan:
    """A batch's message expiry (kernel/core/src/expiry.rs): per row whether its lifetime
    ended before it was routed (``expired``: delivered to no one), and the remaining
    interval (seconds) each live row with an expiry header carries on its deliveries."""

    expired: np.ndarray
    remaining: dict[int, int]


def plan_expiry(publishes: PublishColumns, reasons: list[str | None],
                now_ms: int) -> ExpiryPlan | None:
    """The expiry of a batch's publishes at ``now_ms`` (None: no publish has an expiry
    header); a publish whose header is not an interval, and not rejected already, gets its
    reason in ``reasons`` (the order of ``RouteTable.route_at``)."""
    rows, values = publishes.last_values(EXPIRY_HEADER)
    if not rows:
        return None
    published = pc.cast(pc.cast(publishes.published_at.take(pa.array(rows, pa.int64())),
                                pa.timestamp("ms", tz="UTC"), safe=False), pa.int64())
    published_ms = [now_ms if p is None else p for p in published.to_pylist()]
    expired = np.zeros(publishes.n, dtype=bool)
    remaining: dict[int, int] = {}
    for row, state in zip(rows, expiry_states(values, published_ms, now_ms), strict=True):
        if reasons[row] is not None:
            continue
        if isinstance(state, str):
            reasons[row] = state
        elif state == 0:
            expired[row] = True
        else:
            remaining[row] = state
    return ExpiryPlan(expired, remaining)


def _with_alternate(kept: list, via: list[str | None] | None) -> list:
    """``kept`` (per publish its kept headers) with :data:`ALTERNATE_EXCHANGE_HEADER` last on
    each publish routed through an alternate exchange, as its deliveries carry it."""
    if via is None:
        return kept
    return [k if v is None else [*k, (ALTERNATE_EXCHANGE_HEADER, v.encode())]
            for k, v in zip(kept, via, strict=True)]


def kept_header_columns(plan: BatchPlan) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """The publishes' kept headers as their deliveries carry them (``PublishColumns.
    kept_header_columns``), each ``expiry`` header of a live publish set to its remaining
    interval (MQTT 5: the received value minus the time the message waited), and
    :data:`ALTERNATE_EXCHANGE_HEADER` last on a publish routed through an alternate."""
    offsets, names, values = plan.publishes.kept_header_columns()
    if plan.via is not None:
        offsets, names, values = _alternate_header_columns(plan.via, offsets, names, values)
    if plan.expiry is None or not plan.expiry.remaining:
        return offsets, names, values
    remaining = plan.expiry.remaining
    at = np.flatnonzero(pc.equal(names, EXPIRY_HEADER).to_numpy(zero_copy_only=False))
    rows = (np.searchsorted(offsets, at, side="right") - 1).tolist()
    live = [(i, row) for i, row in zip(at.tolist(), rows, strict=True) if row in remaining]
    if not live:
        return offsets, names, values
    mask = np.zeros(len(values), dtype=bool)
    mask[[i for i, _ in live]] = True
    new = pa.array([str(remaining[row]).encode() for _, row in live], pa.binary())
    return offsets, names, pc.replace_with_mask(values.cast(pa.binary()), pa.array(mask), new)


def _alternate_header_columns(via: list[str | None], offsets: np.ndarray, names: pa.Array,
                              values: pa.Array) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """Header columns ``(offsets, names, values)`` with one entry more, last, in each row
    ``r`` that has ``via[r]``: the alternate exchange header."""
    rows = np.array([r for r, v in enumerate(via) if v is not None], dtype=np.int64)
    n = len(offsets) - 1
    added = np.zeros(n, dtype=np.int64)
    added[rows] = 1
    own = (offsets[1:] - offsets[:-1]).astype(np.int64)
    new_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(own + added, out=new_offsets[1:])
    # Entry i of row r moves by the entries added in the rows before r.
    before = np.cumsum(added) - added
    source = np.empty(int(new_offsets[-1]), dtype=np.int64)
    entries = len(names)
    source[np.arange(entries) + np.repeat(before, own)] = np.arange(entries)
    source[new_offsets[rows + 1] - 1] = entries + np.arange(len(rows))
    take = pa.array(source)
    extra = [via[r] for r in rows.tolist()]
    return (new_offsets,
            pa.concat_arrays([names.cast(pa.string()),
                              pa.array([ALTERNATE_EXCHANGE_HEADER] * len(rows), pa.string())]
                             ).take(take),
            pa.concat_arrays([values.cast(pa.binary()),
                              pa.array([v.encode() for v in extra], pa.binary())]).take(take))


def plan_batch(matcher: Matcher, batch: pa.RecordBatch, settings: RouteSettings) -> BatchPlan:
    """Match and validate one Arrow batch of Kafka rows: everything decided before writing."""
    publishes = PublishColumns(batch, settings.default_exchange, settings.incarnation)
    n = publishes.n
    header_lists = publishes.header_lists()
    message_ids, keys = publishes.message_ids.to_pylist(), publishes.keys.to_pylist()
    headers = header_lists if settings.with_headers else None
    deliveries, errors = matcher.match_columns(message_ids, publishes.exchanges, keys, headers)
    deliveries, via = match_alternates(matcher, settings.alternates, message_ids,
                                       publishes.exchanges, keys, headers, deliveries, errors)
    reasons: list[str | None] = errors.tolist()
    for row, reason in publishes.exchange_errors.items():
        reasons[row] = reason
    retain = plan_retained(publishes.headers, publishes.values, publishes.exchanges, reasons,
                           settings.retain)
    now_ms = settings.now_ms if settings.now_ms is not None else int(time.time() * 1000)
    expiry = plan_expiry(publishes, reasons, now_ms)
    expired = expiry.expired if expiry is not None else None

    kept = [kept_headers(h) for h in header_lists]
    entries = deliveries.flatten()
    subscribers, subscription_ids = entries.flatten()
    owner = pc.list_parent_indices(deliveries).to_numpy(zero_copy_only=False)
    ids_json = subscription_ids_json(subscription_ids)
    version = str(settings.snapshot_version).encode()
    per_delivery = (pc.binary_length(ids_json).to_numpy(zero_copy_only=False)
                    + settings.layout.key_bytes(subscribers))
    _reject_oversize(publishes, _with_alternate(kept, via), owner, per_delivery, len(version),
                     reasons, settings.producer.max_record_bytes, expired)
    ok = np.fromiter((r is None for r in reasons), dtype=bool, count=n)
    if retain is not None:
        ok &= ~retain.cleared
    if expired is not None:
        ok &= ~expired
        if retain is not None:  # an expired retained publish leaves its topic none: cleared
            retain.cleared[retain.rows] |= expired[retain.rows]
    send = np.flatnonzero(ok[owner]) if len(owner) else np.zeros(0, np.int64)
    return BatchPlan(publishes, reasons, deliveries, entries, subscribers, owner, ids_json, ok,
                     send, message_ids, keys, publishes.values.to_pylist(), kept, version, retain,
                     matcher.retain_as_published, expiry, via)


def delivery_columns(plan: BatchPlan, settings: RouteSettings) -> DeliveryColumns:
    """The records to produce for ``plan.send``, in ``settings.layout``, as columns (no
    Python object per record: the kernel's delivery writer reads the Arrow buffers), made
    by the one builder of delivery records (:func:`streaming.router.batch.delivery.delivery_records`).

    Record ``i`` is flattened delivery ``plan.send[i]``, of publish ``rows[i]``: its
    topic and key as the layout says, its publish's payload as value, and its publish's
    kept headers (an ``expiry`` header with the remaining interval, then the alternate
    exchange's header on a publish routed through one: :func:`kept_header_columns`),
    marked ``bitroute.replayed: true`` for a replay (``settings.replay``), then the
    router's headers.

    A live delivery of a retained publish keeps its ``retain`` header only when one of
    its subscriptions has Retain As Published (MQTT 5.0, 3.8.3.1): the others are records
    of a copy of the publish's row without it (rows ``n`` and up, see :func:`_unretained`).
    """
    publishes = plan.publishes
    send = pa.array(plan.send, pa.int64())
    rows = plan.owner[plan.send].astype(np.int64)
    header_offsets, header_names, header_values = kept_header_columns(plan)
    routing_keys, values, message_ids = publishes.keys, publishes.values, publishes.message_ids
    if plan.retain is not None and len(plan.retain.rows):
        rows, header_offsets, header_names, header_values, routing_keys, values, message_ids = \
            _unretained(plan, plan.retain, rows, header_offsets, header_names, header_values)
    return delivery_records(
        settings.layout, plan.subscribers.take(send), rows, routing_keys, values,
        header_offsets, header_names, header_values, message_ids, plan.ids_json.take(send),
        plan.version,
        mark=(REPLAYED_HEADER, REPLAYED_VALUE) if settings.replay is not None else None)


def _unretained(plan: BatchPlan, retain: RetainPlan, rows: np.ndarray, header_offsets: np.ndarray,
                header_names: pa.Array, header_values: pa.Array):
    """The delivery columns with each live delivery of a retained publish that none of its
    subscriptions asks Retain As Published of pointed at a copy of its publish's row
    without the ``retain`` header (MQTT 5.0, 3.3.1.3: the server "MUST set the RETAIN flag
    to 0" when forwarding it to a subscription without it). Returns ``(rows,
    header_offsets, header_names, header_values, routing_keys, values, message_ids)``;
    only a batch with retained publishes gets here."""
    publishes = plan.publishes
    retained = set(retain.rows.tolist())
    ids = plan.entries.flatten()[1]
    copies: dict[int, int] = {}
    rows = rows.copy()
    for i, row in enumerate(rows.tolist()):
        if row in retained and plan.retain_as_published.isdisjoint(ids[int(plan.send[i])].as_py()):
            rows[i] = copies.setdefault(row, publishes.n + len(copies))
    if not copies:
        return (rows, header_offsets, header_names, header_values, publishes.keys,
                publishes.values, publishes.message_ids)
    kept, counts = [], []
    for row in copies:
        entries = [h for h in range(int(header_offsets[row]), int(header_offsets[row + 1]))
                   if header_names[h].as_py() != RETAIN_HEADER]
        kept += entries
        counts.append(len(entries))
    offsets = np.concatenate([header_offsets, header_offsets[-1] + np.cumsum(counts)]).astype(
        np.int32)
    entries = pa.array(kept, pa.int64())
    source = pa.array(list(copies), pa.int64())

    def extended(column: pa.Array, take: pa.Array) -> pa.Array:
        return pa.concat_arrays([column, column.take(take)])

    return (rows, offsets, extended(header_names, entries), extended(header_values, entries),
            extended(publishes.keys, source), extended(publishes.values, source),
            extended(publishes.message_ids, source))


def route_batch(matcher: Matcher, producer: DeliveryProducer, batch: pa.RecordBatch,
                settings: RouteSettings) -> pa.RecordBatch:
    """Route one Arrow batch of Kafka rows, producing with ``producer``; return its
    ``ROUTED_ARROW`` rows (the deliveries listed are the ones Kafka acknowledged; for a
    replay's chunk, ``settings.replay``, only the publishes with deliveries)."""
    replay = settings.replay
    if replay is not None:
        if not settings.with_headers:
            batch = replay.matching_keys_only(matcher, batch)
        if not batch.num_rows:
            return pa.RecordBatch.from_pylist([], schema=ROUTED_ARROW)
    plan = plan_batch(matcher, batch, settings)
    if replay is not None:
        plan = replay.narrowed(plan, batch)
    columns = delivery_columns(plan, settings)
    reasons, owner = plan.reasons, plan.owner
    acked = plan.ok[owner] if len(owner) else np.zeros(0, dtype=bool)
    failed = deliver(producer, columns, settings.layout)
    if failed:
        # Each failure names its record (its index in the columns): reject its publish
        # with Kafka's reason (a replay rejects nothing: the delivery is left out); a
        # refused publish lists only the deliveries Kafka acknowledged.
        for failure in failed:
            row = int(owner[plan.send[failure.tag]])
            if replay is not None:
                _log.warning(f"replay: {_why(failure)} (left out)")
            else:
                reasons[row] = reasons[row] or _why(failure)
        acked[plan.send[sorted({failure.tag for failure in failed})]] = False
    if replay is not None:
        routed = _routed_rows(plan.publishes, reasons, plan.deliveries, plan.entries, owner, acked)
        return routed.filter(pc.greater(pc.list_value_length(routed.column("deliveries")), 0))
    _report_rejected(producer, settings, reasons, plan.keys, plan.values, plan.kept,
                     plan.message_ids)
    if plan.retain is not None and settings.retain is not None:  # both or neither (plan_retained)
        published = pc.cast(pc.cast(plan.publishes.published_at, pa.timestamp("ms", tz="UTC"),
                                    safe=False), pa.int64())
        write_retained(producer, plan.retain, settings.retain, plan.publishes.exchanges, plan.keys,
                       plan.values, plan.kept, plan.message_ids, published.to_pylist(), reasons)
    cleared = plan.retain.cleared if plan.retain is not None else None
    expired = plan.expiry.expired if plan.expiry is not None else None
    return _routed_rows(plan.publishes, reasons, plan.deliveries, plan.entries, owner, acked,
                        cleared, expired, plan.via)


def deliver(producer: DeliveryProducer, columns: DeliveryColumns,
            layout: DeliveryLayout) -> list[FailedRecord]:
    """Produce ``columns`` and wait for Kafka's verdict: the routing entry point of every
    delivery (a batch's, a replay's chunk's, the retained messages of new subscriptions).

    A record batch the broker refused for one record in it is written again a record
    at a time (:func:`_refused`), a deleted delivery topic is created again and its
    deliveries written once more (:func:`_recreated`); returns the deliveries that still
    failed for a reason of their own (each naming its index in ``columns``). A failure
    not about a record raises (:meth:`DeliveryProducer.flush`).
    """
    producer.produce_deliveries(columns)
    return _recreated(producer, layout, _refused(producer, producer.flush(), columns), columns)


def _reject_oversize(publishes: PublishColumns, kept: list, owner: np.ndarray,
                     per_delivery: np.ndarray, version_bytes: int, reasons: list[str | None],
                     limit: int, expired: np.ndarray | None = None) -> None:
    """Reject every publish with a delivery larger than ``limit`` bytes (a record the broker
    refuses), but an ``expired`` one (delivered to no one). A delivery is its publish's key,
    payload, kept headers and message id, the router's fixed headers, and
    ``per_delivery[i]`` bytes of its own (aligned with ``owner``)."""
    base = (record_sizes(publishes.keys, publishes.values, kept) + _ROUTER_HEADERS_SIZE
            + version_bytes + pc.binary_length(publishes.message_ids).to_numpy())
    largest = base.copy()
    if len(owner):
        np.maximum.at(largest, owner, base[owner] + per_delivery)
    for row in np.flatnonzero(largest > limit).tolist():
        if reasons[row] is None and (expired is None or not expired[row]):
            reasons[row] = (f"a delivery of this publish would be {int(largest[row]):,} bytes, more "
                            f"than kafka.max_delivery_bytes ({limit:,}): the broker would refuse it")


def _refused(producer: DeliveryProducer, failed: list[FailedRecord],
             columns: DeliveryColumns) -> list[FailedRecord]:
    """Of the deliveries that failed, those Kafka refuses for a reason of their own.

    Each failure names its record, but a broker refuses a whole record batch for
    one record in it (:data:`~streaming.kafka.errors.BATCH_ERRORS`): such a
    failure is written again on its own, one at a time (a refused batch wrote none
    of its records), and only a refusal then counts. Rare, and through
    confluent-kafka: a flush per record.
    """
    refused = [f for f in failed if f.code not in BATCH_ERRORS]
    for failure in (f for f in failed if f.code in BATCH_ERRORS):
        producer.produce_tagged(*columns.record(failure.tag), failure.tag)
        refused += producer.flush()
    return refused


def _recreated(producer: DeliveryProducer, layout: DeliveryLayout, failed: list[FailedRecord],
               columns: DeliveryColumns) -> list[FailedRecord]:
    """Deliveries refused because their topic does not exist (an administrator deleted
    it while subscriptions feed it): the topic is created again, as the layout says, and
    they are written once more; returns what still fails. A topic the router may not
    create fails its deliveries with a reason naming the subscriber and the grant; the
    same publishes' other deliveries are unaffected."""
    missing = [f for f in failed if f.code in MISSING_TOPIC_ERRORS]
    if not missing:
        return failed
    still = [f for f in failed if f.code not in MISSING_TOPIC_ERRORS]
    refused = {}
    for topic in sorted({f.topic for f in missing}):
        subscriber = layout.subscriber_of(topic)
        whose = f" of subscriber {subscriber}" if subscriber is not None else ""
        try:
            if recreate_delivery_topic(producer.settings.client, layout, topic):
                _log.warning(f"the delivery topic {topic}{whose} did not exist (deleted while "
                             f"subscriptions feed it): created it again with {layout.partitions} "
                             "partitions")
        except (KafkaAccessError, TopicCreationError) as exc:
            refused[topic] = (f"the delivery topic {topic}{whose} does not exist and the router "
                              f"could not create it: {exc}")
    for failure in missing:
        if failure.topic in refused:
            still.append(dataclasses.replace(failure, reason=refused[failure.topic]))
        else:
            producer.produce_tagged(*columns.record(failure.tag), failure.tag)
    return still + producer.flush()


def _why(failure: FailedRecord) -> str:
    return f"Kafka refused the delivery to {failure.topic}: {failure.reason}"


def _report_rejected(producer: DeliveryProducer, settings: RouteSettings, reasons: list,
                     keys: list, values: list, kept: list, message_ids: list[str]) -> None:
    """Write every rejected publish to the rejected topic
    (:func:`streaming.router.batch.rejected.write_rejected`, its failure policy);
    ``reasons`` gains what became of each copy."""
    rejected = [r for r, reason in enumerate(reasons) if reason is not None]
    if not rejected:
        return
    final, _ = write_rejected(producer, settings.rejected_topic, [
        BadRecord(keys[row], values[row], kept[row], reasons[row], SOURCE_PUBLISH, message_ids[row])
        for row in rejected], settings.producer.max_record_bytes)
    for row, reason in zip(rejected, final, strict=True):
        reasons[row] = reason


def _routed_rows(publishes: PublishColumns, reasons: list[str | None], deliveries: pa.ListArray,
                 entries: pa.StructArray, owner: np.ndarray, acked: np.ndarray,
                 cleared: np.ndarray | None = None,
                 expired: np.ndarray | None = None,
                 via: list[str | None] | None = None) -> pa.RecordBatch:
    n = publishes.n
    keep = np.flatnonzero(acked) if len(owner) else np.zeros(0, np.int64)
    counts = np.bincount(owner[keep], minlength=n) if len(keep) else np.zeros(n, np.int64)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    acked_entries = entries.take(pa.array(keep, pa.int64()))
    routed = pa.ListArray.from_arrays(pa.array(offsets), acked_entries)
    reason_array = pa.array(reasons, pa.string())
    outcome = np.where(np.array([r is not None for r in reasons], dtype=bool), OUTCOME_REJECTED,
                       np.where(counts > 0, OUTCOME_ROUTED, OUTCOME_UNROUTABLE))
    if cleared is not None:  # a retained publish that cleared its topic: delivered to no one
        outcome = np.where(cleared & (outcome != OUTCOME_REJECTED), OUTCOME_CLEARED, outcome)
    if expired is not None:  # its lifetime ended before it was routed: delivered to no one
        outcome = np.where(expired & (outcome != OUTCOME_REJECTED), OUTCOME_EXPIRED, outcome)
    exchanges = pa.array(publishes.exchanges, pa.string())
    if via is None:
        alternate = pa.nulls(n, pa.string())
    else:  # a publish that is not routed after all (rejected, expired) went through none
        alternate = pa.array([v if o == OUTCOME_ROUTED else None for v, o in zip(via, outcome, strict=True)],
                             pa.string())
    columns = [publishes.message_ids, exchanges, text(publishes.keys), pa.array(outcome, pa.string()),
               reason_array, routed, publishes.header_map(), publishes.payload_bytes(),
               publishes.published_at, alternate]
    return pa.RecordBatch.from_arrays(
        [c.cast(f.type) for c, f in zip(columns, ROUTED_ARROW, strict=True)], schema=ROUTED_ARROW)


def _unroutable_record(producer: DeliveryProducer, batch: pa.RecordBatch, settings: RouteSettings,
                       error: Exception) -> pa.RecordBatch:
    """The row of a record that made routing raise on its own: rejected with the error as reason."""
    last = traceback.extract_tb(error.__traceback__)[-1:] if error.__traceback__ else []
    where = f" at {last[0].name}" if last else ""
    reason = f"routing this publish failed: {type(error).__name__}: {error}{where}"
    _log.warning("rejecting one publish that failed routing: %s", reason)
    columns = {name: batch.column(i) for i, name in enumerate(batch.schema.names)}
    mid = message_id(columns["topic"][0].as_py(), columns["partition"][0].as_py(),
                     columns["offset"][0].as_py(), settings.incarnation)
    key = columns["key"][0].as_py()
    try:
        headers = kept_headers([(h["key"], h["value"]) for h in (columns["headers"][0].as_py() or [])])
    except Exception:  # noqa: BLE001 - the headers may be what failed
        headers = []
    reasons = [reason]
    _report_rejected(producer, settings, reasons, [key], [columns["value"][0].as_py()], [headers],
                     [mid])
    empty = pa.array([[]], ROUTED_ARROW.field("deliveries").type)
    key_text = None if key is None else key.decode("utf-8", "backslashreplace")
    return pa.RecordBatch.from_arrays([
        pa.array([mid], pa.string()), pa.array([None], pa.string()),
        pa.array([key_text], pa.string()), pa.array([OUTCOME_REJECTED]), pa.array(reasons),
        empty, pa.array([None], ROUTED_ARROW.field("headers").type),
        pa.array([len(columns["value"][0].as_py() or b"")], pa.int32()),
        columns["timestamp"].slice(0, 1).cast(ROUTED_ARROW.field("published_at").type),
        pa.nulls(1, pa.string()),
    ], schema=ROUTED_ARROW)

"""Following the compacted subscription changelog in the driver.

The changelog (``config.kafka.subscriptions_topic``) is keyed by
subscription id; a value is ``{exchange, subscriber, filter, headers?}`` as
JSON, a null value (tombstone) removes the subscription. The router's state
is a function of the latest record per key, like the compacted topic itself,
so a restart, or a rebuild after compaction, reaches the same state:

- a valid value upserts the subscription;
- a tombstone removes it (a tombstone for an unknown id is recorded and
  changes nothing);
- an invalid value (malformed JSON, invalid filter, unknown exchange, bad
  subscriber name, bad header criteria, no key) is rejected with a reason:
  it goes to the rejected topic and, as ``change = "rejected"``, to the
  Delta ``subscriptions`` table (both written by
  :mod:`streaming.router.subscriptions.subscription_sync`). When it replaces a live subscription,
  that subscription is removed and the row says ``change = "remove"`` with
  the reason, because after compaction the invalid value is all the changelog
  holds for that id.

This module is the subscription state alone: it reads the changelog and
applies it to the :class:`~compiler.RoutingIndex`, and makes snapshot
versions of it, which it hands to their owner
(:class:`~streaming.router.subscriptions.snapshots.BatchSnapshots`). :meth:`Subscriptions.catch_up`
reads every partition up to the end offsets fetched when it is called (the
happens-before guarantee: a change Kafka acknowledged before the call is in
the index when it returns). A catch-up that read any record returns a
:class:`PendingVersion` (the next snapshot version: its changes, the rejected
records among them, the offsets it covers), already applied to the index; the
caller writes what the version implies, then makes it current with
:meth:`Subscriptions.commit` (the version's bytes and whether it reads headers
go to :meth:`BatchSnapshots.commit`, which persists them) or drops it with
:meth:`Subscriptions.rollback` (the index goes back to the current version and
the next catch-up re-reads the records). :mod:`streaming.router.subscriptions.subscription_sync`
does that writing, in the order that makes a crash safe.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from confluent_kafka import OFFSET_BEGINNING, KafkaError, Message, TopicPartition

from compiler import (
    CompilerError,
    Dialect,
    RoutingIndex,
    Snapshot,
    SnapshotFormatError,
    Subscription,
    SubscriptionError,
)
from schemas.records import (
    CHANGE_REJECTED,
    CHANGE_REMOVE,
    CHANGE_UPSERT,
    REASON_HEADER,
    SUBSCRIPTION_REQUIRED_FIELDS,
)
from streaming.config import MODE_REALTIME, Config, LimitsConfig
from streaming.kafka.clients import OnError, access_failure, consumer, record_headers, record_position
from streaming.kafka.errors import KAFKA_TIMEOUT_S
from streaming.router.errors import ChangelogError
from streaming.router.replay.requests import ReplayRequest, check_request, request_of
from streaming.router.subscriptions.limits import check_limits
from streaming.router.subscriptions.snapshots import BatchSnapshots, SnapshotVersion

CATCH_UP_TIMEOUT_S = 60.0
"""A catch-up that cannot read the changelog to its end offsets in this time fails the batch."""
POLL_MAX_RECORDS = 1000
_POLL_TIMEOUT_S = 0.02
"""One ``consume`` call's wait. librdkafka's ``consume`` returns once it holds
``POLL_MAX_RECORDS`` records or at this timeout, and the read ends at the end
offsets whatever it waits: with 0.5 s every catch-up that found a few new
changes (a batch after a subscribe) waited out the 0.5 s (docs/benchmarks-history.md,
"The batch cycle"); a short wait costs only a few more turns of the loop."""
_FETCH_WAIT_MS = 10


class Change(NamedTuple):
    """One changelog record as the router applied it: a row of Delta ``subscriptions``
    without its snapshot version, times as epoch milliseconds."""

    subscription_id: str
    change: str
    exchange: str | None
    subscriber: str | None
    filter: str | None
    header_match: str | None
    header_criteria: dict[str, str | None] | None
    reason: str | None
    changelog_partition: int
    changelog_offset: int
    changed_at_ms: int | None
    applied_at_ms: int
    retain_handling: int | None = None
    """An upsert's MQTT Retain Handling (0, 1, 2; :mod:`compiler.options`), else None."""
    retain_as_published: bool | None = None
    """An upsert's MQTT Retain As Published, else None."""
    existed: bool | None = None
    """An upsert's: whether its id was live before this record (Retain Handling 1)."""
    no_local: bool | None = None
    """An upsert's MQTT No Local, else None."""


SINCE_REFUSED_IN_REALTIME = ('a replay ("since") is served by streaming.mode = "microbatch", '
                             'not by the realtime mode this router runs')
"""The reason a subscription asking for a replay is rejected in realtime mode."""


def apply_record(index: RoutingIndex, key: bytes | None, value: bytes | None, partition: int,
                 offset: int, changed_at_ms: int | None, applied_at_ms: int,
                 headers: Sequence[tuple[str, bytes | None]] | None = None,
                 replays: list[ReplayRequest] | None = None,
                 refuse_since: str | None = None, limits: LimitsConfig | None = None) -> Change:
    """Apply one changelog record to ``index``; never raises for a bad record. A tombstone's
    ``bitroute.reason`` header (``bitroute retire`` writes one) is its removal's reason.
    An upsert with ``since`` is checked (:func:`~streaming.router.replay.requests.check_request`)
    and, applied, appends its :class:`ReplayRequest` to ``replays``; with ``refuse_since``
    (a mode that cannot replay) it is an invalid value, with that reason; with ``limits``, an
    upsert that breaks one is an invalid value
    (:func:`streaming.router.subscriptions.limits.check_limits`)."""
    sub_id = "" if key is None else key.decode("utf-8", errors="replace")
    where = (partition, offset, changed_at_ms, applied_at_ms)
    if value is None:
        if key is None:
            return Change(sub_id, CHANGE_REJECTED, None, None, None, None, None,
                          "tombstone without a key", *where)
        index.remove(sub_id)
        return Change(sub_id, CHANGE_REMOVE, None, None, None, None, None,
                      _header_text(headers, REASON_HEADER), *where)
    try:
        sub = Subscription.from_changelog(key, value)
        if refuse_since is not None and sub.since is not None:
            raise SubscriptionError(refuse_since)
        check_request(index, sub, changed_at_ms if changed_at_ms is not None else applied_at_ms)
        existed = sub_id in index
        if limits is not None:
            check_limits(index, sub, limits)
        index.upsert(sub)
    except CompilerError as exc:
        exchange, subscriber, filter_ = _fields_of(value)
        if key is not None and index.remove(sub_id):
            reason = (f"{exc} (the subscription {sub_id!r} is removed: this invalid value is "
                      "its latest changelog record)")
            return Change(sub_id, CHANGE_REMOVE, exchange, subscriber, filter_, None, None,
                          reason, *where)
        return Change(sub_id, CHANGE_REJECTED, exchange, subscriber, filter_, None, None,
                      str(exc), *where)
    if sub.since is not None and replays is not None:
        replays.append(request_of(sub, partition, offset))
    criteria = sub.headers
    options = (sub.options.retain_handling, sub.options.retain_as_published, existed,
               sub.options.no_local)
    if criteria is None:
        return Change(sub.id, CHANGE_UPSERT, sub.exchange, sub.subscriber, sub.filter, None, None,
                      None, *where, *options)
    return Change(sub.id, CHANGE_UPSERT, sub.exchange, sub.subscriber, sub.filter, criteria.match,
                  dict(criteria.criteria), None, *where, *options)


def _header_text(headers: Sequence[tuple[str, bytes | None]] | None, name: str) -> str | None:
    """The last value of header ``name`` as text, None when absent."""
    found = [v for n, v in headers or () if n == name and v is not None]
    return found[-1].decode("utf-8", errors="replace")[:1000] if found else None


class ChangelogReader:
    """Reads the changelog's partitions from given offsets up to their current end.

    No consumer group: partitions are assigned explicitly and nothing is
    committed to Kafka; the position lives in the router's snapshots.
    """

    def __init__(self, config: Config, on_error: OnError | None = None,
                 topic: str | None = None) -> None:
        """``topic``: another compacted topic read the same way (default: the changelog;
        :mod:`streaming.router.retained` reads the retained messages with it)."""
        self._topic = topic or config.kafka.subscriptions_topic
        # librdkafka insists on a group id; it is never joined or committed to.
        self._consumer = consumer(config.kafka.client_settings, "bitroute-router-changelog", {
            "enable.partition.eof": True,
            # A fetch at the end of a partition waits this long on the broker for
            # more, and the next catch-up's end-offset requests wait behind it on
            # the same connection (Kafka's default: 500 ms per catch-up).
            "fetch.wait.max.ms": _FETCH_WAIT_MS,
            "auto.offset.reset": "earliest",
        }, on_error=on_error)

    def end_offsets(self) -> dict[int, int]:
        """Each partition's end offset (the next offset Kafka will assign), fetched now."""
        metadata = self._consumer.topics(KAFKA_TIMEOUT_S, self._topic)
        topic = metadata.topics.get(self._topic)
        if topic is not None and topic.error is not None:
            denied = access_failure(self._consumer.errors.settings, topic.error, "Read", "topic",
                                    self._topic)
            if denied is not None:
                raise denied
        if topic is None or topic.error is not None:
            raise ChangelogError(f"changelog topic {self._topic!r} is not available: "
                                 f"{topic.error if topic else 'no such topic'}")
        ends = {}
        for partition in sorted(topic.partitions):
            _, high = self._consumer.get_watermark_offsets(
                TopicPartition(self._topic, partition), timeout=KAFKA_TIMEOUT_S, cached=False)
            ends[partition] = high
        return ends

    def read_to_end(self, offsets: Mapping[int, int], apply: Callable[[Message], object],
                    timeout: float = CATCH_UP_TIMEOUT_S,
                    progress: Callable[[int, int], None] | None = None) -> dict[int, int]:
        """Call ``apply`` on each record from ``offsets`` (partition -> next offset;
        absent = from the beginning) up to the end offsets fetched at call time,
        in offset order per partition; return the new offsets (partition -> end).

        ``progress(done, total)``, when given, is called in this thread with
        the offsets covered so far and the offsets to cover in all (the end
        offsets minus ``offsets``, a partition absent from ``offsets`` counting
        from 0; compacted-away offsets count as covered): ``(0, total)`` before
        reading, after each poll, and ``(total, total)`` once every partition
        is at its end offset. An exception from it ends the catch-up.
        """
        ends = self.end_offsets()
        for partition, end in ends.items():
            if offsets.get(partition, 0) > end:
                raise ChangelogError(
                    f"changelog {self._topic!r} partition {partition} ends at {end} but the router "
                    f"has read up to {offsets[partition]}: the topic was truncated or recreated; "
                    "start the router with a fresh checkpoint folder")
        todo = {p for p, end in ends.items() if offsets.get(p, 0) < end}
        position = {p: offsets.get(p, 0) for p in todo}
        total = sum(ends[p] - position[p] for p in todo)
        if progress is not None:
            progress(0, total)
        if todo:
            self._consumer.assign([TopicPartition(self._topic, p, offsets.get(p, OFFSET_BEGINNING))
                                   for p in sorted(todo)])
            deadline = time.monotonic() + timeout
            try:
                while todo:
                    if time.monotonic() > deadline:
                        raise ChangelogError(
                            f"changelog {self._topic!r} partitions {sorted(todo)} not read up to "
                            f"their end offsets within {timeout:.0f}s")
                    # At most what is left of the range: the last record ends the wait
                    # (asking for more waited out the poll timeout on every catch-up).
                    left = sum(ends[p] - position[p] for p in todo)
                    messages = self._consumer.consume(min(POLL_MAX_RECORDS, max(1, left)),
                                                      _POLL_TIMEOUT_S)
                    self._consumer.errors.check()
                    for message in messages:
                        partition = message.partition()
                        if partition not in todo:
                            continue
                        error = message.error()
                        if error is not None:
                            if error.code() == KafkaError._PARTITION_EOF:
                                if message.offset() >= ends[partition]:
                                    todo.discard(partition)
                                    position[partition] = ends[partition]
                            elif (failure := access_failure(self._consumer.errors.settings, error, "Read",
                                                            "topic", self._topic)) is not None:
                                raise failure
                            elif error.fatal():
                                raise ChangelogError(f"reading changelog {self._topic!r}: {error.str()}")
                            continue
                        if message.offset() < ends[partition]:
                            apply(message)
                        position[partition] = min(message.offset() + 1, ends[partition])
                        if message.offset() + 1 >= ends[partition]:
                            todo.discard(partition)
                    if progress is not None and todo:
                        progress(sum(position[p] - offsets.get(p, 0) for p in position), total)
            finally:
                self._consumer.unassign()
        if progress is not None:
            progress(total, total)
        new_offsets = dict(offsets)
        new_offsets.update(ends)
        return new_offsets

    def close(self) -> None:
        self._consumer.close()


class RejectedRecord(NamedTuple):
    """A changelog record the index did not take as it is, as read, with the
    ``reason`` of its :class:`Change`."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] | None
    reason: str


@dataclass(frozen=True)
class PendingVersion:
    """The next snapshot version as one catch-up read it, applied to the index but
    not committed: the changes that make it (changelog order per partition), the
    rejected records among them, and the changelog offsets it covers."""

    version: int
    changes: list[Change]
    rejected: list[RejectedRecord]
    offsets: dict[int, int]
    replays: list[ReplayRequest] = field(default_factory=list)
    """The replays its records ask for (``since``, :mod:`streaming.router.replay.replay`)."""

    def subscribers(self) -> set[str]:
        """The subscribers of its upserts (each one's delivery topic must exist
        before a batch routes with this version)."""
        return {c.subscriber for c in self.changes if c.change == CHANGE_UPSERT and c.subscriber is not None}


class Subscriptions:
    """The routing index and the changelog position; the version is its owner's.

    Build with :meth:`open`. Not thread-safe: the router calls it from one
    batch at a time. Versions only grow; version 0 is the empty index. At most
    one :class:`PendingVersion` is outstanding: :meth:`catch_up` refuses to
    run until it is committed or rolled back.
    """

    def __init__(self, config: Config, snapshots: BatchSnapshots, index: RoutingIndex,
                 offsets: Mapping[int, int], on_error: OnError | None = None) -> None:
        self._snapshots = snapshots
        self._index = index
        self._offsets = dict(offsets)
        self._pending: PendingVersion | None = None
        self._reader = ChangelogReader(config, on_error)
        self._refuse_since = (SINCE_REFUSED_IN_REALTIME if config.streaming.mode == MODE_REALTIME
                              else None)
        self._limits = config.limits

    @classmethod
    def open(cls, config: Config, snapshots: BatchSnapshots,
             on_error: OnError | None = None) -> tuple[Subscriptions, list[Change]]:
        """Rebuild from the latest persisted version (plus nothing else yet: call
        :meth:`catch_up` for the changelog after it), or from an empty index;
        return the state and the changes that made its version, which a crash
        may have left unaudited (empty when the index is rebuilt).

        A version built for other exchanges than the configured ones is not
        reused: the index is rebuilt from the whole changelog as the next version.
        """
        exchanges = {name: Dialect(d) for name, d in config.exchanges.dialects.items()}
        stored = snapshots.current
        if stored is not None:
            snapshot = _reusable(stored.data, exchanges)
            if snapshot is not None:
                state = cls(config, snapshots, RoutingIndex.from_snapshot(snapshot),
                            snapshot.offsets, on_error)
                return state, [Change(*c) for c in snapshots.changes(stored.version)]
        # From scratch: an empty index at offsets {} as a new version, so
        # that the next catch-up reads the whole changelog.
        version = 0 if stored is None else stored.version + 1
        index = RoutingIndex(exchanges)
        snapshots.commit(SnapshotVersion.of(index.snapshot(version, {})), [])
        return cls(config, snapshots, index, {}, on_error), []

    @property
    def version(self) -> int:
        """The current (committed) snapshot version."""
        return self._snapshots.committed().version

    @property
    def offsets(self) -> dict[int, int]:
        """Changelog partition -> next offset covered by the current version."""
        return dict(self._offsets)

    def __len__(self) -> int:
        return len(self._index)

    def catch_up(self, progress: Callable[[int, int], None] | None = None) -> PendingVersion | None:
        """Apply the changelog up to its current end offsets to the index; return
        the next version, pending, or None when no record was read (the current
        version then covers the new offsets).

        ``progress`` is passed to :meth:`ChangelogReader.read_to_end`. A failed
        read leaves the index at the current version.
        """
        if self._pending is not None:
            raise RuntimeError(f"version {self._pending.version} is pending: commit() or "
                               "rollback() it before the next catch-up")
        changes: list[Change] = []
        rejected: list[RejectedRecord] = []
        replays: list[ReplayRequest] = []
        applied_at_ms = int(time.time() * 1000)

        def apply(message: Message) -> None:
            _, timestamp = message.timestamp()
            topic, partition, offset = record_position(message)
            value = message.value()
            # The headers are copied out of the record only where they are read: a
            # tombstone's reason, a rejected record's copy (not per upsert of a first
            # catch-up over millions of records).
            headers = record_headers(message) if value is None else None
            change = apply_record(self._index, message.key(), value, partition,
                                  offset, timestamp if timestamp > 0 else None,
                                  applied_at_ms, headers, replays, self._refuse_since,
                                  self._limits)
            changes.append(change)
            if change.reason is not None:
                if value is not None:
                    headers = record_headers(message)
                rejected.append(RejectedRecord(topic, partition, offset, message.key(), value,
                                               headers, change.reason))

        try:
            offsets = self._reader.read_to_end(self._offsets, apply, progress=progress)
        except BaseException:
            if changes:
                self._restore_index()
            raise
        if not changes:
            self._offsets = offsets
            return None
        self._pending = PendingVersion(self.version + 1, changes, rejected, offsets, replays)
        return self._pending

    def commit(self, pending: PendingVersion) -> None:
        """Hand ``pending`` (its snapshot and changes) to the versions' owner, which
        persists it and makes it the current version. If this raises, nothing is
        current that was not before: call :meth:`rollback`."""
        if pending is not self._pending:
            raise RuntimeError(f"version {pending.version} is not the pending catch-up")
        self._snapshots.commit(SnapshotVersion.of(self._index.snapshot(pending.version,
                                                                       pending.offsets)),
                               pending.changes)
        self._offsets = dict(pending.offsets)
        self._pending = None

    def rollback(self) -> None:
        """Drop the pending version, if any: the index goes back to the current
        version, so that the next catch-up re-reads its records."""
        if self._pending is not None:
            self._restore_index()
            self._pending = None

    def close(self) -> None:
        self._reader.close()

    def _restore_index(self) -> None:
        self._index = RoutingIndex.from_snapshot(Snapshot.from_bytes(self._snapshots.committed().data))


def _reusable(data: bytes, exchanges: Mapping[str, Dialect]) -> Snapshot | None:
    """The persisted snapshot, unless it is unreadable by this build or made for other exchanges."""
    try:
        snapshot = Snapshot.from_bytes(data)
    except SnapshotFormatError:
        return None
    return snapshot if dict(snapshot.exchanges) == dict(exchanges) else None


def _fields_of(value: bytes) -> tuple[str | None, str | None, str | None]:
    """Exchange, subscriber and filter of a rejected value, where they parse as strings."""
    try:
        obj = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError):
        obj = None
    if not isinstance(obj, dict):
        obj = {}
    exchange, subscriber, filter_ = (obj.get(name) for name in SUBSCRIPTION_REQUIRED_FIELDS)
    return _text(exchange), _text(subscriber), _text(filter_)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None

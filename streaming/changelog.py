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
  Delta ``subscriptions`` table. When it replaces a live subscription, that
  subscription is removed and the row says ``change = "remove"`` with the
  reason, because after compaction the invalid value is all the changelog
  holds for that id.

:meth:`Subscriptions.catch_up` reads every partition up to the end offsets
fetched when it is called (the happens-before guarantee: a change Kafka
acknowledged before the call is applied when it returns). A catch-up that
read any record yields the next snapshot version, covering the offsets read.
Before that version is returned, in this order: rejected records are in the
rejected topic (at least once), each new subscriber's delivery topic exists,
the version is persisted in the :class:`~streaming.snapshots.SnapshotStore`,
and its changes are in Delta ``subscriptions`` (exactly once, keyed by the
version). A restart resumes from the latest persisted version and re-appends
its changes idempotently, so a crash at any point loses no change and no
audit row.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition

from compiler import CompilerError, Dialect, RoutingIndex, Snapshot, SnapshotFormatError, Subscription
from schemas.records import (
    CHANGE_REJECTED,
    CHANGE_REMOVE,
    CHANGE_UPSERT,
    SOURCE_SUBSCRIPTION,
    message_id,
)
from schemas.tables import SUBSCRIPTIONS_TABLE, arrow_schema
from streaming.broker_watch import KAFKA_LOG
from streaming.config import Config
from streaming.delivery import RECORD_ERRORS
from streaming.delta_sink import AuditTables
from streaming.errors import BitrouteError
from streaming.kafka_records import kept_headers, record_size, rejected_headers
from streaming.snapshots import SnapshotStore
from streaming.topics import admin_client, ensure_delivery_topics

CATCH_UP_TIMEOUT_S = 60.0
"""A catch-up that cannot read the changelog to its end offsets in this time fails the batch."""
POLL_MAX_RECORDS = 1000
_POLL_TIMEOUT_S = 0.5
_KAFKA_TIMEOUT_S = 30.0
_SUBSCRIPTIONS_ARROW = arrow_schema(SUBSCRIPTIONS_TABLE)


class ChangelogError(BitrouteError):
    """The changelog could not be read, or a rejected change could not be reported."""


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


def changes_table(changes: Sequence[Change], version: int) -> pa.Table:
    """``changes`` as the Arrow form of ``SUBSCRIPTIONS_TABLE``, all made by ``version``.

    Columnar, so that the changes of a whole changelog (millions at a
    first start) reach Spark without a Python object per cell.
    """
    columns = dict(zip(Change._fields, zip(*changes))) if changes else {
        name: () for name in Change._fields}
    arrays = []
    for field in _SUBSCRIPTIONS_ARROW:
        if field.name == "snapshot_version":
            arrays.append(pa.array([version] * len(changes), field.type))
        elif field.name in ("changed_at", "applied_at"):
            millis = pa.array(columns[f"{field.name}_ms"], pa.timestamp("ms", tz="UTC"))
            arrays.append(millis.cast(field.type))
        else:
            arrays.append(pa.array(columns[field.name], field.type))
    return pa.Table.from_arrays(arrays, schema=_SUBSCRIPTIONS_ARROW)


def apply_record(index: RoutingIndex, key: bytes | None, value: bytes | None, partition: int,
                 offset: int, changed_at_ms: int | None, applied_at_ms: int) -> Change:
    """Apply one changelog record to ``index``; never raises for a bad record."""
    sub_id = "" if key is None else key.decode("utf-8", errors="replace")
    where = (partition, offset, changed_at_ms, applied_at_ms)
    if value is None:
        if key is None:
            return Change(sub_id, CHANGE_REJECTED, None, None, None, None, None,
                          "tombstone without a key", *where)
        index.remove(sub_id)
        return Change(sub_id, CHANGE_REMOVE, None, None, None, None, None, None, *where)
    try:
        sub = Subscription.from_changelog(key, value)
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
    criteria = sub.headers
    if criteria is None:
        return Change(sub.id, CHANGE_UPSERT, sub.exchange, sub.subscriber, sub.filter, None, None,
                      None, *where)
    return Change(sub.id, CHANGE_UPSERT, sub.exchange, sub.subscriber, sub.filter, criteria.match,
                  dict(criteria.criteria), None, *where)


class ChangelogReader:
    """Reads the changelog's partitions from given offsets up to their current end.

    No consumer group: partitions are assigned explicitly and nothing is
    committed to Kafka; the position lives in the router's snapshots.
    """

    def __init__(self, config: Config, client_settings: Mapping[str, object] | None = None) -> None:
        self._topic = config.kafka.subscriptions_topic
        self._consumer = Consumer({
            **(client_settings or {"logger": KAFKA_LOG}),
            "bootstrap.servers": config.kafka.bootstrap,
            # librdkafka insists on a group id; it is never joined or committed to.
            "group.id": "bitroute-router-changelog",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        })

    def end_offsets(self) -> dict[int, int]:
        """Each partition's end offset (the next offset Kafka will assign), fetched now."""
        metadata = self._consumer.list_topics(self._topic, timeout=_KAFKA_TIMEOUT_S)
        topic = metadata.topics.get(self._topic)
        if topic is None or topic.error is not None:
            raise ChangelogError(f"changelog topic {self._topic!r} is not available: "
                                 f"{topic.error if topic else 'no such topic'}")
        ends = {}
        for partition in sorted(topic.partitions):
            _, high = self._consumer.get_watermark_offsets(
                TopicPartition(self._topic, partition), timeout=_KAFKA_TIMEOUT_S, cached=False)
            ends[partition] = high
        return ends

    def read_to_end(self, offsets: Mapping[int, int], apply: Callable[[Message], None],
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
                    for message in self._consumer.consume(POLL_MAX_RECORDS, _POLL_TIMEOUT_S):
                        partition = message.partition()
                        if partition not in todo:
                            continue
                        error = message.error()
                        if error is not None:
                            if error.code() == KafkaError._PARTITION_EOF:
                                if message.offset() >= ends[partition]:
                                    todo.discard(partition)
                                    position[partition] = ends[partition]
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


class Subscriptions:
    """The routing index, its current snapshot version and the changelog position.

    Build with :meth:`open`. Not thread-safe: the router calls it from one
    batch at a time. Versions only grow; version 0 is the empty index.
    """

    def __init__(self, config: Config, store: SnapshotStore, audit: AuditTables,
                 index: RoutingIndex, version: int, data: bytes, offsets: Mapping[int, int],
                 client_settings: Mapping[str, object] | None = None) -> None:
        self._config = config
        self._store = store
        self._audit = audit
        self._index = index
        self._version = version
        self._data = data
        self._offsets = dict(offsets)
        settings = dict(client_settings or {"logger": KAFKA_LOG})
        self._reader = ChangelogReader(config, settings)
        self._producer = Producer({**settings, "bootstrap.servers": config.kafka.bootstrap,
                                   "enable.idempotence": True,
                                   "message.max.bytes": config.kafka.max_delivery_bytes + 65536})
        self._admin = admin_client(config)
        self._topics_ensured: set[str] = set()
        self._unaudited: tuple[int, pa.Table] | None = None

    @classmethod
    def open(cls, config: Config, store: SnapshotStore, audit: AuditTables,
             client_settings: Mapping[str, object] | None = None) -> Subscriptions:
        """Rebuild from the latest persisted version (plus nothing else yet: call
        :meth:`catch_up` for the changelog after it), or from an empty index.

        The latest version's changes are re-appended to Delta (a no-op when
        they are there already). A version built for other exchanges than the
        configured ones is not reused: the index is rebuilt from the whole
        changelog as the next version.
        """
        exchanges = {name: Dialect(d) for name, d in config.exchanges.dialects.items()}
        stored = store.latest()
        if stored is not None:
            snapshot = _reusable(stored.data, exchanges)
            if snapshot is not None:
                changes = [Change(*c) for c in stored.changes]
                audit.append_subscriptions(stored.version, changes_table(changes, stored.version))
                return cls(config, store, audit, RoutingIndex.from_snapshot(snapshot),
                           stored.version, stored.data, snapshot.offsets, client_settings)
        # From scratch: an empty index at offsets {} as a new version, so
        # that the next catch-up reads the whole changelog.
        version = 0 if stored is None else stored.version + 1
        index = RoutingIndex(exchanges)
        data = index.snapshot(version, {}).to_bytes()
        store.save(version, data, [])
        return cls(config, store, audit, index, version, data, {}, client_settings)

    @property
    def version(self) -> int:
        """The current snapshot version."""
        return self._version

    @property
    def offsets(self) -> dict[int, int]:
        """Changelog partition -> next offset covered by the current version."""
        return dict(self._offsets)

    def __len__(self) -> int:
        return len(self._index)

    def reads_headers(self, version: int) -> bool:
        """Whether matching against ``version`` needs the publishes' headers: the
        current version knows; an older one is assumed to."""
        return version != self._version or self._index.has_header_criteria

    def data(self, version: int) -> bytes:
        """The snapshot bytes of ``version``: the current one, or a persisted one."""
        if version == self._version:
            return self._data
        return self._store.load(version).data

    def catch_up(self, progress: Callable[[int, int], None] | None = None) -> int:
        """Apply the changelog up to its current end offsets; return the current version.

        ``progress`` is passed to :meth:`ChangelogReader.read_to_end`.
        """
        if self._unaudited is not None:
            self._audit.append_subscriptions(*self._unaudited)
            self._unaudited = None
        changes: list[Change] = []
        rejected: list[tuple[Message, str]] = []
        applied_at_ms = int(time.time() * 1000)

        def apply(message: Message) -> None:
            _, timestamp = message.timestamp()
            change = apply_record(self._index, message.key(), message.value(), message.partition(),
                                  message.offset(), timestamp if timestamp > 0 else None,
                                  applied_at_ms)
            changes.append(change)
            if change.reason is not None:
                rejected.append((message, change.reason))

        try:
            offsets = self._reader.read_to_end(self._offsets, apply, progress=progress)
            if changes:
                self._commit(changes, rejected, offsets)
            else:
                self._offsets = offsets
        except BaseException:
            if changes:
                # The index holds changes that were not committed: go back to
                # the current version, so that the next catch-up re-reads them.
                self._index = RoutingIndex.from_snapshot(Snapshot.from_bytes(self._data))
            raise
        return self._version

    def close(self) -> None:
        self._reader.close()
        self._producer.flush(_KAFKA_TIMEOUT_S)

    def _commit(self, changes: list[Change], rejected: list[tuple[Message, str]],
                offsets: dict[int, int]) -> None:
        """Commit the applied ``changes`` as the next version (see the module docstring)."""
        self._report_rejected(rejected)
        subscribers = {c.subscriber for c in changes if c.change == CHANGE_UPSERT}
        new = sorted(subscribers - self._topics_ensured)
        ensure_delivery_topics(self._config, new, admin=self._admin)
        self._topics_ensured.update(new)

        version = self._version + 1
        data = self._index.snapshot(version, offsets).to_bytes()
        self._store.save(version, data, changes)
        # Committed: from here the version stands, and a failed audit append
        # is retried by the next catch-up (or by open() after a restart).
        self._version, self._data, self._offsets = version, data, offsets
        self._unaudited = (version, changes_table(changes, version))
        self._audit.append_subscriptions(*self._unaudited)
        self._unaudited = None

    def _report_rejected(self, rejected: Sequence[tuple[Message, str]]) -> None:
        """Send each bad change to the rejected topic and wait for Kafka's acks.

        A change too large to copy whole (its value plus the reason headers)
        goes without its value; one Kafka refuses even so is left out of the
        topic (its ``subscriptions`` audit row still holds the reason): a bad
        record never stops the catch-up. Any other failure raises
        :class:`ChangelogError` (the batch retries).
        """
        if not rejected:
            return
        limit = self._config.kafka.max_delivery_bytes
        refused: list[str] = []
        failures: list[str] = []

        def delivered(error: KafkaError | None, _message: Message) -> None:
            if error is None:
                return
            (refused if error.code() in RECORD_ERRORS else failures).append(error.str())

        for message, reason in rejected:
            mid = message_id(message.topic(), message.partition(), message.offset())
            headers = rejected_headers(kept_headers(message.headers()), reason, SOURCE_SUBSCRIPTION, mid)
            value = message.value()
            if record_size(message.key(), value, headers) > limit:
                value = None
                headers = rejected_headers([], reason + " (the copy in the rejected topic has no "
                                           "value: too large)", SOURCE_SUBSCRIPTION, mid)
            try:
                self._producer.produce(self._config.kafka.rejected_topic, key=message.key(),
                                       value=value, headers=headers, on_delivery=delivered)
            except KafkaException as exc:
                refused.append(exc.args[0].str())
        left = self._producer.flush(_KAFKA_TIMEOUT_S)
        if left or failures:
            raise ChangelogError(f"could not write {left or len(failures)} rejected subscription "
                                 f"changes to {self._config.kafka.rejected_topic!r}: "
                                 f"{failures[:1] or 'timed out'}")
        if refused:
            print(f"bitroute: {len(refused)} rejected subscription changes were refused by "
                  f"{self._config.kafka.rejected_topic!r} ({refused[0]}); their reasons are in "
                  "the subscriptions audit table", file=sys.stderr, flush=True)


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
    exchange, subscriber, filter_ = (obj.get(name) for name in ("exchange", "subscriber", "filter"))
    return tuple(v if isinstance(v, str) else None for v in (exchange, subscriber, filter_))

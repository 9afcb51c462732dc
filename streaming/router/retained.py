"""MQTT retained messages: the retained state, its writes, and the deliveries at subscribe time.

The contract (docs/design.md, "Retained messages"):

- A publish to an MQTT exchange whose last ``retain`` header is ``true``
  (:data:`schemas.records.RETAIN_HEADER`) is routed as usual (the header kept on a
  live delivery only for Retain As Published: ``streaming.router.batch.routing``) and becomes its
  topic's retained message; with an empty (or null) payload it clears it and is
  delivered to no one (``messages.outcome = cleared``). ``retain=true`` on an
  exchange that is not MQTT is bad input: the publish is rejected with a reason.
- The retained state is the compacted topic ``kafka.retained_topic``, keyed by
  ``[exchange, topic]`` (JSON): the latest retained message of each topic, a
  tombstone for a cleared one, so that it survives restarts and is bounded by the
  number of topics.
- A new MQTT subscription (an upsert of the changelog, not ``$share/``) receives,
  once, the retained messages whose topics its filter matches (and whose headers
  its criteria accept), marked with :data:`schemas.records.RETAINED_HEADER`, then
  the live stream.

Where each part runs, and why that makes it as durable as routing:

1. **The write** (:func:`plan_retained`, :func:`write_retained`): in the routing
   task, after its deliveries were acknowledged, each retained publish of the
   task that was not rejected is produced to the retained topic and the task
   flushes again before it returns; so the write is acknowledged before Spark
   commits the batch. A re-run batch writes the same value again (same key,
   same bytes), which compaction makes harmless.
2. **The state in the driver** (:class:`RetainedMessages`): the retained topic
   read to its end offsets (from the beginning at the first need after a start)
   into a map ``(exchange, topic) -> message`` and, per exchange, the reverse-match
   index (:data:`compiler.retained_index.RetainedIndex`: per-level bitmaps,
   measured against a trie walk). It is read only when new subscriptions ask.
3. **The deliveries at subscribe time** (:class:`RetainedDeliveries`): the
   subscription changes of every version the router makes are noted
   (:meth:`RetainedDeliveries.note`); when a batch first pins a version, its
   changelog catch-up calls :meth:`RetainedDeliveries.prepare` *before* the pin
   is written: the new subscriptions are matched in reverse against the state,
   whose every write was acknowledged before the previous batch committed, and
   the deliveries are written as a plan (``retained/<batch id>.arrow`` in the
   router's state, whole or not at all). After the pin,
   :meth:`RetainedDeliveries.deliver` produces the plan (the kernel's delivery
   writer, the live record format plus the retained header), appends their
   ``deliveries`` rows (``retained = true``) in one Delta transaction under the
   app id ``bitroute-<router id>-retained`` with the batch id as version, and
   marks the batch done (``retained/<batch id>.done``). The batch's own
   publishes are then routed live, to the new subscriptions too: no gap, no
   duplicate at the boundary. A re-run batch id finds its plan (delivered
   again: Kafka at least once, the audit's ``txn`` adds nothing) or its done
   mark (nothing happens); a batch re-run after a crash before its pin
   makes its plan again from the noted changes, which a restart reads back from
   the versions not yet pinned.
4. **The same, idle** (:meth:`RetainedDeliveries.deliver_applied`): with no
   publish arriving, the router applies the changelog itself (holding the pin
   lock, no batch running); the subscriptions it noted get their retained messages
   at once, from a plan keyed by the snapshot version (``applied-<version>``) and
   audited under ``bitroute-<router id>-retained-applied``. Which upserts receive
   them is their Retain Handling (:mod:`compiler.options`): 0 every one, 1 only
   one that created its id, 2 none.
5. **In the router** (:class:`RetainedFeature`): 3 and 4 as a feature of the batch loop
   (:mod:`streaming.router.feature`: its open, its part of a new batch's catch-up before
   the pin, its step, its idle hook); the router names none of it.

Memory: the driver keeps every retained message of the MQTT exchanges (topic,
payload, headers): bounded by the retained topics, not by time.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compiler.options import RETAIN_HANDLING_IF_NEW, RETAIN_HANDLING_NEVER
from schemas.records import (
    CHANGE_UPSERT,
    EXPIRY_HEADER,
    MESSAGE_ID_HEADER,
    PUBLISHED_AT_HEADER,
    RETAIN_HEADER,
    RETAIN_TRUE,
    RETAINED_HEADER,
)
from schemas.tables import ROUTED_PUBLISH, arrow_schema
from streaming.atomic import write_atomically
from streaming.config import Config
from streaming.kafka.records import subscription_ids_json
from streaming.router.feature import BatchFeature, BatchPin, BatchStep, IdleCatchUp, RouterContext

if TYPE_CHECKING:
    from compiler.headers import HeaderCriteria
    from compiler.retained_index import RetainedIndex

_log = logging.getLogger(__name__)

RETAINED_VALUE = b"true"
"""The value of :data:`schemas.records.RETAINED_HEADER` on a delivery at subscribe time."""
PLANS_KEPT = 16
"""Done marks of this many most recent batch ids are kept (as pins are, router/subscriptions/snapshots)."""
_RETAIN_TRUE = RETAIN_TRUE.encode()
_ROUTED_ARROW = arrow_schema(ROUTED_PUBLISH)
_PLAN_SCHEMA = pa.schema([
    ("message_id", pa.string()),
    ("exchange", pa.string()),
    ("topic", pa.string()),
    ("subscriber", pa.string()),
    ("subscription_ids", pa.list_(pa.string())),
    ("value", pa.binary()),
    ("header_names", pa.list_(pa.string())),
    ("header_values", pa.list_(pa.binary())),
    ("published_at_ms", pa.int64()),
])
"""A plan file: one row per delivery to make (a retained message to one subscriber)."""


# --- 1. the write, in the routing task ------------------------------------------------

@dataclass(frozen=True)
class RetainSettings:
    """What a routing task needs for retained publishes (picklable)."""

    topic: str
    """``kafka.retained_topic``."""
    mqtt_exchanges: frozenset[str]
    """The exchanges whose dialect is MQTT: ``retain=true`` elsewhere is rejected."""

    @classmethod
    def of(cls, config: Config) -> RetainSettings:
        return cls(config.kafka.retained_topic, mqtt_exchanges(config))


def mqtt_exchanges(config: Config) -> frozenset[str]:
    return frozenset(name for name, dialect in config.exchanges.dialects.items()
                     if dialect == "mqtt")


def retained_key(exchange: str, topic: str) -> bytes:
    """The retained topic's record key of ``topic`` of ``exchange``."""
    return json.dumps([exchange, topic], ensure_ascii=False).encode("utf-8")


def retain_flags(headers: pa.ListArray, n: int) -> np.ndarray:
    """Per row of a publishes batch (its ``headers`` column): whether its last ``retain``
    header is ``true``."""
    flags = np.zeros(n, dtype=bool)
    names, values = headers.flatten().flatten()
    if not len(names):
        return flags
    named = np.flatnonzero(pc.equal(names, RETAIN_HEADER).to_numpy(zero_copy_only=False))
    if not len(named):
        return flags
    parents = pc.list_parent_indices(headers).to_numpy(zero_copy_only=False)
    last: dict[int, int] = {}
    for row, entry in zip(parents[named].tolist(), named.tolist(), strict=True):
        last[row] = entry
    for row, value in zip(last, values.take(pa.array(list(last.values()))).to_pylist(), strict=True):
        flags[row] = value == _RETAIN_TRUE
    return flags


@dataclass(frozen=True)
class RetainPlan:
    """A batch's retained publishes: ``rows`` (retained, not rejected when planned) and
    per row of the batch whether it clears its topic (``cleared``: delivered to no one)."""

    rows: np.ndarray
    cleared: np.ndarray


def plan_retained(headers: pa.ListArray, values: pa.Array, exchanges: Sequence[str | None],
                  reasons: list[str | None], settings: RetainSettings | None) -> RetainPlan | None:
    """The retained publishes of a batch (None: none); a ``retain=true`` publish to an
    exchange that is not MQTT gets its rejection reason in ``reasons``."""
    if settings is None:
        return None
    n = len(reasons)
    flags = retain_flags(headers, n)
    if not flags.any():
        return None
    rows = []
    for row in np.flatnonzero(flags).tolist():
        if reasons[row] is not None:
            continue
        if exchanges[row] not in settings.mqtt_exchanges:
            reasons[row] = (f"{RETAIN_HEADER}={RETAIN_TRUE} on exchange {exchanges[row]!r}, which "
                            "is not an MQTT exchange: retained messages are MQTT's "
                            "(exchanges.dialects)")
            continue
        rows.append(row)
    cleared = np.zeros(n, dtype=bool)
    if rows:
        empty = pc.fill_null(pc.equal(pc.binary_length(values), 0), True)
        cleared[rows] = empty.to_numpy(zero_copy_only=False)[rows]
    return RetainPlan(np.array(rows, dtype=np.int64), cleared)


def write_retained(producer, plan: RetainPlan, settings: RetainSettings,
                   exchanges: Sequence[str | None], keys: Sequence[bytes | None],
                   values: Sequence[bytes | None], kept: Sequence, message_ids: Sequence[str],
                   published_ms: Sequence[int | None], reasons: Sequence[str | None]) -> int:
    """Produce the retained record of each planned row still not rejected (its payload, or a
    tombstone when it clears) and wait for Kafka's acks; return the records written.

    A record Kafka refuses for a reason of its own (the retained topic's
    ``max.message.bytes`` lowered under the deliveries') is logged and left out: the
    publish was delivered already; any other failure raises (the batch is retried).
    """
    written = 0
    for row in plan.rows.tolist():
        if reasons[row] is not None:
            continue
        topic = keys[row].decode("utf-8")
        headers = [*(kept[row] or []), (MESSAGE_ID_HEADER, message_ids[row].encode()),
                   (PUBLISHED_AT_HEADER, str(published_ms[row] or 0).encode())]
        producer.produce_tagged(settings.topic, retained_key(exchanges[row], topic),
                                None if plan.cleared[row] else values[row], headers, row)
        written += 1
    if written:
        for failure in producer.flush():
            _log.warning(f"the retained message of {message_ids[failure.tag]} was not kept: "
                         f"{failure.topic} refused it ({failure.reason})")
    return written


# --- 2. the state, in the driver ----------------------------------------------------

@dataclass(frozen=True)
class RetainedMessage:
    """A topic's retained message as the retained topic holds it."""

    exchange: str
    topic: str
    message_id: str
    value: bytes
    headers: tuple[tuple[str, bytes | None], ...]
    """The publish's kept headers (``retain`` among them)."""
    published_at_ms: int


class RetainedMessages:
    """The retained topic, followed by the driver: ``(exchange, topic) -> message`` and the
    reverse-match index of each exchange. Not thread-safe (the batch thread and ``open``)."""

    def __init__(self, config: Config, on_error=None) -> None:
        from compiler.retained_index import RetainedIndex
        from streaming.router.subscriptions.changelog import ChangelogReader

        self._index_type = RetainedIndex
        self._reader = ChangelogReader(config, on_error, topic=config.kafka.retained_topic)
        self._offsets: dict[int, int] = {}
        self._messages: dict[tuple[str, str], RetainedMessage] = {}
        self._indexes: dict[str, RetainedIndex] = {}
        #: The retained messages with an expiry header: the value of their last one.
        self._expiring: dict[tuple[str, str], bytes | None] = {}
        #: As of the last :meth:`expire`: the remaining interval (seconds) of each retained
        #: message with an expiry, by ``(exchange, topic)``.
        self.remaining: dict[tuple[str, str], int] = {}

    def __len__(self) -> int:
        return len(self._messages)

    def catch_up(self) -> None:
        """Read the retained topic up to its end offsets now."""
        self._offsets = self._reader.read_to_end(self._offsets, self._apply)

    def _apply(self, message) -> None:
        try:
            exchange, topic = json.loads(message.key())
            if not isinstance(exchange, str) or not isinstance(topic, str):
                raise ValueError("not two strings")
        except (TypeError, ValueError) as exc:
            _log.warning(f"ignored a record of {message.topic()} at {message.partition()}/"
                         f"{message.offset()}: its key is not [exchange, topic] ({exc})")
            return
        index = self._indexes.get(exchange)
        self._expiring.pop((exchange, topic), None)
        if message.value() is None:
            self._messages.pop((exchange, topic), None)
            if index is not None:
                index.discard(topic)
            return
        own = [(n, v) for n, v in message.headers() or ()]
        router = {n: v for n, v in own if n in (MESSAGE_ID_HEADER, PUBLISHED_AT_HEADER)}
        kept = tuple((n, v) for n, v in own if n not in (MESSAGE_ID_HEADER, PUBLISHED_AT_HEADER))
        try:
            if index is None:
                index = self._indexes[exchange] = self._index_type()
            index.add(topic)
        except Exception as exc:  # noqa: BLE001 - a record the router did not write
            _log.warning(f"ignored the retained message of {topic!r}: {exc}")
            return
        published = router.get(PUBLISHED_AT_HEADER) or b"0"
        self._messages[(exchange, topic)] = RetainedMessage(
            exchange, topic, (router.get(MESSAGE_ID_HEADER) or b"").decode("utf-8", "replace"),
            message.value(), kept, int(published) if published.isdigit() else 0)
        expiry = [v for n, v in kept if n == EXPIRY_HEADER]
        if expiry:
            self._expiring[(exchange, topic)] = expiry[-1]

    def expire(self, now_ms: int) -> list[RetainedMessage]:
        """Remove the retained messages whose lifetime (``expiry`` header) ended by ``now_ms``
        from the state and return them; :attr:`remaining` gets the interval left to the
        others with an expiry (the rule of both modes, ``bitroute_kernel.expiry_states``)."""
        from bitroute_kernel import expiry_states

        self.remaining = {}
        if not self._expiring:
            return []
        keys = list(self._expiring)
        states = expiry_states([self._expiring[k] for k in keys],
                               [self._messages[k].published_at_ms for k in keys], now_ms)
        gone, remaining = [], {}
        for (exchange, topic), state in zip(keys, states, strict=True):
            if isinstance(state, str):  # a record the router did not write: never expires
                continue
            if state:
                remaining[(exchange, topic)] = state
                continue
            gone.append(self._messages.pop((exchange, topic)))
            del self._expiring[(exchange, topic)]
            self._indexes[exchange].discard(topic)
        self.remaining = remaining
        return gone

    def matching(self, exchange: str, filter_text: str) -> list[RetainedMessage]:
        """The retained messages of ``exchange`` whose topics ``filter_text`` matches."""
        index = self._indexes.get(exchange)
        if index is None:
            return []
        return [self._messages[(exchange, topic)] for topic in index.match(filter_text)]

    def get(self, exchange: str, topic: str) -> RetainedMessage | None:
        """``topic``'s retained message on ``exchange``, or None."""
        return self._messages.get((exchange, topic))

    def topics(self, exchange: str) -> int:
        """How many topics of ``exchange`` hold a retained message."""
        index = self._indexes.get(exchange)
        return 0 if index is None else len(index)

    def close(self) -> None:
        self._reader.close()


# --- 3. the deliveries at subscribe time ------------------------------------------------

APPLIED_PREFIX = "applied-"
"""The plan files of subscriptions applied while no batch ran: ``applied-<version>.arrow``
and its done mark ``.done`` (:meth:`RetainedDeliveries.deliver_applied`)."""


def _ipc_writer(table: pa.Table):
    def write(file) -> None:
        with pa.ipc.new_file(file, table.schema) as writer:
            writer.write_table(table)

    return write


def _read_plan(path) -> pa.Table:
    with pa.OSFile(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


@dataclass(frozen=True)
class NewSubscription:
    """An MQTT subscription applied since the last pinned version, as the changelog said it."""

    id: str
    exchange: str
    subscriber: str
    filter: str
    criteria: HeaderCriteria | None


def _change_field(change: Sequence, name: str):
    """Field ``name`` of a change (a :class:`~streaming.router.subscriptions.changelog.Change` or its
    persisted JSON array; None for a field added after the array was written)."""
    from streaming.router.subscriptions.changelog import Change

    position = Change._fields.index(name)
    return change[position] if position < len(change) else None


class RetainedDeliveries:
    """The deliveries of retained messages to new subscriptions, once per subscription
    (module docstring, part 3). Made by the router at open, after its snapshots."""

    def __init__(self, config: Config, folder, audit, on_error=None) -> None:
        self._config = config
        self._folder = folder
        self._audit = audit
        self._mqtt = mqtt_exchanges(config)
        self.messages = RetainedMessages(config, on_error)
        self._caught_up = False
        self._new: dict[str, NewSubscription | None] = {}
        self._store = None
        os.makedirs(folder, exist_ok=True)
        for name in os.listdir(folder):
            if name.startswith("."):  # a temporary file a killed writer left
                os.unlink(os.path.join(folder, name))

    def seed(self, snapshots) -> None:
        """Note the changes of the persisted versions no batch has pinned yet (a restart's
        view of what the last run noted and did not deliver); forget the plans and marks of
        batch ids above the last pinned one (a new streaming checkpoint starts at 0).

        Without any pin (a first start, or a new streaming checkpoint over kept
        snapshots) nothing is noted: the subscriptions of kept versions were applied
        before, and a first start notes its versions as it makes them."""
        batches = snapshots.pinned_batches()
        last = batches[-1] if batches else -1
        for batch_id in self._batches():
            if batch_id > last:
                self._remove(batch_id)
        self._store = snapshots
        if not batches:
            return
        pinned = snapshots.pinned(last)
        served = max([pinned, *self._applied_versions(".arrow"),
                      *self._applied_versions(".done")])
        for version in snapshots.versions():
            if version > served:
                self.note(snapshots.changes(version))

    def note(self, changes: Iterable[Sequence]) -> None:
        """Note a new version's changes (a :class:`BatchSnapshots` commit listener)."""
        from compiler import HeaderCriteria

        for change in changes:
            if self._audit.change_audited(_change_field(change, "changelog_partition"),
                                          _change_field(change, "changelog_offset")):
                continue  # applied before a restore (streaming.router.restore): served then
            sub_id = _change_field(change, "subscription_id")
            exchange = _change_field(change, "exchange")
            filter_ = _change_field(change, "filter")
            handling = _change_field(change, "retain_handling") or 0
            if (_change_field(change, "change") != CHANGE_UPSERT or exchange not in self._mqtt
                    or filter_ is None or filter_.startswith("$share/")
                    or handling == RETAIN_HANDLING_NEVER):
                self._new[sub_id] = None  # removed, rejected, not MQTT, shared, or never: nothing
                continue
            if (handling == RETAIN_HANDLING_IF_NEW and _change_field(change, "existed")
                    and self._new.get(sub_id) is None):
                # The id was live before: only its creation sends (an earlier upsert noted and
                # not served yet created it, and the latest definition is served for it).
                self._new[sub_id] = None
                continue
            match = _change_field(change, "header_match")
            criteria = (HeaderCriteria(match, dict(_change_field(change, "header_criteria") or {}))
                        if match is not None else None)
            self._new[sub_id] = NewSubscription(sub_id, exchange,
                                                _change_field(change, "subscriber"), filter_,
                                                criteria)

    def waiting(self) -> bool:
        """Whether a noted subscription waits for its retained messages."""
        return any(sub is not None for sub in self._new.values())

    def prepare(self, batch_id: int, version: int) -> int:
        """Before batch ``batch_id`` is pinned (first run) to ``version``: the deliveries of
        the retained messages the noted subscriptions match, written as the batch's plan;
        return how many. A plan an idle application left undelivered is delivered first.
        Raises on a Kafka failure (the catch-up is retried)."""
        self._remove(batch_id)
        self._deliver_applied()
        table = self._plan_table(version, batch_id)
        if table is not None and table.num_rows:
            write_atomically(self._plan(batch_id), _ipc_writer(table))
        self._new.clear()
        return 0 if table is None else table.num_rows

    def deliver_applied(self, version: int, next_batch: int) -> int:
        """Deliver now the retained messages of the subscriptions noted since the last
        delivery: the router applied them while no batch runs (``Router._idle_catch_up``,
        with the pin lock held, ``version`` the current version). The retained state is
        then as of the end of the last batch, whose writes were acknowledged, and
        ``next_batch`` (the batch id the rows' audit names) routes the publishes after it,
        which reach the new subscriptions live. Return the deliveries made.

        Crash-safe as a batch's plan: the plan is written (``applied-<version>.arrow``, an
        empty one too) before anything is produced, its audit rows are appended once
        (app id ``bitroute-<router id>-retained-applied``, the version as ``txn`` version),
        and a done mark ends it; :meth:`seed` notes again only the versions above the
        latest such plan, and a plan left undelivered is delivered by the next idle
        application or batch, before anything else."""
        delivered = self._deliver_applied()
        table = self._plan_table(version, next_batch)
        if table is None:
            self._new.clear()
            return delivered
        write_atomically(self._applied(version, ".arrow"), _ipc_writer(table))
        self._new.clear()
        return delivered + self._deliver_applied()

    def _plan_table(self, version: int, batch_id: int) -> pa.Table | None:
        """The deliveries of the noted subscriptions (None: none noted waits), as a plan."""
        new = [s for s in self._new.values() if s is not None]
        if not new:
            return None
        self.messages.catch_up()
        self._caught_up = True
        remaining = self._expire()
        wanted: dict[tuple[str, str, str], list[str]] = {}
        found: dict[tuple[str, str], RetainedMessage] = {}
        for sub in new:
            for message in self.messages.matching(sub.exchange, sub.filter):
                if sub.criteria is not None and not sub.criteria.matches(
                        {n: v for n, v in message.headers}):
                    continue
                found[(message.exchange, message.topic)] = message
                wanted.setdefault((message.exchange, message.topic, sub.subscriber),
                                  []).append(sub.id)
        rows: dict[str, list] = {name: [] for name in _PLAN_SCHEMA.names}
        for (exchange, topic, subscriber), ids in sorted(wanted.items()):
            message = found[(exchange, topic)]
            rows["message_id"].append(message.message_id)
            rows["exchange"].append(exchange)
            rows["topic"].append(topic)
            rows["subscriber"].append(subscriber)
            rows["subscription_ids"].append(sorted(ids))
            rows["value"].append(message.value)
            left = remaining.get((exchange, topic))
            rows["header_names"].append([n for n, _ in message.headers])
            rows["header_values"].append([
                str(left).encode() if left is not None and n == EXPIRY_HEADER else v
                for n, v in message.headers])
            rows["published_at_ms"].append(message.published_at_ms)
        return pa.table(rows, schema=_PLAN_SCHEMA).replace_schema_metadata(
            {b"snapshot_version": str(version).encode(), b"batch_id": str(batch_id).encode()})

    def _expire(self) -> dict[tuple[str, str], int]:
        """Drop the retained messages whose lifetime ended (now) from the state and the
        retained topic (a tombstone each); return the remaining interval of the others with
        an expiry, by ``(exchange, topic)``. Raises on a Kafka failure (retried)."""
        from streaming.router.batch.delivery import ProducerSettings, cached_producer

        gone = self.messages.expire(int(time.time() * 1000))
        if gone:
            kafka = self._config.kafka
            producer = cached_producer(ProducerSettings.of(kafka))
            for i, message in enumerate(gone):
                producer.produce_tagged(kafka.retained_topic,
                                        retained_key(message.exchange, message.topic), None,
                                        [(MESSAGE_ID_HEADER, message.message_id.encode())], i)
            failed = producer.flush()
            if failed:
                raise OSError(f"the retained topic refused {len(failed)} tombstones of expired "
                              f"retained messages: {failed[0].reason}")
            _log.info(f"{len(gone)} retained messages expired and left the retained state")
        return self.messages.remaining

    def deliver(self, batch_id: int) -> int:
        """Make batch ``batch_id``'s planned deliveries (after its pin): produce them, wait
        for Kafka's acks, append their audit rows once, mark the batch done; return the
        deliveries made (0 when there is no plan, or the batch is done already)."""
        self._prune_applied(batch_id)
        plan_path = self._plan(batch_id)
        if not plan_path.exists():
            return 0
        plan = _read_plan(plan_path)
        version = int(plan.schema.metadata[b"snapshot_version"])
        if not os.path.exists(self._done(batch_id)):
            kept = self._make(plan, version, batch_id,
                              lambda rows: self._audit.append_retained(rows, batch_id))
            write_atomically(self._done(batch_id), b"")
            _log.info(f"batch {batch_id}: {kept} retained messages delivered to new "
                      "subscriptions")
        plan_path.unlink(missing_ok=True)
        self._prune(batch_id)
        return plan.num_rows

    def _deliver_applied(self) -> int:
        """Deliver the applied plans not done yet (normally none), oldest first."""
        made = 0
        for version in self._applied_versions(".arrow"):
            plan_path = self._applied(version, ".arrow")
            plan = _read_plan(plan_path)
            if not os.path.exists(self._applied(version, ".done")):
                batch_id = int(plan.schema.metadata[b"batch_id"])
                kept = self._make(plan, version, batch_id,
                                  lambda rows, version=version: self._audit.append_retained_applied(rows, version))
                write_atomically(self._applied(version, ".done"), b"")
                if plan.num_rows:
                    _log.info(f"version {version}: {kept} retained messages delivered to new "
                              "subscriptions, applied while no batch ran")
                made += plan.num_rows
            plan_path.unlink(missing_ok=True)
        return made

    def _make(self, plan: pa.Table, version: int, batch_id: int, append) -> int:
        """Produce ``plan`` and ``append`` the audit rows of what Kafka took; return those."""
        if not plan.num_rows:
            return 0
        failed = self._produce(plan, version)
        routed_at = datetime.now(UTC)
        keep = [i for i in range(plan.num_rows) if i not in failed]
        append(self._audit_rows(plan.take(keep), version, batch_id, routed_at))
        return len(keep)

    def _produce(self, plan: pa.Table, version: int) -> set[int]:
        """Produce every delivery of ``plan`` (a row each, marked ``bitroute.retained:
        true``) through the routing entry point; return the rows Kafka refused (logged)."""
        from streaming.router.batch.delivery import (
            ProducerSettings,
            cached_producer,
            delivery_records,
        )
        from streaming.router.batch.routing import deliver

        kafka = self._config.kafka
        names = plan["header_names"].combine_chunks()
        values = plan["header_values"].combine_chunks()
        columns = delivery_records(
            kafka.layout, plan["subscriber"].combine_chunks(),
            np.arange(plan.num_rows, dtype=np.int64),
            plan["topic"].combine_chunks().cast(pa.binary()), plan["value"].combine_chunks(),
            _from_zero(names.offsets), names.flatten(), values.flatten(),
            plan["message_id"].combine_chunks(),
            subscription_ids_json(plan["subscription_ids"].combine_chunks()),
            str(version).encode(), mark=(RETAINED_HEADER, RETAINED_VALUE))
        producer = cached_producer(ProducerSettings.of(kafka))
        failed = deliver(producer, columns, kafka.layout)
        for failure in failed:
            _log.warning(f"a retained message for a new subscription was not delivered: "
                         f"{failure.topic} refused it ({failure.reason})")
        return {f.tag for f in failed}

    def _audit_rows(self, plan: pa.Table, version: int, batch_id: int,
                    routed_at: datetime) -> pa.Table:
        from streaming.audit.writer import deliveries_rows

        fields = list(_ROUTED_ARROW.field("deliveries").type.value_type)
        entries = pa.StructArray.from_arrays(
            [plan[f.name].combine_chunks().cast(f.type) for f in fields], fields=fields)
        deliveries = pa.ListArray.from_arrays(
            pa.array(np.arange(plan.num_rows + 1, dtype=np.int32)), entries)
        published = pc.cast(plan["published_at_ms"].combine_chunks().cast(pa.int64()),
                            pa.timestamp("ms", tz="UTC"))
        routed = pa.table({
            "message_id": plan["message_id"].cast(pa.string()),
            "exchange": plan["exchange"].cast(pa.string()),
            "routing_key": plan["topic"].cast(pa.string()), "deliveries": deliveries,
            "published_at": published.cast(_ROUTED_ARROW.field("published_at").type),
        })
        return deliveries_rows(routed, version, batch_id, routed_at, self._config.kafka.layout,
                               retained=True)

    def close(self) -> None:
        self.messages.close()

    def _applied(self, version: int, suffix: str):
        from pathlib import Path

        return Path(self._folder) / f"{APPLIED_PREFIX}{version:020d}{suffix}"

    def _applied_versions(self, suffix: str) -> list[int]:
        return sorted(int(name[len(APPLIED_PREFIX):-len(suffix)])
                      for name in os.listdir(self._folder)
                      if name.startswith(APPLIED_PREFIX) and name.endswith(suffix))

    def _prune_applied(self, batch_id: int) -> None:
        """Forget the done marks of applied plans at or below batch ``batch_id``'s pinned
        version: a restart notes only the versions above it anyway."""
        pinned = self._store.pinned(batch_id) if self._store is not None else None
        if pinned is None:
            return
        for version in self._applied_versions(".done"):
            if version <= pinned:
                os.unlink(self._applied(version, ".done"))

    def _plan(self, batch_id: int):
        from pathlib import Path

        return Path(self._folder) / f"{batch_id:020d}.arrow"

    def _done(self, batch_id: int) -> str:
        return os.path.join(self._folder, f"{batch_id:020d}.done")

    def _batches(self) -> list[int]:
        return sorted({int(name.split(".")[0]) for name in os.listdir(self._folder)
                       if name.split(".")[0].isdigit()})

    def _remove(self, batch_id: int) -> None:
        self._plan(batch_id).unlink(missing_ok=True)
        if os.path.exists(self._done(batch_id)):
            os.unlink(self._done(batch_id))

    def _prune(self, batch_id: int) -> None:
        for old in self._batches():
            if old <= batch_id - PLANS_KEPT:
                self._remove(old)


def _from_zero(offsets: pa.Array) -> np.ndarray:
    """A list array's offsets as int32, from 0 (the list array may be a slice)."""
    found = np.asarray(offsets.to_numpy(zero_copy_only=False), np.int64)
    return (found - found[0]).astype(np.int32)


# --- 5. as a feature of the router's batch loop ------------------------------------------

class RetainedFeature(BatchFeature):
    """Retained messages as a feature of the batch loop (:mod:`streaming.router.feature`):
    at each open, the deliveries' state made and seeded and its note of every version's
    changes registered; before a batch's first pin its plan (:meth:`RetainedDeliveries.prepare`,
    inside the catch-up's retry); at its step the plan delivered (through the batch's retry);
    idle, the noted subscriptions served at once (:meth:`RetainedDeliveries.deliver_applied`)."""

    name = "retained"

    def __init__(self) -> None:
        self.deliveries: RetainedDeliveries | None = None
        """The deliveries to new subscriptions while the router is open."""

    @classmethod
    def of(cls, router: RouterContext) -> RetainedFeature:
        return cls()

    def open(self, router: RouterContext) -> None:
        self.deliveries = RetainedDeliveries(router.config, router.layout.retained, router.audit,
                                             router.on_error)
        self.deliveries.seed(router.store)
        router.snapshots.commit_listeners.append(self.deliveries.note)

    def prepare(self, pin: BatchPin) -> None:
        self._open().prepare(pin.batch_id, pin.version)

    def step(self, batch: BatchStep) -> None:
        deliveries = self._open()
        batch.retrying("the retained messages of new subscriptions",
                       lambda: deliveries.deliver(batch.batch_id))

    def idle(self, idle: IdleCatchUp) -> None:
        deliveries = self._open()
        if deliveries.waiting():
            deliveries.deliver_applied(idle.version, idle.next_batch)

    def close(self) -> None:
        if self.deliveries is not None:
            self.deliveries.close()
            self.deliveries = None

    def _open(self) -> RetainedDeliveries:
        if self.deliveries is None:
            raise RuntimeError("the router is not open: call open() or start() first")
        return self.deliveries

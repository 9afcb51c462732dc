"""The router's routing state as an operator asks about it: the live
subscriptions (``bitroute subscriptions``) and who would receive a publish now
(``bitroute explain``), with the MQTT exchanges' retained messages where they
matter (a topic's retained message; how many retained messages a subscription's
filter matches: :func:`retained_of`, :func:`with_retained`).

:func:`load_state` builds the state the router would route the next publish
with, from, in order:

1. the latest snapshot the router persisted under
   ``<streaming.checkpoint_dir>/router/snapshots/``, read through the store's
   read-only view (:class:`streaming.router.subscriptions.snapshots.SnapshotFiles`);
2. the changelog records after that snapshot's offsets, applied with the
   router's own :func:`streaming.router.subscriptions.changelog.apply_record`, so the answer is as
   of now, not as of the router's last batch;
3. without a snapshot (no router ever ran on this checkpoint folder), or with
   one made for other exchanges than the configured ones (the router would
   rebuild it too), the whole changelog.

It writes nothing anywhere: nothing is published, nothing committed to Kafka
(the changelog is read by explicit assignment, :class:`ChangelogReader`), and
the snapshot folder is only read (never through the writable
``SnapshotStore``, whose constructor creates folders and deletes temporary
files: a running router's write in progress would lose its temporary file).

When Kafka does not answer within :data:`KAFKA_PROBE_TIMEOUT_S`, a persisted
snapshot still answers, and :attr:`RoutingState.stale` says why it may be
behind; without a snapshot the answer is an :class:`InspectError`.

Matching is the router's :class:`compiler.Matcher` on that state, so a publish
the router would reject (unknown exchange, routing key invalid in the
exchange's dialect) is a :class:`RejectedPublish` with the router's reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaException

from compiler import (
    Dialect,
    HeaderCriteria,
    HeaderError,
    Matcher,
    RoutingIndex,
    Snapshot,
    SnapshotFormatError,
    TopicError,
    UnknownExchangeError,
)
from compiler.options import SubscriptionOptions
from compiler.shared import shared_filters
from schemas.records import EXPIRY_HEADER
from streaming.config import Config
from streaming.errors import one_line
from streaming.kafka.clients import access_failure, consumer as kafka_consumer, failure
from streaming.kafka.errors import PROBE_TIMEOUT_S, KafkaAccessError
from streaming.kafka.records import expiry_error
from streaming.ops.errors import InspectError, RejectedPublish
from streaming.router.subscriptions.snapshots import SnapshotFiles, SnapshotStoreError
from streaming.state.checkpoint import CheckpointLayout

KAFKA_PROBE_TIMEOUT_S = PROBE_TIMEOUT_S
"""How long to wait for Kafka's metadata before answering from the snapshot alone."""

SUBSCRIPTION_COLUMNS = ["subscription_id", "exchange", "subscriber", "filter", "header_match",
                        "header_criteria", "retain_handling", "retain_as_published", "no_local"]
"""A listed subscription's fields: the names of the Delta ``subscriptions`` table."""
OPTION_COLUMNS = ("retain_handling", "retain_as_published", "no_local")
"""The MQTT subscription options among them (:mod:`compiler.options`): the text tables show
them only where an MQTT exchange is listed."""


@dataclass(frozen=True)
class RoutingState:
    """The subscriptions the router would route the next publish with.

    ``snapshot`` holds them (the persisted one itself when the changelog had
    nothing newer); ``base_version`` is the persisted snapshot version the
    state starts from (``None``: rebuilt from the whole changelog);
    ``changes_applied`` counts the changelog records read after it; ``stale``
    is why the changelog could not be read (then the state is the snapshot's
    alone), else ``None``.
    """

    snapshot: Snapshot
    base_version: int | None
    changes_applied: int
    stale: str | None

    def json_fields(self) -> dict[str, object]:
        return {"snapshot_version": self.base_version, "changes_after_snapshot": self.changes_applied,
                "stale": self.stale}


def latest_snapshot(config: Config) -> Snapshot | None:
    """The latest snapshot the router persisted, or None when there is none. Reads only."""
    files = SnapshotFiles(CheckpointLayout.of(config.streaming.checkpoint_dir))
    try:
        latest = files.latest()
    except SnapshotStoreError as exc:
        raise InspectError(str(exc)) from None
    if latest is None:
        return None
    try:
        return Snapshot.from_bytes(latest.data)
    except SnapshotFormatError as exc:
        raise InspectError(f"{files.layout.snapshot_file(latest.version)}: {exc}") from None


def load_state(config: Config) -> RoutingState:
    """The routing state now (see the module docstring); raises :class:`InspectError`.

    The index is rebuilt from a persisted snapshot only when the changelog has
    newer records: at a million subscriptions that costs about a second.
    """
    exchanges = {name: Dialect(d) for name, d in config.exchanges.dialects.items()}
    snapshot = latest_snapshot(config)
    if snapshot is not None and dict(snapshot.exchanges) != exchanges:
        snapshot = None  # made for other exchanges: the router would rebuild it
    problem = _changelog_problem(config)
    if snapshot is not None:
        if problem is not None:
            return RoutingState(snapshot, snapshot.version, 0, problem)
        base = snapshot
        index, offsets, applied = _apply_changelog(
            config, lambda: RoutingIndex.from_snapshot(base), base.offsets)
        if applied and index is not None:  # the index is made at the first record
            snapshot = index.snapshot(base.version, offsets)
        return RoutingState(snapshot, base.version, applied, None)
    if problem is not None:
        raise InspectError(f"no router snapshot in "
                           f"{CheckpointLayout.of(config.streaming.checkpoint_dir).snapshots} "
                           f"and {problem}")
    index, offsets, applied = _apply_changelog(config, lambda: RoutingIndex(exchanges), {})
    if index is None:
        index = RoutingIndex(exchanges)
    return RoutingState(index.snapshot(0, offsets), None, applied, None)


def _changelog_problem(config: Config) -> str | None:
    """Why the changelog cannot be read now (Kafka unreachable, topic missing), or None.

    A consumer, not an admin client, asks: its metadata requests never create
    the topic on a broker that auto-creates topics.
    """
    topic = config.kafka.subscriptions_topic
    consumer = kafka_consumer(config.kafka.client_settings, "bitroute-inspect")
    try:
        metadata = consumer.topics(KAFKA_PROBE_TIMEOUT_S, topic)
    except KafkaAccessError as exc:
        return str(exc)
    except KafkaException as exc:
        return str(failure(config.kafka.client_settings, exc, "Read", "topic", topic,
                           KAFKA_PROBE_TIMEOUT_S))
    finally:
        consumer.close()
    found = metadata.topics.get(topic)
    if found is not None and found.error is not None:
        # Kafka answers a topic the principal may not describe as if it did not exist.
        refused = access_failure(config.kafka.client_settings, found.error, "Read", "topic", topic)
        if refused is not None:
            return str(refused)
    if found is None or found.error is not None:
        return f"the changelog topic {topic!r} does not exist on {config.kafka.bootstrap}"
    return None


def _apply_changelog(config: Config, make_index: Callable[[], RoutingIndex],
                     offsets: Mapping[int, int]) -> tuple[RoutingIndex | None, dict[int, int], int]:
    """Apply the changelog from ``offsets`` to its end to the index ``make_index()``
    makes at the first record; (that index or None, the new offsets, records read)."""
    from streaming.router.subscriptions.changelog import ChangelogError, ChangelogReader, apply_record

    applied_at_ms = int(time.time() * 1000)
    index: RoutingIndex | None = None
    count = 0

    def apply(message) -> None:
        nonlocal index, count
        if index is None:
            index = make_index()
        _, timestamp = message.timestamp()
        apply_record(index, message.key(), message.value(), message.partition(), message.offset(),
                     timestamp if timestamp > 0 else None, applied_at_ms, limits=config.limits)
        count += 1

    reader = ChangelogReader(config)
    try:
        new_offsets = reader.read_to_end(offsets, apply)
    except ChangelogError as exc:
        raise InspectError(str(exc)) from None
    except KafkaException as exc:
        raise InspectError(f"reading the changelog {config.kafka.subscriptions_topic!r}: "
                           f"{one_line(exc)}") from None
    finally:
        reader.close()
    return index, new_offsets, count


# --- subscriptions -----------------------------------------------------------------

def subscriptions(state: RoutingState, subscriber: str | None = None, exchange: str | None = None
                  ) -> list[dict[str, Any]]:
    """The live subscriptions (of ``subscriber``, of ``exchange`` when given), sorted by
    exchange, subscriber and id; each a dict of :data:`SUBSCRIPTION_COLUMNS`."""
    t = state.snapshot.tables
    table = _table(state.snapshot, np.flatnonzero(_live(t)))
    if subscriber is not None:
        table = table.filter(pc.equal(table["subscriber"], subscriber))
    if exchange is not None:
        table = table.filter(pc.equal(table["exchange"], exchange))
    table = table.take(pc.sort_indices(table, sort_keys=[
        ("exchange", "ascending"), ("subscriber", "ascending"), ("subscription_id", "ascending")]))
    return _rows(state.snapshot, table)


def _live(tables) -> np.ndarray:
    return pc.is_valid(tables.sub_ids).to_numpy(zero_copy_only=False)


def _table(snapshot: Snapshot, slots: np.ndarray) -> pa.Table:
    """Subscription slots ``slots`` (live ones) as columns: slot, id, exchange, subscriber,
    filter. Columnar, so a million subscriptions cost a few Arrow kernels, not a
    million lookups."""
    t = snapshot.tables
    filters = t.sub_filter[slots]
    return pa.table({
        "slot": pa.array(slots, pa.int64()),
        "subscription_id": t.sub_ids.take(pa.array(slots, pa.int64())),
        "exchange": pa.DictionaryArray.from_arrays(
            pa.array(t.filter_exchange[filters].astype(np.int32)),
            pa.array(t.exchange_names, pa.string())).cast(pa.string()),
        "subscriber": t.subscriber_names.take(pa.array(t.sub_subscriber[slots], pa.int64())),
        "filter": t.filter_text.take(pa.array(filters, pa.int64())),
    })


def _criteria(snapshot: Snapshot) -> dict[int, HeaderCriteria]:
    t = snapshot.tables
    return {int(slot): t.criteria_sets[ref]
            for slot, ref in zip(t.criteria_slots.tolist(), t.criteria_ref.tolist(), strict=True)}


def _rows(snapshot: Snapshot, table: pa.Table) -> list[dict[str, Any]]:
    """The rows of a :func:`_table`, as dicts of :data:`SUBSCRIPTION_COLUMNS`."""
    criteria = _criteria(snapshot)
    t = snapshot.tables
    flags = dict(zip(t.option_slots.tolist(), t.option_flags.tolist(), strict=True))
    rows = []
    for row in table.to_pylist():
        slot = row.pop("slot")
        found = criteria.get(slot)
        row["header_match"] = None if found is None else found.match
        row["header_criteria"] = None if found is None else dict(found.criteria)
        options = SubscriptionOptions.from_flags(flags.get(slot, 0))
        row["retain_handling"] = options.retain_handling
        row["retain_as_published"] = options.retain_as_published
        row["no_local"] = options.no_local
        rows.append(row)
    return rows


# --- explain -----------------------------------------------------------------------

@dataclass(frozen=True)
class Receiver:
    """One subscriber a publish would reach, with its matching subscriptions (each a
    dict of :data:`SUBSCRIPTION_COLUMNS` plus ``shared_group``), sorted by id.

    ``certain`` is False when every one of them is a member of a shared group
    and no message id was given: the subscriber receives the message only if
    chosen (one member per group per message, chosen from the message id).
    """

    subscriber: str
    certain: bool
    subscriptions: list[dict[str, Any]]


def explain(state: RoutingState, exchange: str, routing_key: str,
            headers: Sequence[tuple[str, bytes]] = (), message_id: str | None = None
            ) -> list[Receiver]:
    """Who would receive a publish of ``routing_key`` to ``exchange`` with ``headers``
    (Kafka's convention: the last value of a repeated name counts), sorted by subscriber.

    With ``message_id`` (``<topic>/<partition>/<offset>``), exactly the router's
    deliveries for that message. Without, every subscription that matches,
    shared-group members included (each marked with its group), since which
    member gets the message depends on its id.

    Raises :class:`RejectedPublish` for what the router would reject.
    """
    snapshot = state.snapshot
    header_map = dict(headers)
    try:
        deliveries = Matcher(snapshot).match(exchange, routing_key, header_map, message_id or "")
    except (UnknownExchangeError, TopicError, HeaderError) as exc:
        raise RejectedPublish(f"the router would reject this publish: {exc}") from None
    if EXPIRY_HEADER in header_map:
        reason = expiry_error(header_map[EXPIRY_HEADER])
        if reason is not None:
            raise RejectedPublish(f"the router would reject this publish: {reason}")
    t = snapshot.tables
    ids = [sub_id for d in deliveries for sub_id in d.subscription_ids]
    live = _live(t)
    matched = live & pc.is_in(t.sub_ids, pa.array(ids, pa.string())).to_numpy(zero_copy_only=False)
    shared = shared_filters(snapshot)
    if message_id is None and shared.any():
        # The other members of each matched group: same (exchange, filter), criteria holding.
        groups = np.unique(t.sub_filter[matched][shared[t.sub_filter[matched]]])
        criteria = _criteria(snapshot)
        for slot in np.flatnonzero(live & np.isin(t.sub_filter, groups) & ~matched).tolist():
            found = criteria.get(slot)
            matched[slot] = found is None or found.matches(header_map)
    slots = np.flatnonzero(matched)
    table = _table(snapshot, slots)
    table = table.append_column("shared", pa.array(shared[t.sub_filter[slots]], pa.bool_()))
    table = table.take(pc.sort_indices(table, sort_keys=[("subscriber", "ascending"),
                                                        ("subscription_id", "ascending")]))
    receivers: dict[str, list[dict[str, Any]]] = {}
    for row in _rows(snapshot, table):
        row["shared_group"] = row["filter"] if row.pop("shared") else None
        receivers.setdefault(row["subscriber"], []).append(row)
    return [Receiver(name, message_id is not None or any(r["shared_group"] is None for r in rows),
                     rows) for name, rows in receivers.items()]


# --- retained messages (MQTT) ---------------------------------------------------------

def retained_messages(config: Config, state: RoutingState):
    """The MQTT exchanges' retained messages now (:class:`streaming.router.retained.RetainedMessages`,
    read from ``kafka.retained_topic`` to its end; none when no router created the topic
    yet), or None when Kafka was not reachable for the state (``state.stale``) or the
    topic cannot be read."""
    from streaming.router.retained import RetainedMessages
    from streaming.router.subscriptions.changelog import ChangelogError

    if state.stale is not None:
        return None
    try:
        messages = RetainedMessages(config)
    except KafkaException:
        return None
    try:
        if _topic_exists(config, config.kafka.retained_topic):
            messages.catch_up()
        # As the router serves them: an expired one is no longer retained.
        messages.expire(int(time.time() * 1000))
        return messages
    except (ChangelogError, KafkaException, KafkaAccessError):
        return None
    finally:
        messages.close()


def _topic_exists(config: Config, topic: str) -> bool:
    """Whether ``topic`` exists (asked by a consumer: it never creates the topic)."""
    consumer = kafka_consumer(config.kafka.client_settings, "bitroute-inspect")
    try:
        found = consumer.topics(KAFKA_PROBE_TIMEOUT_S, topic).topics.get(topic)
    finally:
        consumer.close()
    return found is not None and found.error is None


def retained_of(config: Config, state: RoutingState, exchange: str,
                topic: str) -> dict[str, object] | None:
    """``bitroute explain``'s view of ``topic``'s retained message on an MQTT exchange:
    ``{"message_id", "payload_bytes", "published_at"}`` (ISO-8601, UTC), or None when the
    topic has none (or the retained topic could not be read)."""
    from datetime import datetime

    messages = retained_messages(config, state)
    found = None if messages is None else messages.get(exchange, topic)
    if found is None:
        return None
    published = datetime.fromtimestamp(found.published_at_ms / 1000, UTC)
    return {"message_id": found.message_id, "payload_bytes": len(found.value),
            "published_at": published.isoformat(),
            "expiry_remaining": messages.remaining.get((exchange, topic))}


def with_retained(config: Config, state: RoutingState,
                  rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` of :func:`subscriptions`, each of an MQTT exchange with ``retained``: how many
    retained messages its filter matches now, what it would receive if applied again
    (None for a ``$share/`` subscription, which receives none when applied, or when the
    retained topic could not be read). Rows of other exchanges are left as they are."""
    mqtt = {name for name, dialect in config.exchanges.dialects.items() if dialect == "mqtt"}
    if not any(row["exchange"] in mqtt for row in rows):
        return rows
    messages = retained_messages(config, state)
    for row in rows:
        if row["exchange"] not in mqtt:
            continue
        if messages is None or str(row["filter"]).startswith("$share/"):
            row["retained"] = None
            continue
        if row["header_match"] is not None:
            criteria = HeaderCriteria(row["header_match"], dict(row["header_criteria"] or {}))
            row["retained"] = sum(criteria.matches(dict(m.headers)) for m in
                                  messages.matching(row["exchange"], row["filter"]))
        else:
            row["retained"] = len(messages.matching(row["exchange"], row["filter"]))
    return rows

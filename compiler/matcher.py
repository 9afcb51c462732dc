"""Matching publishes against one snapshot.

A :class:`Matcher` turns a :class:`~compiler.snapshot.Snapshot` into the
matching kernel's tables once (``bitroute_kernel.Kernel``, ``kernel/``; see
docs/architecture.md, "Matching"), then answers a topic in time that does
not grow with the number of subscriptions: one hash lookup of the whole topic
among the exact (wildcard-free) filters, and one walk of its words through a
trie of the wildcard filters, each (node, position) state visited once (so
AMQP filters with several ``#`` cost no backtracking).

Each hit names a subscription slot (a filter held by one subscription
without conditions) or a filter slot, whose subscription slots follow (see
*hit codes* in :mod:`compiler.resolve`). The topic's subscription slots are
sorted by (subscriber, id); header criteria (:mod:`compiler.criteria_index`)
and shared-subscription choices (:mod:`compiler.shared`) are applied per
message on top of that, in Python: the kernel hands such topics back.

Two APIs: :meth:`Matcher.match` answers one message (the kernel builds the
``Delivery`` tuples; large and conditioned results are kept in a
byte-bounded per-matcher cache, :mod:`compiler.cache`);
:meth:`Matcher.match_columns` answers a batch (the router's path,
:mod:`streaming.router.batch.routing`), matching its distinct keys together in the
kernel and having it write the Arrow output (:mod:`compiler.batch`). The batch
path does not read the topic cache.

Output contract (both APIs): one delivery per subscriber with at least one
matching subscription, listing every matching subscription id of that
subscriber; deliveries sorted by subscriber, ids sorted within a delivery. For
a shared-subscription group (exchange, ``$share/<group>/<filter>``) only the
chosen member's subscriptions of that group count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from bitroute_kernel import Kernel, TableError

from schemas.records import PUBLISHER_HEADER

from .batch import Units
from .cache import MATCH_CACHE_MAX_BYTES, MATCH_CACHE_MIN_ITEMS, TopicCache
from .columns import bool_mask, string_buffers
from .criteria_index import CriteriaIndex
from .errors import HeaderError, SnapshotFormatError, TopicError, UnknownExchangeError, quote
from .frame_input import (
    MALFORMED,
    decode_keys,
    frame_headers,
    header_value,
    publisher_of,
    relevant_headers,
    relevant_mapping,
)
from .grammar import grammar_for, kernel_grammar
from .options import SubscriptionOptions
from .output import DELIVERIES_TYPE, Delivery, deliveries_column
from .resolve import HAS_CRITERIA, HAS_SHARED, Resolver, TopicResult
from .shared import shared_filters
from .snapshot import Snapshot
from .tables import KernelTables, filter_subscriptions, slot_ranks

__all__ = ["DELIVERIES_TYPE", "Delivery", "Matcher"]


class Matcher:
    """Matches publishes against one snapshot; see the module docstring.

    Thread-compatible, not thread-safe (the topic cache is unsynchronised).
    ``cache_max_bytes`` bounds the topic cache (estimated bytes, see
    :mod:`compiler.cache`).

    The kernel's tables hold *hit codes*: a code ``h >= 0`` is the subscription
    slot of a filter held by exactly one subscription, without header
    criteria or shared group (the common case, resolved without further
    lookups); ``h < 0`` stands for filter slot ``~h``, whose subscriptions and
    conditions are looked up by :class:`compiler.resolve.Resolver`.
    """

    def __init__(self, snapshot: Snapshot, cache_max_bytes: int = MATCH_CACHE_MAX_BYTES) -> None:
        self._snapshot = snapshot
        t = snapshot.tables
        self._cache = TopicCache(cache_max_bytes)
        self._cache_get = self._cache.get

        self._names: list[str | None] = t.subscriber_names.to_pylist()

        live = np.flatnonzero(bool_mask(pc.is_valid(t.sub_ids)))
        owners = np.zeros(len(t.sub_ids), dtype=np.int64)
        owners[live] = t.sub_subscriber[live]
        rank = slot_ranks(t.subscriber_names, owners, t.sub_ids)
        single, (fs_start, fs_count, fs_slots) = filter_subscriptions(t.sub_filter, live, len(t.filter_text))

        self._grammars = [grammar_for(snapshot.exchanges[name]) for name in t.exchange_names]
        self._exchange_number = {name: i for i, name in enumerate(t.exchange_names)}
        flags: dict[int, int] = {}
        self._criteria: CriteriaIndex | None = None
        if len(t.criteria_slots):
            self._criteria = CriteriaIndex(t.criteria_slots, t.criteria_ref, t.criteria_sets)
            for f in np.unique(t.sub_filter[t.criteria_slots]).tolist():
                flags[f] = HAS_CRITERIA
        for f in np.flatnonzero(shared_filters(snapshot)).tolist():
            flags[f] = flags.get(f, 0) | HAS_SHARED
        hit_code = np.where(single >= 0, single, ~np.arange(len(single)))
        special = np.zeros(len(single), dtype=np.uint8)
        if flags:
            conditioned = np.fromiter(flags, dtype=np.int64, count=len(flags))
            hit_code[conditioned] = ~conditioned
            special[conditioned] = 1
        tables = KernelTables(
            delivery_type=Delivery,
            names=self._names,
            name_text=string_buffers(t.subscriber_names),
            ids=string_buffers(t.sub_ids),
            rank=rank,
            owners=owners,
            filter_start=fs_start,
            filter_count=fs_count,
            filter_slots=fs_slots,
            special=special,
            grammars=[kernel_grammar(snapshot.exchanges[name]) for name in t.exchange_names],
            filter_text=string_buffers(t.filter_text),
            filter_exchange=np.where(bool_mask(pc.is_valid(t.filter_text)), t.filter_exchange.astype(np.int64), -1),
            hit_code=hit_code,
        )
        try:
            self._kernel = Kernel(tables)
        except TableError as exc:
            raise SnapshotFormatError(f"snapshot {snapshot.version}: the matching kernel refuses its "
                                      f"tables: {exc}") from exc
        self._kernel_deliveries = self._kernel.deliveries
        self._resolver = Resolver(self._kernel, self._names, owners, flags, t.sub_filter, t.filter_text)
        options = [(slot, SubscriptionOptions.from_flags(bits))
                   for slot, bits in zip(t.option_slots.tolist(), t.option_flags.tolist(), strict=True)]
        published = [slot for slot, o in options if o.retain_as_published]
        self._retain_as_published = frozenset(
            t.sub_ids.take(pa.array(published, pa.int64())).to_pylist())
        local = pa.array([slot for slot, o in options if o.no_local], pa.int64())
        self._no_local_ids = frozenset(t.sub_ids.take(local).to_pylist())
        self._no_local_subscribers = frozenset(t.subscriber_names.take(
            pa.array(t.sub_subscriber[local.to_numpy()], pa.int64())).to_pylist())
        if not self._no_local_ids:
            # No No Local to apply: match() is _match() itself, without a wrapper's call
            # on the cold path (python -m benchmarks compiler, "cold median"); an instance
            # attribute that shadows the method, which mypy refuses to assign.
            self.match = self._match  # type: ignore[method-assign]

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    @property
    def version(self) -> int:
        return self._snapshot.version

    @property
    def retain_as_published(self) -> frozenset[str]:
        """The ids of the subscriptions with MQTT Retain As Published (:mod:`compiler.options`):
        a live delivery of a retained publish keeps its ``retain`` header only for them."""
        return self._retain_as_published

    @property
    def reads_publisher(self) -> bool:
        """Whether some subscription has MQTT No Local: matching then reads each publish's
        last :data:`~schemas.records.PUBLISHER_HEADER` (its headers must be given)."""
        return bool(self._no_local_ids)

    @property
    def cache(self) -> TopicCache:
        """The topic cache (for its bound, size and eviction count)."""
        return self._cache

    def match(
        self,
        exchange: str,
        routing_key: str,
        headers: Mapping[str, str | bytes | None] | None = None,
        message_id: str = "",
    ) -> list[Delivery]:
        """Deliveries of one message (see the module docstring for the contract).

        Raises :class:`~compiler.errors.UnknownExchangeError` for an exchange
        not in the snapshot, :class:`~compiler.errors.TopicError` for a routing
        key invalid in the exchange's dialect, and
        :class:`~compiler.errors.HeaderError` for headers that are not a
        mapping of string names to bytes, str or ``None`` (headers are only
        read when a matched subscription has header criteria).
        ``message_id`` picks the member of each shared-subscription group. A
        subscription with No Local does not match a publish whose last ``publisher``
        header names its subscriber.
        """
        deliveries = self._match(exchange, routing_key, headers, message_id)
        if self._no_local_ids and headers:
            if not isinstance(headers, Mapping):
                raise HeaderError(f"headers must be a mapping of name to value, not "
                                  f"{type(headers).__name__}")
            publisher = header_value(PUBLISHER_HEADER, headers.get(PUBLISHER_HEADER))
            if publisher in self._no_local_subscribers:
                deliveries = [Delivery(d.subscriber, tuple(ids)) for d, ids in (
                    (d, self._not_local(d.subscriber, d.subscription_ids, publisher))
                    for d in deliveries) if ids]
        return deliveries

    def _not_local(self, subscriber: str, ids, publisher: str | None):
        """``ids`` of a delivery to ``subscriber`` less those with No Local when it published."""
        if subscriber != publisher:
            return ids
        return [i for i in ids if i not in self._no_local_ids]

    def _match(self, exchange: str, routing_key: str, headers=None,
               message_id: str = "") -> list[Delivery]:
        """:meth:`match` before No Local."""
        try:
            result = self._cache_get((exchange, routing_key))
        except TypeError:  # an unhashable exchange or routing key: invalid below
            result = None
        if result is None:
            number = self._exchange_number.get(exchange) if exchange.__class__ is str else None
            if number is None:
                raise UnknownExchangeError(f"unknown exchange {quote(exchange)}")
            deliveries = self._kernel_deliveries(number, routing_key)
            if deliveries is not None and len(deliveries) < MATCH_CACHE_MIN_ITEMS:
                return list(deliveries)  # small and without conditions: not cached
            result = self._lookup(number, exchange, routing_key, deliveries)
        slots: Sequence[int]
        deliveries, slots, conditions, shared = result
        if not conditions:
            return list(deliveries)
        if conditions & HAS_CRITERIA:
            assert self._criteria is not None  # a filter with criteria is in the criteria index
            slots = self._resolver.criteria_filtered(
                self._criteria, slots, relevant_headers(headers, self._criteria.names)
            )
        if conditions & HAS_SHARED:
            slots = self._resolver.shared(exchange, slots, shared, message_id)
        return list(self._kernel.slot_deliveries(slots))

    def match_columns(
        self, message_ids: list, exchanges: list, keys: list, headers: list | None = None
    ) -> tuple[pa.ListArray, np.ndarray]:
        """Match a batch of publishes given as columns, one list per column:
        the router's batch path (:mod:`streaming.router.batch.routing`).

        Input: ``message_ids`` (str), ``exchanges`` (str), ``keys`` (routing
        keys: bytes, as Kafka keys arrive, or str; ``None`` or invalid UTF-8
        is a rejection), and optionally ``headers``: per row ``None`` or a
        sequence of Kafka header entries, each a ``(key, value)`` pair or a
        mapping with ``"key"`` and ``"value"``, the value bytes, str or
        ``None``. Headers are only read when some subscription of the
        snapshot has header criteria.

        Returns ``(deliveries, errors)``, one entry per row, in order:
        ``deliveries``, the ``DELIVERIES_TYPE`` Arrow column: the
        :meth:`match` result as ``[{subscriber, subscription_ids}]``, empty
        when unroutable or rejected; ``errors``, an object array: ``None``,
        or why the row was rejected (unknown or missing exchange, missing or
        invalid routing key, malformed headers). Never raises for a bad row.

        Rows with equal (exchange, routing key, relevant headers) are matched
        once; the Arrow output is assembled from flat slot arrays, without a
        Python object per delivery.
        """
        n = len(keys)
        units = Units()
        row_unit = np.zeros(n, dtype=np.int64)
        errors = np.full(n, None, dtype=object)
        rest = self._match_keys(exchanges, keys, units, row_unit)
        if rest is None or len(rest):
            self._match_rows(message_ids, exchanges, keys, headers, rest, units, row_unit, errors)
        flat, offsets = units.build()
        deliveries = deliveries_column(n, self._kernel.layout(row_unit, flat, offsets))
        if self._no_local_ids and headers is not None:
            deliveries = self._without_local(deliveries, headers)
        return deliveries, errors

    def _without_local(self, deliveries: pa.ListArray, headers: list) -> pa.ListArray:
        """``deliveries`` less the subscriptions with No Local of the subscriber each row's
        last ``publisher`` header names (a Python pass over the batch's headers: only
        with a snapshot that has such subscriptions; rows rebuilt only when one is hit)."""
        hit: dict[int, str] = {}
        for row, entries in enumerate(headers):
            publisher = publisher_of(entries)
            if publisher is not None and publisher in self._no_local_subscribers:
                hit[row] = publisher
        if not hit:
            return deliveries
        rows = deliveries.to_pylist()
        for row, publisher in hit.items():
            kept = []
            for d in rows[row] or ():
                ids = self._not_local(d["subscriber"], d["subscription_ids"], publisher)
                if ids:
                    kept.append({"subscriber": d["subscriber"], "subscription_ids": list(ids)})
            rows[row] = kept
        return pa.array(rows, DELIVERIES_TYPE)

    def _match_keys(self, exchanges: list, keys: list, units: Units, row_unit: np.ndarray) -> np.ndarray | None:
        """The common batch, all in the kernel: no header criteria in the
        snapshot and one known exchange. Sets ``row_unit`` of the rows the
        kernel answered and returns the others' indices (``None``: the
        batch is not one the kernel takes, every row is left)."""
        if self._criteria is not None or not exchanges:
            return None
        exchange = exchanges[0]
        number = self._exchange_number.get(exchange) if exchange.__class__ is str else None
        if number is None or exchanges.count(exchange) != len(exchanges):
            return None
        row_topic_bytes, flat, offsets = self._kernel.match_keys(number, keys)
        row_topic = np.frombuffer(row_topic_bytes, dtype=np.int64)
        base = units.add_block(np.frombuffer(flat, dtype=np.int64), np.frombuffer(offsets, dtype=np.int64))
        answered = row_topic >= 0
        row_unit[answered] = base + row_topic[answered]
        return np.flatnonzero(~answered)

    def _match_rows(self, message_ids: list, exchanges: list, keys: list, headers: list | None,
                    rows: np.ndarray | None, units: Units, row_unit: np.ndarray, errors: np.ndarray) -> None:
        """Every kind of batch row (``rows``: indices; ``None``: all): per
        exchange, header criteria, shared groups, rejections. Sets
        ``row_unit`` and ``errors`` of those rows."""
        if rows is not None:
            exchanges = [exchanges[i] for i in rows.tolist()]
            keys = [keys[i] for i in rows.tolist()]
        n = len(keys)
        row_errors: list[str | None] = [None] * n
        distinct_input: list[tuple]
        if self._criteria is not None and headers is not None:
            if rows is not None:
                headers = [headers[i] for i in rows.tolist()]
            relevant = frame_headers(headers, self._criteria.names, row_errors)
            distinct_input = list(zip(exchanges, keys, relevant, strict=True))
        else:
            distinct_input = list(zip(exchanges, keys, strict=True))
        # Distinct rows in order of first appearance, deduplicated in C.
        distinct_rows = list(dict.fromkeys(distinct_input))
        position = {row: j for j, row in enumerate(distinct_rows)}
        row_distinct = np.fromiter(map(position.__getitem__, distinct_input), dtype=np.int64, count=n)

        distinct_unit = np.zeros(len(distinct_rows), dtype=np.int64)
        distinct_error: dict[int, str] = {}
        per_message: dict[int, tuple] = {}
        groups: dict = {}
        for j, row in enumerate(distinct_rows):
            if len(row) == 2 or row[2] is not MALFORMED:
                groups.setdefault(row[0], []).append(j)
        for exchange, members in groups.items():
            if exchange.__class__ is not str or exchange not in self._exchange_number:
                reason = "missing exchange" if exchange is None else f"unknown exchange {quote(exchange)}"
                distinct_error.update(dict.fromkeys(members, reason))
                continue
            topics, key_errors = decode_keys([distinct_rows[j][1] for j in members])
            for i, reason in key_errors.items():
                distinct_error[members[i]] = reason
            # Rows of one topic differ by their relevant headers: number the
            # distinct topics once.
            distinct_topics = list(dict.fromkeys(x for x in topics if x is not None))
            numbers: dict[str | None, int] = {topic: t for t, topic in enumerate(distinct_topics)}
            numbers[None] = -1
            topic_of = np.fromiter(map(numbers.__getitem__, topics), dtype=np.int64, count=len(topics))
            block, topic_errors, conditioned = self.match_topics(exchange, distinct_topics)
            base = units.add_block(*block)
            member_rows = np.array(members, dtype=np.int64)
            valid = topic_of >= 0
            distinct_unit[member_rows[valid]] = base + topic_of[valid]
            if topic_errors or conditioned:
                for i in np.flatnonzero(np.isin(topic_of, list(topic_errors) + list(conditioned))).tolist():
                    j, topic = members[i], int(topic_of[i])
                    if topic in topic_errors:
                        distinct_error[j] = topic_errors[topic]
                        continue
                    row = distinct_rows[j]
                    slots: Sequence[int]
                    _, slots, flags, shared = conditioned[topic]
                    if flags & HAS_CRITERIA:
                        slots = self._resolver.criteria_filtered(
                            self._criteria, slots, relevant_mapping(row[2] if len(row) > 2 else ())
                        )
                    if flags & HAS_SHARED:
                        per_message[j] = (slots, shared)
                        distinct_unit[j] = 0
                    else:
                        distinct_unit[j] = units.add(slots)
        unit = distinct_unit[row_distinct]
        if distinct_error:
            for i in np.flatnonzero(np.isin(row_distinct, list(distinct_error))).tolist():
                row_errors[i] = row_errors[i] or distinct_error[row_distinct[i]]
        if per_message:
            if rows is not None:
                message_ids = [message_ids[i] for i in rows.tolist()]
            for i in np.flatnonzero(np.isin(row_distinct, list(per_message))).tolist():
                if row_errors[i] is None:
                    slots, shared = per_message[row_distinct[i]]
                    unit[i] = units.add(self._resolver.shared(exchanges[i], slots, shared, message_ids[i] or ""))
        if rows is None:
            row_unit[:] = unit
            errors[:] = np.array(row_errors, dtype=object)
        else:
            row_unit[rows] = unit
            for i, error in zip(rows.tolist(), row_errors, strict=True):
                errors[i] = error

    def match_topics(
        self, exchange: str, topics: list[str]
    ) -> tuple[tuple, dict[int, str], dict[int, TopicResult]]:
        """Match distinct topics (str) of one known exchange together, before
        per-message conditions: the batch entry point under
        :meth:`match_columns` (see :mod:`compiler.batch`).

        Returns ``((flat, offsets), errors, conditioned)``: topic ``t``'s
        subscription slots, in (subscriber, id) order (that of deliveries),
        are ``flat[offsets[t]:offsets[t + 1]]``; ``errors[t]`` is why topic
        ``t`` is invalid; ``conditioned[t]`` is the result, in slot form, of
        a topic that hit a filter with header criteria or a shared group (its
        slots in ``flat`` are empty: the caller applies the per-message
        conditions). Raises ``KeyError`` for an exchange not in the snapshot.
        """
        number = self._exchange_number[exchange]
        flat, offsets, unhandled, special = self._kernel.match_topics(number, topics)
        errors: dict[int, str] = {}
        conditioned: dict[int, TopicResult] = {}
        for t in unhandled + special:
            try:
                words = self._grammars[number].parse_topic(topics[t])
            except TopicError as exc:
                errors[t] = str(exc)
            else:
                conditioned[t] = self._resolver.slots(self._kernel.hits(number, words))
        return (np.frombuffer(flat, dtype=np.int64), np.frombuffer(offsets, dtype=np.int64)), errors, conditioned

    def _lookup(self, number: int, exchange: str, topic: str, deliveries: tuple | None) -> TopicResult:
        """The result of a topic not in the cache, cached: ``deliveries``, the
        kernel's finished deliveries of a topic without conditions, or for
        ``None`` (an invalid topic, or a hit of a filter with per-message
        conditions) its slots.

        Raises TopicError for an invalid topic (not cached).
        """
        if deliveries is not None:
            result = TopicResult(deliveries, (), 0, ())
        else:  # the grammar raises an invalid topic's error
            words = self._grammars[number].parse_topic(topic)
            result = self._resolver.result(self._kernel.hits(number, words))
        self._cache.put((exchange, topic), result)
        return result

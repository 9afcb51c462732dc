"""Matching publishes against one snapshot.

A :class:`Matcher` turns a :class:`~compiler.snapshot.Snapshot` into lookup
tables once, then answers a topic in time that does not grow with the number
of subscriptions:

1. one hash lookup of the whole topic among the exact (wildcard-free) filters;
2. one hash lookup per *shape* that exists for the topic's word count (see
   :mod:`compiler.pattern`), keyed by the topic's words at the shape's literal
   positions; catch-all filters (``#``, ``*.#``, ``+/+``) are listed per topic
   length without any lookup;
3. AMQP filters with several ``#`` runs through one automaton
   (:mod:`compiler.nfa`).

Each hit is a filter slot; a filter slot maps to its single subscription slot,
or to a roaring bitmap of them when several subscriptions share the filter.
The topic's subscription slots are sorted once by (subscriber, id) and cached
per topic (:mod:`compiler.cache`); header criteria
(:mod:`compiler.criteria_index`) and shared-subscription choices
(:mod:`compiler.shared`) are applied per message on top of the cached result.

Output contract (both APIs): one delivery per subscriber with at least one
matching subscription, listing every matching subscription id of that
subscriber; deliveries sorted by subscriber, ids sorted within a delivery. For
a shared-subscription group (exchange, ``$share/<group>/<filter>``) only the
chosen member's subscriptions of that group count.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import FrozenBitMap

from .cache import MATCH_CACHE_MAX_BYTES, TopicCache
from .columns import bitmap_of
from .criteria_index import CriteriaIndex
from .errors import HeaderError, TopicError, UnknownExchangeError, quote
from .grammar import grammar_for
from .headers import decode_header_value
from .nfa import FilterAutomaton
from .pattern import Shape
from .shared import choose_member, group_key
from .snapshot import CODE_EXACT, CODE_MULTI, CODE_SHAPE_BASE, Snapshot

DELIVERIES_TYPE = pa.list_(
    pa.struct([pa.field("subscriber", pa.string()), pa.field("subscription_ids", pa.list_(pa.string()))])
)
"""Arrow type of :meth:`Matcher.match_frame`'s ``deliveries`` column."""

SORT_IN_PYTHON_MAX = 64
"""Results up to this many subscriptions are ordered with Python's sort; larger
ones through a per-matcher rank array (numpy), computed on first need."""

PLAN_CACHE_MAX_LENGTHS = 512
"""Per exchange, lookup plans are memoised for at most this many topic lengths."""

RESULT_OVERHEAD_BYTES = 320
"""Estimated bytes of one cached topic result besides its slots and key text."""

_HAS_CRITERIA = 1
_HAS_SHARED = 2
_NO_HEADERS: frozenset = frozenset()


class Delivery(NamedTuple):
    """One copy of a message for one subscriber, naming every subscription of
    that subscriber that matched (sorted)."""

    subscriber: str
    subscription_ids: tuple[str, ...]


class _Result:
    """The subscriptions a topic matches before per-message conditions.

    ``slots``: subscription slots sorted by (subscriber, id); ``flags``: whether
    some of them have header criteria / belong to a shared group; ``shared``:
    the matched filter slots of shared groups.
    """

    __slots__ = ("slots", "flags", "shared")

    def __init__(self, slots: array, flags: int, shared: tuple[int, ...]) -> None:
        self.slots = slots
        self.flags = flags
        self.shared = shared


_EMPTY_RESULT = _Result(array("I"), 0, ())


def _result_bytes(key: tuple[str, str], result: _Result) -> int:
    return RESULT_OVERHEAD_BYTES + len(key[0]) + len(key[1]) + 4 * len(result.slots) + 8 * len(result.shared)


class _Plan(NamedTuple):
    """What to look up for a topic of one length: (key getter, table) pairs,
    and the catch-all filter slots; ``dollar_*`` for MQTT topics starting with '$'."""

    lookups: tuple
    catch_all: tuple[int, ...]
    dollar_lookups: tuple


class _Exchange:
    """The lookup tables of one exchange."""

    __slots__ = ("name", "grammar", "dollar_rule", "exact", "shaped", "catch_alls", "automaton", "_plans")

    def __init__(self, name: str, grammar: ModuleType) -> None:
        self.name = name
        self.grammar = grammar
        self.dollar_rule = grammar.DOLLAR_RULE
        self.exact: dict[str, int | tuple[int, ...]] = {}
        self.shaped: list[tuple[Shape, object, dict]] = []
        self.catch_alls: list[tuple[Shape, tuple[int, ...]]] = []
        self.automaton: FilterAutomaton | None = None
        self._plans: dict[int, _Plan] = {}

    def filters(self, words: list[str], topic: str) -> list[int]:
        """Filter slots of this exchange matching the topic (validated, split into ``words``)."""
        out: list[int] = []
        hit = self.exact.get(topic)
        if hit is not None:
            if hit.__class__ is int:
                out.append(hit)
            else:
                out += hit
        plan = self._plans.get(len(words))
        if plan is None:
            plan = self._plan(len(words))
        if self.dollar_rule and topic[0] == "$":
            lookups = plan.dollar_lookups
        else:
            lookups = plan.lookups
            out += plan.catch_all
        for getter, table in lookups:
            hit = table.get(getter(words))
            if hit is not None:
                if hit.__class__ is int:
                    out.append(hit)
                else:
                    out += hit
        if self.automaton is not None:
            out += self.automaton.match(words)
        return out

    def _plan(self, length: int) -> _Plan:
        lookups = tuple((getter, table) for shape, getter, table in self.shaped if shape.applies_to(length))
        dollar = tuple(
            (getter, table)
            for shape, getter, table in self.shaped
            if shape.applies_to(length) and not shape.first_wild
        )
        catch_all = tuple(f for shape, fslots in self.catch_alls if shape.applies_to(length) for f in fslots)
        plan = _Plan(lookups, catch_all, dollar)
        if len(self._plans) < PLAN_CACHE_MAX_LENGTHS:
            self._plans[length] = plan
        return plan


def _table(keys: list, fslots: list[int]) -> dict:
    """``keys[i] -> fslots[i]``; a key held by several filter slots maps to their tuple."""
    table = dict(zip(keys, fslots))
    if len(table) == len(fslots):
        return table
    table = {}
    for key, fslot in zip(keys, fslots):
        prev = table.get(key)
        if prev is None:
            table[key] = fslot
        elif prev.__class__ is int:
            table[key] = (prev, fslot)
        else:
            table[key] = prev + (fslot,)
    return table


class Matcher:
    """Matches publishes against one snapshot; see the module docstring.

    Thread-compatible, not thread-safe (the topic cache is unsynchronised).
    ``cache_max_bytes`` bounds the topic cache (estimated bytes).
    """

    def __init__(self, snapshot: Snapshot, cache_max_bytes: int = MATCH_CACHE_MAX_BYTES) -> None:
        self._snapshot = snapshot
        t = snapshot.tables
        self._cache: TopicCache[tuple[str, str], _Result] = TopicCache(cache_max_bytes, _result_bytes)

        self._ids: list[str | None] = t.sub_ids.to_pylist()
        self._names: list[str | None] = t.subscriber_names.to_pylist()
        self._ids_arrow = t.sub_ids
        self._names_arrow = t.subscriber_names
        self._sub_subscriber_np = t.sub_subscriber
        self._sub_subscriber: list[int] = t.sub_subscriber.tolist()
        self._sub_filter: list[int] = t.sub_filter.tolist()
        self._rank: np.ndarray | None = None

        live = np.flatnonzero(pc.is_valid(t.sub_ids).to_numpy(zero_copy_only=False))
        n_filters = len(t.filter_text)
        self._fsubs = self._filter_subscriptions(t.sub_filter, live, n_filters)

        texts: list[str | None] = t.filter_text.to_pylist()
        self._filter_text = texts
        self._exchanges: dict[str, _Exchange] = {
            name: _Exchange(name, grammar_for(snapshot.exchanges[name])) for name in t.exchange_names
        }
        exchange_list = [self._exchanges[name] for name in t.exchange_names]
        flags: dict[int, int] = {}
        for exchange_code, code, fslots in _groups(t.filter_exchange, t.filter_code, texts):
            exchange = exchange_list[exchange_code]
            grammar = exchange.grammar
            group_texts = [texts[f] for f in fslots]
            if grammar.DOLLAR_RULE:
                for f, text in zip(fslots, group_texts):
                    if text.startswith(grammar.SHARE_PREFIX):
                        flags[f] = _HAS_SHARED
            if code == CODE_EXACT:
                exchange.exact.update(_table([grammar.exact_key(x) for x in group_texts], fslots))
            elif code == CODE_MULTI:
                exchange.automaton = FilterAutomaton(
                    ((grammar.filter_words(x), f) for f, x in zip(fslots, group_texts)), grammar.ONE, grammar.MANY
                )
            else:
                shape = t.shapes[code - CODE_SHAPE_BASE]
                if shape.catch_all:
                    exchange.catch_alls.append((shape, tuple(fslots)))
                else:
                    getter = shape.key_getter()
                    split = grammar.filter_words
                    exchange.shaped.append((shape, getter, _table([getter(split(x)) for x in group_texts], fslots)))

        self._criteria: CriteriaIndex | None = None
        if len(t.criteria_slots):
            self._criteria = CriteriaIndex(t.criteria_slots, t.criteria_ref, t.criteria_sets)
            for f in np.unique(t.sub_filter[t.criteria_slots]).tolist():
                flags[f] = flags.get(f, 0) | _HAS_CRITERIA
        self._flags = flags
        self._special = frozenset(flags)

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    @property
    def version(self) -> int:
        return self._snapshot.version

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
        mapping of string names. ``message_id`` picks the member of each
        shared-subscription group.
        """
        result = self._result(exchange, routing_key)
        slots: Sequence[int] = result.slots
        if result.flags:
            relevant = self._relevant_headers(headers) if result.flags & _HAS_CRITERIA else {}
            slots = self._conditioned(exchange, result, relevant, message_id)
        return self._deliveries(slots)

    def match_frame(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Match a batch of publishes, for ``mapInPandas``.

        Input columns: ``message_id`` (str), ``exchange`` (str),
        ``routing_key`` (bytes, as Kafka keys arrive, or str; ``None`` or
        invalid UTF-8 is a rejection), and optionally ``headers``: per row
        ``None`` or a sequence of Kafka header entries, each a ``(key, value)``
        pair or a mapping with ``"key"`` and ``"value"``, the value bytes, str
        or ``None``.

        Output: one row per input row, in order, with ``message_id``;
        ``deliveries``, of pandas ``ArrowDtype(DELIVERIES_TYPE)``: the
        :meth:`match` result as ``[{subscriber, subscription_ids}]``, empty
        when unroutable or rejected; ``error``: ``None``, or why the row was
        rejected (unknown or missing exchange, missing or invalid routing key,
        malformed headers). Never raises for a bad row.

        Rows with equal (exchange, routing key, relevant headers) are matched
        once; the Arrow output is assembled from flat slot arrays, without a
        Python object per delivery.
        """
        n = len(frame)
        message_ids = frame["message_id"].tolist()
        exchanges = frame["exchange"].tolist()
        keys = frame["routing_key"].tolist()
        headers = frame["headers"].tolist() if "headers" in frame.columns else None
        criteria_names = self._criteria.names if self._criteria is not None else None

        units: list[array] = [_EMPTY_RESULT.slots]
        row_unit = np.zeros(n, dtype=np.int32)
        errors: list[str | None] = [None] * n
        seen: dict[tuple, tuple] = {}
        for i in range(n):
            key = keys[i]
            if key.__class__ is bytearray:
                key = bytes(key)
            relevant_key = _NO_HEADERS
            if criteria_names is not None and headers is not None and headers[i] is not None:
                try:
                    relevant_key = _relevant_entries(headers[i], criteria_names)
                except HeaderError as exc:
                    errors[i] = str(exc)
                    continue
            dedup = (exchanges[i], key, relevant_key)
            entry = seen.get(dedup)
            if entry is None:
                entry = self._frame_entry(exchanges[i], key, relevant_key, units)
                seen[dedup] = entry
            unit, error, result = entry
            if unit >= 0:
                row_unit[i] = unit
                errors[i] = error
            else:
                units.append(array("I", self._shared(exchanges[i], result, message_ids[i] or "")))
                row_unit[i] = len(units) - 1
        deliveries = self._deliveries_array(units).take(pa.array(row_unit))
        return pd.DataFrame(
            {
                "message_id": pd.Series(message_ids, dtype=object),
                "deliveries": pd.Series(pd.arrays.ArrowExtensionArray(deliveries)),
                "error": pd.Series(errors, dtype=object),
            }
        )

    def _frame_entry(self, exchange: object, key: object, relevant_key: frozenset, units: list[array]) -> tuple:
        """``(unit, error, result)`` for one distinct row of a frame.

        ``unit`` indexes ``units`` (appending to it), or is -1 when the row's
        deliveries depend on its message id (shared groups): then ``result``
        holds the header-filtered slots to choose from.
        """
        try:
            if exchange is None:
                raise UnknownExchangeError("missing exchange")
            if key is None:
                raise TopicError("missing routing key")
            if key.__class__ is bytes:
                try:
                    key = key.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise TopicError(f"routing key is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
            result = self._result(exchange, key)
        except TopicError as exc:
            return 0, str(exc), None
        if not result.flags:
            if result.slots:
                units.append(result.slots)
                return len(units) - 1, None, None
            return 0, None, None
        relevant: dict[str, list[str | None]] = {}
        for name, value in relevant_key:
            relevant.setdefault(name, []).append(value)
        slots = self._criteria_filtered(result, relevant)
        if result.flags & _HAS_SHARED:
            return -1, None, _Result(array("I", slots), result.flags, result.shared)
        units.append(array("I", slots))
        return len(units) - 1, None, None

    def _result(self, exchange: str, topic: str) -> _Result:
        """The cached or computed topic result; raises TopicError/UnknownExchangeError."""
        cache_key = (exchange, topic)
        try:
            cached = self._cache.get(cache_key)
        except TypeError:  # an unhashable exchange or topic
            cached = None
        if cached is not None:
            return cached
        table = self._exchanges.get(exchange) if exchange.__class__ is str else None
        if table is None:
            raise UnknownExchangeError(f"unknown exchange {quote(exchange)}")
        words = table.grammar.parse_topic(topic)
        fslots = table.filters(words, topic)
        if not fslots:
            result = _EMPTY_RESULT
        else:
            result = self._build_result(fslots)
        self._cache.put(cache_key, result)
        return result

    def _build_result(self, fslots: list[int]) -> _Result:
        singles: list[int] = []
        maps: list[FrozenBitMap] = []
        fsubs = self._fsubs
        for f in fslots:
            subs = fsubs[f]
            if subs.__class__ is int:
                singles.append(subs)
            else:
                maps.append(subs)
        # Filter slots partition the subscriptions, so the parts are disjoint.
        total = len(singles) + sum(map(len, maps))
        if total <= SORT_IN_PYTHON_MAX:
            for subs in maps:
                singles += subs
            if total > 1:
                names, subscriber, ids = self._names, self._sub_subscriber, self._ids
                singles.sort(key=lambda s: (names[subscriber[s]], ids[s]))
            slots = array("I", singles)
        else:
            parts = [np.array(singles, dtype=np.uint32)] + [np.frombuffer(m.to_array(), dtype=np.uint32) for m in maps]
            merged = np.concatenate(parts)
            ordered = merged[np.argsort(self._ranks()[merged], kind="stable")]
            slots = array("I")
            slots.frombytes(ordered.astype(np.uint32).tobytes())
        flags = 0
        shared: tuple[int, ...] = ()
        if self._special and not self._special.isdisjoint(fslots):
            for f in fslots:
                flags |= self._flags.get(f, 0)
            if flags & _HAS_SHARED:
                shared = tuple(f for f in fslots if self._flags.get(f, 0) & _HAS_SHARED)
        return _Result(slots, flags, shared)

    def _ranks(self) -> np.ndarray:
        """``rank[slot]``: the slot's position in (subscriber, id) order."""
        if self._rank is None:
            table = pa.table({"subscriber": self._names_arrow.take(pa.array(self._sub_subscriber_np)), "id": self._ids_arrow})
            order = pc.sort_indices(table, sort_keys=[("subscriber", "ascending"), ("id", "ascending")])
            rank = np.empty(len(order), dtype=np.int64)
            rank[order.to_numpy()] = np.arange(len(order))
            self._rank = rank
        return self._rank

    def _relevant_headers(self, headers: Mapping[str, str | bytes | None] | None) -> dict[str, list[str | None]]:
        if headers is None:
            return {}
        if not isinstance(headers, Mapping):
            raise HeaderError(f"headers must be a mapping of name to value, not {type(headers).__name__}")
        names = self._criteria.names if self._criteria is not None else frozenset()
        relevant: dict[str, list[str | None]] = {}
        for name, value in headers.items():
            if type(name) is not str:
                raise HeaderError(f"header name must be a string, not {quote(name)}")
            if name in names:
                relevant[name] = [_header_value(name, value)]
        return relevant

    def _criteria_filtered(self, result: _Result, relevant: Mapping[str, Sequence[str | None]]) -> Sequence[int]:
        if not result.flags & _HAS_CRITERIA:
            return result.slots
        with_criteria = self._criteria.with_criteria
        satisfied = self._criteria.satisfied(relevant)
        return [s for s in result.slots if s not in with_criteria or s in satisfied]

    def _conditioned(
        self, exchange: str, result: _Result, relevant: Mapping[str, Sequence[str | None]], message_id: str
    ) -> Sequence[int]:
        slots = self._criteria_filtered(result, relevant)
        if result.flags & _HAS_SHARED:
            slots = self._shared(exchange, _Result(slots, result.flags, result.shared), message_id)
        return slots

    def _shared(self, exchange: str, result: _Result, message_id: str) -> list[int]:
        """``result.slots`` without the subscriptions of shared-group members
        that were not chosen for ``message_id``."""
        slots = list(result.slots)
        names, subscriber, sub_filter = self._names, self._sub_subscriber, self._sub_filter
        for f in result.shared:
            members = sorted({names[subscriber[s]] for s in slots if sub_filter[s] == f})
            if len(members) > 1:
                chosen = choose_member(group_key(exchange, self._filter_text[f]), message_id, members)
                slots = [s for s in slots if sub_filter[s] != f or names[subscriber[s]] == chosen]
        return slots

    def _deliveries(self, slots: Sequence[int]) -> list[Delivery]:
        out: list[Delivery] = []
        names, subscriber, ids = self._names, self._sub_subscriber, self._ids
        current = -1
        group: list[str] = []
        for s in slots:
            owner = subscriber[s]
            if owner != current:
                if group:
                    out.append(Delivery(names[current], tuple(group)))
                current = owner
                group = [ids[s]]
            else:
                group.append(ids[s])
        if group:
            out.append(Delivery(names[current], tuple(group)))
        return out

    def _deliveries_array(self, units: list[array]) -> pa.ListArray:
        """``DELIVERIES_TYPE`` array with one entry per unit (slots in output order)."""
        lengths = np.fromiter(map(len, units), dtype=np.int64, count=len(units))
        unit_offsets = np.zeros(len(units) + 1, dtype=np.int64)
        np.cumsum(lengths, out=unit_offsets[1:])
        flat = np.frombuffer(b"".join(units), dtype=np.uint32)
        owners = self._sub_subscriber_np[flat]
        starts = np.ones(len(flat), dtype=bool)
        starts[1:] = owners[1:] != owners[:-1]
        starts[unit_offsets[:-1][lengths > 0]] = True
        group_starts = np.flatnonzero(starts)
        group_offsets = np.append(group_starts, len(flat)).astype(np.int32)
        ids = pa.ListArray.from_arrays(pa.array(group_offsets), self._ids_arrow.take(pa.array(flat)))
        subscribers = self._names_arrow.take(pa.array(owners[group_starts]))
        groups = pa.StructArray.from_arrays([subscribers, ids], fields=list(DELIVERIES_TYPE.value_type))
        unit_groups = np.searchsorted(group_starts, unit_offsets).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(unit_groups), groups, type=DELIVERIES_TYPE)

    @staticmethod
    def _filter_subscriptions(sub_filter: np.ndarray, live: np.ndarray, n_filters: int) -> list:
        """``fsubs[filter slot]``: its only subscription slot, or a bitmap of several."""
        filters = sub_filter[live]
        order = np.argsort(filters, kind="stable")
        by_filter = live[order]
        counts = np.bincount(filters, minlength=n_filters)
        starts = np.zeros(n_filters + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        single = np.full(n_filters, -1, dtype=np.int64)
        ones = counts == 1
        single[ones] = by_filter[starts[:-1][ones]]
        fsubs: list = single.tolist()
        for f in np.flatnonzero(counts > 1).tolist():
            fsubs[f] = bitmap_of(by_filter[starts[f]:starts[f + 1]])
        return fsubs


def _groups(exchanges: np.ndarray, codes: np.ndarray, texts: list[str | None]):
    """Live filter slots grouped by (exchange, filter code): yields ``(exchange, code, [fslot...])``."""
    live = np.flatnonzero(np.fromiter((x is not None for x in texts), dtype=bool, count=len(texts)))
    keys = (exchanges[live].astype(np.uint64) << np.uint64(32)) | codes[live].astype(np.uint64)
    order = np.argsort(keys, kind="stable")
    keys, live = keys[order], live[order]
    bounds = np.flatnonzero(np.diff(keys)) + 1
    for start, end in zip(np.concatenate([[0], bounds]).tolist(), np.concatenate([bounds, [len(keys)]]).tolist()):
        if start < end:
            key = int(keys[start])
            yield key >> 32, key & 0xFFFFFFFF, live[start:end].tolist()


def _header_value(name: str, value: object) -> str | None:
    if value is None or value.__class__ is str:
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return decode_header_value(value)
    raise HeaderError(f"header {quote(name)} must have a bytes, str or null value, not {type(value).__name__}")


def _relevant_entries(entries: object, names: frozenset[str]) -> frozenset:
    """The (name, decoded value) pairs of Kafka header ``entries`` whose name is in ``names``."""
    if isinstance(entries, (str, bytes)) or not hasattr(entries, "__iter__"):
        raise HeaderError(f"headers must be a sequence of (key, value) entries, not {type(entries).__name__}")
    out = []
    for entry in entries:
        if isinstance(entry, Mapping):
            try:
                name, value = entry["key"], entry["value"]
            except KeyError:
                raise HeaderError(f"header entry needs 'key' and 'value': {quote(entry)}") from None
        elif isinstance(entry, (tuple, list)) and len(entry) == 2:
            name, value = entry
        else:
            raise HeaderError(f"header entry must be a (key, value) pair or mapping: {quote(entry)}")
        if type(name) is not str:
            raise HeaderError(f"header name must be a string, not {quote(name)}")
        if name in names:
            out.append((name, _header_value(name, value)))
    return frozenset(out) if out else _NO_HEADERS

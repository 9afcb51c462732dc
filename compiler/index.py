"""The mutable, incremental routing index that produces snapshots.

Three slot spaces, each a dense range of small integers with a free list:

- a **subscription slot** per live subscription id;
- a **subscriber slot** per distinct subscriber name with a live subscription;
- a **filter slot** per distinct (exchange, filter string) with a live
  subscription: identical filters share one slot, so a million clients on one
  filter cost one trie leaf, and the matcher maps the slot to the
  subscriptions holding it (a range of a CSR array; a filter held by one
  subscription is that subscription's slot directly).

Invariants: a live subscription keeps its slot for as long as it lives
(replacing it keeps the slot too); freed slots are reused lowest first, so the
slot spaces stay dense and bitmaps over them stay compact; the index never
holds a filter, subscriber or exchange that failed validation. Each filter is
validated by its dialect's grammar once, when its slot is created; the tables
that match topics (the kernel's exact-filter map and trie) are built per
snapshot by :class:`~compiler.matcher.Matcher`, not here.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Mapping

import numpy as np

from .columns import slot_array, string_column
from .dialect import Dialect
from .errors import CompilerError, SubscriptionError, UnknownExchangeError, quote
from .grammar import grammar_for, parse_dialect
from .headers import HeaderCriteria
from .options import DEFAULT_OPTIONS, SubscriptionOptions
from .snapshot import Snapshot, SnapshotTables
from .subscription import Subscription, validate_subscriber
from .text import is_utf8_text


class RoutingIndex:
    """Subscriptions of a fixed set of exchanges, each with its dialect.

    ``upsert`` and ``remove`` are incremental: their cost does not depend on
    the number of other subscriptions. ``snapshot`` is linear in the index
    size, but converts whole columns at once (Arrow, numpy) rather than
    building an object per subscription.
    """

    def __init__(self, exchanges: Mapping[str, Dialect | str]) -> None:
        self._exchanges: dict[str, Dialect] = {}
        for name, dialect in exchanges.items():
            if type(name) is not str or not name or not is_utf8_text(name):
                raise ValueError(f"exchange name must be a non-empty UTF-8 string, not {name!r}")
            self._exchanges[name] = parse_dialect(dialect)
        self._exchange_names = tuple(self._exchanges)
        self._exchange_code = {name: code for code, name in enumerate(self._exchange_names)}
        self._grammars = [grammar_for(d) for d in self._exchanges.values()]
        self._last_version = -1

        self._slot_of: dict[str, int] = {}
        self._ids: list[str | None] = []
        self._sub_filter = array("I")
        self._sub_subscriber = array("I")
        self._criteria: dict[int, HeaderCriteria] = {}
        self._options: dict[int, int] = {}
        """Subscription slot -> its MQTT options' flags, for the options not the default."""
        self._free_subs: list[int] = []

        self._subscriber_slot: dict[str, int] = {}
        self._subscriber_names: list[str | None] = []
        self._subscriber_refs = array("I")
        self._free_subscribers: list[int] = []

        self._filter_slot: list[dict[str, int]] = [{} for _ in self._exchanges]
        self._filter_text: list[str | None] = []
        self._filter_exchange = array("I")
        self._filter_refs = array("I")
        self._free_filters: list[int] = []

    @property
    def exchanges(self) -> Mapping[str, Dialect]:
        return dict(self._exchanges)

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, sub_id: object) -> bool:
        return sub_id in self._slot_of

    @property
    def has_header_criteria(self) -> bool:
        """Whether some live subscription has header criteria (else headers never matter)."""
        return bool(self._criteria)

    @property
    def filter_count(self) -> int:
        """Number of distinct (exchange, filter) pairs held, i.e. live filter slots."""
        return sum(map(len, self._filter_slot))

    def subscriptions_of(self, subscriber: str) -> int:
        """``subscriber``'s live subscriptions, on every exchange (kept as it changes)."""
        slot = self._subscriber_slot.get(subscriber)
        return 0 if slot is None else self._subscriber_refs[slot]

    def count(self, exchange: str, subscriber: str | None = None) -> int:
        """Live subscriptions of ``exchange`` (of ``subscriber`` on it, when given).

        Counted when asked, over whole columns (linear in the slots): the limits
        (streaming.router.subscriptions.limits) ask only when :meth:`subscriptions_of` or ``len``, the
        bounds kept for free, reach a limit, so upserts pay nothing for it."""
        code = self._exchange_code.get(exchange)
        if code is None:
            return 0
        live = np.ones(len(self._ids), dtype=bool)
        live[self._free_subs] = False
        if subscriber is not None:
            slot = self._subscriber_slot.get(subscriber)
            if slot is None:
                return 0
            live &= np.frombuffer(self._sub_subscriber, np.uint32) == slot
        exchange_of = np.frombuffer(self._filter_exchange, np.uint32)[
            np.frombuffer(self._sub_filter, np.uint32)[live]]
        return int(np.count_nonzero(exchange_of == code))

    def slot(self, sub_id: str) -> int | None:
        """The subscription slot of ``sub_id`` (stable while it lives), or ``None``."""
        return self._slot_of.get(sub_id)

    def get(self, sub_id: str) -> Subscription | None:
        """The live subscription with id ``sub_id``, or ``None``."""
        slot = self._slot_of.get(sub_id)
        if slot is None:
            return None
        fslot = self._sub_filter[slot]
        return Subscription(
            sub_id,
            self._exchange_names[self._filter_exchange[fslot]],
            _live(self._subscriber_names[self._sub_subscriber[slot]]),
            _live(self._filter_text[fslot]),
            self._criteria.get(slot),
            options=SubscriptionOptions.from_flags(self._options.get(slot, 0)),
        )

    def upsert(self, sub: Subscription) -> None:
        """Add ``sub``, or replace the subscription with its id (keeping its slot).

        Raises a :class:`~compiler.errors.CompilerError` subclass, leaving the
        index unchanged, for an unknown exchange (``UnknownExchangeError``),
        an invalid filter (``FilterError``), or an invalid id, subscriber name
        or criteria (``SubscriptionError``).
        """
        if not isinstance(sub, Subscription):
            raise SubscriptionError(f"expected a Subscription, not {type(sub).__name__}")
        sub_id = sub.id
        if type(sub_id) is not str or not sub_id or not (sub_id.isascii() or is_utf8_text(sub_id)):
            raise SubscriptionError(f"subscription id must be a non-empty UTF-8 string, not {quote(sub_id)}")
        exchange = self._exchange_code.get(sub.exchange) if type(sub.exchange) is str else None
        if exchange is None:
            raise UnknownExchangeError(f"subscription {quote(sub_id)}: unknown exchange {quote(sub.exchange)}")
        subscriber_slot = self._subscriber_slot.get(sub.subscriber) if type(sub.subscriber) is str else None
        if subscriber_slot is None:
            try:
                validate_subscriber(sub.subscriber)
            except SubscriptionError as exc:
                raise SubscriptionError(f"subscription {quote(sub_id)}: {exc}") from None
        criteria = sub.headers
        if criteria is not None and not isinstance(criteria, HeaderCriteria):
            raise SubscriptionError(f"subscription {quote(sub_id)}: headers must be HeaderCriteria or None")
        options = sub.options
        if options is DEFAULT_OPTIONS:  # the common case, kept cheap (benchmarks compiler, churn)
            flags = 0
        else:
            if not isinstance(options, SubscriptionOptions):
                raise SubscriptionError(f"subscription {quote(sub_id)}: options must be SubscriptionOptions")
            options.check(sub_id, sub.exchange, self._exchanges[sub.exchange].value, sub.filter)
            flags = options.flags
        fslot = self._filter_slot[exchange].get(sub.filter) if type(sub.filter) is str else None
        if fslot is None:
            try:
                self._grammars[exchange].parse_filter(sub.filter)
            except CompilerError as exc:
                raise type(exc)(f"subscription {quote(sub_id)}: {exc}") from None

        old = self._slot_of.get(sub_id)
        if (
            old is not None
            and fslot == self._sub_filter[old]
            and subscriber_slot == self._sub_subscriber[old]
            and self._criteria.get(old) == criteria
            and self._options.get(old, 0) == flags
        ):
            return
        # Validated: from here on nothing raises.
        if fslot is None:
            fslot = self._new_filter(exchange, sub.filter)
        self._filter_refs[fslot] += 1
        if subscriber_slot is None:
            subscriber_slot = self._new_subscriber(sub.subscriber)
        self._subscriber_refs[subscriber_slot] += 1
        if old is not None:
            self._release(old)
            slot = old
        elif self._free_subs:
            slot = heapq.heappop(self._free_subs)
            self._ids[slot] = sub_id
        else:
            slot = len(self._ids)
            self._ids.append(sub_id)
            self._sub_filter.append(0)
            self._sub_subscriber.append(0)
        self._slot_of[sub_id] = slot
        self._sub_filter[slot] = fslot
        self._sub_subscriber[slot] = subscriber_slot
        if criteria is not None:
            self._criteria[slot] = criteria
        elif self._criteria:
            self._criteria.pop(slot, None)
        if flags:
            self._options[slot] = flags
        elif self._options:
            self._options.pop(slot, None)

    def remove(self, sub_id: str) -> bool:
        """Remove the subscription ``sub_id``; whether it existed."""
        slot = self._slot_of.pop(sub_id, None)
        if slot is None:
            return False
        self._release(slot)
        self._criteria.pop(slot, None)
        if self._options:
            self._options.pop(slot, None)
        self._ids[slot] = None
        heapq.heappush(self._free_subs, slot)
        return True

    def snapshot(self, version: int, offsets: Mapping[int, int]) -> Snapshot:
        """An immutable copy of the index as :class:`~compiler.snapshot.Snapshot` ``version``.

        ``offsets`` maps each changelog partition to the next offset the
        snapshot covers. Versions never decrease: a ``version`` below the last
        one produced (or loaded) raises ``ValueError``.
        """
        if type(version) is not int or version < self._last_version:
            raise ValueError(f"snapshot version {version!r} is below the last version {self._last_version}")
        sets: dict[HeaderCriteria, int] = {}
        criteria_slots = sorted(self._criteria)
        criteria_ref = [sets.setdefault(self._criteria[slot], len(sets)) for slot in criteria_slots]
        option_slots = sorted(self._options)
        tables = SnapshotTables(
            exchange_names=self._exchange_names,
            sub_ids=string_column(self._ids),
            sub_filter=slot_array(self._sub_filter),
            sub_subscriber=slot_array(self._sub_subscriber),
            criteria_slots=slot_array(criteria_slots),
            criteria_ref=slot_array(criteria_ref),
            criteria_sets=tuple(sets),
            subscriber_names=string_column(self._subscriber_names),
            filter_text=string_column(self._filter_text),
            filter_exchange=slot_array(self._filter_exchange),
            option_slots=slot_array(option_slots),
            option_flags=slot_array([self._options[slot] for slot in option_slots]),
        )
        snap = Snapshot(version, offsets, self._exchanges, tables, len(self._slot_of))
        self._last_version = version
        return snap

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> RoutingIndex:
        """An index holding exactly ``snapshot``'s subscriptions, in the same slots,
        to continue incrementally (e.g. after a restart)."""
        t = snapshot.tables
        index = cls({name: snapshot.exchanges[name] for name in t.exchange_names})
        index._last_version = snapshot.version

        ids = t.sub_ids.to_pylist()
        index._ids = ids
        index._slot_of = {sub_id: slot for slot, sub_id in enumerate(ids) if sub_id is not None}
        index._free_subs = [slot for slot, sub_id in enumerate(ids) if sub_id is None]
        index._sub_filter = _uint_array(t.sub_filter)
        index._sub_subscriber = _uint_array(t.sub_subscriber)
        index._criteria = {
            int(slot): t.criteria_sets[ref]
            for slot, ref in zip(t.criteria_slots.tolist(), t.criteria_ref.tolist(), strict=True)
        }
        index._options = dict(zip(t.option_slots.tolist(), t.option_flags.tolist(), strict=True))
        live = np.fromiter(index._slot_of.values(), dtype=np.int64, count=len(index._slot_of))

        names = t.subscriber_names.to_pylist()
        index._subscriber_names = names
        index._subscriber_slot = {name: slot for slot, name in enumerate(names) if name is not None}
        index._free_subscribers = [slot for slot, name in enumerate(names) if name is None]
        index._subscriber_refs = _uint_array(np.bincount(t.sub_subscriber[live], minlength=len(names)))

        texts = t.filter_text.to_pylist()
        index._filter_text = texts
        for fslot, (text, exchange) in enumerate(zip(texts, t.filter_exchange.tolist(), strict=True)):
            if text is not None:
                index._filter_slot[exchange][text] = fslot
        index._free_filters = [fslot for fslot, text in enumerate(texts) if text is None]
        index._filter_exchange = _uint_array(t.filter_exchange)
        index._filter_refs = _uint_array(np.bincount(t.sub_filter[live], minlength=len(texts)))
        return index

    def _new_filter(self, exchange: int, text: str) -> int:
        if self._free_filters:
            fslot = heapq.heappop(self._free_filters)
            self._filter_text[fslot] = text
            self._filter_exchange[fslot] = exchange
        else:
            fslot = len(self._filter_text)
            self._filter_text.append(text)
            self._filter_exchange.append(exchange)
            self._filter_refs.append(0)
        self._filter_slot[exchange][text] = fslot
        return fslot

    def _new_subscriber(self, name: str) -> int:
        if self._free_subscribers:
            slot = heapq.heappop(self._free_subscribers)
            self._subscriber_names[slot] = name
        else:
            slot = len(self._subscriber_names)
            self._subscriber_names.append(name)
            self._subscriber_refs.append(0)
        self._subscriber_slot[name] = slot
        return slot

    def _release(self, slot: int) -> None:
        """Drop subscription ``slot``'s references to its filter and subscriber."""
        fslot = self._sub_filter[slot]
        self._filter_refs[fslot] -= 1
        if not self._filter_refs[fslot]:
            del self._filter_slot[self._filter_exchange[fslot]][_live(self._filter_text[fslot])]
            self._filter_text[fslot] = None
            heapq.heappush(self._free_filters, fslot)
        subscriber = self._sub_subscriber[slot]
        self._subscriber_refs[subscriber] -= 1
        if not self._subscriber_refs[subscriber]:
            del self._subscriber_slot[_live(self._subscriber_names[subscriber])]
            self._subscriber_names[subscriber] = None
            heapq.heappush(self._free_subscribers, subscriber)


def _uint_array(values: np.ndarray) -> array:
    out = array("I")
    out.frombytes(np.ascontiguousarray(values, dtype=np.uint32).tobytes())
    return out


def _live(name: str | None) -> str:
    """The text of a live filter or subscriber slot (a free slot's is None: reading one
    as live is the index's bug)."""
    if name is None:
        raise RuntimeError("the routing index read a free slot as a live one")
    return name

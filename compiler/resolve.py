"""The single-topic path of :meth:`compiler.matcher.Matcher.match`: from a
topic's hit codes to its cacheable *result*.

A result is the triple ``(items, flags, shared)``:

- ``flags == 0`` (no matched subscription has header criteria or a shared
  group, the common case): ``items`` is the finished tuple of
  :class:`~compiler.output.Delivery`, in output order; ``shared`` is ``()``.
  ``match`` returns ``list(items)``: nothing per call beyond the copy.
- ``flags != 0`` (``HAS_CRITERIA | HAS_SHARED``): ``items`` are the matched
  subscription slots in (subscriber, id) order, ``shared`` the matched filter
  slots of shared groups; per-message conditions are applied on top
  (:meth:`Resolver.criteria_filtered`, :meth:`Resolver.shared`) and the
  deliveries built per message (:func:`compiler.output.deliveries`).

A *hit code* ``h >= 0`` is the subscription slot of a filter held by exactly
one subscription, without header criteria or shared group; ``h < 0`` stands
for filter slot ``~h``, whose subscriptions (``fsubs[~h]``: a slot, a tuple of
a few, or a roaring bitmap of many) and conditions (``flags[~h]``) are looked
up here.

Deliveries of one subscription are the same immutable object every time
(made on first use, at most one per subscription slot): a topic whose
matched subscriptions belong to different subscribers, the usual case, costs
one list lookup per subscription and one sort of those objects; results of
more than :data:`SMALL_MAX` subscriptions are grouped with numpy.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from collections import deque
from itertools import repeat
from operator import itemgetter

import numpy as np
from pyroaring import FrozenBitMap

from .output import Delivery
from .shared import choose_member, group_key

HAS_CRITERIA = 1
HAS_SHARED = 2

SMALL_MAX = 64
"""Results up to this many subscriptions are ordered as Python objects,
larger ones with numpy."""

EMPTY_RESULT: tuple = ((), 0, ())

_new = tuple.__new__
_first = itemgetter(0)


class Resolver:
    """Turns hit codes into results for one snapshot (see the module docstring).

    ``owner[slot]``: subscriber name (the same str object per subscriber);
    ``ids[slot]``: subscription id; ``rank``: numpy ``rank[slot]``, the
    slot's position in (subscriber, id) order; ``sub_subscriber``: numpy
    subscriber slot per subscription slot, naming ``names[...]``;
    ``fsubs``/``flags``: per filter slot, see the module docstring;
    ``sub_filter[slot]`` (numpy) and ``filter_text`` (Arrow) name the filter of
    a slot (for shared groups).
    """

    __slots__ = (
        "_owner", "_ids", "_rank", "_rank_get", "_sub_subscriber", "_names", "_fsubs", "_flags", "_sub_filter",
        "_filter_text", "_single",
    )

    def __init__(self, owner: list, ids: list, rank: np.ndarray, sub_subscriber: np.ndarray, names: list,
                 fsubs: list, flags: dict[int, int], sub_filter: np.ndarray, filter_text) -> None:
        self._owner = owner
        self._ids = ids
        self._rank = rank
        self._rank_get = None
        self._sub_subscriber = sub_subscriber
        self._names = names
        self._fsubs = fsubs
        self._flags = flags
        self._sub_filter = sub_filter
        self._filter_text = filter_text
        self._single: list[Delivery | None] = [None] * len(ids)
        """Per subscription slot, its one-subscription delivery, made on first use."""

    def result(self, hits: list[int]) -> tuple:
        """The result of a topic whose hit codes are ``hits`` (each once)."""
        if not hits:
            return EMPTY_RESULT
        if min(hits) >= 0:  # single-subscription filters without conditions
            if len(hits) <= SMALL_MAX:
                return self._small(hits), 0, ()
            return self._large(hits, ()), 0, ()
        slots: list[int] = []
        large: list[FrozenBitMap] = []
        flags = 0
        shared: tuple[int, ...] = ()
        fsubs, filter_flags = self._fsubs, self._flags
        for hit in hits:
            if hit >= 0:
                slots.append(hit)
                continue
            fslot = ~hit
            subs = fsubs[fslot]
            if subs.__class__ is int:
                slots.append(subs)
            elif subs.__class__ is tuple:
                slots += subs
            else:
                large.append(subs)
            condition = filter_flags.get(fslot, 0)
            if condition:
                flags |= condition
                if condition & HAS_SHARED:
                    shared += (fslot,)
        # Filter slots partition the subscriptions: no slot appears twice.
        if not flags:
            if large or len(slots) > SMALL_MAX:
                return self._large(slots, large), 0, ()
            return self._small(slots), 0, ()
        if large or len(slots) > SMALL_MAX:
            return self._ordered_array(slots, large), flags, shared
        if self._rank_get is None:
            self._rank_get = self._rank.tolist().__getitem__
        slots.sort(key=self._rank_get)
        return tuple(slots), flags, shared

    def _small(self, slots: list[int]) -> tuple:
        """The deliveries of a few slots, from the per-slot deliveries."""
        if len(slots) > 1:
            if self._rank_get is None:
                self._rank_get = self._rank.tolist().__getitem__
            slots.sort(key=self._rank_get)
        single, owner, ids = self._single, self._owner, self._ids
        out: list[Delivery] = []
        last = None
        for slot in slots:
            d = single[slot]
            if d is None:
                d = single[slot] = _new(Delivery, (owner[slot], (ids[slot],)))
            if last is not None and d[0] is last[0]:  # one str object per subscriber
                last = out[-1] = _new(Delivery, (last[0], last[1] + d[1]))
            else:
                out.append(d)
                last = d
        return tuple(out)

    def _large(self, slots: Sequence[int], large: Sequence[FrozenBitMap]) -> tuple:
        """The deliveries of many slots, grouped by subscriber with numpy: a
        subscriber with one of the slots gets its per-slot delivery, the
        others a new one, each step a C-level loop."""
        ordered = self._order(slots, large)
        owners = self._sub_subscriber[ordered]
        change = np.ones(len(ordered), dtype=bool)
        change[1:] = owners[1:] != owners[:-1]
        firsts = np.flatnonzero(change)
        sizes = np.diff(np.append(firsts, len(ordered)))
        heads = ordered[firsts].tolist()
        out = list(map(self._single.__getitem__, heads))
        several = np.flatnonzero(sizes > 1)
        if len(several):
            ids = list(map(self._ids.__getitem__, ordered.tolist()))
            starts = firsts[several]
            groups = map(tuple, map(ids.__getitem__, map(slice, starts.tolist(), (starts + sizes[several]).tolist())))
            names = map(self._owner.__getitem__, ordered[starts].tolist())
            made = map(_new, repeat(Delivery), zip(names, groups))
            deque(map(out.__setitem__, several.tolist(), made), maxlen=0)
        if None in out:
            self._fill_singles(out, heads)
        return tuple(out)

    def _fill_singles(self, out: list, heads: list[int]) -> None:
        """Make the per-slot deliveries that ``out`` (one per head slot) lacks."""
        single, owner, ids = self._single, self._owner, self._ids
        for g, d in enumerate(out):
            if d is None:
                slot = heads[g]
                out[g] = single[slot] = _new(Delivery, (owner[slot], (ids[slot],)))

    def _order(self, slots: Sequence[int], large: Sequence[FrozenBitMap]) -> np.ndarray:
        """``slots`` and the members of ``large`` in (subscriber, id) order (int64)."""
        parts = [np.array(slots, dtype=np.int64)]
        parts += [np.frombuffer(m.to_array(), dtype=np.uint32) for m in large]
        merged = np.concatenate(parts).astype(np.int64, copy=False)
        return merged[np.argsort(self._rank[merged])]

    def _ordered_array(self, slots: list[int], large: list[FrozenBitMap]) -> array:
        out = array("I")
        out.frombytes(self._order(slots, large).astype(np.uint32).tobytes())
        return out

    def criteria_filtered(self, criteria, slots: Sequence[int], relevant: Mapping[str, Sequence[str | None]]) -> list[int]:
        """``slots`` without the subscriptions whose header criteria (``criteria``,
        a :class:`~compiler.criteria_index.CriteriaIndex`) fail (order kept)."""
        with_criteria = criteria.with_criteria
        satisfied = criteria.satisfied(relevant)
        return [s for s in slots if s not in with_criteria or s in satisfied]

    def shared(self, exchange: str, slots: Sequence[int], shared: Sequence[int], message_id: str) -> list[int]:
        """``slots`` without the subscriptions of shared-group members that were
        not chosen for ``message_id`` (order kept)."""
        owner, sub_filter = self._owner, self._sub_filter
        slots = list(slots)
        for f in shared:
            members = sorted({owner[s] for s in slots if sub_filter[s] == f})
            if len(members) > 1:
                chosen = choose_member(group_key(exchange, self._filter_text[f].as_py()), message_id, members)
                slots = [s for s in slots if sub_filter[s] != f or owner[s] == chosen]
        return slots

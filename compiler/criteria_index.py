"""Inverted bitmaps over header criteria, for evaluating them in bulk.

For a snapshot, one bitmap of subscription slots per criterion ``name=value``
and per presence criterion ``name``, plus the slots by mode (``any``, and
``all`` grouped by number of criteria). A message's relevant headers then
select a handful of bitmaps, and a few unions and intersections give every
subscription whose criteria hold, independent of how many subscriptions have
criteria (OpenAMQ "Rapid Message Matching", field matching).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np
from pyroaring import BitMap

from .columns import bitmap_of, mutable_bitmap_of
from .headers import HeaderCriteria


class CriteriaIndex:
    """The criteria of one snapshot: ``slots[i]`` has ``sets[refs[i]]``."""

    __slots__ = ("names", "with_criteria", "_any", "_all_by_count", "_presence", "_equals")

    def __init__(self, slots: np.ndarray, refs: np.ndarray, sets: tuple[HeaderCriteria, ...]) -> None:
        order = np.argsort(refs, kind="stable")
        bounds = np.searchsorted(refs[order], np.arange(len(sets) + 1))
        self._any = BitMap()
        self._all_by_count: dict[int, BitMap] = {}
        self._presence: dict[str, BitMap] = {}
        self._equals: dict[tuple[str, str], BitMap] = {}
        for ref, criteria in enumerate(sets):
            members = mutable_bitmap_of(slots[order[bounds[ref]:bounds[ref + 1]]])
            if criteria.match == "any":
                self._any |= members
            else:
                self._all_by_count.setdefault(len(criteria.criteria), BitMap()).update(members)
            for name, value in criteria.criteria.items():
                if value is None:
                    self._presence.setdefault(name, BitMap()).update(members)
                else:
                    self._equals.setdefault((name, value), BitMap()).update(members)
        self.names = frozenset(self._presence) | frozenset(name for name, _ in self._equals)
        """Header names that some criterion mentions; other headers never matter."""
        self.with_criteria = bitmap_of(slots)
        """Slots of every subscription that has criteria."""

    def satisfied(self, headers: Mapping[str, Collection[str | None]]) -> BitMap:
        """Slots (among those with criteria) whose criteria hold on ``headers``.

        ``headers`` maps a header name to the decoded values it carries
        (``None`` for a null or undecodable value, which counts only for
        presence).
        """
        hits: list[BitMap] = []
        for name, values in headers.items():
            parts = []
            present = self._presence.get(name)
            if present is not None:
                parts.append(present)
            for value in values:
                if value is not None:
                    equal = self._equals.get((name, value))
                    if equal is not None:
                        parts.append(equal)
            if parts:
                hits.append(BitMap.union(*parts) if len(parts) > 1 else parts[0])
        result = BitMap(self._all_by_count.get(0, ()))
        if not hits:
            return result
        any_hit = BitMap.union(*hits) if len(hits) > 1 else hits[0]
        result |= self._any & any_hit
        # A subscription with k criteria in "all" mode holds iff it is in k
        # hit bitmaps (one per header name, at most one per criterion):
        # at_least[j] holds the slots seen in j or more hits so far.
        at_least: list[BitMap] = [BitMap(), BitMap()]
        for hit in hits:
            for j in range(len(at_least) - 1, 0, -1):
                again = at_least[j] & hit
                if again:
                    if j + 1 == len(at_least):
                        at_least.append(again)
                    else:
                        at_least[j + 1] |= again
            at_least[1] |= hit
        for count, members in self._all_by_count.items():
            if 0 < count < len(at_least):
                result |= members & at_least[count]
        return result

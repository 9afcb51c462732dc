"""The Python side of resolving hit codes, for the topics the kernel hands
back: those that matched a filter with per-message conditions (header
criteria, a shared group).

A topic's :class:`TopicResult` is what :class:`compiler.cache.TopicCache`
holds per topic. A *hit code* ``h >= 0`` is the subscription slot of a
filter held by exactly one subscription, without header criteria or shared
group; ``h < 0`` stands for filter slot ``~h``, whose subscriptions the
kernel holds and whose conditions are ``flags[f]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from .output import Delivery
from .shared import choose_member, group_key

HAS_CRITERIA = 1
HAS_SHARED = 2


class TopicResult(NamedTuple):
    """What one topic matched, before the per-message conditions.

    - ``conditions == 0`` (no matched subscription has header criteria or a
      shared group, the common case): ``deliveries`` is the finished tuple
      of :class:`~compiler.output.Delivery`, in output order, as the kernel
      (``bitroute_kernel.Kernel.deliveries``) builds it; ``slots`` and
      ``shared`` are empty.
    - ``conditions != 0`` (``HAS_CRITERIA | HAS_SHARED``): ``slots`` are the
      matched subscription slots in (subscriber, id) order, ``shared`` the
      matched filter slots of shared groups, ``deliveries`` empty: the
      conditions are applied per message (:meth:`Resolver.criteria_filtered`,
      :meth:`Resolver.shared`) and the deliveries built then
      (``Kernel.slot_deliveries``).
    """

    deliveries: tuple[Delivery, ...]
    slots: tuple[int, ...]
    conditions: int
    shared: tuple[int, ...]


EMPTY_RESULT = TopicResult((), (), 0, ())


class Resolver:
    """Turns hit codes into results for one snapshot (see the module docstring).

    ``kernel``: the snapshot's ``bitroute_kernel.Kernel`` (it orders slots
    and builds the deliveries); ``names[owners[slot]]``: a slot's subscriber
    name (``owners``: numpy); ``flags``: per filter slot with conditions,
    its ``HAS_*`` bits;
    ``sub_filter[slot]`` (numpy) and ``filter_text`` (Arrow) name the filter
    of a slot (for shared groups).
    """

    __slots__ = ("_kernel", "_names", "_owners", "_flags", "_sub_filter", "_filter_text")

    def __init__(self, kernel, names: list, owners: np.ndarray, flags: dict[int, int], sub_filter: np.ndarray,
                 filter_text) -> None:
        self._kernel = kernel
        self._names = names
        self._owners = owners
        self._flags = flags
        self._sub_filter = sub_filter
        self._filter_text = filter_text

    def result(self, hits: list[int]) -> TopicResult:
        """The result of a topic whose hit codes are ``hits`` (each once)."""
        result = self.slots(hits)
        if not result.conditions:
            return TopicResult(self._kernel.slot_deliveries(result.slots), (), 0, ())
        return result

    def slots(self, hits: list[int]) -> TopicResult:
        """The result of a topic whose hit codes are ``hits`` (each once), in
        slot form whatever its conditions."""
        if not hits:
            return EMPTY_RESULT
        conditions = 0
        shared: list[int] = []
        for h in hits:
            condition = self._flags.get(~h, 0) if h < 0 else 0
            conditions |= condition
            if condition & HAS_SHARED:
                shared.append(~h)
        return TopicResult((), tuple(self._kernel.ordered_slots(hits)), conditions, tuple(shared))

    def criteria_filtered(self, criteria, slots: Sequence[int],
                          relevant: Mapping[str, Sequence[str | None]]) -> list[int]:
        """``slots`` without the subscriptions whose header criteria (``criteria``,
        a :class:`~compiler.criteria_index.CriteriaIndex`) fail (order kept)."""
        with_criteria = criteria.with_criteria
        satisfied = criteria.satisfied(relevant)
        return [s for s in slots if s not in with_criteria or s in satisfied]

    def shared(self, exchange: str, slots: Sequence[int], shared: Sequence[int], message_id: str) -> list[int]:
        """``slots`` without the subscriptions of shared-group members that were
        not chosen for ``message_id`` (order kept)."""
        names, owners, sub_filter = self._names, self._owners, self._sub_filter
        slots = list(slots)
        for f in shared:
            members = sorted({names[owners[s]] for s in slots if sub_filter[s] == f})
            if len(members) > 1:
                chosen = choose_member(group_key(exchange, self._filter_text[f].as_py()), message_id, members)
                slots = [s for s in slots if sub_filter[s] != f or names[owners[s]] == chosen]
        return slots

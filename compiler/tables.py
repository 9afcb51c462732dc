"""The tables a :class:`~compiler.matcher.Matcher` hands the kernel
(``bitroute_kernel.Kernel``), as one :class:`KernelTables`, and the
per-snapshot arrays in them: each filter slot's subscriptions
(:func:`filter_subscriptions`) and each subscription slot's rank in
(subscriber, id) order (:func:`slot_ranks`), the order of every delivery
list.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .columns import StringColumn, numpy_of
from .grammar import KernelGrammar


@dataclass(frozen=True)
class KernelTables:
    """What ``Kernel(tables)`` reads, by attribute (``bitroute_kernel.pyi``
    types it). Arrays are int64 numpy arrays unless stated.

    ``delivery_type``: the tuple subclass of each delivery
    (:class:`~compiler.output.Delivery`). ``names[k]``: subscriber slot
    ``k``'s name (``None`` when free; a list the kernel keeps and that must
    not change), also as ``name_text``. Per subscription slot: ``ids``, its
    id; ``rank``, its position in (subscriber, id) order; ``owners``, its
    subscriber slot. Per filter slot: its subscriptions
    ``filter_slots[filter_start[f]:filter_start[f] + filter_count[f]]``;
    ``special`` (uint8), whether it has per-message conditions (header
    criteria, a shared group); ``filter_text``; ``filter_exchange``, its
    exchange's number into ``grammars`` (-1: a free slot); ``hit_code``,
    what its trie leaf holds (see :mod:`compiler.resolve`). ``grammars``:
    per exchange, the rules of its dialect the kernel applies.
    """

    delivery_type: type
    names: list[str | None]
    name_text: StringColumn
    ids: StringColumn
    rank: np.ndarray
    owners: np.ndarray
    filter_start: np.ndarray
    filter_count: np.ndarray
    filter_slots: np.ndarray
    special: np.ndarray
    grammars: list[KernelGrammar]
    filter_text: StringColumn
    filter_exchange: np.ndarray
    hit_code: np.ndarray


def slot_ranks(names: pa.StringArray, owners: np.ndarray, ids: pa.StringArray) -> np.ndarray:
    """``rank[slot]``: the position of each subscription slot in (subscriber
    name, id) order, the order of every delivery list. Subscriber names are
    ranked first (there are few), so the big sort compares integers before
    strings."""
    name_rank = np.empty(len(names), dtype=np.int64)
    name_rank[numpy_of(pc.sort_indices(names))] = np.arange(len(names))
    table = pa.table({"owner": name_rank[owners] if len(names) else owners, "id": ids})
    order = numpy_of(pc.sort_indices(table, sort_keys=[("owner", "ascending"), ("id", "ascending")]))
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank


def filter_subscriptions(sub_filter: np.ndarray, live: np.ndarray, n_filters: int) -> tuple[np.ndarray, tuple]:
    """The subscriptions of each filter slot: ``single[filter]``, its only
    subscription slot (-1: none or several), and CSR arrays ``(start,
    count, slots)`` (int64) with the filter's slots at
    ``slots[start:start + count]``."""
    filters = sub_filter[live]
    order = np.argsort(filters, kind="stable")
    by_filter = live[order]
    counts = np.bincount(filters, minlength=n_filters)
    starts = np.zeros(n_filters + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    single = np.full(n_filters, -1, dtype=np.int64)
    ones = counts == 1
    single[ones] = by_filter[starts[:-1][ones]]
    return single, (starts[:-1], counts.astype(np.int64), by_filter.astype(np.int64))

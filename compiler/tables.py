"""The per-snapshot arrays a :class:`~compiler.matcher.Matcher` builds
before handing them to the kernel (``bitroute_kernel.Kernel``): each filter
slot's subscriptions (:func:`filter_subscriptions`) and each subscription
slot's rank in (subscriber, id) order (:func:`slot_ranks`), the order of
every delivery list.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .columns import numpy_of


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

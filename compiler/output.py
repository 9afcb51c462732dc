"""The two output forms of a match: :class:`Delivery` tuples (``Matcher.match``;
the kernel, ``bitroute_kernel.Kernel``, builds them) and the Arrow
``DELIVERIES_TYPE`` column (``Matcher.match_frame``).

Both list one delivery per subscriber with at least one matching
subscription, naming every matching subscription id of that subscriber;
deliveries sorted by subscriber, ids sorted within a delivery. Callers hand
in subscription slots already in that order.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa

DELIVERIES_TYPE = pa.list_(
    pa.struct([pa.field("subscriber", pa.string()), pa.field("subscription_ids", pa.list_(pa.string()))])
)
"""Arrow type of :meth:`Matcher.match_frame`'s ``deliveries`` column."""


class Delivery(NamedTuple):
    """One copy of a message for one subscriber, naming every subscription of
    that subscriber that matched (sorted)."""

    subscriber: str
    subscription_ids: tuple[str, ...]


def deliveries_array(
    flat: np.ndarray, unit_offsets: np.ndarray, sub_subscriber: np.ndarray, names: pa.StringArray, ids: pa.StringArray
) -> pa.ListArray:
    """``DELIVERIES_TYPE`` array with one entry per unit: unit ``u``'s slots,
    in output order, are ``flat[unit_offsets[u]:unit_offsets[u + 1]]``;
    ``sub_subscriber[slot]`` indexes ``names``, ``ids[slot]`` is the id."""
    lengths = np.diff(unit_offsets)
    owners = sub_subscriber[flat]
    starts = np.ones(len(flat), dtype=bool)
    starts[1:] = owners[1:] != owners[:-1]
    starts[unit_offsets[:-1][lengths > 0]] = True
    group_starts = np.flatnonzero(starts)
    group_offsets = np.append(group_starts, len(flat)).astype(np.int32)
    id_lists = pa.ListArray.from_arrays(pa.array(group_offsets), ids.take(pa.array(flat)))
    subscribers = names.take(pa.array(owners[group_starts]))
    groups = pa.StructArray.from_arrays([subscribers, id_lists], fields=list(DELIVERIES_TYPE.value_type))
    unit_groups = np.searchsorted(group_starts, unit_offsets).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(unit_groups), groups, type=DELIVERIES_TYPE)

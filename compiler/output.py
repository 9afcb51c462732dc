"""The two output forms of a match: :class:`Delivery` tuples (``Matcher.match``;
the kernel, ``bitroute_kernel.Kernel``, builds them) and the Arrow
``DELIVERIES_TYPE`` column (``Matcher.match_columns``).

Both list one delivery per subscriber with at least one matching
subscription, naming every matching subscription id of that subscriber;
deliveries sorted by subscriber, ids sorted within a delivery. Callers hand
in subscription slots already in that order.
"""

from __future__ import annotations

from typing import NamedTuple

import pyarrow as pa

DELIVERIES_TYPE = pa.list_(
    pa.struct([pa.field("subscriber", pa.string()), pa.field("subscription_ids", pa.list_(pa.string()))])
)
"""Arrow type of the ``deliveries`` column :meth:`Matcher.match_columns` returns."""


class Delivery(NamedTuple):
    """One copy of a message for one subscriber, naming every subscription of
    that subscriber that matched (sorted)."""

    subscriber: str
    subscription_ids: tuple[str, ...]


def deliveries_column(n_rows: int, buffers: list[bytes]) -> pa.ListArray:
    """The ``DELIVERIES_TYPE`` column of ``n_rows`` rows from the buffers
    ``Kernel.layout`` writes: ``(row_offsets, group_offsets, id_offsets,
    id_data, name_offsets, name_data)``, offsets int32 (Arrow's layout, no
    copy here)."""
    row_offsets, group_offsets, id_offsets, id_data, name_offsets, name_data = map(pa.py_buffer, buffers)
    n_groups, n_ids = len(name_offsets) // 4 - 1, len(id_offsets) // 4 - 1
    ids = pa.StringArray.from_buffers(n_ids, id_offsets, id_data)
    id_lists = pa.ListArray.from_arrays(pa.Array.from_buffers(pa.int32(), n_groups + 1, [None, group_offsets]), ids)
    names = pa.StringArray.from_buffers(n_groups, name_offsets, name_data)
    groups = pa.StructArray.from_arrays([names, id_lists], fields=list(DELIVERIES_TYPE.value_type))
    rows = pa.Array.from_buffers(pa.int32(), n_rows + 1, [None, row_offsets])
    return pa.ListArray.from_arrays(rows, groups, type=DELIVERIES_TYPE)

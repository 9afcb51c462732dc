"""Member choice for MQTT shared subscriptions (``$share/<group>/<filter>``).

A group is identified by (exchange, the full filter string, which names the
group and the filter). Among the group's members whose subscription matched a
message (header criteria included), exactly one receives it. The choice must
be the same on every worker and on every re-run or replay of the message, so it is a
pure function of the message id: a CRC-32 (stable across processes and
Python versions, unlike the salted ``hash()``) of the group and the message id,
modulo the number of members, indexing the members sorted by name. Including
the group spreads a message's copies over different positions in different
groups.

Which filters are groups is the grammar's rule (its ``SHARE_PREFIX``),
applied to a snapshot's filters by :func:`shared_filters`.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.compute as pc

from .columns import bool_mask
from .grammar import grammar_for

if TYPE_CHECKING:
    from .snapshot import Snapshot


def group_key(exchange: str, filter_text: str) -> str:
    """The identity of a shared-subscription group."""
    return f"{exchange}\x00{filter_text}"


def choose_member(group: str, message_id: str, members: Sequence[str]) -> str:
    """The member of ``group`` that receives ``message_id``.

    Precondition: ``members`` is non-empty, sorted and without duplicates.
    """
    digest = zlib.crc32(f"{group}\x00{message_id}".encode("utf-8", "surrogatepass"))
    return members[digest % len(members)]


def shared_filters(snapshot: Snapshot) -> np.ndarray:
    """Per filter slot of ``snapshot``, whether it is a shared-subscription
    group: a live filter starting with its exchange's ``SHARE_PREFIX``
    (bool numpy array). The one place this is decided, for the matcher and
    for whoever shows the groups."""
    t = snapshot.tables
    shared = np.zeros(len(t.filter_text), dtype=bool)
    for number, name in enumerate(t.exchange_names):
        prefix = grammar_for(snapshot.exchanges[name]).SHARE_PREFIX
        if prefix is not None and len(t.filter_text):
            shared |= bool_mask(pc.starts_with(t.filter_text, prefix)) & (t.filter_exchange == number)
    return shared

"""What a routing task needs to route one chunk of a replay (``subscribe --since``).

A replay's chunk (:mod:`streaming.router.replay.replay`) is routed by the same routing
task as a live batch (:class:`streaming.router.batch.routing.RoutePartitions`, on the
executors), against a snapshot of the replayed subscriptions only, with
``RouteSettings.replay`` set to a :class:`ReplayScope`. The scope narrows what
the task's plan delivers (:meth:`ReplayScope.narrowed`):

- each delivery's subscription ids to the replays whose range holds its publish
  (per publishes partition, ``position <= offset < end``), a delivery left with
  none dropped;
- the publishes delivered to no one dropped: rejected when routed live,
  clearing a retained message, or expired by the time the replay reads them;
- the (message, subscriber) pairs the ``deliveries`` audit already holds
  dropped (one delivery per message and subscriber, live or replayed);
- nothing rejected: the live routing rejected what was bad.

Picklable, and built in the driver once per chunk; the per-record work is the
task's. The audit's pairs (tens of MB for a busy subscriber) reach the tasks as a
broadcast (:meth:`ReplayScope.shipped`: fetched once per executor, not copied into
every task's closure), which the driver releases once the chunk's job is done
(:meth:`ReplayScope.release`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import Broadcast, SparkContext

from compiler import Matcher
from streaming.kafka.records import subscription_ids_json

PAIR_SEPARATOR = "\x00"
"""Between a message id and a subscriber in :attr:`ReplayScope.delivered` (in neither)."""


@dataclass(frozen=True)
class ReplayScope:
    """The replays a chunk serves (module docstring).

    ``low[i][p]``/``high[i][p]``: the offsets of publishes partition ``p`` replay
    ``subscription_ids[i]`` still delivers (``low <= offset < high``; a partition it does
    not read has ``low > high``). ``delivered``: ``message id + PAIR_SEPARATOR +
    subscriber`` of the deliveries the audit holds for the replays' subscribers, the
    array itself as built, a broadcast of it once :meth:`shipped`.
    ``exchanges``: every exchange, for :meth:`matching_keys_only`.
    """

    subscription_ids: tuple[str, ...]
    low: np.ndarray
    high: np.ndarray
    delivered: pa.Array | Broadcast[pa.Array]
    exchanges: tuple[str, ...]

    def shipped(self, context: SparkContext) -> ReplayScope:
        """This scope as the chunk's tasks get it: ``delivered`` broadcast (a task's closure
        holds its id only), unless it is empty. The caller calls :meth:`release` on it once
        the chunk's job is done."""
        if isinstance(self.delivered, Broadcast) or not len(self.delivered):
            return self
        return dataclasses.replace(self, delivered=context.broadcast(self.delivered))

    def release(self) -> None:
        """Free the broadcast of :meth:`shipped` on the executors and the driver (nothing for
        an unshipped scope). Best effort: a stopped context freed it already."""
        if isinstance(self.delivered, Broadcast):
            try:
                self.delivered.destroy()
            except Exception:  # noqa: BLE001 - the context is gone, and the broadcast with it
                pass

    def delivered_pairs(self) -> pa.Array:
        """The audit's (message id, subscriber) pairs: on an executor, the broadcast's value."""
        delivered = self.delivered
        return delivered.value if isinstance(delivered, Broadcast) else delivered

    def matching_keys_only(self, matcher: Matcher, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The rows of ``batch`` whose routing key some replayed subscription's filter matches
        in some exchange: each distinct key matched once, so that the per-row work of
        routing is paid by the matching rows only (a replay of a filter matching one
        publish in ten plans one row in ten). For snapshots without header criteria:
        a superset of the rows that make deliveries, which the plan decides."""
        keys = batch.column(batch.schema.get_field_index("key"))
        distinct = pc.unique(keys).drop_null()
        if not len(distinct):
            return batch.slice(0, 0)
        listed = distinct.to_pylist()
        hit = np.zeros(len(listed), dtype=bool)
        for exchange in self.exchanges:
            deliveries, _ = matcher.match_columns([""] * len(listed), [exchange] * len(listed),
                                                  listed)
            hit |= pc.list_value_length(deliveries).to_numpy(zero_copy_only=False) > 0
        if hit.all():
            return batch
        return batch.filter(pc.is_in(keys, value_set=distinct.filter(pa.array(hit))))

    def narrowed(self, plan, batch: pa.RecordBatch):
        """``plan`` (a :class:`streaming.router.batch.routing.BatchPlan` of ``batch``) as the
        replay delivers it (module docstring): only the deliveries it makes, no reason,
        no retained message, every publish ``ok``."""
        entries = plan.entries
        n = len(entries)
        publishes = plan.publishes.n
        untouched = dict(reasons=[None] * publishes, ok=np.ones(publishes, dtype=bool),
                         retain=None)
        if not n:
            return dataclasses.replace(plan, **untouched)
        ids_lists = entries.field("subscription_ids")
        flat = pc.list_flatten(ids_lists)
        parent = pc.list_parent_indices(ids_lists).to_numpy(zero_copy_only=False)
        row = plan.owner[parent]
        partitions = batch.column(batch.schema.get_field_index("partition")).to_numpy(
            zero_copy_only=False)[row].astype(np.int64)
        offsets = batch.column(batch.schema.get_field_index("offset")).to_numpy(
            zero_copy_only=False)[row].astype(np.int64)
        which = pc.fill_null(pc.index_in(flat, pa.array(self.subscription_ids, pa.string())),
                             -1).to_numpy(zero_copy_only=False).astype(np.int64)
        known = which >= 0
        which = np.maximum(which, 0)
        inside = partitions < self.low.shape[1]
        part = np.where(inside, partitions, 0)
        keep_id = (known & inside & (offsets >= self.low[which, part])
                   & (offsets < self.high[which, part]))
        counts = np.bincount(parent[keep_id], minlength=n)
        wanted = counts > 0
        wanted &= plan.ok[plan.owner]  # delivered to no one live, or expired now
        delivered = self.delivered_pairs() if wanted.any() else None
        if delivered is not None and len(delivered):
            pairs = pc.binary_join_element_wise(
                plan.publishes.message_ids.cast(pa.string()).take(pa.array(plan.owner)),
                plan.subscribers.cast(pa.string()), PAIR_SEPARATOR)
            wanted &= ~pc.is_in(pairs, value_set=delivered).to_numpy(zero_copy_only=False)
        keep = np.flatnonzero(wanted)
        take = pa.array(keep, pa.int64())
        kept_ids = pa.ListArray.from_arrays(
            pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)),
            flat.filter(pa.array(keep_id))).take(take)
        subscribers = plan.subscribers.take(take)
        new_entries = pa.StructArray.from_arrays([subscribers, kept_ids], fields=list(entries.type))
        owner = plan.owner[keep]
        deliveries = pa.ListArray.from_arrays(
            pa.array(np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=publishes))])
                     .astype(np.int32)), new_entries)
        return dataclasses.replace(
            plan, deliveries=deliveries, entries=new_entries, subscribers=subscribers,
            owner=owner, ids_json=subscription_ids_json(kept_ids),
            send=np.arange(len(keep), dtype=np.int64), **untouched)


def delivered_pairs(message_ids: pa.Array, subscribers: pa.Array) -> pa.Array:
    """The :attr:`ReplayScope.delivered` form of (message id, subscriber) columns."""
    return pc.binary_join_element_wise(message_ids.cast(pa.string()),
                                       subscribers.cast(pa.string()), PAIR_SEPARATOR)

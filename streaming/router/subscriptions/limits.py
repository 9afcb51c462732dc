"""Limits on subscriptions (``[limits]``, :class:`streaming.config.LimitsConfig`): one check
for the router and the command line.

A subscription is held, on its exchange (each limit may be set per exchange in
``[limits.exchanges]``), to:

- ``max_filter_levels``: the words (AMQP) or levels (MQTT) of its filter (of a
  ``$share/<group>/<filter>``, those of ``<filter>``); the empty AMQP binding key has none;
- ``max_filter_length``: the bytes of its filter as written (UTF-8);
- ``max_header_criteria``: its header criteria;
- ``max_subscriptions_per_subscriber``: its subscriber's live subscriptions on the
  exchange, itself included;
- ``max_subscriptions_per_exchange``: the exchange's live subscriptions, itself included.

Replacing a live subscription (the same id) is not a new subscription: it counts for its
subscriber and exchange only when it moves to another one.

:func:`check_limits` raises :class:`LimitError` (a ``SubscriptionError``: the changelog
rejects the record as any invalid value, :mod:`streaming.router.subscriptions.changelog`) with one line
naming the limit's key and value. ``bitroute subscribe`` calls it on the state the router
would apply the record to before writing anything; the router calls it where it applies
each changelog record. :func:`usage` is ``bitroute status``'s view: per exchange, each
limit and the largest use of it in a snapshot.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compiler import Dialect, RoutingIndex, Snapshot, Subscription
from compiler.errors import quote
from compiler.grammar import grammar_for
from streaming.config import LIMIT_NAMES, LimitsConfig
from streaming.router.errors import LimitError

__all__ = ["LimitError", "check_limits", "filter_length", "filter_levels", "usage"]


def filter_levels(dialect: Dialect, text: str) -> int:
    """The words (AMQP) or levels (MQTT) of filter ``text``, after a shared prefix's group."""
    prefix = grammar_for(dialect).SHARE_PREFIX
    if prefix and text.startswith(prefix):
        text = text[len(prefix):].partition("/")[2]
    if dialect is Dialect.MQTT:
        return text.count("/") + 1
    return text.count(".") + 1 if text else 0


def filter_length(text: str) -> int:
    """The bytes of filter ``text`` (UTF-8; a lone surrogate counts as its escape)."""
    return len(text.encode("utf-8", "surrogatepass"))


def check_limits(index: RoutingIndex, sub: Subscription, limits: LimitsConfig) -> None:
    """Raise :class:`LimitError` when upserting ``sub`` into ``index`` would break a limit
    (see the module docstring); an unknown exchange is the index's to reject."""
    exchange = sub.exchange
    dialect = index.exchanges.get(exchange) if isinstance(exchange, str) else None
    if dialect is None or not isinstance(sub.filter, str):
        return

    def over(name: str, used: int, what: str) -> None:
        limit = limits.of(exchange, name)
        if used > limit:
            raise LimitError(f"subscription {quote(sub.id)}: {what}, more than "
                             f"{limits.key(exchange, name)} = {limit} (exchange "
                             f"{quote(exchange)})")

    over("max_filter_length", filter_length(sub.filter),
         f"its filter is {filter_length(sub.filter)} bytes long")
    over("max_filter_levels", filter_levels(dialect, sub.filter),
         f"its filter has {filter_levels(dialect, sub.filter)} levels")
    criteria = len(sub.headers.criteria) if sub.headers is not None else 0
    over("max_header_criteria", criteria, f"it has {criteria} header criteria")
    # The counts are exact but linear: asked only when the bounds kept for free (every
    # subscription, the subscriber's on every exchange) reach the limit.
    old = index.get(sub.id) if isinstance(sub.id, str) else None
    if (old is None or old.exchange != exchange) and len(index) >= limits.of(
            exchange, "max_subscriptions_per_exchange"):
        count = index.count(exchange) + 1
        over("max_subscriptions_per_exchange", count,
             f"it would be subscription {count:,} of the exchange")
    if (old is None or (old.exchange, old.subscriber) != (exchange, sub.subscriber)) and \
            isinstance(sub.subscriber, str) and index.subscriptions_of(sub.subscriber) >= \
            limits.of(exchange, "max_subscriptions_per_subscriber"):
        count = index.count(exchange, sub.subscriber) + 1
        over("max_subscriptions_per_subscriber", count,
             f"it would be subscription {count:,} of subscriber {quote(sub.subscriber)} on the "
             "exchange")


def usage(snapshot: Snapshot, limits: LimitsConfig) -> dict[str, dict[str, dict[str, int]]]:
    """Per exchange of ``snapshot``, per limit: ``{"limit": value, "used": the largest use}``
    (the exchange's subscriptions, the most one subscriber has, the deepest and the longest
    filter, the most header criteria of one subscription), in whole columns."""
    t = snapshot.tables
    names = t.exchange_names
    n = len(names)
    live = np.flatnonzero(pc.is_valid(t.sub_ids).to_numpy(zero_copy_only=False))
    exchange_of = t.filter_exchange[t.sub_filter[live]].astype(np.int64)
    per_exchange = np.bincount(exchange_of, minlength=n)
    largest = np.zeros(n, np.int64)
    if len(live):
        pairs, counts = np.unique((exchange_of << 32) | t.sub_subscriber[live].astype(np.int64),
                                  return_counts=True)
        np.maximum.at(largest, pairs >> 32, counts)
    filters = np.flatnonzero(pc.is_valid(t.filter_text).to_numpy(zero_copy_only=False))
    texts = t.filter_text.take(pa.array(filters, pa.int64()))
    exchange_of_filter = t.filter_exchange[filters].astype(np.int64)
    length = pc.fill_null(pc.binary_length(texts.cast(pa.binary())), 0).to_numpy(
        zero_copy_only=False).astype(np.int64)
    levels = np.zeros(len(filters), np.int64)
    for code, name in enumerate(names):
        mine = exchange_of_filter == code
        if not mine.any():
            continue
        dialect = snapshot.exchanges[name]
        own = texts.filter(pa.array(mine))
        if dialect is Dialect.MQTT:
            counted = pc.count_substring(own, "/").to_numpy(zero_copy_only=False) + 1
            prefix = grammar_for(dialect).SHARE_PREFIX
            shared = pc.starts_with(own, prefix).to_numpy(zero_copy_only=False)
            counted = counted - 2 * shared  # "$share/<group>/": its two separators
        else:
            counted = pc.count_substring(own, ".").to_numpy(zero_copy_only=False) + 1
            counted = np.where(pc.equal(own, "").to_numpy(zero_copy_only=False), 0, counted)
        levels[mine] = counted
    longest, deepest, criteria = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
    np.maximum.at(longest, exchange_of_filter, length)
    np.maximum.at(deepest, exchange_of_filter, levels)
    if len(t.criteria_slots):
        slots = np.asarray(t.criteria_slots, np.int64)
        alive = pc.is_valid(t.sub_ids.take(pa.array(slots))).to_numpy(zero_copy_only=False)
        sizes = np.array([len(c.criteria) for c in t.criteria_sets], np.int64)[
            np.asarray(t.criteria_ref, np.int64)[alive]]
        np.maximum.at(criteria, t.filter_exchange[t.sub_filter[slots[alive]]].astype(np.int64),
                      sizes)
    used = {"max_subscriptions_per_subscriber": largest,
            "max_subscriptions_per_exchange": per_exchange, "max_filter_levels": deepest,
            "max_filter_length": longest, "max_header_criteria": criteria}
    return {name: {limit: {"limit": limits.of(name, limit), "used": int(used[limit][code])}
                   for limit in LIMIT_NAMES}
            for code, name in enumerate(names)}

"""The topic-result cache of one matcher: bounded by bytes, one snapshot version.

A matcher serves one immutable snapshot, so its cache never needs
invalidation: a new snapshot version gets a new matcher and a new cache
(BifroMQ and the NATS sublist key their caches by index generation in the
same spirit). The bound is on *estimated bytes*, not entries: at a million
subscriptions one fan-out result can hold thousands of slots, and a cache of
10k such results was measured at 1.5 GB.

Keys are ``(exchange, topic)`` pairs of strings; values are
:class:`~compiler.resolve.TopicResult`. An entry is estimated at
:data:`ENTRY_OVERHEAD_BYTES` plus its key's characters plus
:data:`DELIVERY_BYTES` per delivery and :data:`SLOT_BYTES` per slot (matched
subscription or shared filter).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .resolve import TopicResult

MATCH_CACHE_MAX_BYTES = 64 * 1024 * 1024
"""Default bound of one matcher's topic cache, in estimated bytes."""

MATCH_CACHE_MAX_ENTRY_FRACTION = 8
"""A result estimated above ``max_bytes / MATCH_CACHE_MAX_ENTRY_FRACTION`` is
not cached: one huge fan-out result must not flush every other entry."""

MATCH_CACHE_MIN_ITEMS = 16
"""A result of fewer deliveries, without per-message conditions, is not
cached: the kernel recomputes it in 0.6-3 us, and caching it would cost a
put on every miss and keep millions of small objects alive (measured: a cold
``match()`` at a million subscriptions 2.7 us without the put, 3.9 us with)."""

ENTRY_OVERHEAD_BYTES = 400
"""Dict slot, key tuple and strings, result tuple and container headers."""

SLOT_BYTES = 8
"""Per slot: a pointer in a tuple (small results share the int objects of the
matcher's tables) or a uint32 in an array (large results)."""

DELIVERY_BYTES = 96
"""Per delivery: a pointer, and for a delivery made for this result (several
ids of one subscriber, or a result of many subscriptions) its two tuples;
one-subscription deliveries are shared with the matcher, so this
over-estimates the common small result."""

Key = tuple[str, str]


def entry_bytes(key: Key, result: TopicResult) -> int:
    """The estimated size of one cache entry."""
    deliveries, slots, _, shared = result
    return (ENTRY_OVERHEAD_BYTES + len(key[0]) + len(key[1]) + DELIVERY_BYTES * len(deliveries)
            + SLOT_BYTES * (len(slots) + len(shared)))


class TopicCache:
    """Insertion-ordered; inserting past ``max_bytes`` evicts the oldest
    entries first, so :attr:`bytes` never exceeds :attr:`max_bytes`."""

    __slots__ = ("_entries", "_bytes", "_max_bytes", "_max_entry_bytes", "evictions", "get")

    def __init__(self, max_bytes: int = MATCH_CACHE_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"cache bound must be >= 0 bytes, not {max_bytes}")
        self._entries: dict[Key, TopicResult] = {}
        self._bytes = 0
        self._max_bytes = max_bytes
        self._max_entry_bytes = max_bytes // MATCH_CACHE_MAX_ENTRY_FRACTION
        self.evictions = 0
        """Entries evicted so far."""
        self.get = self._entries.get
        """``get(key)``: the cached result or ``None`` (a bound ``dict.get``: this is the hot path)."""

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    @property
    def bytes(self) -> int:
        """Estimated bytes held; never above :attr:`max_bytes`."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, key: Key, result: TopicResult) -> None:
        """Cache ``result`` for ``key`` (precondition: not cached yet) unless it
        is too big; evict the oldest entries to make room."""
        size = entry_bytes(key, result)
        if size > self._max_entry_bytes:
            return
        entries = self._entries
        self._bytes += size
        while self._bytes > self._max_bytes:
            oldest = next(iter(entries))
            self._bytes -= entry_bytes(oldest, entries.pop(oldest))
            self.evictions += 1
        entries[key] = result

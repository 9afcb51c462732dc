"""A topic-result cache bounded by bytes, for one snapshot version.

A matcher serves one immutable snapshot, so its cache never needs
invalidation: a new snapshot version gets a new matcher and a new cache
(BifroMQ and the NATS sublist key their caches by index generation in the
same spirit). The bound is on *estimated bytes*, not entries: at a million
subscriptions one fan-out result can hold thousands of slots, and a cache of
10k such results was measured at 1.5 GB.
"""

from __future__ import annotations

from typing import Callable, Generic, Hashable, TypeVar

MATCH_CACHE_MAX_BYTES = 64 * 1024 * 1024
"""Default bound of one matcher's topic cache, in estimated bytes."""

MATCH_CACHE_MAX_ENTRY_FRACTION = 8
"""A result estimated above ``max_bytes / MATCH_CACHE_MAX_ENTRY_FRACTION`` is
not cached: one huge fan-out result must not flush every other entry."""

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TopicCache(Generic[K, V]):
    """Insertion-ordered cache; inserting past ``max_bytes`` evicts the oldest
    entries first. ``sizeof(key, value)`` estimates an entry's bytes and must
    return the same number for the same entry."""

    __slots__ = ("_entries", "_bytes", "_max_bytes", "_sizeof", "evictions")

    def __init__(self, max_bytes: int, sizeof: Callable[[K, V], int]) -> None:
        if max_bytes < 0:
            raise ValueError(f"cache bound must be >= 0 bytes, not {max_bytes}")
        self._entries: dict[K, V] = {}
        self._bytes = 0
        self._max_bytes = max_bytes
        self._sizeof = sizeof
        self.evictions = 0

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    @property
    def bytes(self) -> int:
        """Estimated bytes held; never above :attr:`max_bytes`."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        return self._entries.get(key)

    def put(self, key: K, value: V) -> None:
        """Cache ``value`` unless it is too big; evict the oldest entries to fit it."""
        size = self._sizeof(key, value)
        if size > self._max_bytes // MATCH_CACHE_MAX_ENTRY_FRACTION or key in self._entries:
            return
        entries = self._entries
        while self._bytes + size > self._max_bytes:
            oldest = next(iter(entries))
            self._bytes -= self._sizeof(oldest, entries.pop(oldest))
            self.evictions += 1
        entries[key] = value
        self._bytes += size

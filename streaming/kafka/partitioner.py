"""Kafka's default partitioner: which partition a keyed record goes to.

The Java producer (and librdkafka with ``partitioner = murmur2_random``) puts
a record with a non-null key in partition ``toPositive(murmur2(key)) %
partitions``. The shared delivery layout relies on it: the router produces
with librdkafka's ``murmur2_random``, keyed by subscriber, and ``bitroute
tail`` (or any consumer that knows the rule) reads only the subscriber's
partition. Test vectors: Kafka's ``UtilsTest.testMurmur2``.
"""

from __future__ import annotations

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 of ``data`` (``Utils.murmur2``), as an unsigned int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length & ~3
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def default_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner gives a record keyed ``key``."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, not {partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % partitions

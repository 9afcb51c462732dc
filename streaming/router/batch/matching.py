"""The routing side of a batch's snapshot: each broadcast version loaded once per routing
process (a Python worker, or the driver for a batch it routes).

The driver ships a snapshot's bytes to the executors once per version with
``SparkContext.broadcast`` (no shared file system needed) and keeps exactly
one broadcast alive (:class:`streaming.router.subscriptions.snapshots.BatchSnapshots`); a
released version's broadcast is destroyed, which also drops it from the
Python workers.

Each routing process loads a version once: :func:`cached_matcher` keeps the
:class:`compiler.Matcher` of the last :data:`MATCHERS_CACHED` broadcasts in a
module-level cache (a reused worker serves many tasks), so the cost of
``Snapshot.from_bytes`` and of building the matcher's tables is paid once per
version per worker, not per task (:mod:`streaming.router.batch.routing` calls it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from compiler import Matcher, Snapshot

MATCHERS_CACHED = 3
"""Matchers (snapshot versions) a routing process keeps loaded: the current one
and the previous, so the batch after a version change and a re-run of the
batch before it do not reload, and the replayed subscriptions' of a
``subscribe --since`` (:mod:`streaming.router.replay.replay`), whose chunks the same
workers route between live batches. A matcher holds its snapshot and a topic cache
bounded by ``compiler.MATCH_CACHE_MAX_BYTES``."""

_matchers: OrderedDict[str, Matcher] = OrderedDict()


def cached_matcher(key: str, load: Callable[[], bytes]) -> Matcher:
    """This process's matcher for broadcast ``key``, built from ``load()`` on first use.

    Least recently used matchers beyond :data:`MATCHERS_CACHED` are dropped.
    ``key`` names one broadcast (a random id drawn when it was made), so two
    routers in one application never share an entry.
    """
    matcher = _matchers.get(key)
    if matcher is None:
        matcher = Matcher(Snapshot.from_bytes(load()))
        _matchers[key] = matcher
        while len(_matchers) > MATCHERS_CACHED:
            _matchers.popitem(last=False)
    else:
        _matchers.move_to_end(key)
    return matcher


def cached_versions() -> list[int]:
    """Snapshot versions of the matchers this process holds, least recently used first."""
    return [m.version for m in _matchers.values()]

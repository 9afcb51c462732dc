"""The worker side of matching, no Spark needed: the matcher cache (one load per snapshot
broadcast, bounded)."""

from __future__ import annotations

import functools

import pytest

from compiler import RoutingIndex, Subscription
from streaming.router.batch import matching


@pytest.fixture(autouse=True)
def empty_cache():
    matching._matchers.clear()
    yield
    matching._matchers.clear()


def _snapshot_bytes(version: int) -> bytes:
    index = RoutingIndex({"amq.topic": "amqp"})
    index.upsert(Subscription.from_changelog(
        b"s1", b'{"exchange": "amq.topic", "subscriber": "bob", "filter": "a.*"}'))
    return index.snapshot(version, {0: version}).to_bytes()


def test_a_broadcast_is_loaded_once_per_worker():
    loads = []

    def load() -> bytes:
        loads.append(1)
        return _snapshot_bytes(1)

    first = matching.cached_matcher("b1", load)
    assert matching.cached_matcher("b1", load) is first
    assert len(loads) == 1
    assert first.match("amq.topic", "a.b")[0].subscriber == "bob"


def test_the_cache_holds_at_most_MATCHERS_CACHED_least_recently_used_first():
    versions = range(matching.MATCHERS_CACHED + 2)
    for version in versions:
        matching.cached_matcher(f"b{version}", functools.partial(_snapshot_bytes, version))
        matching.cached_matcher("b0", lambda: pytest.fail("b0 is in use and must stay cached"))
    assert len(matching._matchers) == matching.MATCHERS_CACHED
    # The newest MATCHERS_CACHED - 1 loaded, least recently used first, then b0 (used last).
    assert matching.cached_versions() == [*versions[-(matching.MATCHERS_CACHED - 1):], 0]

"""The worker-side matcher cache: one load per snapshot broadcast, bounded (no Spark needed)."""

from __future__ import annotations

import pytest

from compiler import RoutingIndex, Subscription
from streaming import matching


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

    first = matching.cached_matcher(10, load)
    assert matching.cached_matcher(10, load) is first
    assert len(loads) == 1
    assert first.match("amq.topic", "a.b")[0].subscriber == "bob"


def test_the_cache_holds_at_most_MATCHERS_CACHED_least_recently_used_first():
    keys = range(matching.MATCHERS_CACHED + 2)
    for key in keys:
        matching.cached_matcher(key, lambda key=key: _snapshot_bytes(key))
        matching.cached_matcher(0, lambda: pytest.fail("version 0 must stay cached"))
    assert len(matching._matchers) == matching.MATCHERS_CACHED
    assert matching.cached_versions() == [keys[-1], 0]

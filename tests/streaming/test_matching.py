"""The worker side of matching, no Spark needed: the matcher cache (one load per snapshot
broadcast, bounded) and the JSON text the deliveries cross to the JVM in."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from compiler import DELIVERIES_TYPE, RoutingIndex, Subscription
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

    first = matching.cached_matcher("b1", load)
    assert matching.cached_matcher("b1", load) is first
    assert len(loads) == 1
    assert first.match("amq.topic", "a.b")[0].subscriber == "bob"


def test_the_cache_holds_at_most_MATCHERS_CACHED_least_recently_used_first():
    versions = range(matching.MATCHERS_CACHED + 2)
    for version in versions:
        matching.cached_matcher(f"b{version}", lambda version=version: _snapshot_bytes(version))
        matching.cached_matcher("b0", lambda: pytest.fail("b0 is in use and must stay cached"))
    assert len(matching._matchers) == matching.MATCHERS_CACHED
    assert matching.cached_versions() == [versions[-1], 0]


_deliveries = st.lists(st.lists(st.tuples(
    st.from_regex(r"[A-Za-z0-9._-]{1,12}", fullmatch=True),
    st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=3)),
    max_size=4, unique_by=lambda d: d[0]), max_size=6)


@given(_deliveries, st.integers(0, 3))
def test_deliveries_json_is_each_publishs_deliveries_in_order(rows, start):
    """Any id text (quotes, backslashes, control characters, non-ASCII) survives, in order,
    also from a sliced column (Arrow slices share their parent's buffers)."""
    column = pa.array([[{"subscriber": s, "subscription_ids": ids} for s, ids in row] for row in rows],
                      DELIVERIES_TYPE).slice(min(start, len(rows)))
    texts = matching.deliveries_json(column).to_pylist()
    expected = [dict(row) for row in rows[min(start, len(rows)):]]
    assert [json.loads(t) for t in texts] == expected
    assert [list(json.loads(t)) for t in texts] == [list(e) for e in expected]


def test_deliveries_json_of_no_deliveries_is_an_empty_object():
    column = pa.array([[], [{"subscriber": "bob", "subscription_ids": ['say "hi"\\n\x00']}]], DELIVERIES_TYPE)
    assert matching.deliveries_json(column).to_pylist() == ['{}', '{"bob":["say \\"hi\\"\\\\n\\u0000"]}']

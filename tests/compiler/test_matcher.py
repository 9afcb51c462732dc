"""Matcher: delivery grouping and order, shared subscriptions, the cache bound, the batch
path (``match_columns``, what the router calls)."""

from __future__ import annotations

from collections import Counter

import pytest

from compiler import (
    DELIVERIES_TYPE,
    Delivery,
    HeaderCriteria,
    Matcher,
    RoutingIndex,
    Snapshot,
    Subscription,
    TopicError,
    UnknownExchangeError,
)
from compiler.cache import ENTRY_OVERHEAD_BYTES, MATCH_CACHE_MAX_ENTRY_FRACTION, MATCH_CACHE_MIN_ITEMS

EXCHANGES = {"amq": "amqp", "mq": "mqtt"}


def _matcher(subs, cache_max_bytes=None) -> Matcher:
    index = RoutingIndex(EXCHANGES)
    for sub in subs:
        index.upsert(sub)
    snap = index.snapshot(1, {})
    return Matcher(snap) if cache_max_bytes is None else Matcher(snap, cache_max_bytes=cache_max_bytes)


def test_one_delivery_per_subscriber_listing_every_matched_subscription(routing):
    r = routing([
        Subscription("z2", "amq", "zed", "a.*"),
        Subscription("z1", "amq", "zed", "#"),
        Subscription("z3", "amq", "zed", "a.b"),
        Subscription("b1", "amq", "bob", "a.b"),
        Subscription("a1", "amq", "al", "*.b"),
        Subscription("n1", "amq", "nomatch", "c"),
    ])
    assert r.matcher.match("amq", "a.b") == [
        Delivery("al", ("a1",)), Delivery("bob", ("b1",)), Delivery("zed", ("z1", "z2", "z3"))]


@pytest.mark.parametrize("size", [2, 17, 65, 700])
def test_deliveries_are_sorted_by_subscriber_then_id_at_every_result_size(size, routing):
    subs = [Subscription(f"id{(i * 7919) % size:04d}", "amq", f"sub{(i * 31) % 13:02d}", "x.*" if i % 2 else "#")
            for i in range(size)]
    deliveries = routing(subs).matcher.match("amq", "x.y")
    assert [d.subscriber for d in deliveries] == sorted({s.subscriber for s in subs})
    assert all(list(d.subscription_ids) == sorted(d.subscription_ids) for d in deliveries)
    assert sum(len(d.subscription_ids) for d in deliveries) == size


def test_invalid_input_raises_typed_errors():
    matcher = _matcher([Subscription("s", "amq", "c", "#")])
    with pytest.raises(UnknownExchangeError, match="unknown exchange 'nope'"):
        matcher.match("nope", "a")
    with pytest.raises(TopicError, match="must not contain the wildcards"):
        matcher.match("mq", "a/+")
    with pytest.raises(TopicError, match="must be a string"):
        matcher.match("amq", None)
    with pytest.raises(UnknownExchangeError):
        matcher.match(["amq"], "a")


def _shared_subs():
    return [Subscription(f"m{i}", "mq", f"member{i}", "$share/workers/jobs/+") for i in range(5)] + [
        Subscription("other-group", "mq", "member0", "$share/auditors/jobs/#"),
        Subscription("plain", "mq", "member1", "jobs/+"),
    ]


def test_shared_group_delivers_each_message_to_exactly_one_member(routing):
    r = routing(_shared_subs())
    chosen: Counter[str] = Counter()
    for n in range(400):
        deliveries = r.matcher.match("mq", "jobs/42", message_id=f"jobs/0/{n}")
        assert deliveries == r.reference.match("mq", "jobs/42", message_id=f"jobs/0/{n}")
        workers = [i for d in deliveries for i in d.subscription_ids if i.startswith("m")]
        assert len(workers) == 1
        chosen[workers[0]] += 1
        assert any("other-group" in d.subscription_ids for d in deliveries)
        assert any("plain" in d.subscription_ids for d in deliveries)
    assert set(chosen) == {f"m{i}" for i in range(5)} and min(chosen.values()) > 40


def test_shared_choice_is_deterministic_across_matchers_and_reloads():
    first = _matcher(_shared_subs())
    reloaded = Matcher(Snapshot.from_bytes(first.snapshot.to_bytes()))
    for n in range(50):
        mid = f"t/1/{n}"
        assert first.match("mq", "jobs/x", message_id=mid) == reloaded.match("mq", "jobs/x", message_id=mid)
        assert first.match("mq", "jobs/x", message_id=mid) == first.match("mq", "jobs/x", message_id=mid)


def test_shared_group_members_are_those_whose_criteria_hold(routing):
    subs = [Subscription("red", "mq", "a", "$share/g/t", HeaderCriteria("all", {"c": "red"})),
            Subscription("blue", "mq", "b", "$share/g/t", HeaderCriteria("all", {"c": "blue"}))]
    r = routing(subs)
    for n in range(20):
        assert r.ids("mq", "t", {"c": "red"}, f"m{n}") == ["red"]
        assert r.ids("mq", "t", {"c": "blue"}, f"m{n}") == ["blue"]


def test_cache_is_bounded_by_bytes_and_evicts_oldest():
    per_topic = MATCH_CACHE_MIN_ITEMS
    bound = MATCH_CACHE_MAX_ENTRY_FRACTION * (ENTRY_OVERHEAD_BYTES + 100 * per_topic)  # ~8 entries fit
    subs = [Subscription(f"s{i}-{j:02d}", "amq", f"c{j:02d}", f"t{i}.*") for i in range(100) for j in range(per_topic)]
    matcher = _matcher(subs, cache_max_bytes=bound)
    for _ in range(2):
        for i in range(100):
            assert matcher.match("amq", f"t{i}.x") == [
                Delivery(f"c{j:02d}", (f"s{i}-{j:02d}",)) for j in range(per_topic)
            ]
            assert matcher.cache.bytes <= bound
    assert 0 < len(matcher.cache) < 100
    assert matcher.cache.evictions >= 200 - len(matcher.cache)


def test_small_results_are_recomputed_not_cached():
    matcher = _matcher(
        [Subscription("s", "amq", "c", "t.*"), Subscription("h", "amq", "d", "t.*", HeaderCriteria("all", {"k": "v"}))]
    )
    for _ in range(2):
        assert matcher.match("amq", "u.x") == []
        assert matcher.match("amq", "t.x") == [Delivery("c", ("s",))]
        assert matcher.match("amq", "t.x", {"k": "v"}) == [Delivery("c", ("s",)), Delivery("d", ("h",))]
    # only the conditioned topic's result (slots and conditions) was kept
    assert len(matcher.cache) == 1


def test_cache_skips_a_result_too_big_for_its_share_of_the_bound():
    subs = [Subscription(f"s{i}", "amq", f"c{i}", "#") for i in range(2000)]
    matcher = _matcher(subs, cache_max_bytes=64 * 1024)
    assert len(matcher.match("amq", "big")) == 2000
    assert len(matcher.cache) == 0 and matcher.cache.bytes == 0


def _match_rows(matcher: Matcher, rows, with_headers: bool = True) -> tuple[list, list]:
    """``Matcher.match_columns`` (the router's batch path, streaming/router/batch/routing.py) on
    ``(message_id, exchange, routing_key, headers)`` rows: ``(deliveries, errors)`` as lists,
    one entry per row, the deliveries column of ``DELIVERIES_TYPE``."""
    ids, exchanges, keys, headers = (list(column) for column in zip(*rows, strict=True)) if rows else ([], [], [], [])
    column, errors = matcher.match_columns(ids, exchanges, keys, headers if with_headers else None)
    assert column.type == DELIVERIES_TYPE and len(column) == len(errors) == len(rows)
    return column.to_pylist(), errors.tolist()


def test_match_columns_rejects_bad_rows_without_raising():
    matcher = _matcher([Subscription("s1", "amq", "c", "#"), Subscription("s2", "mq", "d", "#")])
    deliveries, errors = _match_rows(
        matcher,
        [
            ("m0", "amq", b"a.b", None),
            ("m1", "amq", b"\xffa", None),
            ("m2", "nope", b"a", None),
            ("m3", "amq", None, None),
            ("m4", None, b"a", None),
            ("m5", "mq", b"a/+", None),
            ("m6", "mq", "a/b", None),
            ("m7", "amq", b"a" * 256, None),
        ],
    )
    assert errors[0] is None and errors[6] is None
    assert "not valid UTF-8" in errors[1]
    assert errors[2] == "unknown exchange 'nope'"
    assert errors[3] == "missing routing key"
    assert errors[4] == "missing exchange"
    assert "wildcards" in errors[5]
    assert "longer than 255" in errors[7]
    assert deliveries[0] == [{"subscriber": "c", "subscription_ids": ["s1"]}]
    assert deliveries[6] == [{"subscriber": "d", "subscription_ids": ["s2"]}]
    assert all(len(deliveries[i]) == 0 for i in (1, 2, 3, 4, 5, 7))


def test_match_columns_equals_match_row_by_row_including_shared_choices():
    subs = _shared_subs() + [
        Subscription("h", "mq", "member3", "jobs/#", HeaderCriteria("any", {"k": "v"})),
        Subscription("a", "amq", "member2", "x.#"),
    ]
    matcher = _matcher(subs)
    rows: list[tuple] = [(f"jobs/0/{n}", "mq", b"jobs/7", [("k", b"v")] if n % 3 else None) for n in range(30)]
    rows += [(f"x/0/{n}", "amq", "x.y", None) for n in range(3)] + [("u", "mq", b"none", None)]
    deliveries, _ = _match_rows(matcher, rows)
    for (mid, exchange, key, headers), got in zip(rows, deliveries, strict=True):
        topic = key.decode() if isinstance(key, bytes) else key
        expected = matcher.match(exchange, topic, dict(headers or []), mid)
        assert [(d["subscriber"], tuple(d["subscription_ids"])) for d in got] == [tuple(d) for d in expected]


def test_match_columns_of_no_rows_and_without_headers():
    matcher = _matcher([Subscription("s1", "amq", "c", "#")])
    assert _match_rows(matcher, []) == ([], [])
    deliveries, errors = _match_rows(matcher, [("m", "amq", b"k", None)], with_headers=False)
    assert (deliveries, errors) == ([[{"subscriber": "c", "subscription_ids": ["s1"]}]], [None])


def test_match_columns_batch_path_follows_every_rule():
    """The vectorised path of match_columns (uncached topics) on each kind of filter."""
    subs = [
        Subscription("hash", "mq", "a", "#"),
        Subscription("plus-x", "mq", "b", "+/x"),
        Subscription("sys", "mq", "c", "$SYS/#"),
        Subscription("exact", "mq", "d", "$SYS/x"),
        Subscription("share1", "mq", "e", "$share/g/+/y"),
        Subscription("share2", "mq", "f", "$share/g/+/y"),
        Subscription("a-suffix", "amq", "g", "#.x.y"),
        Subscription("a-mid", "amq", "h", "a.#.y"),
        Subscription("a-multi", "amq", "i", "#.x.#"),
        Subscription("a-empty", "amq", "j", ""),
        Subscription("a-star", "amq", "k", "*.*"),
    ] + [Subscription(f"many{i}", "amq", f"m{i % 3}", "a.x.y") for i in range(19)]
    matcher = _matcher(subs)
    rows = [
        ("m0", "mq", b"$SYS/x", None),
        ("m1", "mq", b"q/x", None),
        ("m2", "amq", b"a.x.y", None),
        ("m3", "amq", b"", None),
        ("m4", "amq", b"x.y", None),
        ("m5", "mq", b"r/y", None),
    ]
    deliveries, _ = _match_rows(matcher, rows)
    fresh = _matcher(subs)
    for (mid, exchange, key, _), got in zip(rows, deliveries, strict=True):
        expected = fresh.match(exchange, key.decode(), None, mid)
        assert [(d["subscriber"], tuple(d["subscription_ids"])) for d in got] == [tuple(d) for d in expected]
    ids = [sorted(i for d in row for i in d["subscription_ids"]) for row in deliveries]
    assert ids[0] == ["exact", "sys"]
    assert ids[1] == ["hash", "plus-x"]
    assert ids[3] == ["a-empty"]
    assert ids[4] == ["a-multi", "a-star", "a-suffix"]
    assert len(ids[5]) == 2 and ids[5][0] == "hash" and ids[5][1].startswith("share")


def test_match_columns_of_one_exchange_mixes_kernel_rows_and_python_rows():
    """One exchange without header criteria: the kernel answers the rows it
    can (equal keys once, bytes or str), and hands back the rest (bad keys,
    invalid topics, shared groups) with their rows and messages intact."""
    subs = [
        Subscription("all", "mq", "a", "#"),
        Subscription("x", "mq", "b", "+/x"),
        Subscription("share1", "mq", "e", "$share/g/s/+"),
        Subscription("share2", "mq", "f", "$share/g/s/+"),
    ]
    matcher = _matcher(subs)
    keys = [b"q/x", None, "q/x", b"\xff", b"s/1", b"a/+", "\udc80", b"q/x", b"", 7, b"z"]
    rows = [(f"m{i}", "mq", key, None) for i, key in enumerate(keys)]
    deliveries, errors = _match_rows(matcher, rows)
    got = [sorted(i for d in row for i in d["subscription_ids"]) for row in deliveries]
    assert got[0] == got[2] == got[7] == ["all", "x"] and errors[0] is errors[2] is errors[7] is None
    assert got[10] == ["all"] and errors[10] is None
    assert got[4][0] == "all" and got[4][1] in ("share1", "share2") and errors[4] is None
    assert got[4] == sorted(i for d in matcher.match("mq", "s/1", None, "m4") for i in d.subscription_ids)
    for bad, reason in (
        (1, "missing routing key"),
        (3, "not valid UTF-8"),
        (5, "wildcards"),
        (6, "UTF-8"),
        (8, "empty"),
        (9, "bytes or a string"),
    ):
        assert got[bad] == [] and reason in errors[bad], (bad, errors[bad])

"""RoutingIndex: incremental upsert/replace/remove, slots, validation, restart from a snapshot."""

from __future__ import annotations

import pytest

from compiler import (
    Dialect,
    FilterError,
    HeaderCriteria,
    Matcher,
    RoutingIndex,
    Subscription,
    SubscriptionError,
    TopicError,
    UnknownExchangeError,
)

EXCHANGES = {"amq": Dialect.AMQP, "mq": "mqtt"}


def ids(matcher: Matcher, exchange: str, topic: str) -> list[str]:
    return [i for d in matcher.match(exchange, topic) for i in d.subscription_ids]


def test_upsert_remove_len_contains_get():
    index = RoutingIndex(EXCHANGES)
    sub = Subscription("s1", "amq", "alice", "a.*")
    index.upsert(sub)
    assert len(index) == 1 and "s1" in index and index.get("s1") == sub
    assert index.remove("s1") is True
    assert index.remove("s1") is False
    assert len(index) == 0 and "s1" not in index and index.get("s1") is None


def test_replace_keeps_the_slot_and_changes_routing():
    index = RoutingIndex(EXCHANGES)
    index.upsert(Subscription("s1", "amq", "alice", "a.*"))
    index.upsert(Subscription("s2", "amq", "bob", "b"))
    slot = index.slot("s1")
    index.upsert(Subscription("s1", "amq", "carol", "c.#", HeaderCriteria("any", {"k": None})))
    assert index.slot("s1") == slot and len(index) == 2
    assert index.get("s1") == Subscription("s1", "amq", "carol", "c.#", HeaderCriteria("any", {"k": None}))
    matcher = Matcher(index.snapshot(1, {}))
    assert ids(matcher, "amq", "a.x") == []
    assert matcher.match("amq", "c.d", {"k": "v"})[0].subscriber == "carol"


def test_has_header_criteria_follows_the_live_subscriptions():
    index = RoutingIndex(EXCHANGES)
    index.upsert(Subscription("s1", "amq", "alice", "a.*"))
    assert not index.has_header_criteria
    index.upsert(Subscription("s2", "amq", "bob", "b", HeaderCriteria("all", {"k": "v"})))
    assert index.has_header_criteria
    index.upsert(Subscription("s2", "amq", "bob", "b"))
    assert not index.has_header_criteria
    index.upsert(Subscription("s3", "mq", "carol", "c/#", HeaderCriteria("any", {"k": None})))
    index.remove("s3")
    assert not index.has_header_criteria
    assert RoutingIndex.from_snapshot(index.snapshot(1, {})).has_header_criteria is False
    index.upsert(Subscription("s4", "amq", "dave", "d", HeaderCriteria("all", {"k": "v"})))
    assert RoutingIndex.from_snapshot(index.snapshot(2, {})).has_header_criteria is True


def test_freed_slots_are_reused_lowest_first_and_live_slots_never_move():
    index = RoutingIndex(EXCHANGES)
    for i in range(6):
        index.upsert(Subscription(f"s{i}", "amq", f"c{i}", f"t{i}"))
    before = {f"s{i}": index.slot(f"s{i}") for i in range(6)}
    index.remove("s4")
    index.remove("s1")
    index.upsert(Subscription("new-a", "amq", "x", "q"))
    index.upsert(Subscription("new-b", "amq", "x", "q"))
    index.upsert(Subscription("new-c", "amq", "x", "q"))
    assert [index.slot(k) for k in ("new-a", "new-b", "new-c")] == [before["s1"], before["s4"], 6]
    assert all(index.slot(k) == v for k, v in before.items() if k in index)


def test_identical_filters_share_one_filter_slot():
    index = RoutingIndex(EXCHANGES)
    for i in range(1000):
        index.upsert(Subscription(f"s{i}", "amq", f"c{i % 7}", "same.*.filter"))
    index.upsert(Subscription("other", "mq", "c0", "same.*.filter"))  # another exchange: another slot
    assert index.filter_count == 2
    matcher = Matcher(index.snapshot(1, {}))
    deliveries = matcher.match("amq", "same.x.filter")
    assert [d.subscriber for d in deliveries] == [f"c{i}" for i in range(7)]
    assert sum(len(d.subscription_ids) for d in deliveries) == 1000
    for i in range(1000):
        index.remove(f"s{i}")
    assert index.filter_count == 1


@pytest.mark.parametrize(
    "sub, error, message",
    [
        (Subscription("s", "nope", "c", "a"), UnknownExchangeError, "unknown exchange 'nope'"),
        (Subscription("s", "mq", "c", "a/#/b"), FilterError, "'#' must be the last level: 'a/#/b'"),
        (Subscription("s", "amq", "c", "a" * 256), FilterError, "longer than 255"),
        (Subscription("s", "amq", "a b", "a"), SubscriptionError, "subscriber name"),
        (Subscription("", "amq", "c", "a"), SubscriptionError, "non-empty UTF-8 string"),
        (Subscription("a\udc80", "amq", "c", "a"), SubscriptionError, "non-empty UTF-8 string"),
        (Subscription("s", "amq", "c", "a", {"match": "all"}), SubscriptionError, "HeaderCriteria"),
        (Subscription("s", ["amq"], "c", "a"), UnknownExchangeError, "unknown exchange ['amq']"),
        (Subscription("s", "amq", ["c"], "a"), SubscriptionError, "subscriber must be a string"),
        (Subscription("s", "amq", "c", ["a"]), FilterError, "must be a string"),
    ],
)
def test_invalid_upsert_raises_and_leaves_the_index_unchanged(sub, error, message):
    index = RoutingIndex(EXCHANGES)
    original = Subscription("s", "amq", "keep", "k.*")
    index.upsert(original)
    before = index.snapshot(1, {}).to_bytes()
    with pytest.raises(error) as info:
        index.upsert(sub)
    assert message in str(info.value)
    assert index.get("s") == original
    assert index.snapshot(1, {}).to_bytes() == before


def test_unknown_exchange_is_both_a_subscription_and_a_topic_error():
    assert issubclass(UnknownExchangeError, SubscriptionError)
    assert issubclass(UnknownExchangeError, TopicError)


def test_exchanges_are_isolated():
    index = RoutingIndex({"a1": "amqp", "a2": "amqp"})
    index.upsert(Subscription("s1", "a1", "c", "#"))
    index.upsert(Subscription("s2", "a2", "c", "x"))
    matcher = Matcher(index.snapshot(1, {}))
    assert ids(matcher, "a1", "x") == ["s1"]
    assert ids(matcher, "a2", "x") == ["s2"]


def test_bad_exchange_configuration():
    with pytest.raises(ValueError, match="unknown dialect 'stomp'"):
        RoutingIndex({"x": "stomp"})
    with pytest.raises(ValueError, match="non-empty UTF-8 string"):
        RoutingIndex({"": "amqp"})


def test_snapshot_versions_never_decrease():
    index = RoutingIndex(EXCHANGES)
    assert index.snapshot(3, {0: 5}).version == 3
    assert index.snapshot(3, {0: 5}).offsets == {0: 5}
    with pytest.raises(ValueError, match="below the last version 3"):
        index.snapshot(2, {})
    restored = RoutingIndex.from_snapshot(index.snapshot(7, {}))
    with pytest.raises(ValueError, match="below the last version 7"):
        restored.snapshot(6, {})


def test_snapshot_is_isolated_from_later_changes():
    index = RoutingIndex(EXCHANGES)
    index.upsert(Subscription("s1", "amq", "c", "a"))
    snap = index.snapshot(1, {})
    index.upsert(Subscription("s1", "amq", "c", "b"))
    index.upsert(Subscription("s2", "amq", "c", "a"))
    matcher = Matcher(snap)
    assert len(snap) == 1 and ids(matcher, "amq", "a") == ["s1"] and ids(matcher, "amq", "b") == []


def test_from_snapshot_continues_incrementally_with_the_same_slots():
    index = RoutingIndex(EXCHANGES)
    for i in range(10):
        index.upsert(Subscription(f"s{i}", "amq" if i % 2 else "mq", f"c{i % 3}", f"t/{i}" if i % 2 == 0 else f"t.{i}"))
    index.remove("s3")
    index.remove("s4")
    restored = RoutingIndex.from_snapshot(index.snapshot(5, {0: 10}))
    names = ["n1"] + [f"s{i}" for i in range(10)]
    assert [restored.slot(k) for k in names] == [index.slot(k) for k in names]
    assert [restored.get(f"s{i}") for i in range(10)] == [index.get(f"s{i}") for i in range(10)]
    for target in (index, restored):
        target.upsert(Subscription("n1", "amq", "c9", "t.#"))
        target.remove("s5")
        target.upsert(Subscription("s0", "mq", "c0", "t/+"))
    assert [restored.slot(k) for k in names] == [index.slot(k) for k in names]
    assert restored.snapshot(6, {0: 13}).to_bytes() == index.snapshot(6, {0: 13}).to_bytes()

"""Property tests: the index + matcher agree with the reference matcher.

Random filters, topics, header criteria and shared groups over small
alphabets (so that matches are frequent), for both dialects; a stateful
machine of upsert / replace / remove / snapshot-to-bytes / restart steps.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from compiler import (
    CompilerError,
    HeaderCriteria,
    Matcher,
    RoutingIndex,
    Snapshot,
    Subscription,
)
from compiler.reference import ReferenceMatcher

EXCHANGES = {"amq": "amqp", "mq": "mqtt"}
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

amqp_words = st.lists(st.sampled_from(["a", "b", "", "*", "#"]), max_size=6)
amqp_filters = amqp_words.map(".".join)
amqp_topics = st.lists(st.sampled_from(["a", "b", ""]), max_size=7).map(".".join)

mqtt_levels = st.lists(st.sampled_from(["a", "b", "", "+", "$x"]), min_size=1, max_size=5)
mqtt_filters = st.builds(
    lambda share, levels, tail: share + "/".join(levels + (["#"] if tail else [])),
    st.sampled_from(["", "", "$share/g/", "$share/h/"]),
    mqtt_levels,
    st.booleans(),
) | st.sampled_from(["#", "+", "$share/g/#"])
mqtt_topics = st.lists(st.sampled_from(["a", "b", "", "$x", "$"]), min_size=1, max_size=6).map("/".join).filter(bool)

criteria = st.none() | st.builds(
    HeaderCriteria,
    st.sampled_from(["all", "any"]),
    st.dictionaries(st.sampled_from(["h1", "h2", "h3"]), st.sampled_from(["1", "2", None]), max_size=3),
)
message_headers = st.none() | st.dictionaries(
    st.sampled_from(["h1", "h2", "h3", "other"]), st.sampled_from(["1", "2", b"1", b"\xff", None]), max_size=4
)
subscribers = st.sampled_from(["c0", "c1", "c2", "c3"])


def subscription(exchange: str, filters: st.SearchStrategy[str], ids: int) -> st.SearchStrategy[Subscription]:
    """A subscription on ``exchange`` with one of ``filters``, its id one of ``ids + 1``."""
    return st.builds(lambda i, s, f, h: Subscription(f"id{i}", exchange, s, f, h),
                     st.integers(0, ids), subscribers, filters, criteria)


def subscriptions(exchange: str, filters: st.SearchStrategy[str]) -> st.SearchStrategy[list[Subscription]]:
    return st.lists(subscription(exchange, filters, 30), max_size=25, unique_by=lambda sub: sub.id)


def _check(subs: list[Subscription], exchange: str, topics: list[str], headers, message_id: str) -> None:
    index, reference = RoutingIndex(EXCHANGES), ReferenceMatcher(EXCHANGES)
    for sub in subs:
        try:
            reference.upsert(sub)
        except CompilerError as exc:
            try:
                index.upsert(sub)
            except CompilerError as got:
                assert type(got) is type(exc)
            else:
                raise AssertionError(f"index accepted {sub}, reference refused: {exc}")
            continue
        index.upsert(sub)
    matcher = Matcher(Snapshot.from_bytes(index.snapshot(1, {}).to_bytes()))
    for topic in topics:
        assert matcher.match(exchange, topic, headers, message_id) == reference.match(
            exchange, topic, headers, message_id
        )


@SETTINGS
@given(subscriptions("amq", amqp_filters), st.lists(amqp_topics, max_size=8), message_headers, st.text(max_size=3))
def test_amqp_index_agrees_with_reference(subs, topics, headers, message_id):
    _check(subs, "amq", topics, headers, message_id)


@SETTINGS
@given(subscriptions("mq", mqtt_filters), st.lists(mqtt_topics, max_size=8), message_headers, st.text(max_size=3))
def test_mqtt_index_agrees_with_reference(subs, topics, headers, message_id):
    _check(subs, "mq", topics, headers, message_id)


batch_rows = st.lists(
    st.one_of(
        st.tuples(
            st.just("mq"),
            mqtt_topics | st.sampled_from(["a/+", "", "b/#"]),
            message_headers,
            st.sampled_from(["m1", "m2", "m3"]),
        ),
        st.tuples(st.just("amq"), amqp_topics, message_headers, st.sampled_from(["m1", "m2"])),
    ),
    max_size=16,
)


@SETTINGS
@given(subscriptions("mq", mqtt_filters), subscriptions("amq", amqp_filters), batch_rows, st.booleans())
def test_match_columns_agrees_with_match(mqtt_subs, amqp_subs, rows, warm):
    index = RoutingIndex(EXCHANGES)
    for sub in mqtt_subs + amqp_subs:
        try:
            index.upsert(sub)
        except CompilerError:
            pass
    matcher = Matcher(index.snapshot(1, {}))
    if warm:  # half the topics come from the topic cache, half from the batch path
        for exchange, topic, _, _ in rows[::2]:
            try:
                matcher.match(exchange, topic)
            except CompilerError:
                pass
    deliveries, errors = matcher.match_columns(  # the router's batch path (router/batch/routing.py)
        [mid for _, _, _, mid in rows],
        [exchange for exchange, _, _, _ in rows],
        [topic.encode() for _, topic, _, _ in rows],
        [None if h is None else list(h.items()) for _, _, h, _ in rows],
    )
    fresh = Matcher(index.snapshot(2, {}))
    for (exchange, topic, headers, mid), got, error in zip(rows, deliveries.to_pylist(), errors.tolist(), strict=True):
        try:
            expected = fresh.match(exchange, topic, headers, mid)
        except CompilerError as exc:
            assert (list(got), error) == ([], str(exc))
            continue
        assert error is None
        assert [(d["subscriber"], tuple(d["subscription_ids"])) for d in got] == [tuple(d) for d in expected]


any_subscription = st.one_of(subscription("amq", amqp_filters, 12), subscription("mq", mqtt_filters, 12))


class IndexMachine(RuleBasedStateMachine):
    """Upserts, replacements and removals in any order, a snapshot round trip
    and a restart from it, checked against the reference after every step."""

    @initialize()
    def start(self) -> None:
        self.index = RoutingIndex(EXCHANGES)
        self.reference = ReferenceMatcher(EXCHANGES)
        self.version = 0

    @rule(sub=any_subscription)
    def upsert(self, sub: Subscription) -> None:
        try:
            self.reference.upsert(sub)
        except CompilerError as exc:
            before = self.index.get(sub.id)
            try:
                self.index.upsert(sub)
            except CompilerError as got:
                assert type(got) is type(exc)
            assert self.index.get(sub.id) == before
            return
        slot = self.index.slot(sub.id)
        self.index.upsert(sub)
        assert slot is None or self.index.slot(sub.id) == slot
        assert self.index.get(sub.id) == sub

    @rule(i=st.integers(0, 12))
    def remove(self, i: int) -> None:
        assert self.index.remove(f"id{i}") == self.reference.remove(f"id{i}")

    @rule()
    def restart(self) -> None:
        self.version += 1
        data = self.index.snapshot(self.version, {0: self.version}).to_bytes()
        self.index = RoutingIndex.from_snapshot(Snapshot.from_bytes(data))

    @rule(
        amqp_topic=amqp_topics,
        mqtt_topic=mqtt_topics,
        headers=message_headers,
        message_id=st.sampled_from(["m1", "m2"]),
    )
    def match(self, amqp_topic: str, mqtt_topic: str, headers, message_id: str) -> None:
        self.version += 1
        snap = self.index.snapshot(self.version, {})
        for matcher in (Matcher(snap), Matcher(Snapshot.from_bytes(snap.to_bytes()))):
            for exchange, topic in (("amq", amqp_topic), ("mq", mqtt_topic)):
                got = matcher.match(exchange, topic, headers, message_id)
                assert got == self.reference.match(exchange, topic, headers, message_id)

    @invariant()
    def same_size(self) -> None:
        assert len(self.index) == len(self.reference)


IndexMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
TestIndexMachine = IndexMachine.TestCase

"""The realtime mode's routing table (``bitroute_kernel.RouteTable``: the Rust core its
JNI library routes with) gives the micro-batch path's answer for every publish: the
exchange (last ``exchange`` header, else the default), every rejection reason byte for
byte, the deliveries (header criteria, shared groups, order) and their
``bitroute.subscription_ids`` header. The grammar corpora run through it too, in
``conftest.Routing.ids``; here: chosen cases, and random publishes and subscriptions
against the micro-batch path (``route_tables.micro_batch``), including bytes that are
not UTF-8 in keys and headers."""

from __future__ import annotations

import pytest
from bitroute_kernel import RouteTable, TableError
from hypothesis import HealthCheck, given, settings, strategies as st

from compiler import CompilerError, HeaderCriteria, Matcher, RoutingIndex, Subscription
from compiler.options import SubscriptionOptions
from route_tables import REJECTED, ROUTED, UNROUTABLE, micro_batch, realtime, route_table, table_json

EXCHANGES = {"amq": "amqp", "mq": "mqtt"}
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def both(subs, publishes, default="amq", exchanges=EXCHANGES, alternates=None):
    """Each publish's outcome by the routing table, after checking the micro-batch path agrees
    (``alternates``: each exchange's alternate exchange)."""
    index = RoutingIndex(exchanges)
    valid = []
    for sub in subs:
        try:
            index.upsert(sub)
        except CompilerError:
            continue
        valid.append(sub)
    got = realtime(route_table(valid, exchanges, default, alternates), publishes)
    assert got == micro_batch(Matcher(index.snapshot(1, {})), default, publishes, alternates)
    return got


SUBS = [
    Subscription("s1", "amq", "billing", "orders.*.paid"),
    Subscription("s0", "amq", "billing", "orders.#"),
    Subscription("a9", "amq", "audit", "#"),
    Subscription('q"\\\n\x01é', "amq", "audit", "orders.eu.*"),
    Subscription("t1", "mq", "ops", "sensors/+/temperature",
                 HeaderCriteria("all", {"unit": "celsius", "x": None})),
    Subscription("t2", "mq", "ops2", "sensors/#", HeaderCriteria("any", {"unit": "kelvin", "y": None})),
    *(Subscription(f"g{i}", "mq", f"w{i}", "$share/g/jobs/#") for i in range(4)),
    Subscription("h1", "mq", "w1", "$share/h/jobs/+"),
    Subscription("h2", "mq", "w2", "$share/h/jobs/+", HeaderCriteria("all", {"unit": None})),
]

CASES = {
    "routed, ids escaped as JSON": (b"orders.eu.paid", []),
    "unroutable": (b"nothing", []),
    "exchange by header": (b"sensors/a/temperature", [("exchange", b"mq"), ("unit", b"celsius"), ("x", None)]),
    "last exchange header wins": (b"a.b", [("exchange", b"mq"), ("exchange", b"amq")]),
    "last criteria header wins": (b"sensors/a/temperature",
                                  [("exchange", b"mq"), ("unit", b"celsius"), ("x", b"\xff"), ("unit", b"kelvin")]),
    "unknown exchange": (b"a", [("exchange", b"it's \x85 \xc2\x85 \xc2\xa0 q\"")]),
    "unknown exchange, long name": (b"a", [("exchange", "é\u200b".encode() * 100)]),
    "empty exchange": (b"a", [("exchange", b"")]),
    "null exchange header": (b"a", [("exchange", None)]),
    "exchange header not UTF-8": (b"a", [("exchange", b"amq\xff")]),
    "exchange header cut short": (b"a", [("exchange", b"x" * 70 + b"\xe2\x82")]),
    "exchange header overlong": (b"a", [("exchange", b"\xe0\x80\x80'\\\t")]),
    "missing routing key": (None, []),
    "routing key not UTF-8": (b"orders.\xed\xa0\x80", []),
    "routing key too long": ("a\x00\u2028é'".encode() * 60, []),
    "MQTT wildcard in topic": (b"a/+", [("exchange", b"mq")]),
    "MQTT empty topic": (b"", [("exchange", b"mq")]),
    "MQTT U+0000": (b"a\x00b", [("exchange", b"mq")]),
    "MQTT topic too long": (b"a" * 65536, [("exchange", b"mq")]),
    "AMQP empty key": (b"", []),
    "shared groups": (b"jobs/x", [("exchange", b"mq"), ("unit", b"1")]),
    "MQTT dollar topic": (b"$SYS/jobs", [("exchange", b"mq")]),
}


@pytest.mark.parametrize("key, headers", CASES.values(), ids=CASES.keys())
def test_chosen_publishes(key, headers):
    both(SUBS, [(key, headers)])
    both(SUBS, [(key, headers)], default="mq")
    both(SUBS, [(key, headers)], default="nope")


def test_chosen_outcomes():
    got = both(SUBS, [(b"orders.eu.paid", []), (b"x", []), (None, [("exchange", b"\xff")])])
    assert got[0] == (ROUTED, "amq", "orders.eu.paid", None, [
        ("audit", '["a9","q\\"\\\\\\n\\u0001é"]', ["a9", 'q"\\\n\x01é']),
        ("billing", '["s0","s1"]', ["s0", "s1"])], None)
    assert got[1] == (ROUTED, "amq", "x", None, [("audit", '["a9"]', ["a9"])], None)
    assert got[2] == (REJECTED, None, None,
                      "the exchange header is not valid UTF-8 (invalid start byte at byte 0): b'\\xff'", [],
                      None)


def test_a_shared_group_delivers_each_publish_to_one_member():
    publishes = [(b"jobs/x", [("exchange", b"mq")])] * 200
    got = both(SUBS, publishes)
    chosen = [[s for s, _, ids in deliveries if ids[0].startswith("g")] for *_, deliveries, _ in got]
    assert all(len(c) == 1 for c in chosen)
    assert {c[0] for c in chosen} == {"w0", "w1", "w2", "w3"}


NO_LOCAL = [
    Subscription("n1", "mq", "ann", "chat/#", options=SubscriptionOptions(no_local=True)),
    Subscription("n2", "mq", "ann", "chat/+"),  # ann's other subscription: still delivered
    Subscription("n3", "mq", "bob", "chat/#", options=SubscriptionOptions(no_local=True)),
    Subscription("n4", "mq", "cy", "chat/#", HeaderCriteria("all", {"k": None}),
                 options=SubscriptionOptions(no_local=True)),
    Subscription("n5", "amq", "ann", "chat.#"),
]


def test_no_local_is_decided_alike_by_both_paths():
    """MQTT No Local: a subscription is not matched by a publish whose last ``publisher``
    header names its subscriber; the subscriber's other subscriptions still are."""
    mq = ("exchange", b"mq")
    got = both(NO_LOCAL, [
        (b"chat/a", [mq, ("publisher", b"ann")]),
        (b"chat/a/b", [mq, ("publisher", b"ann")]),
        (b"chat/a", [mq, ("publisher", b"bob"), ("k", b"1")]),
        (b"chat/a", [mq, ("publisher", b"bob"), ("publisher", b"cy"), ("k", b"1")]),
        (b"chat/a", [mq, ("publisher", b"c\xff"), ("k", b"1")]),
        (b"chat/a", [mq, ("publisher", None)]),
        (b"chat/a", [mq]),
        (b"chat.a", [("publisher", b"ann")]),
    ], default="amq")
    who = [[(s, ids) for s, _, ids in deliveries] for *_, deliveries, _ in got]
    assert who[0] == [("ann", ["n2"]), ("bob", ["n3"])]
    assert got[1][0] == ROUTED and who[1] == [("bob", ["n3"])]
    assert who[2] == [("ann", ["n1", "n2"]), ("cy", ["n4"])]
    assert who[3] == [("ann", ["n1", "n2"]), ("bob", ["n3"])]  # the last publisher header
    assert who[4] == [("ann", ["n1", "n2"]), ("bob", ["n3"]), ("cy", ["n4"])]  # not UTF-8
    assert who[5] == who[6] == [("ann", ["n1", "n2"]), ("bob", ["n3"])]
    assert who[7] == [("ann", ["n5"])]  # an AMQP subscription has no No Local
    only = both([NO_LOCAL[2]], [(b"chat/a", [mq, ("publisher", b"bob")])], default="amq")
    assert only[0][0] == UNROUTABLE


def test_the_table_json_of_the_contract():
    table = RouteTable(b"""{"version": 12, "default_exchange": "amq.topic",
      "exchanges": [{"name": "amq.topic", "dialect": "amqp", "share_prefix": null},
                    {"name": "mqtt", "dialect": "mqtt", "share_prefix": "$share/"}],
      "subscriptions": [{"id": "s1", "exchange": "amq.topic", "subscriber": "billing",
                         "filter": "orders.*.paid", "headers": null},
                        {"id": "s2", "exchange": "mqtt", "subscriber": "ops",
                         "filter": "sensors/+/temperature",
                         "headers": {"match": "all", "criteria": {"unit": "celsius", "x": null}}}]}""")
    assert (table.version, len(table)) == (12, 2)
    assert table.route(b"orders.eu.paid", [], "t/0/1") == (
        ROUTED, "amq.topic", "orders.eu.paid", None, [("billing", '["s1"]', ["s1"])], None)
    headers = [("exchange", b"mqtt"), ("unit", b"celsius")]
    assert table.route(b"sensors/k/temperature", headers, "t/0/2")[0] == UNROUTABLE
    assert table.route(b"sensors/k/temperature", headers + [("x", None)], "t/0/3")[0] == ROUTED


@pytest.mark.parametrize("data, message", [
    (b"{", "routing table"),
    (b'{"default_exchange": "a", "exchanges": [], "subscriptions": []', "routing table"),
    (b'{"default_exchange": "a", "exchanges": [{"name": "a", "dialect": "stomp"}], "subscriptions": []}',
     'unknown dialect "stomp"'),
    (b'{"default_exchange": "a", "exchanges": [], "subscriptions": [{"id": "s", "exchange": "b",'
     b' "subscriber": "c", "filter": "f"}]}', 'unknown exchange "b"'),
])
def test_a_table_it_cannot_read_raises_table_error(data, message):
    with pytest.raises(TableError, match=message):
        RouteTable(data)


def test_unknown_default_exchange_is_a_rejection_not_an_error():
    table = RouteTable(table_json([], EXCHANGES, "gone"))
    assert table.route(b"a", [], "m") == (REJECTED, "gone", "a", "unknown exchange 'gone'", [],
                                          None)


# --- Random subscriptions and publishes against the micro-batch path -------------------

amqp_filters = st.lists(st.sampled_from(["a", "b", "", "*", "#"]), max_size=5).map(".".join)
amqp_topics = st.lists(st.sampled_from(["a", "b", ""]), max_size=6).map(".".join)
mqtt_levels = st.lists(st.sampled_from(["a", "b", "", "+", "$x"]), min_size=1, max_size=4)
mqtt_filters = st.builds(
    lambda share, levels, tail: share + "/".join(levels + (["#"] if tail else [])),
    st.sampled_from(["", "", "$share/g/", "$share/h/"]), mqtt_levels, st.booleans(),
) | st.sampled_from(["#", "+", "$share/g/#", "a/#/b", "$share/g"])  # some invalid: left out of both
mqtt_topics = st.lists(st.sampled_from(["a", "b", "", "$x", "$"]), min_size=1, max_size=5).map("/".join)
criteria = st.none() | st.builds(
    HeaderCriteria, st.sampled_from(["all", "any"]),
    st.dictionaries(st.sampled_from(["h1", "h2", "h3"]), st.sampled_from(["1", "2", "é", None]), max_size=3))
ids = st.builds(lambda form, i: form.format(i), st.sampled_from(["id{}", "id{}", 'q"{}', "b\\{}", "n\n{}", "é{}"]),
                st.integers(0, 20))
subscriptions = st.lists(
    st.builds(Subscription, ids, st.sampled_from(["amq", "mq"]), st.sampled_from(["c0", "c1", "c2", "c3"]),
              amqp_filters | mqtt_filters, criteria),
    max_size=25, unique_by=lambda sub: sub.id)

keys = st.one_of(
    amqp_topics.map(str.encode), mqtt_topics.map(str.encode),
    st.sampled_from([None, b"a/+", b"#", b"\xff", b"a.\xe2\x82", b"a\x00", b"a" * 256, "é\x85".encode() * 90]),
    st.binary(max_size=4))
exchange_values = st.sampled_from([b"amq", b"mq", b"amq", b"mq", b"nope", b"", None, b"\xff", b"m\xc3", "é'".encode()])
header_values = st.sampled_from([b"1", b"2", "é".encode(), b"\xff", None])
headers = st.lists(st.one_of(
    st.tuples(st.just("exchange"), exchange_values),
    st.tuples(st.sampled_from(["h1", "h2", "h3", "other"]), header_values)), max_size=6)


@SETTINGS
@given(subscriptions, st.lists(st.tuples(keys, headers), max_size=12), st.sampled_from(["amq", "mq", "nope"]))
def test_random_publishes_route_as_the_micro_batch_path(subs, publishes, default):
    both(subs, publishes, default)


# --- Alternate exchanges: a publish its exchange routes to no one, tried once on the alternate

ALTERNATE_EXCHANGES = {"amq": "amqp", "ae": "amqp", "last": "amqp", "mq": "mqtt"}
ALTERNATES = {"amq": "ae", "ae": "last"}
ALTERNATE_SUBS = [
    Subscription("o1", "amq", "billing", "orders.#"),
    Subscription("u1", "ae", "ops", "#", HeaderCriteria("all", {"keep": None})),
    Subscription("u2", "ae", "dlq", "*.eu"),
    Subscription("l1", "last", "never", "#"),
    Subscription("m1", "mq", "mq", "#"),
]


def test_an_unroutable_publish_goes_once_through_its_alternate_in_both_paths():
    got = both(ALTERNATE_SUBS, [
        (b"orders.eu", [("keep", b"")]),  # its own exchange routes it: no alternate
        (b"stock.eu", [("keep", b"")]),  # its own routes it to no one: the alternate's
        (b"stock.us", []),  # the alternate's neither; "last" (the alternate's) is not tried
        (b"stock.us", [("exchange", b"ae")]),  # a publish to "ae" goes to its own alternate
        (b"a/b", [("exchange", b"mq")]),  # an MQTT exchange names no alternate
        (None, []),  # rejected before any alternate
    ], alternates=ALTERNATES, exchanges=ALTERNATE_EXCHANGES)
    assert got[0][0::4] == (ROUTED, [("billing", '["o1"]', ["o1"])])
    assert got[0][5] is None
    assert got[1] == (ROUTED, "amq", "stock.eu", None,
                      [("dlq", '["u2"]', ["u2"]), ("ops", '["u1"]', ["u1"])], "ae")
    assert got[2] == (UNROUTABLE, "amq", "stock.us", None, [], None)
    assert got[3][0::5] == (ROUTED, "last")
    assert got[4] == (ROUTED, "mq", "a/b", None, [("mq", '["m1"]', ["m1"])], None)
    assert got[5][0] == REJECTED and got[5][5] is None


def test_alternates_that_loop_are_each_tried_once():
    loop = {"amq": "ae", "ae": "amq"}
    subs = [Subscription("u", "ae", "ops", "x.*"), Subscription("o", "amq", "billing", "*.y")]
    got = both(subs, [(b"x.y", []), (b"z.y", [("exchange", b"ae")]), (b"q", []),
                      (b"q", [("exchange", b"ae")])],
               alternates=loop, exchanges=ALTERNATE_EXCHANGES)
    assert [(g[0], g[5]) for g in got] == [(ROUTED, None), (ROUTED, "amq"), (UNROUTABLE, None),
                                           (UNROUTABLE, None)]


@pytest.mark.parametrize("exchanges, message", [
    ('[{"name": "a", "dialect": "amqp", "alternate": "b"}]', 'alternate exchange "b" is not listed'),
    ('[{"name": "a", "dialect": "amqp", "alternate": "a"}]', "is the exchange itself"),
    ('[{"name": "a", "dialect": "amqp", "alternate": "m"}, {"name": "m", "dialect": "mqtt"}]',
     "must both be AMQP exchanges"),
])
def test_a_table_with_a_bad_alternate_raises_table_error(exchanges, message):
    with pytest.raises(TableError, match=message):
        RouteTable(f'{{"default_exchange": "a", "exchanges": {exchanges}, '
                   f'"subscriptions": []}}'.encode())


alternate_subscriptions = st.lists(
    st.builds(Subscription, ids, st.sampled_from(["amq", "ae", "last"]),
              st.sampled_from(["c0", "c1", "c2"]), amqp_filters, criteria),
    max_size=20, unique_by=lambda sub: sub.id)
alternate_headers = st.lists(st.one_of(
    st.tuples(st.just("exchange"), st.sampled_from([b"amq", b"ae", b"last", b"mq", b"nope"])),
    st.tuples(st.sampled_from(["h1", "h2", "h3"]), header_values)), max_size=4)


@SETTINGS
@given(alternate_subscriptions, st.lists(st.tuples(keys, alternate_headers), max_size=12),
       st.sampled_from([ALTERNATES, {"amq": "ae", "ae": "amq"}, {"last": "amq"}, {}]))
def test_random_publishes_through_alternates_route_as_the_micro_batch_path(subs, publishes,
                                                                          alternates):
    for outcome, _, _, _, deliveries, alternate in both(
            subs, publishes, alternates=alternates, exchanges=ALTERNATE_EXCHANGES):
        assert alternate is None or (outcome == ROUTED and deliveries)


def test_no_local_in_a_single_match_as_explain_asks():
    index = RoutingIndex(EXCHANGES)
    for sub in NO_LOCAL:
        index.upsert(sub)
    matcher = Matcher(index.snapshot(1, {}))
    assert matcher.reads_publisher
    assert [(d.subscriber, d.subscription_ids) for d in matcher.match(
        "mq", "chat/a", {"publisher": b"ann"})] == [("ann", ("n2",)), ("bob", ("n3",))]
    assert [d.subscriber for d in matcher.match("mq", "chat/a", {"publisher": "bob"})] == ["ann"]


# --- Message expiry: RouteTable.route_at against plan_batch -----------------------------

PUBLISHED_MS = 1_735_689_600_000  # arrow_batches.source_batch's timestamp, 2025-01-01 UTC
EXPIRY_PUBLISHES: list[tuple[bytes | None, list[tuple[str, bytes | None]]]] = [
    (b"orders.eu.paid", [("expiry", b"5")]),
    (b"nothing", [("expiry", b"5")]),
    (b"orders.eu.paid", [("expiry", b"0")]),
    (b"orders.eu.paid", [("expiry", b"5"), ("expiry", b"x")]),
    (b"orders.eu.paid", [("expiry", None)]),
    (b"orders.eu.paid", [("expiry", b"x"), ("expiry", b"4294967295")]),
    (b"orders.eu.paid", [("expiry", b"4294967296")]),
    (None, [("expiry", b"1")]),
    (b"orders.eu.paid", []),
    (b"a", [("exchange", b"nope"), ("expiry", b"soon")]),
    (b"orders.eu.paid", [("expiry", b"9"), ("unit", b"x"), ("expiry", b"007")]),
]


def micro_batch_expiry(matcher: Matcher, publishes, now_ms: int) -> list[tuple]:
    """Per publish, as the micro-batch path decides it at ``now_ms`` (``plan_batch``):
    ``(outcome, reason, the expiry header values its deliveries carry)``, outcome 3 expired."""
    from arrow_batches import source_batch
    from streaming.kafka.layout import DeliveryLayout
    from streaming.router.batch.delivery import ProducerSettings
    from streaming.router.batch.routing import RouteSettings, kept_header_columns, plan_batch

    settings = RouteSettings("amq", DeliveryLayout("d."), "rejected", 1, True,
                             ProducerSettings("localhost:1", 1_048_576), now_ms=now_ms)
    plan = plan_batch(matcher, source_batch([(k, b"x", h) for k, h in publishes]), settings)
    offsets, names, values = kept_header_columns(plan)
    names, values = names.to_pylist(), values.to_pylist()
    out = []
    for row in range(plan.publishes.n):
        carried = [v for n, v in zip(names[offsets[row]:offsets[row + 1]],
                                     values[offsets[row]:offsets[row + 1]], strict=True) if n == "expiry"]
        if plan.reasons[row] is not None:
            out.append((REJECTED, plan.reasons[row], carried))
        elif plan.expiry is not None and plan.expiry.expired[row]:
            out.append((3, None, carried))
        else:
            routed = bool((plan.owner == row).any())
            out.append((ROUTED if routed else UNROUTABLE, None, carried))
    return out


@pytest.mark.parametrize("waited_ms", [-5_000, 0, 999, 1_000, 4_999, 5_000, 9_000, 10 ** 12])
def test_both_paths_expire_publishes_alike(waited_ms):
    subs = [s for s in SUBS if s.exchange == "amq"]
    index = RoutingIndex(EXCHANGES)
    for sub in subs:
        index.upsert(sub)
    table = route_table(subs, EXCHANGES, "amq")
    now_ms = PUBLISHED_MS + waited_ms
    got = micro_batch_expiry(Matcher(index.snapshot(1, {})), EXPIRY_PUBLISHES, now_ms)
    for offset, ((key, headers), (outcome, reason, carried)) in enumerate(
            zip(EXPIRY_PUBLISHES, got, strict=True)):
        (kind, _, _, table_reason, deliveries, _), remaining = table.route_at(
            key, headers, f"p/0/{offset}", PUBLISHED_MS, now_ms)
        assert (kind, table_reason) == (outcome, reason), (key, headers)
        assert (kind == 3) == (deliveries == [] and outcome == 3)
        own = [v for n, v in headers if n == "expiry"]
        # The deliveries' expiry headers: each set to the remaining interval.
        assert carried == (own if remaining is None else [str(remaining).encode()] * len(own))
    waited_s = max(waited_ms, 0) // 1000
    assert got[0] == ((3, None, [b"5"]) if waited_s >= 5
                      else (ROUTED, None, [str(5 - waited_s).encode()]))
    assert got[2][0] == REJECTED and got[2][1].endswith("not b'0'")
    assert got[3][0] == REJECTED  # the last header counts: 'x'
    assert got[4][1].endswith("not null")
    assert got[7][1] == "missing routing key" and got[9][1] == "unknown exchange 'nope'"
    assert got[8] == (ROUTED, None, [])

"""Limits on subscriptions (streaming/router/subscriptions/limits.py, ``[limits]``): the check the router
and the command line share, the counts the index keeps for it (a replaced id is not a new
subscription), ``bitroute status``'s usage figures and the configuration keys."""

from __future__ import annotations

import pytest

from compiler import Dialect, HeaderCriteria, RoutingIndex, Subscription
from streaming.config import load
from streaming.errors import ConfigError
from streaming.router.subscriptions.changelog import apply_record
from streaming.router.subscriptions.limits import LimitError, check_limits, filter_levels, usage

EXCHANGES = {"amq.topic": "amqp", "mqtt": "mqtt"}


def limits(**values: str):
    return load(overrides={f"limits.{k.replace('__', '.')}": v for k, v in values.items()},
                environ={}).limits


def test_the_defaults_follow_the_anchors_and_overrides_are_per_exchange():
    cfg = load(environ={}).limits
    assert cfg.of("mqtt", "max_filter_levels") == 128  # EMQX's max_topic_levels
    assert cfg.of("mqtt", "max_filter_length") == 65_535  # MQTT's longest topic filter
    own = limits(**{"exchanges.mqtt.max_filter_levels": "4"})
    assert (own.of("mqtt", "max_filter_levels"), own.of("amq.topic", "max_filter_levels")) == (4, 128)
    assert own.key("mqtt", "max_filter_levels") == 'limits.exchanges."mqtt.max_filter_levels"'
    assert own.key("amq.topic", "max_filter_levels") == "limits.max_filter_levels"
    for key, value, why in (("max_filter_levels", "0", "limits.max_filter_levels: expected an integer >= 1"),
                            ("exchanges.nope.max_filter_levels", "3", 'limits.exchanges."nope.max_filter_levels"'),
                            ("exchanges.mqtt.max_levels", "3", "a key <exchange>.<limit>"),
                            ("exchanges.mqtt.max_filter_levels", "x", "an integer >= 1"),
                            ("max_fliter_levels", "3", "unknown configuration key")):
        with pytest.raises(ConfigError, match=why.replace(".", r"\.").replace('"', '"')):
            load(overrides={f"limits.{key}": value}, environ={})


def test_nested_toml_tables_set_an_exchange_s_limits(tmp_path):
    path = tmp_path / "b.toml"
    path.write_text('[limits.exchanges."amq.topic"]\nmax_header_criteria = 2\n'
                    '[limits.exchanges]\n"mqtt.max_filter_length" = 9\n')
    cfg = load(path, environ={}).limits
    assert (cfg.of("amq.topic", "max_header_criteria"), cfg.of("mqtt", "max_filter_length")) == (2, 9)


def test_filter_levels_count_words_levels_and_a_shared_filter_s_own():
    assert filter_levels(Dialect.AMQP, "") == 0
    assert filter_levels(Dialect.AMQP, "a..b") == 3
    assert filter_levels(Dialect.MQTT, "/a") == 2
    assert filter_levels(Dialect.MQTT, "$share/g/a/+/#") == 3


def test_each_limit_refuses_with_one_line_naming_it_and_its_value():
    cfg = limits(max_filter_levels="3", max_filter_length="12", max_header_criteria="1",
                 max_subscriptions_per_subscriber="2", max_subscriptions_per_exchange="4",
                 **{"exchanges.mqtt.max_filter_levels": "2"})
    index = RoutingIndex(EXCHANGES)

    def refused(sub: Subscription) -> str:
        with pytest.raises(LimitError) as raised:
            check_limits(index, sub, cfg)
        assert "\n" not in str(raised.value)
        return str(raised.value)

    assert refused(Subscription("s", "amq.topic", "a", "a.b.c.d")) == (
        "subscription 's': its filter has 4 levels, more than limits.max_filter_levels = 3 "
        "(exchange 'amq.topic')")
    assert refused(Subscription("s", "mqtt", "a", "a/b/c")).endswith(
        "more than limits.exchanges.\"mqtt.max_filter_levels\" = 2 (exchange 'mqtt')")
    assert "13 bytes long, more than limits.max_filter_length = 12" in refused(
        Subscription("s", "amq.topic", "a", "a" * 13))
    assert "2 header criteria, more than limits.max_header_criteria = 1" in refused(
        Subscription("s", "amq.topic", "a", "a", HeaderCriteria("all", {"x": "1", "y": None})))
    for sub_id, subscriber in (("1", "a"), ("2", "a"), ("3", "b")):
        sub = Subscription(sub_id, "amq.topic", subscriber, "a.*")
        check_limits(index, sub, cfg)
        index.upsert(sub)
    assert "subscription 3 of subscriber 'a' on the exchange, more than " \
           "limits.max_subscriptions_per_subscriber = 2" in refused(
               Subscription("4", "amq.topic", "a", "b"))
    # Replacing an id is not a new subscription; moving it to another subscriber is, for it.
    check_limits(index, Subscription("2", "amq.topic", "a", "other.#"), cfg)
    check_limits(index, Subscription("2", "amq.topic", "b", "other.#"), cfg)
    index.upsert(Subscription("3", "amq.topic", "b", "b"))
    index.upsert(Subscription("4", "amq.topic", "b", "c"))
    assert "subscription 3 of subscriber 'b'" in refused(Subscription("1", "amq.topic", "b", "x"))
    assert "subscription 5 of the exchange, more than limits.max_subscriptions_per_exchange = 4" \
        in refused(Subscription("5", "amq.topic", "c", "b"))
    check_limits(index, Subscription("4", "mqtt", "a", "x"), cfg)  # another exchange


def test_the_index_counts_follow_upserts_removals_replacements_and_restores():
    index = RoutingIndex(EXCHANGES)
    for sub_id, exchange, subscriber in (("1", "amq.topic", "a"), ("2", "amq.topic", "a"),
                                         ("3", "mqtt", "a"), ("4", "amq.topic", "b")):
        index.upsert(Subscription(sub_id, exchange, subscriber, "x"))
    index.upsert(Subscription("2", "amq.topic", "b", "y"))  # moved to b
    index.upsert(Subscription("1", "amq.topic", "a", "z"))  # replaced in place
    index.remove("3")

    def counts(ix: RoutingIndex) -> tuple[int, ...]:
        return (ix.count("amq.topic"), ix.count("amq.topic", "a"), ix.count("amq.topic", "b"),
                ix.count("mqtt"), ix.count("mqtt", "a"))

    assert counts(index) == (3, 1, 2, 0, 0)
    snapshot = index.snapshot(1, {})
    assert counts(RoutingIndex.from_snapshot(snapshot)) == (3, 1, 2, 0, 0)
    figures = usage(snapshot, limits())
    assert figures["amq.topic"]["max_subscriptions_per_exchange"] == {"limit": 10_000_000, "used": 3}
    assert figures["amq.topic"]["max_subscriptions_per_subscriber"]["used"] == 2
    assert figures["mqtt"]["max_subscriptions_per_exchange"]["used"] == 0


def test_usage_names_the_largest_use_of_each_limit():
    index = RoutingIndex(EXCHANGES)
    index.upsert(Subscription("1", "mqtt", "a", "$share/group/a/b/c"))
    index.upsert(Subscription("2", "mqtt", "a", "a/b", HeaderCriteria("any", {"x": None, "y": "2"})))
    index.upsert(Subscription("3", "amq.topic", "b", "é.b"))
    index.upsert(Subscription("4", "amq.topic", "c", "gone.a.b.c.d", HeaderCriteria("all", {"z": None})))
    index.remove("4")
    used = {e: {k: v["used"] for k, v in f.items()} for e, f in usage(index.snapshot(1, {}), limits()).items()}
    assert used["mqtt"] == {"max_subscriptions_per_subscriber": 2, "max_subscriptions_per_exchange": 2,
                            "max_filter_levels": 3, "max_filter_length": 18, "max_header_criteria": 2}
    assert used["amq.topic"] == {"max_subscriptions_per_subscriber": 1, "max_subscriptions_per_exchange": 1,
                                 "max_filter_levels": 2, "max_filter_length": 4, "max_header_criteria": 0}


def test_a_changelog_record_that_breaks_a_limit_is_rejected_and_never_applied():
    cfg = limits(max_subscriptions_per_subscriber="1")
    index = RoutingIndex(EXCHANGES)
    value = b'{"exchange": "amq.topic", "subscriber": "a", "filter": "%s"}'
    assert apply_record(index, b"1", value % b"x", 0, 0, None, 0, limits=cfg).change == "upsert"
    again = apply_record(index, b"1", value % b"y", 0, 1, None, 0, limits=cfg)
    assert again.change == "upsert"  # the same id replaced: not a new subscription
    second = apply_record(index, b"2", value % b"z", 0, 2, None, 0, limits=cfg)
    assert second.change == "rejected" and "limits.max_subscriptions_per_subscriber = 1" in (second.reason or "")
    assert "2" not in index and index.get("1").filter == "y"


def test_limits_on_a_real_broker_spark_and_delta(isolated_settings, spark, cli):
    """Records written straight to the changelog that break a limit are rejected (rejected
    topic, ``subscriptions`` audit) and never applied; the command line refuses the same
    with one line before writing anything; ``bitroute status`` shows the use of each."""
    import json

    from confluent_kafka import Producer
    from deltalake import DeltaTable

    from kafka_io import headers_of, read_topic
    from schemas.records import MESSAGE_ID_HEADER, REASON_HEADER, SOURCE_HEADER
    from streaming.router.service import Router

    settings = isolated_settings(**{"limits.max_subscriptions_per_subscriber": "2",
                                    "limits.exchanges.mqtt.max_filter_levels": "3"})
    config = load(overrides=settings, environ={})
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap})

    def record(sub_id: str, subscriber: str, filter_: str, exchange: str = "amq.topic") -> None:
        value = {"exchange": exchange, "subscriber": subscriber, "filter": filter_}
        producer.produce(config.kafka.subscriptions_topic, json.dumps(value).encode(),
                         sub_id.encode())
        assert producer.flush(30) == 0

    record("a1", "ann", "o.*")
    record("a2", "ann", "o.#")
    record("a3", "ann", "o.x")  # a third for ann: rejected
    record("a1", "ann", "o.x")  # replaced: not a new subscription
    record("m1", "mo", "a/b/c/d", "mqtt")  # 4 levels, the exchange's own limit is 3
    record("m2", "mo", "a/b/c", "mqtt")
    router = Router(config, spark)
    router.start()
    try:
        producer.produce(config.kafka.publishes_topic, b"p", b"o.x", headers=[("exchange", b"amq.topic")])
        assert producer.flush(30) == 0
        router.process_all_available()
        assert router.flush_audit(60)
    finally:
        router.stop()
    [delivery] = read_topic(config, config.kafka.layout.topic("ann"))
    assert json.loads(headers_of(delivery)["bitroute.subscription_ids"]) == ["a1", "a2"]
    changes = {(r["subscription_id"], r["change"]): r["reason"]
               for r in DeltaTable(config.delta.table_path("subscriptions")).to_pyarrow_table().to_pylist()}
    assert changes["a3", "rejected"] == (
        "subscription 'a3': it would be subscription 3 of subscriber 'ann' on the exchange, "
        "more than limits.max_subscriptions_per_subscriber = 2 (exchange 'amq.topic')")
    assert "more than limits.exchanges.\"mqtt.max_filter_levels\" = 3" in changes["m1", "rejected"]
    assert ("a1", "upsert") in changes and ("m2", "upsert") in changes
    rejected = [headers_of(r) for r in read_topic(config, config.kafka.rejected_topic)]
    assert sorted((h[SOURCE_HEADER], h[REASON_HEADER] == changes[sid, "rejected"])
                  for h in rejected for sid in ("a3", "m1") if sid in h[REASON_HEADER]) == [
        ("subscription", True), ("subscription", True)]
    assert all(MESSAGE_ID_HEADER in h for h in rejected)

    # The command line: one line naming the limit, nothing written.
    ends = len(read_topic(config, config.kafka.subscriptions_topic))
    done = cli("subscribe", "--exchange", "amq.topic", "--subscriber", "ann", "--filter", "q.*",
               settings=settings)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert done.stderr.strip().endswith("it would be subscription 3 of subscriber 'ann' on the "
                                        "exchange, more than limits.max_subscriptions_per_subscriber"
                                        " = 2 (exchange 'amq.topic')")
    done = cli("subscribe", "--exchange", "mqtt", "--subscriber", "x", "--filter", "a/b/c/d",
               settings=settings)
    assert done.returncode == 2 and 'limits.exchanges."mqtt.max_filter_levels" = 3' in done.stderr
    assert len(read_topic(config, config.kafka.subscriptions_topic)) == ends
    done = cli("subscribe", "--exchange", "amq.topic", "--subscriber", "ann", "--filter", "q.*",
               "--id", "a2", settings=settings)  # replacing: allowed
    assert done.returncode == 0, done.stderr

    done = cli("status", "--json", settings=settings)
    limits_now = json.loads(done.stdout)["limits"]
    assert limits_now["amq.topic"]["max_subscriptions_per_subscriber"] == {"limit": 2, "used": 2}
    assert limits_now["mqtt"]["max_filter_levels"] == {"limit": 3, "used": 3}
    assert limits_now["mqtt"]["max_filter_length"] == {"limit": 65_535, "used": 5}
    text = cli("status", settings=settings).stdout
    [line] = [line for line in text.splitlines() if line.startswith("limits amq.topic:")]
    assert "most per subscriber 2/2, subscriptions 2/10,000,000, deepest filter (levels) 2/128" \
        in line
    listed = cli("subscriptions", "--subscriber", "ann", settings=settings).stdout
    assert "ann on amq.topic: 2 of limits.max_subscriptions_per_subscriber = 2" in listed

"""The router end to end on a real broker, real Spark and real Delta.

Most tests share one running router (module scope) and keep apart by using
their own subscriber names and routing keys; tests that need a router of
their own (re-run, restart) drive :meth:`Router.process_batch` on one that
is opened but not started, which is also how a re-run batch id is
produced deterministically.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import uuid
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable

from delivery_order import assert_publish_order_kept, delivery_order
from isolation import isolated_config
from kafka_io import KAFKA_TIMEOUT_S, headers_of, produce_one, read_topic
from schemas.records import (
    CHANGE_REJECTED,
    CHANGE_REMOVE,
    CHANGE_UPSERT,
    EXCHANGE_HEADER,
    MESSAGE_ID_HEADER,
    OUTCOME_REJECTED,
    OUTCOME_ROUTED,
    OUTCOME_UNROUTABLE,
    REASON_HEADER,
    SNAPSHOT_VERSION_HEADER,
    SOURCE_HEADER,
    SOURCE_PUBLISH,
    SOURCE_SUBSCRIPTION,
    SUBSCRIPTION_IDS_HEADER,
)
from streaming.config import Config
from streaming.router.batch.routing import ROUTED_ARROW
from streaming.router.service import Router

# --- helpers -----------------------------------------------------------------------

def router_config(base: Config, root: Path) -> Config:
    """``base`` with this router's own topics, tables and checkpoints."""
    return isolated_config(base, root, **{"streaming.trigger_interval": "100 milliseconds"})


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _create_topic(config: Config, name: str, settings: dict[str, str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config=settings)])[name].result(KAFKA_TIMEOUT_S)


def subscribe(config: Config, sub_id: str, exchange: str, subscriber: str, filter_: str,
              headers: dict | None = None) -> None:
    value: dict[str, object] = {"exchange": exchange, "subscriber": subscriber, "filter": filter_}
    if headers is not None:
        value["headers"] = headers
    produce_one(config, config.kafka.subscriptions_topic, sub_id.encode(), json.dumps(value).encode())


def unsubscribe(config: Config, sub_id: str) -> None:
    produce_one(config, config.kafka.subscriptions_topic, sub_id.encode(), None)


def publish(config: Config, routing_key: str | None, payload: bytes = b"payload",
            exchange: str | None = None, headers: list[tuple[str, bytes]] | None = None) -> str:
    all_headers: list[tuple[str, str | bytes | None]] = list(headers or [])
    if exchange is not None:
        all_headers.append((EXCHANGE_HEADER, exchange.encode()))
    key = None if routing_key is None else routing_key.encode()
    return produce_one(config, config.kafka.publishes_topic, key, payload, all_headers)


def deliveries_of(config: Config, subscriber: str) -> dict[str, dict[str, str]]:
    """message id -> headers of each record in the subscriber's topic."""
    records = read_topic(config, config.kafka.layout.topic(subscriber))
    return {headers_of(r)[MESSAGE_ID_HEADER]: headers_of(r) for r in records}


def table(config: Config, name: str) -> list:
    """Every row of an audit table, read with delta-rs as the router wrote it: named
    tuples with the table's columns, maps as dicts."""
    arrow = DeltaTable(config.delta.table_path(name)).to_pyarrow_table()
    row = namedtuple(f"{name}_row", arrow.column_names)  # type: ignore[misc]  # a name per table
    columns = [[v if v is None or not pa.types.is_map(column.type) else dict(v)
                for v in column.to_pylist()] for column in arrow.columns]
    return [row(*values) for values in zip(*columns, strict=True)]


def rows_for(config: Config, name: str, column: str, values) -> list:
    wanted = set(values)
    return [r for r in table(config, name) if getattr(r, column) in wanted]


def test_a_batch_routed_in_the_driver_is_one_routing_call(spark):
    # toArrow hands back a record batch per partition; each routing call ends with a
    # flush (a Produce request per delivery partition): the driver makes one call.
    calls: list[int] = []

    def route(batches):
        for batch in batches:
            calls.append(batch.num_rows)
            yield pa.RecordBatch.from_pylist([], schema=ROUTED_ARROW)

    source = spark.range(0, 10, numPartitions=2)
    assert len(source.toArrow().to_batches()) == 2
    # route: a stand-in for RoutePartitions (a mapInArrow function of batches); rows through Spark.
    routed = Router._route_in_driver(lambda: None, source, route)  # type: ignore[arg-type]
    assert calls == [10]
    assert routed.schema == ROUTED_ARROW and routed.num_rows == 0
    # Rows read from Kafka by the driver (streaming.router.batch.batch_rows) are one batch: no job.
    calls.clear()
    # The stand-in again, and no DataFrame: the rows are the driver's.
    Router._route_in_driver(lambda: pa.RecordBatch.from_pylist([{"id": 1}] * 3), None, route)  # type: ignore[arg-type]
    assert calls == [3]


# --- one running router, one round of traffic ------------------------------------------
#
# The router is started idle with an empty changelog; then every scenario below
# writes its subscriptions, then its publishes, and one processAllAvailable routes
# them all (a few micro-batches instead of a few per test). That every publish is
# routed by subscriptions written after the router caught up at start is the
# happens-before guarantee at work in every scenario.

@pytest.fixture(scope="module")
def router(base_config: Config, spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    # Every batch through the Python workers (mapInArrow), each task writing its audit
    # files: a cluster's path. test_shared_layout routes small batches in the driver; the
    # executors' ordering test below has the driver write the files (a local master's).
    config = router_config(base_config, tmp_path_factory.mktemp("router"))
    config = dataclasses.replace(config, streaming=dataclasses.replace(
        config.streaming, driver_route_max_publishes=0, executor_audit_files="tasks"))
    instance = Router(config, spark)
    instance.start()
    try:
        yield instance
    finally:
        instance.stop()


@dataclasses.dataclass
class Traffic:
    """Names and message ids of the scenarios, filled in by the ``traffic`` fixture."""

    names: dict[str, str] = dataclasses.field(default_factory=dict)
    sent: dict[str, str] = dataclasses.field(default_factory=dict)
    bad_changes: dict[str, bytes] = dataclasses.field(default_factory=dict)
    start_version: int = 0
    batches: list = dataclasses.field(default_factory=list)
    subscription_ids: list[str] = dataclasses.field(default_factory=list)


@pytest.fixture(scope="module")
def traffic(router: Router) -> Traffic:
    cfg = router.config
    router.process_all_available()
    assert router.subscriptions is not None
    t = Traffic(start_version=router.subscriptions.version)
    reports_before = len(router.reports)  # the query runs: batches may start while we write
    n = t.names
    for name in ("alice", "bob", "carol", "eu", "us", "fay", "tiny", "wide"):
        n[name] = unique(name)

    def sub(sub_id: str, *args, **kwargs) -> None:
        subscribe(cfg, sub_id, *args, **kwargs)
        t.subscription_ids.append(sub_id)

    # Exchanges side by side.
    sub(f"{n['alice']}-amqp", "amq.topic", n["alice"], "sensors.*.temp")
    sub(f"{n['bob']}-mqtt", "mqtt", n["bob"], "sensors/+/temp")
    sub(f"{n['alice']}-mqtt", "mqtt", n["alice"], "sensors/#")
    # Header criteria.
    sub(f"{n['eu']}-s", "amq.topic", n["eu"], "orders.#",
        {"match": "all", "criteria": {"region": "eu", "priority": None}})
    sub(f"{n['us']}-s", "amq.topic", n["us"], "orders.#",
        {"match": "any", "criteria": {"region": "us", "vip": None}})
    # Two matching subscriptions of one subscriber (and one that does not match).
    sub(f"{n['carol']}-2", "amq.topic", n["carol"], "stock.#")
    sub(f"{n['carol']}-1", "amq.topic", n["carol"], "stock.*")
    sub(f"{n['carol']}-3", "amq.topic", n["carol"], "bonds.*")
    # Bad changes next to a good one.
    t.bad_changes = {
        unique("bad-json"): b"{not json",
        unique("bad-filter"): json.dumps({"exchange": "mqtt", "subscriber": n["fay"],
                                          "filter": "a/#/b"}).encode(),
        unique("bad-exchange"): json.dumps({"exchange": "nope", "subscriber": n["fay"],
                                            "filter": "a"}).encode(),
        unique("bad-subscriber"): json.dumps({"exchange": "amq.topic", "subscriber": "no/slash",
                                              "filter": "a"}).encode(),
        # As large as the broker takes: its copy with the reason headers is not.
        unique("bad-huge"): b"{" + b"x" * 1_048_400,
    }
    for sub_id, value in t.bad_changes.items():
        produce_one(cfg, cfg.kafka.subscriptions_topic, sub_id.encode(), value)
        t.subscription_ids.append(sub_id)
    sub(f"{n['fay']}-ok", "amq.topic", n["fay"], "good.key")
    # Poison pills: a delivery topic whose broker limit is smaller than a publish.
    _create_topic(cfg, cfg.kafka.layout.topic(n["tiny"]), {"max.message.bytes": "2000"})
    sub(f"{n['tiny']}-s", "amq.topic", n["tiny"], "big.*")
    sub(f"{n['wide']}-s", "amq.topic", n["wide"], "big.#")

    s = t.sent
    s["amqp"] = publish(cfg, "sensors.k1.temp", b"21.5", "amq.topic", [("trace", b"t-1")])
    s["mqtt"] = publish(cfg, "sensors/k1/temp", b"22.0", "mqtt")
    # The MQTT-shaped key on the AMQP exchange is one word: isolation means no MQTT match.
    s["crossed"] = publish(cfg, "sensors/k1/temp", b"x", "amq.topic")
    s["default"] = publish(cfg, "sensors.k2.temp", b"23.1")  # no exchange header: amq.topic
    s["eu_priority"] = publish(cfg, "orders.new", headers=[("region", b"eu"), ("priority", b"high")])
    s["us"] = publish(cfg, "orders.new", headers=[("region", b"us")])
    s["eu_only"] = publish(cfg, "orders.new", headers=[("region", b"eu")])
    s["vip"] = publish(cfg, "orders.paid", headers=[("vip", b"")])
    s["invoice"] = publish(cfg, "invoices.new", headers=[("region", b"us")])
    s["stock"] = publish(cfg, "stock.acme")
    s["unknown_exchange"] = publish(cfg, "good.key", exchange="nope")
    s["invalid_topic"] = publish(cfg, "a/+/b", exchange="mqtt")
    s["null_key"] = publish(cfg, None, exchange="amq.topic")
    s["good"] = publish(cfg, "good.key")
    # Poison pills, each of which once stopped the router for good.
    s["exchange_not_utf8"] = produce_one(cfg, cfg.kafka.publishes_topic, b"good.key", b"payload",
                                         [(EXCHANGE_HEADER, b"\xff\xfe")])
    s["oversize"] = publish(cfg, "good.key", b"x" * 1_048_480)
    s["binary_header"] = publish(cfg, "good.key", headers=[("blob", b"\xff\x00ok")])
    s["after_pills"] = publish(cfg, "good.key")
    router.process_all_available()
    assert router.flush_audit(60)  # the audit reaches Delta in the background
    t.batches = list(router.reports)[reports_before:]
    assert {b.routed_in for b in t.batches} == {"executors"}
    return t


def test_amqp_and_mqtt_exchanges_route_side_by_side_and_stay_isolated(
        router: Router, traffic: Traffic):
    cfg, n, s = router.config, traffic.names, traffic.sent
    alice, bob = n["alice"], n["bob"]
    to_alice = deliveries_of(cfg, alice)
    assert set(to_alice) == {s["amqp"], s["mqtt"], s["default"]}
    assert set(deliveries_of(cfg, bob)) == {s["mqtt"]}
    first = to_alice[s["amqp"]]
    assert first["trace"] == "t-1" and first[EXCHANGE_HEADER] == "amq.topic"
    assert json.loads(first[SUBSCRIPTION_IDS_HEADER]) == [f"{alice}-amqp"]
    assert int(first[SNAPSHOT_VERSION_HEADER]) > traffic.start_version
    record = next(r for r in read_topic(cfg, cfg.kafka.layout.topic(alice))
                  if headers_of(r)[MESSAGE_ID_HEADER] == s["amqp"])
    assert (record.key(), record.value()) == (b"sensors.k1.temp", b"21.5")

    ids = [s["amqp"], s["mqtt"], s["crossed"], s["default"]]
    messages = {r.message_id: r for r in rows_for(cfg, "messages", "message_id", ids)}
    assert {m: (r.outcome, r.deliveries, r.exchange) for m, r in messages.items()} == {
        s["amqp"]: (OUTCOME_ROUTED, 1, "amq.topic"), s["mqtt"]: (OUTCOME_ROUTED, 2, "mqtt"),
        s["crossed"]: (OUTCOME_UNROUTABLE, 0, "amq.topic"),
        s["default"]: (OUTCOME_ROUTED, 1, "amq.topic")}
    assert messages[s["amqp"]].headers == {"trace": "t-1", EXCHANGE_HEADER: "amq.topic"}
    assert messages[s["amqp"]].payload_bytes == 4
    deliveries = rows_for(cfg, "deliveries", "message_id", ids)
    assert sorted((r.message_id, r.subscriber, r.delivery_topic) for r in deliveries) == sorted([
        (s["amqp"], alice, cfg.kafka.layout.topic(alice)),
        (s["mqtt"], alice, cfg.kafka.layout.topic(alice)),
        (s["mqtt"], bob, cfg.kafka.layout.topic(bob)),
        (s["default"], alice, cfg.kafka.layout.topic(alice))])


def test_header_criteria_all_any_and_presence(router: Router, traffic: Traffic):
    cfg, n, s = router.config, traffic.names, traffic.sent
    assert set(deliveries_of(cfg, n["eu"])) == {s["eu_priority"]}
    assert set(deliveries_of(cfg, n["us"])) == {s["us"], s["vip"]}


def test_a_subscriber_with_two_matching_subscriptions_gets_one_delivery_listing_both(
        router: Router, traffic: Traffic):
    cfg, carol = router.config, traffic.names["carol"]
    records = read_topic(cfg, cfg.kafka.layout.topic(carol))
    assert len(records) == 1
    assert json.loads(headers_of(records[0])[SUBSCRIPTION_IDS_HEADER]) == [f"{carol}-1", f"{carol}-2"]
    [row] = rows_for(cfg, "deliveries", "message_id", [traffic.sent["stock"]])
    assert (row.subscriber, row.subscription_ids) == (carol, [f"{carol}-1", f"{carol}-2"])


def test_every_subscription_change_is_audited_with_the_version_it_produced(
        router: Router, traffic: Traffic):
    cfg, n = router.config, traffic.names
    [change] = rows_for(cfg, "subscriptions", "subscription_id", [f"{n['carol']}-1"])
    assert (change.change, change.exchange, change.subscriber, change.filter) == (
        CHANGE_UPSERT, "amq.topic", n["carol"], "stock.*")
    [criteria] = rows_for(cfg, "subscriptions", "subscription_id", [f"{n['eu']}-s"])
    assert (criteria.header_match, criteria.header_criteria) == (
        "all", {"region": "eu", "priority": None})
    # The deliveries were made with a version that includes the change.
    [delivery] = rows_for(cfg, "deliveries", "message_id", [traffic.sent["stock"]])
    assert traffic.start_version < change.snapshot_version <= delivery.snapshot_version


def test_a_subscription_acked_before_a_publish_applies_to_it(
        router: Router, traffic: Traffic):
    """Happens-before: every subscription was acknowledged before the first publish
    was written, so every batch that read a publish matched with a version
    covering all of them, including the very first one."""
    cfg = router.config
    versions = [r.snapshot_version for r in
                rows_for(cfg, "subscriptions", "subscription_id", traffic.subscription_ids)]
    assert len(versions) == len(traffic.subscription_ids)
    assert traffic.batches and traffic.batches[0].deliveries > 0
    assert all(b.snapshot_version >= max(versions) for b in traffic.batches)
    assert sum(b.rows for b in traffic.batches) == len(traffic.sent)


def test_bad_publishes_and_bad_changes_are_rejected_while_routing_goes_on(
        router: Router, traffic: Traffic):
    cfg, s = router.config, traffic.sent
    bad_publishes = [s["unknown_exchange"], s["invalid_topic"], s["null_key"]]
    assert set(deliveries_of(cfg, traffic.names["fay"])) == {s["good"], s["binary_header"],
                                                              s["after_pills"]}
    rejected = {headers_of(r)[MESSAGE_ID_HEADER]: (r, headers_of(r))
                for r in read_topic(cfg, cfg.kafka.rejected_topic)}
    for sent in bad_publishes:
        record, headers = rejected[sent]
        assert headers[SOURCE_HEADER] == SOURCE_PUBLISH and headers[REASON_HEADER]
        assert record.value() == b"payload"
    by_key = {r.key().decode(): (r, h) for r, h in rejected.values()
              if h[SOURCE_HEADER] == SOURCE_SUBSCRIPTION}
    assert set(by_key) == set(traffic.bad_changes)
    assert all(h[REASON_HEADER] for _, h in by_key.values())
    huge = next(k for k in by_key if k.startswith("bad-huge"))
    assert by_key[huge][0].value() is None and "too large" in by_key[huge][1][REASON_HEADER]

    messages = {r.message_id: r for r in rows_for(
        cfg, "messages", "message_id", [*bad_publishes, s["good"]])}
    assert messages[s["good"]].outcome == OUTCOME_ROUTED
    for sent in bad_publishes:
        assert messages[sent].outcome == OUTCOME_REJECTED and messages[sent].reason
    assert "nope" in messages[s["unknown_exchange"]].reason
    assert messages[s["null_key"]].routing_key is None
    changes = rows_for(cfg, "subscriptions", "subscription_id", list(traffic.bad_changes))
    assert {c.subscription_id for c in changes} == set(traffic.bad_changes)
    assert all(c.change == CHANGE_REJECTED and c.reason for c in changes)


def test_poison_pills_are_rejected_with_a_reason_and_routing_goes_on(
        router: Router, traffic: Traffic):
    """Records that once failed every batch for good: an exchange header that is not
    UTF-8, a delivery larger than any broker takes, a delivery one topic's limit
    refuses. Each is rejected with its reason; everything around them is routed.

    The refused one goes in a round of its own, with one that fits the same topic: a
    record batch is refused whole, so the router writes the suspects again one by one
    to tell them apart (the one that fits may reach Kafka twice: at least once)."""
    cfg, s, n = router.config, dict(traffic.sent), traffic.names
    s["refused"] = publish(cfg, "big.one", b"y" * 3000)
    s["fits"] = publish(cfg, "big.one", b"y" * 100)
    router.process_all_available()
    assert router.flush_audit(60)
    pills = [s["exchange_not_utf8"], s["oversize"], s["refused"]]
    messages = {r.message_id: r for r in rows_for(
        cfg, "messages", "message_id", [*pills, s["fits"], s["binary_header"], s["after_pills"]])}
    assert all(messages[p].outcome == OUTCOME_REJECTED for p in pills)
    assert "exchange header is not valid UTF-8" in messages[s["exchange_not_utf8"]].reason
    assert "kafka.max_delivery_bytes" in messages[s["oversize"]].reason
    refused = messages[s["refused"]]
    assert f"refused the delivery to {cfg.kafka.layout.topic(n['tiny'])}" in refused.reason
    assert "MSG_SIZE_TOO_LARGE" in refused.reason
    # The other subscriber's copy of the refused publish was written, and is audited.
    assert refused.deliveries == 1
    assert set(deliveries_of(cfg, n["wide"])) == {s["refused"], s["fits"]}
    assert set(deliveries_of(cfg, n["tiny"])) == {s["fits"]}
    audited = {(r.message_id, r.subscriber) for r in rows_for(
        cfg, "deliveries", "message_id", [s["refused"], s["fits"]])}
    assert audited == {(s["refused"], n["wide"]), (s["fits"], n["wide"]), (s["fits"], n["tiny"])}
    assert messages[s["after_pills"]].outcome == OUTCOME_ROUTED
    # A header that is not UTF-8 is no reason to reject: the audit shows its bytes escaped.
    assert messages[s["binary_header"]].outcome == OUTCOME_ROUTED
    assert messages[s["binary_header"]].headers["blob"] == "\\xff\x00ok"

    rejected = {headers_of_bytes(r)[MESSAGE_ID_HEADER].decode(): r
                for r in read_topic(cfg, cfg.kafka.rejected_topic)}
    assert rejected[s["exchange_not_utf8"]].value() == b"payload"
    assert (EXCHANGE_HEADER, b"\xff\xfe") in rejected[s["exchange_not_utf8"]].headers()
    # Too large to copy whole: the rejected record keeps key and reason, not the payload.
    assert rejected[s["oversize"]].value() is None
    assert b"no payload" in headers_of_bytes(rejected[s["oversize"]])[REASON_HEADER]
    assert rejected[s["refused"]].value() == b"y" * 3000


def headers_of_bytes(record) -> dict[str, bytes]:
    return dict(record.headers() or [])


def test_unsubscribe_stops_deliveries(router: Router):
    cfg = router.config
    dan = unique("dan")
    subscribe(cfg, f"{dan}-s", "mqtt", dan, "home/+/light")
    before = publish(cfg, "home/kitchen/light", exchange="mqtt")
    router.process_all_available()
    assert set(deliveries_of(cfg, dan)) == {before}

    unsubscribe(cfg, f"{dan}-s")
    after = publish(cfg, "home/kitchen/light", exchange="mqtt")
    router.process_all_available()
    assert router.flush_audit(60)
    assert set(deliveries_of(cfg, dan)) == {before}
    [message] = rows_for(cfg, "messages", "message_id", [after])
    assert message.outcome == OUTCOME_UNROUTABLE
    changes = sorted(rows_for(cfg, "subscriptions", "subscription_id", [f"{dan}-s"]),
                     key=lambda r: r.snapshot_version)
    assert [c.change for c in changes] == [CHANGE_UPSERT, CHANGE_REMOVE]
    assert changes[0].snapshot_version < changes[1].snapshot_version


# --- routers of their own ------------------------------------------------------------

def _batch(spark, config: Config):
    """The publishes topic as a static DataFrame shaped like a micro-batch."""
    return (spark.read.format("kafka")
            .option("kafka.bootstrap.servers", config.kafka.bootstrap)
            .option("subscribe", config.kafka.publishes_topic)
            .option("startingOffsets", "earliest")
            .option("includeHeaders", "true")
            .load())


def test_a_rerun_batch_uses_its_pinned_version_and_adds_no_audit_rows(
        base_config: Config, spark, tmp_path: Path):
    cfg = router_config(base_config, tmp_path)
    router = Router(cfg, spark)
    router.open()
    try:
        gus, hal = unique("gus"), unique("hal")
        subscribe(cfg, "r1", "amq.topic", gus, "rerun.*")
        sent = publish(cfg, "rerun.me")
        batch = _batch(spark, cfg)
        first = router.process_batch(batch, 0)
        assert (first.rows, first.deliveries, first.rerun) == (1, 1, False)
        assert router.flush_audit(60)

        unsubscribe(cfg, "r1")
        subscribe(cfg, "r2", "amq.topic", hal, "rerun.*")
        again = router.process_batch(batch, 0)  # a re-run: not journaled again
        assert router._committer is not None and router._committer.pending_batches == 0
        assert again.rerun and again.snapshot_version == first.snapshot_version
        gus_records = read_topic(cfg, cfg.kafka.layout.topic(gus))
        assert len(gus_records) == 2  # at least once: the re-run writes Kafka again
        assert headers_of(gus_records[0]) == headers_of(gus_records[1])
        assert deliveries_of(cfg, hal) == {}
        assert [(r.subscriber, r.batch_id) for r in
                rows_for(cfg, "deliveries", "message_id", [sent])] == [(gus, 0)]
        assert len(rows_for(cfg, "messages", "message_id", [sent])) == 1

        later = router.process_batch(batch, 1)
        assert router.flush_audit(60)
        assert later.snapshot_version > first.snapshot_version and not later.rerun
        assert set(deliveries_of(cfg, hal)) == {sent}
        assert sorted((r.subscriber, r.batch_id) for r in
                      rows_for(cfg, "deliveries", "message_id", [sent])) == [(gus, 0), (hal, 1)]
    finally:
        router.stop()


def test_a_restart_resumes_from_the_persisted_snapshot_and_the_changelog_after_it(
        base_config: Config, spark, tmp_path: Path):
    cfg = router_config(base_config, tmp_path)
    first = Router(cfg, spark)
    before = set(threading.enumerate())
    first.open()
    try:
        subscribe(cfg, "keep", "mqtt", "ivy", "a/+")
        subscribe(cfg, "drop", "mqtt", "ivy", "b/+")
        sync, _ = first._require_open()
        version = sync.catch_up()
        # The background workers an open router runs (streaming.worker), ...
        assert {"bitroute-audit-committer", "bitroute-audit-maintenance", "bitroute-router-lease",
                "bitroute-replay"} <= {t.name for t in set(threading.enumerate()) - before}
    finally:
        first.stop()
    # ... all ended by its stop.
    assert [t.name for t in set(threading.enumerate()) - before
            if t.name.startswith("bitroute-") and t.is_alive()] == []
    unsubscribe(cfg, "drop")
    # An invalid value for a live id removes it, as a rebuild after compaction would.
    produce_one(cfg, cfg.kafka.subscriptions_topic, b"keep",
                json.dumps({"exchange": "mqtt", "subscriber": "ivy", "filter": "a/#/b"}).encode())
    subscribe(cfg, "new", "mqtt", "jay", "c/#")

    second = Router(cfg, spark)
    second.open()
    try:
        assert second.subscriptions is not None
        assert second.subscriptions.version == version + 1
        assert len(second.subscriptions) == 1
        changes = table(cfg, "subscriptions")
        assert sorted((c.subscription_id, c.change, c.snapshot_version) for c in changes) == sorted([
            ("keep", CHANGE_UPSERT, version), ("drop", CHANGE_UPSERT, version),
            ("drop", CHANGE_REMOVE, version + 1), ("keep", CHANGE_REMOVE, version + 1),
            ("new", CHANGE_UPSERT, version + 1)])
    finally:
        second.stop()


def test_deliveries_keep_their_publishes_order_per_partition_on_the_executors_shared_layout(
        isolated_config, spark):
    # The ordering guarantee (docs/design.md): publishes keyed over three partitions,
    # several batches, every one routed on the executors, the shared delivery layout.
    config = isolated_config(**{
        "kafka.delivery_layout": "shared", "kafka.partitions": "3",
        "kafka.shared_deliveries_topic": f"shared-{uuid.uuid4().hex[:10]}",
        "streaming.driver_route_max_publishes": "0", "streaming.max_offsets_per_trigger": "50"})
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap, "linger.ms": 5})
    for subscriber in ("kay", "lee"):
        producer.produce(config.kafka.subscriptions_topic, json.dumps(
            {"exchange": "amq.topic", "subscriber": subscriber, "filter": "o.#"}).encode(),
            subscriber.encode())
    assert producer.flush(30) == 0
    router = Router(config, spark)
    router.start()
    try:
        for i in range(200):
            producer.produce(config.kafka.publishes_topic, b"x", f"o.{i % 11}".encode(),
                             headers=[(EXCHANGE_HEADER, b"amq.topic")])
        assert producer.flush(30) == 0
        router.process_all_available()
    finally:
        router.stop()
    assert len(router.reports) >= 4  # several batches of at most 50
    for subscriber in ("kay", "lee"):
        order = delivery_order(config, subscriber)
        ids = {m for partition in order.values() for m in partition}
        assert len(ids) == 200 and len({m.rsplit("/", 2)[1] for m in ids}) == 3
        assert_publish_order_kept(order)

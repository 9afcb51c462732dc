"""Realtime mode end to end on a real broker, real Spark (Real-Time Mode) and real Delta:
the router of ``streaming.mode = "realtime"`` delivers with the micro-batch contracts,
keeps happens-before, rejects bad input with its reason, and audits each publish and
each (message, subscriber) exactly once.

One router serves the module (the ``router`` fixture of this folder's conftest.py).
"""

from __future__ import annotations

import json
import uuid

import pytest

from kafka_io import headers_of, produce_one, read_topic
from schemas.records import (
    DELIVERIES,
    EXCHANGE_HEADER,
    EXPIRY_HEADER,
    MESSAGE_ID_HEADER,
    MESSAGES,
    OUTCOME_EXPIRED,
    OUTCOME_REJECTED,
    OUTCOME_ROUTED,
    OUTCOME_UNROUTABLE,
    REASON_HEADER,
    SNAPSHOT_VERSION_HEADER,
    SUBSCRIPTION_IDS_HEADER,
)
from streaming.router.service import Router
from waiting import wait_until

DELIVERY_BOUND_S = 30
"""Generous: the first publishes wait for the routing query's first task to start."""
AUDIT_BOUND_S = 60
"""The longest a publish's audit rows may take here: a checkpoint interval (5 s), a
commit interval, and Spark's first jobs on a busy 2-core machine."""


def _unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _subscribe(config, sub_id: str, exchange: str, subscriber: str, filter_: str,
               headers: dict | None = None) -> None:
    value: dict[str, object] = {"exchange": exchange, "subscriber": subscriber, "filter": filter_}
    if headers is not None:
        value["headers"] = headers
    produce_one(config, config.kafka.subscriptions_topic, sub_id.encode(), json.dumps(value).encode())


def _publish(config, routing_key: str, payload: bytes, exchange: str, headers=()) -> str:
    return produce_one(config, config.kafka.publishes_topic, routing_key.encode(), payload,
                       [*headers, (EXCHANGE_HEADER, exchange.encode())])


def _deliveries(config, subscriber: str, count: int) -> list:
    """The subscriber's delivery records, once there are ``count``."""
    return wait_until(lambda: _at_least(read_topic(config, config.kafka.layout.topic(subscriber)),
                                        count), f"{count} deliveries to {subscriber}", DELIVERY_BOUND_S)


def _at_least(records: list, count: int) -> list | None:
    return records if len(records) >= count else None


def table_rows(config, name: str) -> list[dict]:
    from deltalake import DeltaTable

    return DeltaTable(config.delta.table_path(name)).to_pyarrow_table().to_pylist()


def test_a_publish_reaches_its_subscribers_with_the_micro_batch_contract(router):
    config = router.config
    billing, ops = _unique("billing"), _unique("ops")
    _subscribe(config, f"{billing}-1", "amq.topic", billing, "orders.*.paid")
    _subscribe(config, f"{billing}-2", "amq.topic", billing, "orders.#")
    _subscribe(config, f"{ops}-1", "mqtt", ops, "sensors/+/temperature",
               headers={"match": "all", "criteria": {"unit": "celsius"}})
    paid = _publish(config, "orders.eu.paid", b'{"order": 42}', "amq.topic",
                    [("trace", b"abc")])
    hot = _publish(config, "sensors/boiler/temperature", b"71.5", "mqtt", [("unit", b"celsius")])
    _publish(config, "sensors/boiler/temperature", b"-", "mqtt", [("unit", b"kelvin")])

    [delivery] = _deliveries(config, billing, 1)
    assert delivery.key() == b"orders.eu.paid" and delivery.value() == b'{"order": 42}'
    headers = headers_of(delivery)
    assert headers["trace"] == "abc"
    assert headers[MESSAGE_ID_HEADER] == paid
    assert json.loads(headers[SUBSCRIPTION_IDS_HEADER]) == [f"{billing}-1", f"{billing}-2"]
    assert int(headers[SNAPSHOT_VERSION_HEADER]) >= 1
    [reading] = _deliveries(config, ops, 1)
    assert headers_of(reading)[MESSAGE_ID_HEADER] == hot and reading.value() == b"71.5"


def test_a_subscription_acknowledged_before_a_publish_applies_to_it(router):
    # Happens-before: each subscription is acknowledged by Kafka, then the publish written
    # at once; every publish reaches its new subscriber.
    config = router.config
    subscribers = [_unique("hb") for _ in range(10)]
    for subscriber in subscribers:
        _subscribe(config, subscriber, "amq.topic", subscriber, f"hb.{subscriber}")
        _publish(config, f"hb.{subscriber}", b"x", "amq.topic")
    for subscriber in subscribers:
        assert len(_deliveries(config, subscriber, 1)) == 1, subscriber


def test_no_local_keeps_a_subscribers_own_publish_from_it_as_in_micro_batch_mode(router):
    # The routing view carries no_local to the executors' RouteTable (kernel/core/src/route.rs).
    config = router.config
    ann, bob = _unique("ann"), _unique("bob")
    room = f"chat/{ann}"
    for subscriber in (ann, bob):
        value = {"exchange": "mqtt", "subscriber": subscriber, "filter": f"{room}/#",
                 "no_local": True}
        produce_one(config, config.kafka.subscriptions_topic, subscriber.encode(),
                    json.dumps(value).encode())
    from_ann = _publish(config, f"{room}/x", b"a", "mqtt", [("publisher", ann.encode())])
    from_bob = _publish(config, f"{room}/x", b"b", "mqtt", [("publisher", bob.encode())])
    # One publishes partition: had ann's own publish reached ann, it would come first.
    assert [headers_of(r)[MESSAGE_ID_HEADER] for r in _deliveries(config, ann, 1)] == [from_bob]
    assert [headers_of(r)[MESSAGE_ID_HEADER] for r in _deliveries(config, bob, 1)] == [from_ann]


def test_a_publish_its_exchange_routes_to_no_one_goes_to_the_alternate_as_in_micro_batch_mode(
        router):
    # The routing view's mark carries each exchange's alternate to the executors' RouteTable.
    config = router.config
    catcher, tag = _unique("catch"), _unique("ae")
    _subscribe(config, catcher, "unrouted", catcher, f"{tag}.#")
    through = _publish(config, f"{tag}.x", b"p", "amq.topic")
    [delivery] = _deliveries(config, catcher, 1)
    assert headers_of(delivery)[MESSAGE_ID_HEADER] == through
    [message] = wait_until(lambda: _rows_for(config, MESSAGES, {through}, 1),
                           "the messages row of the publish", AUDIT_BOUND_S)
    assert [message[k] for k in ("outcome", "exchange", "alternate_exchange")] == [
        OUTCOME_ROUTED, "amq.topic", "unrouted"]
    [row] = wait_until(lambda: _rows_for(config, DELIVERIES, {through}, 1),
                       "the deliveries row of the publish", AUDIT_BOUND_S)
    assert (row["subscriber"], row["alternate_exchange"]) == (catcher, "unrouted")


def test_bad_input_is_rejected_with_its_reason_and_audited(router):
    config = router.config
    bad = produce_one(config, config.kafka.publishes_topic, None, b"?")  # no routing key
    unknown = _publish(config, "a.b", b"?", "no-such-exchange")
    records = wait_until(lambda: _at_least(read_topic(config, config.kafka.rejected_topic), 2),
                         "2 rejected records", DELIVERY_BOUND_S)
    rejected = {headers_of(r)[MESSAGE_ID_HEADER]: headers_of(r) for r in records}
    assert set(rejected) == {bad, unknown}
    assert rejected[bad][REASON_HEADER] == "missing routing key"
    assert rejected[unknown][REASON_HEADER] == "unknown exchange 'no-such-exchange'"
    rows = wait_until(lambda: _rows_for(config, MESSAGES, {bad, unknown}, 2), "the rejected publishes' messages rows",
                      AUDIT_BOUND_S)
    assert {r["outcome"] for r in rows} == {OUTCOME_REJECTED}
    assert all(r["reason"] for r in rows)


def test_every_publish_and_delivery_is_audited_exactly_once(router):
    config = router.config
    first, second = _unique("audited"), _unique("audited")
    _subscribe(config, first, "amq.topic", first, "audit.#")
    _subscribe(config, second, "amq.topic", second, "audit.*")
    ids = [_publish(config, f"audit.{i}", b"p", "amq.topic") for i in range(20)]
    nobody = _publish(config, "nobody.listens", b"p", "amq.topic")
    messages = wait_until(lambda: _rows_for(config, MESSAGES, {*ids, nobody}, 21), "21 messages rows",
                          AUDIT_BOUND_S)
    deliveries = wait_until(lambda: _rows_for(config, DELIVERIES, set(ids), 40), "40 deliveries rows",
                            AUDIT_BOUND_S)
    assert sorted(r["message_id"] for r in messages) == sorted([*ids, nobody])
    outcomes = {r["message_id"]: r["outcome"] for r in messages}
    assert outcomes[nobody] == OUTCOME_UNROUTABLE
    assert {outcomes[i] for i in ids} == {OUTCOME_ROUTED}
    pairs = [(r["message_id"], r["subscriber"]) for r in deliveries]
    assert len(pairs) == len(set(pairs)) == 40
    assert all(r["snapshot_version"] >= 1 for r in deliveries)


def test_an_expired_publish_reaches_no_one_and_a_live_one_carries_the_interval_left(router):
    # The rule of micro-batch mode (kernel/core/src/expiry.rs, through the JNI route_at).
    import time

    config = router.config
    subscriber = _unique("expiry")
    _subscribe(config, subscriber, "amq.topic", subscriber, "expiry.#")
    now_ms = int(time.time() * 1000)
    headers = [(EXCHANGE_HEADER, b"amq.topic")]
    expired = produce_one(config, config.kafka.publishes_topic, b"expiry.old", b"x",
                          [*headers, (EXPIRY_HEADER, b"5")], now_ms - 60_000)
    bad = produce_one(config, config.kafka.publishes_topic, b"expiry.bad", b"x",
                      [*headers, (EXPIRY_HEADER, b"4294967296")])
    live = produce_one(config, config.kafka.publishes_topic, b"expiry.live", b"x",
                       [*headers, (EXPIRY_HEADER, b"3600"), ("trace", b"t")], now_ms - 10_000)
    [delivery] = _deliveries(config, subscriber, 1)
    headers_out = headers_of(delivery)
    assert headers_out[MESSAGE_ID_HEADER] == live
    assert 3550 <= int(headers_out[EXPIRY_HEADER]) <= 3590 and headers_out["trace"] == "t"
    assert [h for h, _ in delivery.headers()][:2] == [EXCHANGE_HEADER, EXPIRY_HEADER]  # in place
    rows = wait_until(lambda: _rows_for(config, MESSAGES, {expired, bad, live}, 3),
                      "the expiry publishes' messages rows", AUDIT_BOUND_S)
    outcomes = {r["message_id"]: (r["outcome"], r["reason"]) for r in rows}
    assert outcomes[expired] == (OUTCOME_EXPIRED, None)
    assert outcomes[live] == (OUTCOME_ROUTED, None)
    assert outcomes[bad] == (OUTCOME_REJECTED, (
        "the expiry header must be a whole number of seconds from 1 to 4294967295 "
        "(MQTT 5's Message Expiry Interval), not b'4294967296'"))
    assert wait_until(lambda: router._status_figures()["expired_total"] >= 1 or None,
                      "the expired publish counted", AUDIT_BOUND_S)


def test_status_names_the_mode_and_the_latency(router):
    status = router._status_figures()
    assert status["mode"] == "realtime"
    realtime = status["realtime"]
    assert realtime["view_version"] is not None and realtime["view_failure"] is None
    latency = wait_until(router.latency.percentiles, "a latency figure", AUDIT_BOUND_S)
    assert 0 <= latency["p50"] <= latency["p99"] <= latency["max"]


def _rows_for(config, table: str, message_ids: set[str], expected: int):
    """The rows of ``table`` for ``message_ids`` once there are ``expected`` (else None)."""
    rows = [r for r in table_rows(config, table) if r["message_id"] in message_ids]
    return rows if len(rows) >= expected else None


def test_micro_batch_mode_refuses_a_state_folder_routed_in_realtime_mode(spark, isolated_config):
    from streaming.router.errors import RouterModeError

    config = isolated_config()
    router = Router(config, spark)
    router.layout.realtime_routing.mkdir(parents=True)
    try:
        with pytest.raises(RouterModeError, match="last routed in realtime mode"):
            router.start()
    finally:
        router.stop()

"""Alternate exchanges (``[exchanges.alternates]``, RabbitMQ's alternate exchange) on a real
broker, real Spark and real Delta, micro-batch mode, the batch routed on the executors
(``mapInArrow``) with each task writing its audit files: a publish its own exchange routes
to no one reaches the alternate's subscribers once, with outcome ``routed`` and the
alternate named in its ``messages`` and ``deliveries`` rows; one its own exchange routes
does not; a publish to the alternate does not follow the alternate's own alternate.
A bad ``[exchanges.alternates]`` stops at load with a line naming the key.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings, strategies as st

from kafka_io import deliveries_by_id, produce_one
from schemas.records import (
    ALTERNATE_EXCHANGE_HEADER,
    EXCHANGE_HEADER,
    OUTCOME_ROUTED,
    OUTCOME_UNROUTABLE,
)
from streaming.cli.render import delivery_json, delivery_line
from streaming.config import ConfigError, load
from streaming.kafka.client_verbs import tail
from streaming.router.batch.routing import _alternate_header_columns
from streaming.router.service import Router

ALTERNATES = {
    "exchanges.dialects.unrouted": "amqp",
    "exchanges.dialects.last": "amqp",
    "exchanges.alternates.amq.topic": "unrouted",
    "exchanges.alternates.unrouted": "last",
}


def _subscribe(config, sub_id: str, subscriber: str, filter_: str, exchange: str) -> None:
    value = {"exchange": exchange, "subscriber": subscriber, "filter": filter_}
    produce_one(config, config.kafka.subscriptions_topic, sub_id.encode(),
             json.dumps(value).encode())


def _publish(config, key: str, exchange: str | None = None, headers=()) -> str:
    headers = [*headers, *([] if exchange is None else [(EXCHANGE_HEADER, exchange.encode())])]
    return produce_one(config, config.kafka.publishes_topic, key.encode(), b"x", headers)


def _received(config, subscriber: str) -> set[str]:
    return set(deliveries_by_id(config, subscriber))


def _audit(config, table: str) -> list[dict]:
    return DeltaTable(config.delta.table_path(table)).to_pyarrow_table().to_pylist()


def test_an_unroutable_publish_reaches_its_alternate_s_subscribers_and_the_audit_says_so(
        isolated_config, spark):
    config = isolated_config(**ALTERNATES, **{"streaming.driver_route_max_publishes": "0",
                                              "streaming.executor_audit_files": "tasks"})
    _subscribe(config, "own", "billing", "orders.#", "amq.topic")
    _subscribe(config, "catch", "dlq", "#", "unrouted")
    _subscribe(config, "eu", "ops", "*.eu", "unrouted")
    _subscribe(config, "never", "never", "#", "last")
    router = Router(config, spark)
    router.start()
    try:
        # A publisher's own alternate header is replaced, as every router header is.
        routed = _publish(config, "orders.eu", headers=[(ALTERNATE_EXCHANGE_HEADER, b"forged")])
        through = _publish(config, "stock.eu")
        direct = _publish(config, "stock.us", exchange="unrouted")
        router.process_all_available()
        assert router.flush_audit(60)
    finally:
        router.stop()
    assert _received(config, "billing") == {routed}
    assert _received(config, "dlq") == {through, direct}
    assert _received(config, "ops") == {through}
    assert _received(config, "never") == set()  # the alternate's alternate is not followed
    # A delivery made through the alternate names it in a header; the others do not.
    assert deliveries_by_id(config, "dlq")[through][ALTERNATE_EXCHANGE_HEADER] == "unrouted"
    assert deliveries_by_id(config, "ops")[through][ALTERNATE_EXCHANGE_HEADER] == "unrouted"
    assert ALTERNATE_EXCHANGE_HEADER not in deliveries_by_id(config, "dlq")[direct]
    assert ALTERNATE_EXCHANGE_HEADER not in deliveries_by_id(config, "billing")[routed]
    # bitroute tail names it too.
    tailed = {d.message_id: d for d in tail(config, "dlq", from_beginning=True, max_records=2,
                                             timeout_s=30)}
    assert (tailed[through].alternate_exchange, tailed[direct].alternate_exchange) == (
        "unrouted", None)
    assert json.loads(delivery_json(tailed[through]))["alternate_exchange"] == "unrouted"
    assert " via=unrouted " in delivery_line(tailed[through])
    assert "alternate_exchange" not in json.loads(delivery_json(tailed[direct]))

    messages = {r["message_id"]: r for r in _audit(config, "messages")}
    assert [(messages[m]["outcome"], messages[m]["exchange"], messages[m]["alternate_exchange"],
             messages[m]["deliveries"]) for m in (routed, through, direct)] == [
        (OUTCOME_ROUTED, "amq.topic", None, 1),
        (OUTCOME_ROUTED, "amq.topic", "unrouted", 2),
        (OUTCOME_ROUTED, "unrouted", None, 1),
    ]
    deliveries = {(r["message_id"], r["subscriber"]): r for r in _audit(config, "deliveries")}
    assert {k: (r["exchange"], r["alternate_exchange"], r["subscription_ids"])
            for k, r in deliveries.items()} == {
        (routed, "billing"): ("amq.topic", None, ["own"]),
        (through, "dlq"): ("amq.topic", "unrouted", ["catch"]),
        (through, "ops"): ("amq.topic", "unrouted", ["eu"]),
        (direct, "dlq"): ("unrouted", None, ["catch"]),
    }


def test_a_publish_neither_exchange_routes_is_unroutable(isolated_config, spark):
    config = isolated_config(**ALTERNATES)  # routed in the driver, audit by its committer
    _subscribe(config, "eu", "ops", "*.eu", "unrouted")
    router = Router(config, spark)
    router.start()
    try:
        nowhere = _publish(config, "stock.us")
        through = _publish(config, "stock.eu")
        router.process_all_available()
        assert router.flush_audit(60)
    finally:
        router.stop()
    messages = {r["message_id"]: r for r in _audit(config, "messages")}
    assert (messages[nowhere]["outcome"], messages[nowhere]["alternate_exchange"]) == (
        OUTCOME_UNROUTABLE, None)
    assert (messages[through]["outcome"], messages[through]["alternate_exchange"]) == (
        OUTCOME_ROUTED, "unrouted")


@pytest.mark.parametrize("overrides, message", [
    ({"exchanges.alternates.amq.topic": "nope"},
     'exchanges.alternates."amq.topic": expected the name of another declared AMQP exchange, '
     "got 'nope'"),
    ({"exchanges.alternates.amq.topic": "mqtt"}, "another declared AMQP exchange, got 'mqtt'"),
    ({"exchanges.alternates.amq.topic": "amq.topic"}, "an exchange other than itself"),
    ({"exchanges.alternates.mqtt": "amq.topic"},
     'exchanges.alternates."mqtt": expected a key naming a declared AMQP exchange'),
    ({"exchanges.alternates.gone": "amq.topic"}, "a key naming a declared AMQP exchange"),
])
def test_a_bad_alternate_stops_at_load_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as raised:
        load(overrides=overrides, environ={})
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.tuples(st.sampled_from(["a", "expiry"]),
                                             st.sampled_from([b"1", b"", None])), max_size=3),
                          st.sampled_from([None, "ae", "é"])), max_size=8))
def test_the_alternate_header_is_added_last_to_exactly_the_rows_that_went_through_one(rows):
    """``_alternate_header_columns`` against a list-of-lists oracle."""
    counts = [len(headers) for headers, _ in rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    names = pa.array([n for headers, _ in rows for n, _ in headers], pa.string())
    values = pa.array([v for headers, _ in rows for _, v in headers], pa.binary())
    got_offsets, got_names, got_values = _alternate_header_columns(
        [via for _, via in rows], offsets, names, values)
    entries = list(zip(got_names.to_pylist(), got_values.to_pylist(), strict=True))
    got = [entries[got_offsets[r]:got_offsets[r + 1]] for r in range(len(rows))]
    assert got == [headers + ([] if via is None else [(ALTERNATE_EXCHANGE_HEADER, via.encode())])
                   for headers, via in rows]

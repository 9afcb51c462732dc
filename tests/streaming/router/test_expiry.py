"""Message expiry (the ``expiry`` header, MQTT 5's Message Expiry Interval) on a real broker,
real Spark and real Delta, micro-batch mode: publishes whose lifetime ended before they
were routed (their Kafka timestamps set in the past) are delivered to no one with outcome
``expired`` and counted; live ones carry the remaining interval; a retained message that
expires stops being served and leaves the retained topic; a replay skips what expired.
The command line refuses a bad ``--expiry`` as the router rejects it.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

from deltalake import DeltaTable

from kafka_io import deliveries_by_id, headers_of, produce_one, read_topic
from schemas.records import (
    EXCHANGE_HEADER,
    EXPIRY_HEADER,
    MESSAGE_ID_HEADER,
    OUTCOME_EXPIRED,
    OUTCOME_REJECTED,
    OUTCOME_ROUTED,
    REPLAYED_HEADER,
    RETAIN_HEADER,
    RETAINED_HEADER,
)
from streaming.router.retained import retained_key
from streaming.router.service import Router
from waiting import wait_until

SHORT_S = 25
"""The lifetime of the publishes that expire during the test: long enough for the batch
that routes them alive on a loaded machine, and the test waits it out."""


def _publish(config, topic: str, expiry: bytes | None = None, ago_s: float = 0,
             retain: bool = False, exchange: str = "mqtt") -> str:
    headers = [(EXCHANGE_HEADER, exchange.encode())]
    if expiry is not None:
        headers.append((EXPIRY_HEADER, expiry))
    if retain:
        headers.append((RETAIN_HEADER, b"true"))
    stamp = int((time.time() - ago_s) * 1000)
    return produce_one(config, config.kafka.publishes_topic, topic.encode(), b"x", headers, stamp)


def _subscribe(config, sub_id: str, subscriber: str, filter_: str, exchange: str = "mqtt",
               since: str | None = None) -> None:
    value = {"exchange": exchange, "subscriber": subscriber, "filter": filter_}
    if since is not None:
        value["since"] = since
    produce_one(config, config.kafka.subscriptions_topic, sub_id.encode(), json.dumps(value).encode())


def _audit(config, table: str) -> list[dict]:
    return DeltaTable(config.delta.table_path(table)).to_pyarrow_table().to_pylist()


def test_expired_publishes_reach_no_one_and_live_ones_carry_the_remaining_interval(
        isolated_config, spark):
    config = isolated_config(**{"streaming.replay_share": "100"})
    before = datetime.now(UTC) - timedelta(minutes=5)
    _subscribe(config, "a-all", "a", "sensors/#")
    router = Router(config, spark)
    router.start()
    try:
        old = _publish(config, "sensors/old", b"5", ago_s=60)
        live = _publish(config, "sensors/live", b"3600", ago_s=10)
        bad = _publish(config, "sensors/bad", b"0")
        plain = _publish(config, "sensors/plain")
        long_ = _publish(config, "sensors/long", b"3600", ago_s=10, retain=True)
        gone = _publish(config, "sensors/gone", b"5", ago_s=60, retain=True)
        r_long = _publish(config, "o.long", b"3600", exchange="amq.topic")
        r_none = _publish(config, "o.none", exchange="amq.topic")
        r_bad = _publish(config, "o.bad", b"soon", exchange="amq.topic")  # rejected: not replayed
        router.process_all_available()
        # Lifetimes that end during the test.
        short_ends = time.time() + SHORT_S
        short = _publish(config, "sensors/short", str(SHORT_S).encode(), retain=True)
        r_short = _publish(config, "o.short", str(SHORT_S).encode(), exchange="amq.topic")
        router.process_all_available()
        a = deliveries_by_id(config, "a")
        assert set(a) == {live, plain, short, long_}
        assert 3300 <= int(a[live][EXPIRY_HEADER]) <= 3590  # waited 10 s and more
        assert EXPIRY_HEADER not in a[plain]
        assert 1 <= int(a[short][EXPIRY_HEADER]) <= SHORT_S
        retained = {r.key(): r.value() for r in read_topic(config, config.kafka.retained_topic)}
        assert retained[retained_key("mqtt", "sensors/gone")] is None  # expired: none kept
        assert retained[retained_key("mqtt", "sensors/short")] == b"x"

        time.sleep(max(0.0, short_ends + 1 - time.time()))  # short and r_short expire
        # A new subscription gets the retained messages still alive, with the interval left;
        # a replay gets the publishes still alive.
        _subscribe(config, "b-late", "b", "sensors/#")
        _subscribe(config, "c-since", "c", "o.*", exchange="amq.topic",
                   since=before.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
        trigger = _publish(config, "trigger")
        router.process_all_available()
        wait_until(lambda: len(deliveries_by_id(config, "c")) >= 2, "the replay's deliveries", 120)
        assert router.flush_audit(60)
        b = deliveries_by_id(config, "b")
        assert set(b) == {long_}
        assert b[long_][RETAINED_HEADER] == "true"
        assert 3300 <= int(b[long_][EXPIRY_HEADER]) <= 3600 - 10 - SHORT_S  # waited that long
        retained = {r.key(): r.value() for r in read_topic(config, config.kafka.retained_topic)}
        assert retained[retained_key("mqtt", "sensors/short")] is None  # left the state
        c = deliveries_by_id(config, "c")
        assert set(c) == {r_long, r_none}  # r_short expired when replayed, r_bad rejected
        assert r_short not in c and r_bad not in c
        assert all(h[REPLAYED_HEADER] == "true" for h in c.values())
        assert 3300 <= int(c[r_long][EXPIRY_HEADER]) <= 3600 - SHORT_S
        assert EXPIRY_HEADER not in c[r_none]

        messages = {r["message_id"]: r for r in _audit(config, "messages")}
        assert messages[old]["outcome"] == messages[gone]["outcome"] == OUTCOME_EXPIRED
        assert messages[old]["deliveries"] == 0 and messages[old]["reason"] is None
        assert messages[bad]["outcome"] == OUTCOME_REJECTED
        assert messages[bad]["reason"] == (
            "the expiry header must be a whole number of seconds from 1 to 4294967295 "
            "(MQTT 5's Message Expiry Interval), not b'0'")
        assert messages[live]["outcome"] == OUTCOME_ROUTED and trigger in messages
        assert dict(messages[live]["headers"])[EXPIRY_HEADER] == "3600"  # as published
        assert not [r for r in _audit(config, "deliveries") if r["message_id"] in (old, gone)]
        assert router.expired_total == 2
        status = json.loads(router.layout.status_file.read_text())
        assert status["expired_total"] == 2
        rejected = [headers_of(r) for r in read_topic(config, config.kafka.rejected_topic)]
        assert sorted(h[MESSAGE_ID_HEADER] for h in rejected) == sorted([bad, r_bad])
    finally:
        router.stop()


def test_the_command_line_refuses_a_bad_expiry_and_publishes_a_good_one(
        isolated_settings, cli):
    settings = isolated_settings()
    for value in ("0", "-1", "1.5", "4294967296", "soon"):
        done = cli("publish", "--routing-key", "a.b", "--expiry", value, settings=settings)
        assert done.returncode == 2, done.stderr
        line = done.stderr.strip()
        assert "\n" not in line and line.startswith(f"bitroute: error: --expiry {value}: the expiry "
                                                    "header must be a whole number of seconds")
    done = cli("publish", "--routing-key", "a.b", "--expiry", "30", settings=settings)
    assert done.returncode == 0, done.stderr
    done = cli("subscribe", "--exchange", "amq.topic", "--subscriber", "s", "--filter", "a.*",
               settings=settings)
    assert done.returncode == 0, done.stderr
    done = cli("explain", "--routing-key", "a.b", "--expiry", "0", settings=settings)
    assert done.returncode != 0 and "not b'0'" in done.stderr
    done = cli("explain", "--routing-key", "a.b", "--expiry", "30", "--json", settings=settings)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["expiry"] == 30
    done = cli("explain", "--routing-key", "a.b", "--expiry", "30", settings=settings)
    assert "expiry: 30 s; each delivery carries it less" in done.stdout

"""MQTT subscription options (compiler.options) on a real broker, Spark and Delta: Retain
Handling (delivery when the router applies a subscription, idle or busy), Retain As
Published, No Local.

Each test is one router run, its query started (so that it applies the changelog itself
while no publish arrives), tried as a new user would: e.g. retain, then subscribe, then wait.
"""

from __future__ import annotations

import json
from pathlib import Path

from deltalake import DeltaTable

from compiler.options import SubscriptionOptions
from isolation import isolated_settings
from kafka_io import headers_of, read_topic
from schemas.records import (
    CHANGE_REJECTED,
    CHANGE_UPSERT,
    MESSAGE_ID_HEADER,
    RETAIN_HEADER,
    RETAINED_HEADER,
    SUBSCRIPTION_IDS_HEADER,
)
from streaming.config import load
from streaming.kafka import client_verbs
from streaming.router.service import Router
from waiting import wait_until

RETAIN = [(RETAIN_HEADER, b"true")]


def _deliveries(cfg, subscriber: str) -> list[tuple[str, bool, str | None]]:
    """(message id, retained mark, retain header) of each delivery to ``subscriber``."""
    return [(headers_of(r)[MESSAGE_ID_HEADER], headers_of(r).get(RETAINED_HEADER) == "true",
             headers_of(r).get(RETAIN_HEADER))
            for r in read_topic(cfg, cfg.kafka.layout.topic(subscriber))]


def _audit(cfg, name: str) -> list[dict]:
    return DeltaTable(cfg.delta.table_path(name)).to_pyarrow_table().to_pylist()


def test_retain_handling_delivers_when_applied_on_an_idle_router(
        base_config, spark, tmp_path: Path, cli):
    settings = isolated_settings(base_config, tmp_path)
    cfg = load(overrides=settings, environ={})

    def subscribe(sub_id: str, subscriber: str, handling: int) -> None:
        client_verbs.subscribe(cfg, "mqtt", subscriber, "home/#", sub_id=sub_id,
                               options=SubscriptionOptions(handling))

    door = client_verbs.publish(cfg, "mqtt", "home/door", b"open", RETAIN)
    light = client_verbs.publish(cfg, "mqtt", "home/light", b"on", RETAIN)
    router = Router(cfg, spark)
    router.start()
    try:
        router.process_all_available()  # the retained publishes routed, to no one
        # The command line as a user types it: Retain Handling 1 from the flag.
        done = cli("subscribe", "--exchange", "mqtt", "--subscriber", "bea", "--filter",
                   "home/#", "--id", "rh1", "--retain-handling", "1", settings=settings)
        assert done.returncode == 0, done.stderr
        subscribe("rh0", "al", 0)
        subscribe("rh2", "cy", 2)
        # No publish: the idle router applies them and delivers the retained messages.
        retained = {door: (door, True, "true"), light: (light, True, "true")}
        wait_until(lambda: len(_deliveries(cfg, "al")) == 2 and len(_deliveries(cfg, "bea")) == 2,
                   "the retained messages delivered on an idle router", 60)
        for subscriber in ("al", "bea"):
            assert sorted(_deliveries(cfg, subscriber)) == sorted(retained.values())
        first = read_topic(cfg, cfg.kafka.layout.topic("bea"))[0]
        assert json.loads(headers_of(first)[SUBSCRIPTION_IDS_HEADER]) == ["rh1"]

        # The same ids written again, same definition: 0 sends again, 1 and 2 do not.
        subscribe("rh2", "cy", 2)
        done = cli("subscribe", "--exchange", "mqtt", "--subscriber", "bea", "--filter",
                   "home/#", "--id", "rh1", "--retain-handling", "1", settings=settings)
        assert done.returncode == 0, done.stderr
        subscribe("rh0", "al", 0)
        wait_until(lambda: len(_deliveries(cfg, "al")) == 4, "the re-subscribe served", 60)
        # A live publish after them: whatever was to be delivered at subscribe is before it.
        bell = client_verbs.publish(cfg, "mqtt", "home/bell", b"ring")
        wait_until(lambda: _deliveries(cfg, "cy"), "the live publish routed", 60)
        live = (bell, False, None)
        assert _deliveries(cfg, "cy") == [live]
        assert sorted(_deliveries(cfg, "bea")[:2]) == sorted(retained.values())
        assert _deliveries(cfg, "bea")[2:] == [live]
        assert sorted(_deliveries(cfg, "al")[:4]) == sorted([*retained.values()] * 2)
        assert _deliveries(cfg, "al")[4:] == [live]

        # Bad options: the router rejects them as the command line does, with a reason.
        bad = cli("subscribe", "--exchange", "amq.topic", "--subscriber", "dee", "--filter",
                  "#", "--retain-handling", "1", settings=settings)
        assert bad.returncode != 0
        assert "retain_handling: MQTT subscription options" in bad.stderr
        refused = cli("subscribe", "--exchange", "mqtt", "--subscriber", "dee", "--filter",
                      "#", "--retain-handling", "3", settings=settings)
        assert refused.returncode != 0 and "--retain-handling" in refused.stderr
        for sub_id, value in (("bad-amqp", {"exchange": "amq.topic", "retain_handling": 1}),
                              ("bad-value", {"exchange": "mqtt", "retain_handling": "1"})):
            record = json.dumps({"subscriber": "dee", "filter": "#", **value}).encode()
            client_verbs._produce(cfg, cfg.kafka.subscriptions_topic, sub_id.encode(), record)
        router.flush_audit(60)
        wait_until(lambda: {r["subscription_id"] for r in _audit(cfg, "subscriptions")
                            if r["change"] == CHANGE_REJECTED} >= {"bad-amqp", "bad-value"},
                   "the bad records rejected", 60)
        assert router.flush_audit(60)
    finally:
        router.stop()

    changes = _audit(cfg, "subscriptions")
    reasons = {r["subscription_id"]: r["reason"] for r in changes if r["change"] == CHANGE_REJECTED}
    assert "MQTT subscription options, and exchange 'amq.topic' is amqp" in reasons["bad-amqp"]
    assert "field 'retain_handling' must be 0, 1 or 2" in reasons["bad-value"]
    upserts = {(r["subscription_id"], r["retain_handling"]) for r in changes
               if r["change"] == CHANGE_UPSERT}
    assert upserts == {("rh0", 0), ("rh1", 1), ("rh2", 2)}
    rows = [r for r in _audit(cfg, "deliveries") if r["retained"]]
    assert sorted((r["message_id"], r["subscriber"]) for r in rows) == sorted(
        [(door, "al"), (light, "al")] * 2 + [(door, "bea"), (light, "bea")])
    # The listing shows the options.
    listed = cli("subscriptions", "--json", settings=settings)
    assert listed.returncode == 0, listed.stderr
    options = {row["subscription_id"]: (row["retain_handling"], row["retain_as_published"])
               for row in map(json.loads, listed.stdout.splitlines())}
    assert options == {"rh0": (0, False), "rh1": (1, False), "rh2": (2, False)}


def test_retain_as_published_keeps_the_retain_header_of_live_deliveries(
        base_config, spark, tmp_path: Path, cli):
    settings = isolated_settings(base_config, tmp_path)
    cfg = load(overrides=settings, environ={})

    def subscribe(sub_id: str, subscriber: str, filter_: str, published: bool) -> None:
        client_verbs.subscribe(cfg, "mqtt", subscriber, filter_, sub_id=sub_id,
                               options=SubscriptionOptions(0, published))

    subscribe("kept", "ra", "home/#", True)
    subscribe("plain", "pl", "home/#", False)
    subscribe("mix-plain", "mix", "home/#", False)  # one of two asks for it: kept
    done = cli("subscribe", "--exchange", "mqtt", "--subscriber", "mix", "--filter",
               "home/door", "--id", "mix-kept", "--retain-as-published", settings=settings)
    assert done.returncode == 0, done.stderr
    router = Router(cfg, spark)
    router.start()
    try:
        door = client_verbs.publish(cfg, "mqtt", "home/door", b"open", RETAIN)
        bell = client_verbs.publish(cfg, "mqtt", "home/bell", b"ring", [(RETAIN_HEADER, b"no")])
        router.process_all_available()
        # A subscription applied after: the retained message at subscribe time carries it.
        subscribe("late", "lat", "home/door", False)
        wait_until(lambda: _deliveries(cfg, "lat"), "the retained message at subscribe", 60)
        assert router.flush_audit(60)
    finally:
        router.stop()

    def by_message(subscriber: str) -> dict[str, tuple[bool, str | None]]:
        return {m: (r, retain) for m, r, retain in _deliveries(cfg, subscriber)}

    assert by_message("ra") == {door: (False, "true"), bell: (False, "no")}
    assert by_message("pl") == {door: (False, None), bell: (False, "no")}
    assert by_message("mix") == {door: (False, "true"), bell: (False, "no")}
    mixed = [r for r in read_topic(cfg, cfg.kafka.layout.topic("mix"))
             if headers_of(r)[MESSAGE_ID_HEADER] == door]
    assert json.loads(headers_of(mixed[0])[SUBSCRIPTION_IDS_HEADER]) == ["mix-kept", "mix-plain"]
    assert by_message("lat") == {door: (True, "true")}
    # Only the header differs: the payload and the other headers are the publish's.
    plain = [r for r in read_topic(cfg, cfg.kafka.layout.topic("pl"))
             if headers_of(r)[MESSAGE_ID_HEADER] == door][0]
    assert (plain.key(), plain.value(), headers_of(plain)["exchange"]) == (
        b"home/door", b"open", "mqtt")
    changes = {r["subscription_id"]: r["retain_as_published"] for r in _audit(cfg, "subscriptions")}
    assert changes == {"kept": True, "plain": False, "mix-plain": False, "mix-kept": True,
                       "late": False}
    refused = cli("subscribe", "--exchange", "amq.topic", "--subscriber", "dee", "--filter", "#",
                  "--retain-as-published", settings=settings)
    assert refused.returncode != 0 and "retain_as_published: MQTT subscription" in refused.stderr


def test_no_local_keeps_a_subscribers_own_publishes_from_it(base_config, spark, tmp_path: Path,
                                                             cli):
    settings = isolated_settings(base_config, tmp_path)
    cfg = load(overrides=settings, environ={})
    done = cli("subscribe", "--exchange", "mqtt", "--subscriber", "ann", "--filter", "chat/#",
               "--id", "ann-chat", "--no-local", settings=settings)
    assert done.returncode == 0, done.stderr
    client_verbs.subscribe(cfg, "mqtt", "bob", "chat/#", sub_id="bob-chat",
                           options=SubscriptionOptions(no_local=True))
    client_verbs.subscribe(cfg, "mqtt", "cy", "chat/#", sub_id="cy-chat")
    refused = cli("subscribe", "--exchange", "mqtt", "--subscriber", "dee", "--filter",
                  "$share/g/chat/#", "--no-local", settings=settings)
    assert refused.returncode != 0 and "no_local on a shared subscription" in refused.stderr
    router = Router(cfg, spark)
    router.start()
    try:
        sent = cli("publish", "--exchange", "mqtt", "--routing-key", "chat/room", "--publisher",
                   "ann", "hi from ann", settings=settings)
        assert sent.returncode == 0, sent.stderr
        from_ann = sent.stdout.strip()
        from_bob = client_verbs.publish(cfg, "mqtt", "chat/room", b"hi from bob",
                                        [("publisher", b"bob")])
        anonymous = client_verbs.publish(cfg, "mqtt", "chat/room", b"hi")
        from_dee = client_verbs.publish(cfg, "mqtt", "chat/room", b"hi from dee",
                                        [("publisher", b"dee")])
        bad = cli("publish", "--exchange", "mqtt", "--routing-key", "chat/room", "--publisher",
                  "not a name", "x", settings=settings)
        assert bad.returncode != 0 and "--publisher" in bad.stderr
        router.process_all_available()
        # A replay (--since) of a subscription with No Local leaves out its own too.
        done = cli("subscribe", "--exchange", "mqtt", "--subscriber", "dee", "--filter",
                   "chat/+", "--id", "dee-late", "--since", "1h", "--no-local",
                   settings=settings)
        assert done.returncode == 0, done.stderr
        wait_until(lambda: len(_deliveries(cfg, "dee")) >= 3, "dee's replay", 180)
        assert router.flush_audit(60)
    finally:
        router.stop()

    def got(subscriber: str) -> set[str]:
        return {m for m, _, _ in _deliveries(cfg, subscriber)}

    assert got("ann") == {from_bob, anonymous, from_dee}
    assert got("bob") == {from_ann, anonymous, from_dee}
    assert got("cy") == {from_ann, from_bob, anonymous, from_dee}
    replayed = [headers_of(r) for r in read_topic(cfg, cfg.kafka.layout.topic("dee"))]
    assert all(h.get("bitroute.replayed") == "true" for h in replayed)
    assert sorted(h[MESSAGE_ID_HEADER] for h in replayed) == sorted(
        [from_ann, from_bob, anonymous])
    own = [r for r in read_topic(cfg, cfg.kafka.layout.topic("bob"))
           if headers_of(r)[MESSAGE_ID_HEADER] == from_ann]
    assert headers_of(own[0])["publisher"] == "ann"  # kept on the delivery
    deliveries = {(r["message_id"], r["subscriber"]) for r in _audit(cfg, "deliveries")}
    assert (from_ann, "ann") not in deliveries and (from_ann, "bob") in deliveries
    assert {r["message_id"]: r["deliveries"] for r in _audit(cfg, "messages")} == {
        from_ann: 2, from_bob: 2, anonymous: 3, from_dee: 3}
    changes = {r["subscription_id"]: r["no_local"] for r in _audit(cfg, "subscriptions")}
    assert changes == {"ann-chat": True, "bob-chat": True, "cy-chat": False, "dee-late": True}
    listed = cli("subscriptions", "--json", settings=settings)
    assert {row["subscription_id"]: row["no_local"]
            for row in map(json.loads, listed.stdout.splitlines())} == {
        "ann-chat": True, "bob-chat": True, "cy-chat": False, "dee-late": True}

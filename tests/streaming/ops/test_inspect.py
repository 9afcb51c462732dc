"""bitroute explain and bitroute subscriptions on a real broker.

Each test writes subscriptions to its own fresh changelog topic with the
client, and persists router snapshots the way the router does (the
changelog read with ChangelogReader and apply_record, saved with
SnapshotStore), so what the verbs print is compared with what was written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compiler import Subscription
from compiler.options import SubscriptionOptions
from compiler.shared import choose_member, group_key
from router_runs import persist_snapshot
from streaming.cli.main import main
from streaming.config import Config, load
from streaming.kafka import client_verbs as client
from streaming.kafka.broker import free_port

DEFAULTS = {"retain_handling": 0, "retain_as_published": False, "no_local": False}
"""The MQTT subscription options of a listed subscription that has none."""


@pytest.fixture
def settings(isolated_settings, workdir: Path) -> dict[str, str]:
    """This test's own topics, warehouse and checkpoint folder."""
    return isolated_settings(workdir)


@pytest.fixture
def cfg(settings: dict[str, str]) -> Config:
    return load(overrides=settings, environ={})


def _flags(settings: dict[str, str]) -> list[str]:
    return [flag for key, value in settings.items() for flag in ("--set", f"{key}={value}")]


def _cli(capsys: pytest.CaptureFixture, settings: dict[str, str], *args: str
         ) -> tuple[int, str, str]:
    status = main([*args, *_flags(settings)])
    out, err = capsys.readouterr()
    return status, out, err


def _explain(capsys, settings, *args: str) -> dict:
    status, out, err = _cli(capsys, settings, "explain", "--json", *args)
    assert status == 0, err
    return json.loads(out)


def _receivers(answer: dict) -> dict[str, list[str]]:
    return {r["subscriber"]: [s["subscription_id"] for s in r["subscriptions"]]
            for r in answer["subscribers"]}


def test_explain_without_a_router_rebuilds_from_the_changelog_and_writes_nothing(
        capsys, settings, cfg, workdir):
    client.subscribe(cfg, "amq.topic", "billing", "orders.*.paid", sub_id="s1")
    client.subscribe(cfg, "amq.topic", "billing", "orders.#", {"region": "eu"}, sub_id="s2")
    client.subscribe(cfg, "amq.topic", "audit", "#", sub_id="s3")
    client.subscribe(cfg, "amq.topic", "shipping", "orders.*.shipped", sub_id="s4")
    client.unsubscribe(cfg, "s3")

    answer = _explain(capsys, settings, "--exchange", "amq.topic", "--routing-key",
                      "orders.eu.paid", "--header", "region=eu")
    assert _receivers(answer) == {"billing": ["s1", "s2"]}
    assert answer["snapshot_version"] is None
    assert answer["changes_after_snapshot"] == 5
    s2 = answer["subscribers"][0]["subscriptions"][1]
    assert (s2["filter"], s2["header_match"], s2["header_criteria"]) == ("orders.#", "all",
                                                                         {"region": "eu"})
    assert _receivers(_explain(capsys, settings, "--routing-key", "orders.eu.paid")) == {
        "billing": ["s1"]}  # the default exchange, and without the header s2 does not hold
    assert _explain(capsys, settings, "--routing-key", "invoices.x")["subscribers"] == []

    status, out, err = _cli(capsys, settings, "explain", "--routing-key", "orders.eu.paid")
    assert status == 0 and err == ""
    assert out.splitlines()[0] == ("amq.topic orders.eu.paid: 1 subscriber: billing "
                                   "(rebuilt from the changelog (5 records))")
    assert out.splitlines()[3].split() == ["billing", "s1", "orders.*.paid"]
    assert list(workdir.iterdir()) == []  # no checkpoint folder, no snapshot written


def test_explain_shows_a_publish_its_exchange_routes_to_no_one_going_to_the_alternate(
        capsys, settings):
    settings = {**settings, "exchanges.dialects.unrouted": "amqp",
                "exchanges.alternates.amq.topic": "unrouted"}
    cfg = load(overrides=settings, environ={})
    client.subscribe(cfg, "amq.topic", "billing", "orders.#", sub_id="own")
    client.subscribe(cfg, "unrouted", "dlq", "*.eu", sub_id="catch")

    own = _explain(capsys, settings, "--routing-key", "orders.eu")
    assert (_receivers(own), own["alternate_exchange"]) == ({"billing": ["own"]}, None)
    through = _explain(capsys, settings, "--routing-key", "stock.eu")
    assert (_receivers(through), through["alternate_exchange"]) == ({"dlq": ["catch"]},
                                                                    "unrouted")
    nowhere = _explain(capsys, settings, "--routing-key", "stock.us")
    assert (nowhere["subscribers"], nowhere["alternate_exchange"]) == ([], None)

    status, out, err = _cli(capsys, settings, "explain", "--routing-key", "stock.eu")
    assert status == 0, err
    assert out.splitlines()[0].startswith(
        "amq.topic stock.eu: no subscriber; through its alternate exchange unrouted "
        "(exchanges.alternates): 1 subscriber: dlq (")
    status, out, err = _cli(capsys, settings, "explain", "--routing-key", "stock.us")
    assert out.splitlines()[0].startswith(
        "amq.topic stock.us: no subscriber, nor on its alternate exchange unrouted (")
    # The status names the configured alternates.
    status, out, err = _cli(capsys, settings, "status", "--json")
    assert json.loads(out)["alternate_exchanges"] == {"amq.topic": "unrouted"}


def test_explain_answers_from_the_latest_snapshot_plus_the_newer_changes(capsys, settings, cfg):
    client.subscribe(cfg, "mqtt", "ops", "sensors/+/temperature", sub_id="s1")
    client.subscribe(cfg, "mqtt", "ops", "sensors/#", sub_id="s2")
    persist_snapshot(cfg, 3)
    # Only in the snapshot: proves the answer starts from it, not from the changelog.
    persist_snapshot(cfg, 4, Subscription("snap-only", "mqtt", "archive", "sensors/#"))
    client.subscribe(cfg, "mqtt", "boiler", "sensors/boiler/+", {"unit": None}, sub_id="s3")
    client.unsubscribe(cfg, "s1")

    answer = _explain(capsys, settings, "--exchange", "mqtt", "--routing-key",
                      "sensors/boiler/temperature", "--header", "unit=celsius")
    assert _receivers(answer) == {"archive": ["snap-only"], "boiler": ["s3"], "ops": ["s2"]}
    assert (answer["snapshot_version"], answer["changes_after_snapshot"]) == (4, 2)
    assert answer["headers"] == {"unit": "celsius"}
    # s3's criterion is presence of 'unit': without the header it does not hold.
    assert "boiler" not in _receivers(_explain(
        capsys, settings, "--exchange", "mqtt", "--routing-key", "sensors/boiler/temperature"))

    status, out, _ = _cli(capsys, settings, "subscriptions")
    assert status == 0
    assert out.splitlines()[0] == "snapshot v4 + 2 newer changelog records"


@pytest.mark.parametrize(("exchange", "key", "reason"), [
    ("mqtt", "sensors/+", "topic must not contain the wildcards '+' or '#': 'sensors/+'"),
    ("nope", "a.b", "unknown exchange 'nope'"),
])
def test_explain_rejects_what_the_router_would_reject(capsys, settings, cfg, exchange, key, reason):
    client.subscribe(cfg, "mqtt", "ops", "#", sub_id="s1")
    status, out, err = _cli(capsys, settings, "explain", "--json", "--exchange", exchange,
                            "--routing-key", key)
    assert (status, out) == (2, "")
    assert err.splitlines() == [f"bitroute: error: the router would reject this publish: {reason}"]


def test_explain_lists_every_member_of_a_shared_group_unless_given_the_message_id(
        capsys, settings, cfg):
    client.subscribe(cfg, "mqtt", "w1", "$share/g/jobs/#", sub_id="a")
    client.subscribe(cfg, "mqtt", "w2", "$share/g/jobs/#", sub_id="b")
    client.subscribe(cfg, "mqtt", "w3", "$share/g/jobs/#", {"queue": "slow"}, sub_id="c")
    client.subscribe(cfg, "mqtt", "w1", "jobs/+", sub_id="d")
    base = ["--exchange", "mqtt", "--routing-key", "jobs/1"]

    answer = _explain(capsys, settings, *base)
    assert _receivers(answer) == {"w1": ["a", "d"], "w2": ["b"]}  # w3's criterion fails
    assert {r["subscriber"]: r["certain"] for r in answer["subscribers"]} == {"w1": True,
                                                                             "w2": False}
    assert {s["subscription_id"]: s["shared_group"] for r in answer["subscribers"]
            for s in r["subscriptions"]} == {"a": "$share/g/jobs/#", "b": "$share/g/jobs/#",
                                             "d": None}

    for message_id in ("pubs/0/7", "pubs/1/8", "pubs/0/9"):
        chosen = choose_member(group_key("mqtt", "$share/g/jobs/#"), message_id, ["w1", "w2"])
        answer = _explain(capsys, settings, *base, "--message-id", message_id)
        expected = {"w1": ["a", "d"]} if chosen == "w1" else {"w1": ["d"], "w2": ["b"]}
        assert _receivers(answer) == expected


def test_subscriptions_lists_the_live_subscriptions(capsys, settings, cfg):
    client.subscribe(cfg, "mqtt", "ops", "sensors/+/temperature", {"unit": "celsius"}, "any",
                     sub_id="m1", options=SubscriptionOptions(2))
    client.subscribe(cfg, "amq.topic", "billing", "orders.*.paid", sub_id="a2")
    client.subscribe(cfg, "amq.topic", "billing", "orders.#", sub_id="a1")
    client.subscribe(cfg, "amq.topic", "ops", "alerts.#", sub_id="a3")
    client.subscribe(cfg, "amq.topic", "ops", "alerts.critical", sub_id="a3")  # replaced
    client.subscribe(cfg, "amq.topic", "gone", "x", sub_id="a4")
    client.unsubscribe(cfg, "a4")

    status, out, err = _cli(capsys, settings, "subscriptions", "--json")
    assert (status, err) == (0, "")
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows == [
        {"subscription_id": "a1", "exchange": "amq.topic", "subscriber": "billing",
         "filter": "orders.#", "header_match": None, "header_criteria": None, **DEFAULTS},
        {"subscription_id": "a2", "exchange": "amq.topic", "subscriber": "billing",
         "filter": "orders.*.paid", "header_match": None, "header_criteria": None, **DEFAULTS},
        {"subscription_id": "a3", "exchange": "amq.topic", "subscriber": "ops",
         "filter": "alerts.critical", "header_match": None, "header_criteria": None,
         **DEFAULTS},
        {"subscription_id": "m1", "exchange": "mqtt", "subscriber": "ops",
         "filter": "sensors/+/temperature", "header_match": "any",
         "header_criteria": {"unit": "celsius"}, "retain_handling": 2,
         "retain_as_published": False, "no_local": False, "retained": 0},
    ]
    _, out, _ = _cli(capsys, settings, "subscriptions", "--json", "--subscriber", "ops")
    assert [json.loads(line)["subscription_id"] for line in out.splitlines()] == ["a3", "m1"]
    _, out, _ = _cli(capsys, settings, "subscriptions", "--json", "--subscriber", "ops",
                     "--exchange", "mqtt")
    assert [json.loads(line)["subscription_id"] for line in out.splitlines()] == ["m1"]

    status, out, _ = _cli(capsys, settings, "subscriptions", "--exchange", "mqtt")
    lines = out.splitlines()
    assert lines[1].split() == ["subscription_id", "exchange", "subscriber", "filter",
                                "header_match", "header_criteria", "retain_handling",
                                "retain_as_published", "no_local", "retained"]
    assert lines[3].split() == ["m1", "mqtt", "ops", "sensors/+/temperature", "any",
                                "unit=celsius", "2", "False", "False", "0"]
    assert lines[4] == "(1 row)"


def test_a_snapshot_answers_when_kafka_does_not(capsys, settings, cfg):
    client.subscribe(cfg, "amq.topic", "billing", "orders.#", sub_id="s1")
    persist_snapshot(cfg, 2)
    down = {**settings, "kafka.bootstrap": f"127.0.0.1:{free_port()}"}

    answer = _explain(capsys, down, "--routing-key", "orders.1")
    assert _receivers(answer) == {"billing": ["s1"]}
    assert answer["snapshot_version"] == 2
    assert answer["stale"].startswith(f"cannot reach Kafka at {down['kafka.bootstrap']} ")
    status, out, err = _cli(capsys, down, "subscriptions", "--json")
    assert status == 0 and [json.loads(line)["subscription_id"] for line in out.splitlines()] == ["s1"]
    assert err.startswith("bitroute: warning: answering from snapshot v2 alone")

    no_snapshot = {**down, "streaming.checkpoint_dir": settings["streaming.checkpoint_dir"] + "-x"}
    status, out, err = _cli(capsys, no_snapshot, "subscriptions")
    assert (status, out) == (1, "")
    assert len(err.splitlines()) == 1
    assert err.startswith("bitroute: error: no router snapshot in ")


def test_a_missing_changelog_topic_is_an_error_without_a_snapshot(capsys, settings):
    status, out, err = _cli(capsys, settings, "explain", "--routing-key", "a")
    assert (status, out) == (1, "")
    assert err.strip().endswith(
        f"the changelog topic {settings['kafka.subscriptions_topic']!r} does not exist on "
        f"{settings['kafka.bootstrap']}")


def test_explain_and_subscriptions_show_the_retained_messages(capsys, settings, cfg):
    from confluent_kafka import Producer

    from schemas.records import MESSAGE_ID_HEADER, PUBLISHED_AT_HEADER
    from streaming.kafka.topics import ensure_topics, retained_topic_settings
    from streaming.router.retained import retained_key

    ensure_topics(cfg, [cfg.kafka.retained_topic], retained_topic_settings(cfg))
    producer = Producer({"bootstrap.servers": cfg.kafka.bootstrap})
    for topic, value, mid in (("sensors/boiler/temperature", b"71.5", "pubs/0/1"),
                              ("sensors/attic/temperature", b"20", "pubs/1/2"),
                              ("sensors/attic/temperature", None, None),  # cleared
                              ("sensors/cellar/temperature", b"12", "pubs/0/3"),
                              ("$SYS/broker/load", b"1", "pubs/0/4")):
        headers: list[tuple[str, str | bytes | None]] = []
        if mid is not None:
            headers = [("retain", b"true"), (MESSAGE_ID_HEADER, mid.encode()),
                       (PUBLISHED_AT_HEADER, b"1795715543443")]
        producer.produce(cfg.kafka.retained_topic, key=retained_key("mqtt", topic), value=value,
                         headers=headers)
    assert producer.flush(30) == 0
    client.subscribe(cfg, "mqtt", "ops", "sensors/+/temperature", sub_id="m1")
    client.subscribe(cfg, "mqtt", "ops", "#", sub_id="m2")
    client.subscribe(cfg, "mqtt", "w1", "$share/g/sensors/#", sub_id="m3")
    client.subscribe(cfg, "amq.topic", "billing", "orders.#", sub_id="a1")

    answer = _explain(capsys, settings, "--exchange", "mqtt", "--routing-key",
                      "sensors/boiler/temperature")
    assert answer["retained"] == {"message_id": "pubs/0/1", "payload_bytes": 4,
                                  "published_at": "2026-11-26T17:52:23.443000+00:00",
                                  "expiry_remaining": None}  # it has no expiry header
    assert _explain(capsys, settings, "--exchange", "mqtt", "--routing-key",
                    "sensors/attic/temperature")["retained"] is None
    assert "retained" not in _explain(capsys, settings, "--routing-key", "orders.1")
    status, out, _ = _cli(capsys, settings, "explain", "--exchange", "mqtt", "--routing-key",
                          "sensors/boiler/temperature")
    assert out.splitlines()[-1] == ("retained message: pubs/0/1 (4 bytes, published "
                                    "2026-11-26T17:52:23.443000+00:00)")

    status, out, err = _cli(capsys, settings, "subscriptions", "--json")
    assert (status, err) == (0, "")
    retained = {row["subscription_id"]: row.get("retained", "absent")
                for row in map(json.loads, out.splitlines())}
    # m2 ("#") skips the $SYS topic; a $share/ subscription receives none when applied.
    assert retained == {"a1": "absent", "m1": 2, "m2": 2, "m3": None}

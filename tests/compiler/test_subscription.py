"""Subscription records: the changelog form and subscriber names."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from compiler import HeaderCriteria, RoutingIndex, Subscription, SubscriptionError, validate_subscriber
from compiler.options import SubscriptionOptions
from schemas.records import SUBSCRIPTION_FIELDS, SUBSCRIPTION_REQUIRED_FIELDS


@pytest.mark.parametrize("name", ["a", "A-b_c.9", "x" * 200, "..a", "-"])
def test_valid_subscriber_names(name):
    assert validate_subscriber(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "x" * 201, "a/b", "a b", "é", "a\n", None, 3])
def test_invalid_subscriber_names(name):
    with pytest.raises(SubscriptionError):
        validate_subscriber(name)


def test_from_changelog_parses_every_field():
    value = {
        "exchange": "amq",
        "subscriber": "svc",
        "filter": "a.*",
        "headers": {"match": "any", "criteria": {"k": None}},
    }
    sub = Subscription.from_changelog(b"id-1", json.dumps(value).encode())
    assert sub == Subscription("id-1", "amq", "svc", "a.*", HeaderCriteria("any", {"k": None}))
    assert Subscription.from_changelog(*sub.to_changelog()) == sub


def test_from_changelog_accepts_str_and_null_headers():
    sub = Subscription.from_changelog("id", '{"exchange": "e", "subscriber": "s", "filter": "#", "headers": null}')
    assert sub.headers is None and sub.id == "id"


@pytest.mark.parametrize(
    "key, value, message",
    [
        (b"", b"{}", "must not be empty"),
        (b"\xff", b"{}", "record key) is not valid UTF-8"),
        (b"k", None, "tombstone"),
        (b"k", b"\xff", "value is not valid UTF-8"),
        (b"k", b"{", "not JSON"),
        (b"k", b"[]", "must be a JSON object"),
        (b"k", b'{"subscriber": "s", "filter": "#"}', "missing field 'exchange'"),
        (b"k", b'{"exchange": "e", "filter": "#"}', "missing field 'subscriber'"),
        (b"k", b'{"exchange": "e", "subscriber": "s"}', "missing field 'filter'"),
        (b"k", b'{"exchange": "e", "subscriber": "s", "filter": 1}', "field 'filter' must be a string"),
        (b"k", b'{"exchange": "e", "subscriber": "s", "filter": "#", "x": 1}', "unknown fields x"),
        (b"k", b'{"exchange": "e", "subscriber": "a/b", "filter": "#"}', "subscriber name"),
        (
            b"k",
            b'{"exchange": "e", "subscriber": "s", "filter": "#", "headers": {"match": "x", "criteria": {}}}',
            "'all' or 'any'",
        ),
    ],
)
def test_from_changelog_names_the_problem(key, value, message):
    with pytest.raises(SubscriptionError) as info:
        Subscription.from_changelog(key, value)
    assert message in str(info.value)


def test_the_parser_reads_the_changelog_fields_of_the_record_contract():
    """schemas.records names the fields: each required one is required, and a subscription
    written back carries exactly the declared ones."""
    full = {"exchange": "e", "subscriber": "s", "filter": "#"}
    for name in SUBSCRIPTION_REQUIRED_FIELDS:
        value = {k: v for k, v in full.items() if k != name}
        with pytest.raises(SubscriptionError, match=f"missing field '{name}'"):
            Subscription.from_changelog(b"k", json.dumps(value))
    written = Subscription(
        "k",
        "e",
        "s",
        "#",
        HeaderCriteria("all", {}),
        datetime(2026, 1, 1, tzinfo=UTC),
        SubscriptionOptions(1, True, True),
    ).to_changelog()[1]
    assert set(json.loads(written)) == set(SUBSCRIPTION_FIELDS)


def test_options_are_written_only_when_not_the_default_and_read_back():
    plain = Subscription("k", "e", "s", "#")
    assert json.loads(plain.to_changelog()[1]) == {"exchange": "e", "subscriber": "s", "filter": "#"}
    for options in (
        SubscriptionOptions(1),
        SubscriptionOptions(2, True),
        SubscriptionOptions(0, True),
        SubscriptionOptions(no_local=True),
    ):
        sub = Subscription("k", "e", "s", "#", options=options)
        assert Subscription.from_changelog(*sub.to_changelog()) == sub
    value = {
        "exchange": "e",
        "subscriber": "s",
        "filter": "#",
        "retain_handling": None,
        "retain_as_published": None,
        "no_local": None,
    }
    assert Subscription.from_changelog(b"k", json.dumps(value)).options == (0, False, False)


@pytest.mark.parametrize(
    "field, value",
    [
        ("retain_handling", 3),
        ("retain_handling", -1),
        ("retain_handling", "1"),
        ("retain_handling", True),
        ("retain_handling", 1.0),
        ("retain_as_published", 1),
        ("retain_as_published", "true"),
        ("no_local", 0),
        ("no_local", "false"),
    ],
)
def test_bad_options_are_refused_naming_the_field(field, value):
    record = {"exchange": "e", "subscriber": "s", "filter": "#", field: value}
    with pytest.raises(SubscriptionError, match=f"subscription 'k': field '{field}' must be"):
        Subscription.from_changelog(b"k", json.dumps(record))


def test_options_other_than_the_default_are_refused_on_an_amqp_exchange():
    index = RoutingIndex({"amq": "amqp", "mq": "mqtt"})
    for options in (SubscriptionOptions(1), SubscriptionOptions(0, True)):
        with pytest.raises(SubscriptionError, match="MQTT subscription options, and exchange 'amq' is amqp"):
            index.upsert(Subscription("k", "amq", "s", "#", options=options))
    assert "k" not in index
    index.upsert(Subscription("k", "amq", "s", "#", options=SubscriptionOptions(0)))
    index.upsert(Subscription("m", "mq", "s", "#", options=SubscriptionOptions(2, True, True)))
    assert index.get("m").options == (2, True, True)
    with pytest.raises(SubscriptionError, match="no_local on a shared subscription"):
        index.upsert(Subscription("g", "mq", "s", "$share/g/#", options=SubscriptionOptions(no_local=True)))
    with pytest.raises(SubscriptionError, match="no_local: MQTT subscription options"):
        index.upsert(Subscription("k", "amq", "s", "#", options=SubscriptionOptions(no_local=True)))

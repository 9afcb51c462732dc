"""The rules of a replay request (``since``), without a broker: the command line's parse
and the changelog's checks."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from compiler import RoutingIndex, Subscription
from compiler.errors import SubscriptionError
from streaming.kafka.errors import InvalidRequest
from streaming.router.changelog import apply_record
from schemas.records import CHANGE_REJECTED, CHANGE_REMOVE, CHANGE_UPSERT
from streaming.router.replay_cli import parse_since_argument

NOW = datetime(2026, 11, 26, 18, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("text, expected", [
    ("2h", NOW - timedelta(hours=2)),
    ("1h30m", NOW - timedelta(minutes=90)),
    ("7d", NOW - timedelta(days=7)),
    ("90s", NOW - timedelta(seconds=90)),
    ("2026-11-26T17:00:00Z", datetime(2026, 11, 26, 17, tzinfo=timezone.utc)),
    ("2026-11-26T17:00:00", datetime(2026, 11, 26, 17, tzinfo=timezone.utc)),
    ("2026-11-26T18:00:00+01:00", datetime(2026, 11, 26, 17, tzinfo=timezone.utc)),
])
def test_since_is_a_time_or_a_duration_back_from_now(text, expected):
    assert parse_since_argument(text, NOW) == expected


@pytest.mark.parametrize("text, problem", [
    ("2026-11-26T18:00:01Z", "in the future"),
    ("soon", "not an ISO-8601 time"),
    ("", "not an ISO-8601 time"),
    ("2x", "not an ISO-8601 time"),
])
def test_a_bad_since_is_refused_with_its_reason(text, problem):
    with pytest.raises(InvalidRequest, match=problem):
        parse_since_argument(text, NOW)


def _value(filter_: str, since: str | None) -> bytes:
    import json

    value = {"exchange": "amq.topic", "subscriber": "s", "filter": filter_}
    if since is not None:
        value["since"] = since
    return json.dumps(value).encode()


def test_the_changelog_applies_a_since_and_rejects_a_bad_one_asking_for_nothing():
    index = RoutingIndex({"amq.topic": "amqp"})
    written = int(NOW.timestamp() * 1000)
    asked: list = []
    ok = apply_record(index, b"a", _value("a.*", "2026-11-26T17:00:00Z"), 0, 5, written,
                      written, None, asked)
    assert ok.change == CHANGE_UPSERT and [r.subscription_id for r in asked] == ["a"]
    assert (asked[0].changelog_partition, asked[0].changelog_offset) == (0, 5)
    future = apply_record(index, b"b", _value("a.*", "2026-11-26T18:00:01Z"), 0, 6, written,
                          written, None, asked)
    assert future.change == CHANGE_REJECTED and "in the future" in future.reason
    text = apply_record(index, b"c", _value("a.*", "yesterday"), 0, 7, written, written, None,
                        asked)
    assert text.change == CHANGE_REJECTED and "not an ISO-8601 time" in text.reason
    other = apply_record(index, b"a", _value("b.*", "2026-11-26T17:00:00Z"), 0, 8, written,
                         written, None, asked)
    assert other.change == CHANGE_REMOVE and "exists with another definition" in other.reason
    assert len(asked) == 1 and "b" not in index and "c" not in index


def test_the_same_definition_again_with_since_is_a_replay_request():
    index = RoutingIndex({"amq.topic": "amqp"})
    index.upsert(Subscription("a", "amq.topic", "s", "a.*"))
    asked: list = []
    change = apply_record(index, b"a", _value("a.*", "2026-11-26T17:00:00Z"), 0, 1, None,
                          int(NOW.timestamp() * 1000), None, asked)
    assert change.change == CHANGE_UPSERT and len(asked) == 1
    with pytest.raises(SubscriptionError):
        Subscription.from_changelog(b"x", _value("a.*", "17:00"))

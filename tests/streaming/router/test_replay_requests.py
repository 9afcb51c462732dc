"""The rules of a replay request (``since``), without a broker: the command line's check
(the time grammar itself is tests/streaming/cli/test_times.py) and the changelog's checks."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from compiler import RoutingIndex, Subscription
from compiler.errors import SubscriptionError
from schemas.records import CHANGE_REJECTED, CHANGE_REMOVE, CHANGE_UPSERT
from streaming.cli.times import parse_time
from streaming.kafka.errors import InvalidRequest
from streaming.router.replay.cli import check_since
from streaming.router.subscriptions.changelog import apply_record

NOW = datetime(2026, 11, 26, 18, 0, tzinfo=UTC)


@pytest.mark.parametrize("text", ["2026-11-26T18:00:01Z", "2026-11-27"])
def test_a_since_in_the_future_is_refused(text):
    with pytest.raises(InvalidRequest, match="in the future"):
        check_since(parse_time(text, "--since", NOW), text, NOW)


def test_a_since_now_or_before_is_taken():
    check_since(NOW, "0s", NOW)
    check_since(parse_time("7d", "--since", NOW), "7d", NOW)


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
    assert future.change == CHANGE_REJECTED and "in the future" in (future.reason or "")
    text = apply_record(index, b"c", _value("a.*", "yesterday"), 0, 7, written, written, None,
                        asked)
    assert text.change == CHANGE_REJECTED and "not an ISO-8601 time" in (text.reason or "")
    other = apply_record(index, b"a", _value("b.*", "2026-11-26T17:00:00Z"), 0, 8, written,
                         written, None, asked)
    assert other.change == CHANGE_REMOVE and "exists with another definition" in (other.reason or "")
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


def _replays(tmp_path):
    import threading

    from streaming.config import load
    from streaming.router.replay.replay import Replays
    from streaming.state.checkpoint import CheckpointLayout

    config = load(overrides={"streaming.checkpoint_dir": str(tmp_path)}, environ={})
    layout = CheckpointLayout.of(tmp_path)
    layout.state.mkdir(parents=True, exist_ok=True)
    return Replays(config, None, layout, "r", lambda _: True, threading.Event())


def _pending(version, changes, replays):
    from streaming.router.subscriptions.changelog import Change, PendingVersion

    rows = [Change(sub_id, kind, None, None, None, None, None, None, 0, offset, None, 0)
            for sub_id, kind, offset in changes]
    return PendingVersion(version, rows, [], {0: 99}, replays)


def _request(sub_id, offset):
    from streaming.router.replay.requests import ReplayRequest

    return ReplayRequest(sub_id, "amq.topic", "s", "a.*", None, 0, 0, offset)


def test_replays_are_recorded_once_bounded_at_their_first_batch_and_cancelled_by_a_removal(tmp_path):
    from streaming.router.replay.replay import ReplayLedger, state_path

    replays = _replays(tmp_path)
    replays.requested(_pending(2, [("a", CHANGE_UPSERT, 1), ("b", CHANGE_UPSERT, 2),
                                   ("b", CHANGE_REMOVE, 3)], [_request("a", 1), _request("b", 2)]))
    ledger = ReplayLedger.load(state_path(replays.layout))
    assert [r.request.subscription_id for r in ledger.replays] == ["a"]  # b removed at once
    replays.requested(_pending(2, [("a", CHANGE_UPSERT, 1)], [_request("a", 1)]))  # read again
    assert len(ReplayLedger.load(state_path(replays.layout)).replays) == 1
    replays.on_batch(7, 1, {0: 40})  # a batch pinned to an older version: not the boundary
    assert ReplayLedger.load(state_path(replays.layout)).replays[0].boundary is None
    replays.on_batch(8, 2, {0: 55})
    (a,) = ReplayLedger.load(state_path(replays.layout)).replays
    assert (a.boundary, a.end) == (8, {0: 55})
    replays.requested(_pending(3, [("a", CHANGE_REMOVE, 4)], []))
    assert not ReplayLedger.load(state_path(replays.layout)).replays


def test_a_request_keeps_its_options_and_one_recorded_before_them_reads_with_none():
    from compiler.options import SubscriptionOptions
    from streaming.router.replay.requests import ReplayRequest, request_of

    sub = Subscription("s", "mqtt", "ann", "chat/#", since=datetime(2026, 1, 1, tzinfo=UTC),
                       options=SubscriptionOptions(no_local=True))
    request = request_of(sub, 0, 7)
    assert ReplayRequest.from_json(request.to_json()).subscription().options.no_local
    older = {k: v for k, v in request.to_json().items() if k != "options"}
    assert ReplayRequest.from_json(older).subscription().options == SubscriptionOptions()

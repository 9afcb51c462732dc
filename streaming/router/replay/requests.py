"""Replay requests: what a changelog record with ``since`` asks for, and when it is refused.

A changelog value may carry ``since`` (:data:`schemas.records.SUBSCRIPTION_SINCE_FIELD`,
an ISO-8601 time). Applied by the router (:func:`streaming.router.subscriptions.changelog.apply_record`),
it becomes a :class:`ReplayRequest`, which :mod:`streaming.router.replay.replay` serves. The
rules that make such a record bad, checked as the record is applied (so that a bad one
is rejected whole, with a reason, to the rejected topic and the ``subscriptions``
audit, and asks for nothing):

- ``since`` later than the record itself (its Kafka timestamp, else the time it is
  applied): a replay is of the past. Judged against the record's own time, so that a
  rebuild of the index from the changelog reaches the same verdict.
- the subscription id exists with another exchange, subscriber, filter or header
  criteria: a replay belongs to the subscription it was asked with; replacing a
  subscription and replaying the new one under the old id would mix the two.

``since`` before the oldest publish Kafka still holds is not refused: the replay
starts at the retention start (the earliest offset Kafka keeps) and says so (its
log line, ``bitroute status``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import NamedTuple

from compiler import RoutingIndex, Subscription
from compiler.errors import SubscriptionError
from compiler.subscription import since_text


class ReplayRequest(NamedTuple):
    """One subscription that asked for a replay, as its changelog record said it.

    ``changelog_partition``/``changelog_offset`` name the record: a record read
    again (a catch-up rolled back, a rebuild) asks for nothing new.
    """

    subscription_id: str
    exchange: str
    subscriber: str
    filter: str
    headers: dict | None
    since_ms: int
    changelog_partition: int
    changelog_offset: int
    options: int = 0
    """Its MQTT options' flags (:mod:`compiler.options`): No Local holds for a replay too
    (absent from a request an earlier version recorded: the default)."""

    @property
    def key(self) -> str:
        return f"{self.changelog_partition}/{self.changelog_offset}"

    def subscription(self) -> Subscription:
        from compiler.headers import HeaderCriteria

        headers = HeaderCriteria.from_json(self.headers) if self.headers is not None else None
        from compiler.options import SubscriptionOptions

        return Subscription(self.subscription_id, self.exchange, self.subscriber, self.filter,
                            headers, options=SubscriptionOptions.from_flags(self.options))

    def to_json(self) -> dict:
        return self._asdict()

    @classmethod
    def from_json(cls, obj: dict) -> ReplayRequest:
        return cls(**obj)


def since_ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def ms_text(ms: int) -> str:
    """Epoch milliseconds as the ISO-8601 UTC text ``since`` is written in."""
    return since_text(datetime.fromtimestamp(ms / 1000, UTC))


def check_request(index: RoutingIndex, sub: Subscription, written_ms: int) -> None:
    """Raise :class:`SubscriptionError` when ``sub`` (with ``since``) may not be applied
    (module docstring); ``written_ms`` is the record's time."""
    if sub.since is None:
        return
    asked = since_ms(sub.since)
    if asked > written_ms:
        raise SubscriptionError(
            f"subscription {sub.id!r}: since {since_text(sub.since)} is in the future (the record "
            f"was written at {ms_text(written_ms)}): a replay is of publishes already made")
    existing = index.get(sub.id)
    if existing is not None and (existing.exchange, existing.subscriber, existing.filter,
                                 existing.headers) != (sub.exchange, sub.subscriber, sub.filter,
                                                       sub.headers):
        raise SubscriptionError(
            f"subscription {sub.id!r} exists with another definition (exchange "
            f"{existing.exchange!r}, subscriber {existing.subscriber!r}, filter "
            f"{existing.filter!r}): a replay (since) needs a new id or the same definition")


def request_of(sub: Subscription, partition: int, offset: int) -> ReplayRequest:
    """The replay ``sub`` asks for, read from changelog ``partition``/``offset``."""
    headers = json.loads(json.dumps(sub.headers.to_json())) if sub.headers is not None else None
    return ReplayRequest(sub.id, sub.exchange, sub.subscriber, sub.filter, headers,
                         since_ms(sub.since), partition, offset, sub.options.flags)

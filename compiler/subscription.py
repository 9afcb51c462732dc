"""A subscription record and its changelog form.

The subscriptions changelog is a compacted Kafka topic: key = subscription id
(UTF-8), value = JSON ``{"exchange", "subscriber", "filter", "headers"?, "since"?, "retain_handling"?,
"retain_as_published"?}``
where ``headers`` is ``{"match": "all"|"any", "criteria": {name: value-or-null}}``
or null; a null value (tombstone) removes the subscription and is handled by
the caller, not parsed here.

A subscriber name becomes part of a Kafka topic name,
``bitroute.deliveries.<subscriber>``, so it is restricted to the characters
Kafka allows in topic names.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

from schemas.records import SUBSCRIPTION_FIELDS, SUBSCRIPTION_REQUIRED_FIELDS, SUBSCRIPTION_SINCE_FIELD

from .errors import HeaderCriteriaError, SubscriptionError, quote
from .headers import HeaderCriteria
from .options import DEFAULT_OPTIONS, SubscriptionOptions

SUBSCRIBER_CHARACTER = "[A-Za-z0-9._-]"
"""One character of a subscriber name (a regular expression class): the
characters Kafka allows in a topic name."""

MAX_SUBSCRIBER_CHARS = 200
"""Longest subscriber name: ``bitroute.deliveries.`` plus 200 stays under Kafka's 249."""

RESERVED_SUBSCRIBERS = (".", "..")
"""Names of the right characters that Kafka refuses as topic names."""

_SUBSCRIBER = re.compile(f"{SUBSCRIBER_CHARACTER}{{1,{MAX_SUBSCRIBER_CHARS}}}")


class SubscriberRule(NamedTuple):
    """The subscriber-name rule as data, for the kernel (``bitroute_kernel.offline_match``):
    ``characters`` a name may hold (all ASCII), its longest length, the reserved names."""

    characters: str
    max_chars: int
    reserved: tuple[str, ...]


SUBSCRIBER_RULE = SubscriberRule(
    "".join(c for c in map(chr, range(128)) if re.fullmatch(SUBSCRIBER_CHARACTER, c)),
    MAX_SUBSCRIBER_CHARS,
    RESERVED_SUBSCRIBERS,
)
"""What :func:`validate_subscriber` checks, handed to the kernel rather than written again in Rust."""
_FIELDS = frozenset(SUBSCRIPTION_FIELDS)
_REQUIRED = SUBSCRIPTION_REQUIRED_FIELDS


def validate_subscriber(name: object) -> str:
    """Return ``name`` if it is a valid subscriber name, else raise :class:`SubscriptionError`.

    Valid: 1 to 200 characters from ``[A-Za-z0-9._-]``, and not ``.`` or ``..``.
    """
    if type(name) is not str:
        raise SubscriptionError(f"subscriber must be a string, not {type(name).__name__}: {quote(name)}")
    if _SUBSCRIBER.fullmatch(name) is None or name in RESERVED_SUBSCRIBERS:
        raise SubscriptionError(
            f"subscriber name must be 1-{MAX_SUBSCRIBER_CHARS} characters of {SUBSCRIBER_CHARACTER}, "
            f"not {' or '.join(map(repr, RESERVED_SUBSCRIBERS))}: {quote(name)}"
        )
    return name


@dataclass(frozen=True, slots=True)
class Subscription:
    """One subscription: ``subscriber`` receives messages published to
    ``exchange`` whose routing key matches ``filter`` (in the exchange's
    dialect) and whose headers satisfy ``headers`` when given.

    Construction does not validate; :meth:`compiler.index.RoutingIndex.upsert`
    does, as it knows the exchange's dialect. ``since`` (UTC, from the changelog's
    optional ``since`` field) asks for a replay of the publishes Kafka keeps at
    or after it (``streaming.router.replay.replay``); the index does not keep it. ``options``: the
    MQTT subscription options (:mod:`compiler.options`), which the index keeps.
    """

    id: str
    exchange: str
    subscriber: str
    filter: str
    headers: HeaderCriteria | None = None
    since: datetime | None = None
    options: SubscriptionOptions = DEFAULT_OPTIONS

    @classmethod
    def from_changelog(cls, key: bytes | str, value: bytes | str) -> Subscription:
        """Parse one changelog record; raises :class:`SubscriptionError` naming the problem."""
        sub_id = _decode(key, "subscription id (record key)")
        if not sub_id:
            raise SubscriptionError("subscription id (record key) must not be empty")
        if value is None:
            raise SubscriptionError(f"subscription {quote(sub_id)}: a null value is a tombstone, not a subscription")
        text = _decode(value, f"subscription {quote(sub_id)}: value")
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SubscriptionError(f"subscription {quote(sub_id)}: value is not JSON ({exc}): {quote(text)}") from None
        if not isinstance(obj, dict):
            raise SubscriptionError(f"subscription {quote(sub_id)}: value must be a JSON object: {quote(text)}")
        extra = obj.keys() - _FIELDS
        if extra:
            raise SubscriptionError(
                f"subscription {quote(sub_id)}: unknown fields {', '.join(sorted(extra))}"
            )
        for field in _REQUIRED:
            if field not in obj:
                raise SubscriptionError(f"subscription {quote(sub_id)}: missing field {field!r}")
            if type(obj[field]) is not str:
                raise SubscriptionError(
                    f"subscription {quote(sub_id)}: field {field!r} must be a string, not {quote(obj[field])}"
                )
        subscriber = validate_subscriber(obj["subscriber"])
        headers = None
        if obj.get("headers") is not None:
            try:
                headers = HeaderCriteria.from_json(obj["headers"])
            except HeaderCriteriaError as exc:
                raise SubscriptionError(f"subscription {quote(sub_id)}: {exc}") from None
        since = None
        if obj.get(SUBSCRIPTION_SINCE_FIELD) is not None:
            try:
                since = parse_since(obj[SUBSCRIPTION_SINCE_FIELD])
            except SubscriptionError as exc:
                raise SubscriptionError(f"subscription {quote(sub_id)}: {exc}") from None
        try:
            options = SubscriptionOptions.from_json(obj)
        except SubscriptionError as exc:
            raise SubscriptionError(f"subscription {quote(sub_id)}: {exc}") from None
        return cls(sub_id, obj["exchange"], subscriber, obj["filter"], headers, since, options)

    def to_changelog(self) -> tuple[bytes, bytes]:
        """The changelog record (key, value) that :meth:`from_changelog` parses back."""
        value: dict[str, object] = {"exchange": self.exchange, "subscriber": self.subscriber, "filter": self.filter}
        if self.headers is not None:
            value["headers"] = self.headers.to_json()
        if self.since is not None:
            value[SUBSCRIPTION_SINCE_FIELD] = since_text(self.since)
        value.update(self.options.to_json())
        return self.id.encode("utf-8"), json.dumps(value, ensure_ascii=False).encode("utf-8")


def parse_since(value: object) -> datetime:
    """The changelog's ``since``: an ISO-8601 time (``2026-11-26T17:00:00Z``; UTC when it
    names no zone), as an aware UTC datetime; raises :class:`SubscriptionError`."""
    if type(value) is not str:
        raise SubscriptionError(f"field 'since' must be an ISO-8601 time string, not {quote(value)}")
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise SubscriptionError(f"field 'since' is not an ISO-8601 time: {quote(value)}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC)


def since_text(when: datetime) -> str:
    """``when`` as the changelog writes ``since``: ISO-8601 in UTC, microseconds, ``Z``."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _decode(data: bytes | str, what: str) -> str:
    if isinstance(data, str):
        return data
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise SubscriptionError(f"{what} must be bytes or str, not {type(data).__name__}")
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SubscriptionError(f"{what} is not valid UTF-8 ({exc})") from None

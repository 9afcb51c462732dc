"""``bitroute match``: match topics against subscriptions from files, offline.

Contract (issue 3, item 6)::

    bitroute match --dialect amqp|mqtt --subscriptions SUBS.jsonl --topics TOPICS.jsonl

``SUBS.jsonl``: one JSON object a line, ``{"id", "filter", "subscriber"?,
"headers"?: {"match": "all"|"any", "criteria": {name: value-or-null}}}``. The
id is a JSON string or number and is echoed back exactly as given. Without a
``subscriber``, a subscription is its own subscriber (``str(id)``; an id that
is not a valid subscriber name gets a stable surrogate name instead, as the
name only decides shared-subscription choices here). Other fields are ignored.
All subscriptions go into one exchange of the given dialect.

``TOPICS.jsonl``: one JSON object a line, ``{"topic", "headers"?: {name:
value}, "message_id"?}``; the message id defaults to the line's 0-based line
number in the file, as a string.

stdout: one JSON object per topic line, in input order: ``{"topic": ...,
"subscriptions": [matched ids]}`` (numbers first, numerically, then strings,
lexicographically) or ``{"topic": ..., "error": "reason"}``.

stderr: one JSON object per rejected subscription, ``{"id": ..., "error":
"reason"}``; the first of several lines with the same id wins, later ones are
rejected.

Exit status 0 when both files were read (rejections included); 2, with a
one-line message on stderr and nothing on stdout, when a file cannot be read
or a non-blank line is not a JSON object. Blank lines are skipped.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import IO, Iterator

from .errors import CompilerError, HeaderCriteriaError, HeaderError, SubscriptionError, TopicError
from .grammar import parse_dialect
from .headers import HeaderCriteria
from .index import RoutingIndex
from .matcher import Matcher
from .subscription import Subscription, validate_subscriber

EXCHANGE = "offline"
"""The one exchange every offline subscription and topic belongs to."""

EXIT_OK = 0
EXIT_BAD_INPUT = 2


class _InputError(Exception):
    """A file that cannot be read or is not JSON Lines; ends the run."""


def run_match(dialect: str, subscriptions_path: str, topics_path: str, stdout: IO[str], stderr: IO[str]) -> int:
    """Run ``bitroute match`` (see the module docstring); returns the exit status."""
    try:
        chosen = parse_dialect(dialect)
        subscriptions = list(_read_jsonl(subscriptions_path, "subscriptions"))
        topics = list(_read_jsonl(topics_path, "topics"))
    except (_InputError, ValueError) as exc:
        stderr.write(f"bitroute match: {exc}\n")
        return EXIT_BAD_INPUT

    index = RoutingIndex({EXCHANGE: chosen})
    original_ids: dict[str, object] = {}
    for _, record in subscriptions:
        given_id = record.get("id")
        try:
            sub = _subscription(record)
            if sub.id in original_ids:
                raise SubscriptionError(f"duplicate subscription id {json.dumps(given_id)}")
            index.upsert(sub)
        except CompilerError as exc:
            stderr.write(_dumps({"id": given_id, "error": str(exc)}) + "\n")
            continue
        original_ids[sub.id] = given_id

    matcher = Matcher(index.snapshot(0, {}))
    for line_number, record in topics:
        topic = record.get("topic")
        try:
            headers, message_id = _message(record, line_number)
            deliveries = matcher.match(EXCHANGE, topic, headers, message_id)
        except CompilerError as exc:
            stdout.write(_dumps({"topic": topic, "error": str(exc)}) + "\n")
            continue
        ids = [original_ids[sub_id] for delivery in deliveries for sub_id in delivery.subscription_ids]
        ids.sort(key=_id_order)
        stdout.write(_dumps({"topic": topic, "subscriptions": ids}) + "\n")
    return EXIT_OK


def _read_jsonl(path: str, what: str) -> Iterator[tuple[int, dict]]:
    """``(0-based line number, object)`` for each non-blank line of ``path``."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise _InputError(f"cannot read {what} file {path}: {exc}") from None
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _InputError(f"{what} file {path}, line {number + 1}: not JSON ({exc})") from None
        if not isinstance(record, dict):
            raise _InputError(f"{what} file {path}, line {number + 1}: not a JSON object")
        yield number, record


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _subscription(record: dict) -> Subscription:
    if "id" not in record:
        raise SubscriptionError("missing field 'id'")
    given_id = record["id"]
    if not (_is_number(given_id) or (isinstance(given_id, str) and given_id)):
        raise SubscriptionError(f"id must be a non-empty string or a number, not {json.dumps(given_id)}")
    if "filter" not in record:
        raise SubscriptionError("missing field 'filter'")
    if not isinstance(record["filter"], str):
        raise SubscriptionError(f"field 'filter' must be a string, not {json.dumps(record['filter'])}")
    subscriber = record.get("subscriber")
    if subscriber is None:
        subscriber = _implicit_subscriber(given_id)
    headers = None
    if record.get("headers") is not None:
        try:
            headers = HeaderCriteria.from_json(record["headers"])
        except HeaderCriteriaError as exc:
            raise SubscriptionError(str(exc)) from None
    return Subscription(json.dumps(given_id), EXCHANGE, subscriber, record["filter"], headers)


def _implicit_subscriber(given_id: object) -> str:
    name = str(given_id)
    try:
        return validate_subscriber(name)
    except SubscriptionError:
        return "_" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def _message(record: dict, line_number: int) -> tuple[dict[str, str | None] | None, str]:
    headers = record.get("headers")
    if headers is not None:
        if not isinstance(headers, dict) or not all(v is None or isinstance(v, str) for v in headers.values()):
            raise HeaderError(f"headers must be an object of string or null values, not {json.dumps(headers)}")
    message_id = record.get("message_id", str(line_number))
    if not isinstance(message_id, str):
        raise TopicError(f"message_id must be a string, not {json.dumps(message_id)}")
    return headers, message_id


def _id_order(value: object) -> tuple[int, object]:
    return (0, value) if _is_number(value) else (1, value)


def _dumps(obj: object) -> str:
    # ASCII-escaped: a JSON string may carry a lone surrogate ("\udc80"),
    # which a UTF-8 stream cannot encode.
    return json.dumps(obj)

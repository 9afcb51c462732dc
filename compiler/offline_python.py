"""The Python reference path of offline matching (:func:`compiler.offline.match_files`),
for the files the kernel does not take: see :mod:`compiler.offline` for the
contract.

One ``json.loads`` per line; the subscriptions go through
:meth:`~compiler.index.RoutingIndex.upsert` (its checks name every
rejection), the topics through :meth:`~compiler.matcher.Matcher.match` (the
grammar names every error, header criteria and shared groups apply per
message). The kernel path must write what this path writes, byte for byte
(tests/compiler/test_offline.py).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator

from .errors import CompilerError, HeaderCriteriaError, HeaderError, InputFileError, SubscriptionError, TopicError
from .headers import HeaderCriteria
from .index import RoutingIndex
from .matcher import Matcher
from .offline import EXCHANGE, OfflineResult, read_file
from .shared import shared_filters
from .subscription import Subscription, validate_subscriber

BLOCK_ROWS = 8192
"""Topic lines per output chunk."""

MEMO_CHARS = 64 << 20
"""Bound of the output lines kept for topics that repeat."""


def python_result(dialect, subscriptions_path: str, topics_path: str) -> OfflineResult:
    """The result of a pair of files (see the module docstring)."""
    subs_records = list(_records(read_file(subscriptions_path, "subscriptions"), subscriptions_path, "subscriptions"))
    topics_records = list(_records(read_file(topics_path, "topics"), topics_path, "topics"))
    subs = _Subscriptions(dialect, subs_records)
    return OfflineResult(subs.rejections, _lines(subs, topics_records))


def _records(data: bytes, path: str, what: str) -> Iterator[tuple[int, dict]]:
    """``(0-based line number, object)`` for each non-blank line."""
    lines = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n").splitlines()
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputFileError(f"{what} file {path}, line {number + 1}: not JSON ({exc})") from None
        if not isinstance(record, dict):
            raise InputFileError(f"{what} file {path}, line {number + 1}: not a JSON object")
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


def _rejection(given_id: object, reason: str) -> str:
    # ASCII-escaped: a JSON string may carry a lone surrogate ("\udc80"),
    # which a UTF-8 stream cannot encode.
    return json.dumps({"id": given_id, "error": reason})


class _Subscriptions:
    """The subscriptions of a file, upserted one line at a time: ``matcher``
    over the accepted ones, ``rejections`` (JSON lines) for the others."""

    def __init__(self, dialect, records: list[tuple[int, dict]]) -> None:
        index = RoutingIndex({EXCHANGE: dialect})
        self.rejections: list[str] = []
        self.given_ids: dict[str, object] = {}
        """Internal id (``json.dumps`` of the id as given, also its output text) -> the id as given."""
        # Output order: ids as given by _id_order, ties as the deliveries
        # list them (subscriber, then internal id).
        order_keys: dict[str, tuple] = {}
        for _, record in records:
            given_id = record.get("id")
            try:
                sub = _subscription(record)
                if sub.id in self.given_ids:
                    raise SubscriptionError(f"duplicate subscription id {json.dumps(given_id)}")
                index.upsert(sub)
            except CompilerError as exc:
                self.rejections.append(_rejection(given_id, str(exc)))
                continue
            self.given_ids[sub.id] = given_id
            order_keys[sub.id] = (_id_order(given_id), sub.subscriber, sub.id)
        snapshot = index.snapshot(0, {})
        self.matcher = Matcher(snapshot)
        self.lines: dict[str, str] | None = None
        """Output lines by topic (at most :data:`MEMO_CHARS`), when no
        subscription has header criteria or a shared group: then a line
        depends only on its topic."""
        self.lines_chars = 0
        if not index.has_header_criteria and not shared_filters(snapshot).any():
            self.lines = {}
        self.rank = {sub_id: position for position, sub_id in enumerate(sorted(order_keys, key=order_keys.__getitem__))}
        """Internal id -> its position in every output line."""

    def line(self, record: dict, line_number: int) -> str:
        """The output line of one topic line."""
        topic = record.get("topic")
        try:
            headers, message_id = _message(record, line_number)
        except CompilerError as exc:
            return _error_line(topic, exc)
        if self.lines is None or topic.__class__ is not str:
            return self._line(topic, headers, message_id)
        line = self.lines.get(topic)
        if line is None:
            line = self._line(topic, headers, message_id)
            if self.lines_chars + len(line) <= MEMO_CHARS:
                self.lines[topic] = line
                self.lines_chars += len(line)
        return line

    def _line(self, topic: object, headers, message_id: str) -> str:
        try:
            # Any JSON value: match() raises TopicError for one that is not a str.
            deliveries = self.matcher.match(EXCHANGE, topic, headers, message_id)  # type: ignore[arg-type]
        except CompilerError as exc:
            return _error_line(topic, exc)
        ids = [sub_id for delivery in deliveries for sub_id in delivery.subscription_ids]
        ids.sort(key=self.rank.__getitem__)
        # An internal id is json.dumps of the id as given: the line is
        # json.dumps({"topic": topic, "subscriptions": [ids as given]}).
        return f'{{"topic": {json.dumps(topic)}, "subscriptions": [{", ".join(ids)}]}}\n'


def _error_line(topic: object, exc: CompilerError) -> str:
    return json.dumps({"topic": topic, "error": str(exc)}) + "\n"


def _lines(subs: _Subscriptions, records: list[tuple[int, dict]]) -> Iterator[str]:
    lines: list[str] = []
    for line_number, record in records:
        lines.append(subs.line(record, line_number))
        if len(lines) >= BLOCK_ROWS:
            yield "".join(lines)
            lines = []
    if lines:
        yield "".join(lines)

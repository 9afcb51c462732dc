"""Reading the input columns of ``Matcher.match_columns`` and ``Matcher.match``:
routing keys (Kafka bytes or str) to topics, and message headers reduced to
the names some header criterion mentions. Bad input becomes a reason
(:class:`~compiler.errors.TopicError`, :class:`~compiler.errors.HeaderError`),
never a crash of the batch."""

from __future__ import annotations

from collections.abc import Mapping

from schemas.records import PUBLISHER_HEADER

from .errors import HeaderError, TopicError, quote
from .headers import decode_header_value
from .text import is_utf8_text

NO_HEADERS: frozenset = frozenset()
MALFORMED = object()
"""Stands for a batch row's unreadable headers: the row is rejected."""


def decode_keys(keys: list) -> tuple[list[str | None], dict[int, str]]:
    """Routing keys as topics (``None`` where unusable) and why each unusable one is."""
    try:
        return [key.decode("utf-8") for key in keys], {}
    except (AttributeError, UnicodeDecodeError):
        pass  # not all valid bytes: key by key
    topics: list[str | None] = []
    errors: dict[int, str] = {}
    for i, key in enumerate(keys):
        try:
            topics.append(decode_key(key))
        except TopicError as exc:
            topics.append(None)
            errors[i] = str(exc)
    return topics, errors


def decode_key(key: object) -> str:
    """One routing key as a topic; raises :class:`TopicError` naming the problem."""
    if key is None:
        raise TopicError("missing routing key")
    if key.__class__ is bytes:
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TopicError(f"routing key is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    if key.__class__ is not str:
        raise TopicError(f"routing key must be bytes or a string, not {type(key).__name__}")
    if not is_utf8_text(key):
        raise TopicError(f"routing key is not valid UTF-8 text: {quote(key)}")
    return key


def relevant_mapping(pairs) -> dict[str, list[str | None]]:
    """(name, value) pairs as the ``name -> [values]`` mapping criteria read."""
    relevant: dict[str, list[str | None]] = {}
    for name, value in pairs:
        relevant.setdefault(name, []).append(value)
    return relevant


def relevant_headers(
    headers: Mapping[str, str | bytes | None] | None, names: frozenset[str]
) -> dict[str, list[str | None]]:
    """``headers`` of :meth:`Matcher.match` reduced to ``names``, values decoded."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise HeaderError(f"headers must be a mapping of name to value, not {type(headers).__name__}")
    relevant: dict[str, list[str | None]] = {}
    for name, value in headers.items():
        if type(name) is not str:
            raise HeaderError(f"header name must be a string, not {quote(name)}")
        value = header_value(name, value)
        if name in names:
            relevant[name] = [value]
    return relevant


def frame_headers(headers: list, names: frozenset[str], errors: list[str | None]) -> list[object]:
    """Per batch row, the relevant (name, value) header pairs; a row with
    malformed headers gets ``MALFORMED`` and its reason in ``errors[i]``."""
    out: list[object] = []
    for i, entries in enumerate(headers):
        relevant: object = NO_HEADERS
        if entries is not None:
            try:
                relevant = relevant_entries(entries, names)
            except HeaderError as exc:
                errors[i] = str(exc)
                relevant = MALFORMED
        out.append(relevant)
    return out


def header_value(name: str, value: object) -> str | None:
    if value is None or value.__class__ is str:
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return decode_header_value(value)
    raise HeaderError(f"header {quote(name)} must have a bytes, str or null value, not {type(value).__name__}")


def relevant_entries(entries: object, names: frozenset[str]) -> frozenset:
    """The (name, decoded value) pairs of Kafka header ``entries`` whose name
    is in ``names``; of a repeated name, the last entry (Kafka's
    ``lastHeader`` convention)."""
    if isinstance(entries, (str, bytes)) or not hasattr(entries, "__iter__"):
        raise HeaderError(f"headers must be a sequence of (key, value) entries, not {type(entries).__name__}")
    out: dict[str, str | None] = {}
    for entry in entries:
        if isinstance(entry, Mapping):
            try:
                name, value = entry["key"], entry["value"]
            except KeyError:
                raise HeaderError(f"header entry needs 'key' and 'value': {quote(entry)}") from None
        elif isinstance(entry, (tuple, list)) and len(entry) == 2:
            name, value = entry
        else:
            raise HeaderError(f"header entry must be a (key, value) pair or mapping: {quote(entry)}")
        if type(name) is not str:
            raise HeaderError(f"header name must be a string, not {quote(name)}")
        if name in names:
            out[name] = header_value(name, value)
    return frozenset(out.items()) if out else NO_HEADERS


def publisher_of(entries) -> str | None:
    """The last ``publisher`` header of one batch row's Kafka header entries (``None``, or
    ``(key, value)`` pairs or mappings with ``"key"`` and ``"value"``), as text; ``None``
    when absent, not UTF-8 or malformed (a malformed row is rejected by the matcher)."""
    if entries is None:
        return None
    found = None
    for entry in entries:
        if isinstance(entry, Mapping):
            name, value = entry.get("key"), entry.get("value")
        elif isinstance(entry, (tuple, list)) and len(entry) == 2:
            name, value = entry
        else:
            return None
        if name == PUBLISHER_HEADER:
            found = value
    if found is None or found.__class__ is str:
        return found
    return decode_header_value(found) if isinstance(found, (bytes, bytearray, memoryview)) else None

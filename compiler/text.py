"""UTF-8 text checks for every string that ends up in a snapshot or a Kafka record."""

from __future__ import annotations

from .errors import quote


def is_utf8_text(value: str) -> bool:
    """Whether ``value`` encodes to UTF-8, i.e. holds no lone surrogate
    (Python strings can; Kafka keys, JSON and Arrow strings cannot)."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_utf8_size(text: str, max_bytes: int, what: str, error: type[Exception]) -> None:
    """Raise ``error`` naming ``what`` when ``text`` is not UTF-8 text or its
    UTF-8 encoding is longer than ``max_bytes`` (a dialect's length rule)."""
    if len(text) <= max_bytes // 4 and text.isascii():
        return
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise error(f"{what} is not valid UTF-8 text: {quote(text)}") from None
    if size > max_bytes:
        raise error(f"{what} is {size} bytes, longer than {max_bytes}: {quote(text)}")

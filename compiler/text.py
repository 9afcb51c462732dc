"""UTF-8 text checks for every string that ends up in a snapshot or a Kafka record."""

from __future__ import annotations


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

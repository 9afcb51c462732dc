"""AMQP topic-exchange grammar, as RabbitMQ implements it.

Routing keys (topics)
    Any UTF-8 string of at most 255 bytes (an AMQP 0-9-1 short string).
    Words are separated by ``.``; empty words are words (``a..b`` has three
    words, ``a.`` two, ``.`` two). The empty routing key has *zero* words
    (RabbitMQ's ``split_topic_key(<<>>) -> []``). ``*`` and ``#`` in a routing
    key are ordinary characters.

Binding keys (filters)
    The same strings: any UTF-8 string of at most 255 bytes. A word that is
    exactly ``*`` matches exactly one word; a word that is exactly ``#``
    matches zero or more words. ``#`` may appear anywhere and any number of
    times (RabbitMQ 4.3.5 caps bindings at two ``#``; we do not, and match
    such filters without backtracking: the kernel's trie visits each
    (filter word, key position) state once). A wildcard character inside a longer word is a
    literal (``a*`` matches only the word ``a*``).

Valid filters::

    ""            (matches only the empty routing key)
    "a.b.c"   "a..b"   "."   "a."   "*"   "#"   "*.b.*"   "#.c"   "a.#"
    "a.#.c"   "#.#"   "#.b.#"   "a.#.b.#.c"   "*.#"   "a*.b#"   "ü.€"

Invalid filters::

    a binding key over 255 UTF-8 bytes ("a" * 256)
    a string that is not valid Unicode text ("a\\udc80": a lone surrogate)
    anything that is not a string (None, b"a.b", 42)

Valid, but not matching the routing key ``a.b.c``::

    "a.b"   "a.*"   "*.b"   "b.c.a"   "a.b.d"   "a.b.c.*"   "#.b"   "a.#.d"
    "*.*.*.*"   "a.*.#.*.*"   "a*.b.c"   ""

Matching is RabbitMQ's: ``#`` matches the empty routing key, ``*`` does not;
``#.#`` matches what ``#`` matches; ``a.#.b`` matches ``a.b`` and ``a.x.y.b``.
"""

from __future__ import annotations

from .errors import FilterError, TopicError, quote
from .pattern import ParsedFilter
from .text import check_utf8_size

SEPARATOR = "."
ONE = "*"
MANY = "#"
MAX_BYTES = 255
"""Longest routing key or binding key, in UTF-8 bytes."""

DOLLAR_RULE = False
"""AMQP has no rule for topics starting with ``$``."""

SHARE_PREFIX = None
"""AMQP has no shared subscriptions."""

_MAX_SAFE_CHARS = MAX_BYTES // 4
"""Strings of at most this many characters cannot exceed :data:`MAX_BYTES`."""


def split(text: str) -> list[str]:
    """The words of a routing or binding key (the empty key has none)."""
    return text.split(SEPARATOR) if text else []


def _check_size(text: str, what: str, error: type[Exception]) -> None:
    check_utf8_size(text, MAX_BYTES, what, error)


def parse_filter(text: str) -> ParsedFilter:
    """Validate a binding key; raises :class:`FilterError`."""
    if type(text) is not str:
        raise FilterError(f"binding key must be a string, not {type(text).__name__}: {quote(text)}")
    _check_size(text, "binding key", FilterError)
    return ParsedFilter(text, tuple(split(text)), None)


def parse_topic(key: str) -> list[str]:
    """Validate a routing key and return its words; raises :class:`TopicError`."""
    if key.__class__ is not str:
        raise TopicError(f"routing key must be a string, not {type(key).__name__}: {quote(key)}")
    if len(key) > _MAX_SAFE_CHARS or not key.isascii():
        _check_size(key, "routing key", TopicError)
    return key.split(SEPARATOR) if key else []

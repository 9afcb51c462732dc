"""MQTT 3.1.1 / 5.0 topic grammar.

Topic names (topics)
    1 to 65535 bytes of UTF-8, without U+0000 and without the wildcard
    characters ``+`` and ``#``. Levels are separated by ``/``; empty levels
    are levels (``/a`` has two levels, ``a/`` two, ``/`` two).

Topic filters
    1 to 65535 bytes of UTF-8 without U+0000. ``+`` matches exactly one
    level; ``#`` matches the parent level and every descendant (``a/#``
    matches ``a``, ``a/b`` and ``a/b/c``) and must be the last level. A
    wildcard must occupy a whole level. A filter whose first level is a
    wildcard does not match a topic starting with ``$`` (``#`` does not match
    ``$SYS/x``; ``$SYS/#`` does).

Shared subscriptions (MQTT 5)
    ``$share/<group>/<filter>``: ``<group>`` is at least one character
    without ``/``, ``+`` or ``#``; ``<filter>`` is a valid topic filter. Each
    matching message goes to exactly one member of the group.

Valid filters::

    "a/b/+"   "a/+/c"   "a/#"   "a/b/#"   "#"   "+/b/c"   "+/+/+"   "+"   "/"
    "/+"   "+/"   "//"   "sport/tennis/player1/#"   "$SYS/#"   "$SYS/+/x"
    "a/*"   "$share/g/a/+"   "$share/g/#"   "$share/g/$SYS/#"   "$share"

Invalid filters::

    ""   "a/#/c"   "a+/b/c"   "a/b#"   "#/"   "##"   "a/++"   "a\\x00b"
    "$share/g"   "$share/g/"   "$share//a"   "$share/g+/a"   "$share/#/a"
    "$share/g/a/#/b"   a filter over 65535 UTF-8 bytes

Valid, but not matching the topic ``a/b/c``::

    "a/b"   "a/+"   "+/b"   "b/c/a"   "a/b/d"   "a/b/c/+"   "+/+"   "a/b/c/d/#"

Invalid topics::

    ""   "a/+"   "a/#"   "+"   "a\\x00b"   a topic over 65535 UTF-8 bytes
"""

from __future__ import annotations

from .errors import FilterError, TopicError, quote
from .pattern import ParsedFilter
from .text import check_utf8_size

SEPARATOR = "/"
ONE = "+"
MANY = "#"
MAX_BYTES = 65535
"""Longest topic name or topic filter, in UTF-8 bytes."""

SHARE_PREFIX = "$share/"
"""A filter starting with this is a shared subscription, ``$share/<group>/<filter>``:
the one place the prefix is written (the kernel is handed it, see
:func:`compiler.grammar.kernel_grammar`)."""

DOLLAR_RULE = True
"""Topics starting with ``$`` are not matched by a filter whose first level is a wildcard."""

_MAX_SAFE_CHARS = MAX_BYTES // 4


def _check_text(text: str, what: str, error: type[Exception]) -> None:
    if not text:
        raise error(f"{what} must not be empty")
    if "\x00" in text:
        raise error(f"{what} must not contain U+0000: {quote(text)}")
    check_utf8_size(text, MAX_BYTES, what, error)


def _split_share(text: str) -> tuple[str | None, str]:
    """Split ``$share/<group>/<filter>`` into group and filter (validated)."""
    if not text.startswith(SHARE_PREFIX):
        return None, text
    group, slash, inner = text[len(SHARE_PREFIX):].partition(SEPARATOR)
    if not slash:
        raise FilterError(f"shared subscription needs '$share/<group>/<filter>': {quote(text)}")
    if not group:
        raise FilterError(f"shared subscription group must not be empty: {quote(text)}")
    if "+" in group or "#" in group:
        raise FilterError(f"shared subscription group must not contain '+' or '#': {quote(text)}")
    if not inner:
        raise FilterError(f"shared subscription needs a filter after the group: {quote(text)}")
    return group, inner


def parse_filter(text: str) -> ParsedFilter:
    """Validate a topic filter; raises :class:`FilterError`."""
    if type(text) is not str:
        raise FilterError(f"topic filter must be a string, not {type(text).__name__}: {quote(text)}")
    _check_text(text, "topic filter", FilterError)
    group, inner = _split_share(text)
    words = tuple(inner.split(SEPARATOR))
    if "+" not in inner and "#" not in inner:
        return ParsedFilter(text, words, group)
    last = len(words) - 1
    for i, word in enumerate(words):
        if "#" in word:
            if word != MANY:
                raise FilterError(f"'#' must occupy a whole level: {quote(text)}")
            if i != last:
                raise FilterError(f"'#' must be the last level: {quote(text)}")
        elif "+" in word and word != ONE:
            raise FilterError(f"'+' must occupy a whole level: {quote(text)}")
    return ParsedFilter(text, words, group)


def parse_topic(topic: str) -> list[str]:
    """Validate a topic name and return its levels; raises :class:`TopicError`."""
    if topic.__class__ is not str:
        raise TopicError(f"topic must be a string, not {type(topic).__name__}: {quote(topic)}")
    if "+" in topic or "#" in topic:
        raise TopicError(f"topic must not contain the wildcards '+' or '#': {quote(topic)}")
    # The common case inline (hot path); _check_text names the problem.
    if not topic or "\x00" in topic or len(topic) > _MAX_SAFE_CHARS or not topic.isascii():
        _check_text(topic, "topic", TopicError)
    return topic.split(SEPARATOR)


"""The dialect-neutral form of a validated filter, as both grammars return it.

A filter is a tuple of words; each word is a literal, the one-word wildcard
(``*`` in AMQP, ``+`` in MQTT) or the many-words wildcard (``#``). The
matching kernel (``kernel/``) walks every wildcard filter in one trie, so
nothing classifies filters further (snapshot format 1 kept a class per
filter; see :mod:`compiler.snapshot`).
"""

from __future__ import annotations

from typing import NamedTuple


class ParsedFilter(NamedTuple):
    """A validated filter.

    ``text`` is the filter as given; ``words`` the words that match topics
    (for an MQTT shared subscription, those after ``$share/<group>/``);
    ``share_group`` the MQTT share group or ``None``.
    """

    text: str
    words: tuple[str, ...]
    share_group: str | None

"""Dialect-neutral form of a parsed filter, and its *shape*.

A filter is a tuple of words; each word is a literal, the one-word wildcard
(``*`` in AMQP, ``+`` in MQTT) or the many-words wildcard (``#``). The index
classifies each filter once, and the snapshot records the class as the
filter's code (``filter_code``, with the snapshot's ``shapes``):

``EXACT``
    no wildcard.
``SHAPED``
    the wildcards form at most one *run* containing ``#`` (a run is a maximal
    sequence of adjacent wildcard words). Such a filter matches a topic iff
    the topic has the right number of words and its words at the filter's
    literal positions equal the filter's literals. Positions before the run
    count from the start (``0, 1, ...``), positions after it from the end
    (``-1, -2, ...``), so one position tuple serves every topic length.
``MULTI``
    two or more ``#`` runs separated by literal words (``#.a.#``,
    ``a.#.b.#``; AMQP only).

Matching does not read the classes: the kernel (``kernel/``) walks every
wildcard filter in one trie. They describe the filters in the snapshot
format, which keeps them so that snapshots stay readable across versions.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple


CODE_EXACT = 0
"""Filter code (snapshot ``filter_code``) of a wildcard-free filter."""
CODE_MULTI = 1
"""Filter code of a filter with several ``#`` runs."""
CODE_SHAPE_BASE = 2
"""Filter code of a shaped filter: ``CODE_SHAPE_BASE`` + its shape's index in the snapshot's shapes."""


class FilterKind(IntEnum):
    """The class of a filter; see the module docstring."""

    EXACT = 0
    SHAPED = 1
    MULTI = 2


class Shape(NamedTuple):
    """The length rule and literal positions shared by a family of filters.

    ``variable`` is true when the filter contains ``#``: it then matches
    topics of ``min_len`` words or more (``#`` may match zero words; in MQTT
    ``a/#`` matches ``a``), otherwise exactly ``min_len`` words. ``min_len``
    counts the filter's literal and one-word-wildcard words.
    """

    min_len: int
    variable: bool
    positions: tuple[int, ...]


class ParsedFilter(NamedTuple):
    """A validated filter.

    ``text`` is the filter as given; ``words`` the words that match topics
    (for an MQTT shared subscription, those after ``$share/<group>/``);
    ``share_group`` the MQTT share group or ``None``; ``shape`` is set for
    ``SHAPED`` filters only.
    """

    text: str
    words: tuple[str, ...]
    share_group: str | None
    kind: FilterKind
    shape: Shape | None


def classify(words: list[str] | tuple[str, ...], one: str, many: str) -> tuple[FilterKind, Shape | None]:
    """Classify a filter's words (see the module docstring).

    ``one`` and ``many`` are the dialect's wildcard words; any other word is a
    literal.
    """
    if one not in words and many not in words:
        return FilterKind.EXACT, None
    n = len(words)
    literals: list[int] = []
    first = last = -1
    for i, word in enumerate(words):
        if word == many:
            if first < 0:
                first = i
            last = i
        elif word != one:
            literals.append(i)
    if first < 0:
        return FilterKind.SHAPED, Shape(n, False, tuple(literals))
    if any(first < i < last for i in literals):
        return FilterKind.MULTI, None
    hashes = words.count(many)
    positions = tuple(i if i < first else i - n for i in literals)
    return FilterKind.SHAPED, Shape(n - hashes, True, positions)

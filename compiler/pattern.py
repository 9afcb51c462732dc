"""Dialect-neutral form of a parsed filter, and its *shape*.

A filter is a tuple of words; each word is a literal, the one-word wildcard
(``*`` in AMQP, ``+`` in MQTT) or the many-words wildcard (``#``). The index
never walks filters word by word at match time; it classifies each filter once:

``EXACT``
    no wildcard: found by one hash lookup of the whole topic string.
``SHAPED``
    the wildcards form at most one *run* containing ``#`` (a run is a maximal
    sequence of adjacent wildcard words). Such a filter matches a topic iff
    the topic has the right number of words and its words at the filter's
    literal positions equal the filter's literals. Positions before the run
    count from the start (``0, 1, ...``), positions after it from the end
    (``-1, -2, ...``), so one position tuple serves every topic length.
    Filters with the same :class:`Shape` live in one hash table keyed by their
    literal words: a topic costs one lookup per shape that exists for its
    length, whatever the number of subscriptions. A shape with no literal
    position at all (``#``, ``*.#``, ``+/+``) is a *catch-all*: it matches by
    topic length alone.
``MULTI``
    two or more ``#`` runs separated by literal words (``#.a.#``,
    ``a.#.b.#``; AMQP only): matched by :class:`compiler.nfa.FilterAutomaton`
    in time linear in the topic length, never by backtracking.
"""

from __future__ import annotations

from enum import IntEnum
from operator import itemgetter
from typing import Callable, NamedTuple


CODE_EXACT = 0
"""Filter code (snapshot ``filter_code``) of a wildcard-free filter."""
CODE_MULTI = 1
"""Filter code of a filter with several ``#`` runs."""
CODE_SHAPE_BASE = 2
"""Filter code of a shaped filter: ``CODE_SHAPE_BASE`` + its shape's index in the snapshot's shapes."""


class FilterKind(IntEnum):
    """How the index finds a filter; see the module docstring."""

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

    def applies_to(self, length: int) -> bool:
        """Whether a topic of ``length`` words can match this shape."""
        return length >= self.min_len if self.variable else length == self.min_len

    @property
    def first_wild(self) -> bool:
        """Whether the filter's first word is a wildcard (MQTT '$' rule)."""
        return 0 not in self.positions

    @property
    def catch_all(self) -> bool:
        """Whether the shape has no literal word: it matches by length alone."""
        return not self.positions

    def key_getter(self) -> Callable[[list[str]], str | tuple[str, ...]]:
        """The function picking a topic's (or filter's) words at this shape's
        literal positions: the word itself when there is one position, else
        their tuple.

        Precondition: the shape is not a catch-all and the word list has a
        length the shape applies to. Filters and topics go through the same
        getter, so the two agree.
        """
        return itemgetter(*self.positions)


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

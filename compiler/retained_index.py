"""The reverse match: which retained topics an MQTT filter matches.

A router keeps the topics that hold a retained message (MQTT 3.1.1 section
3.3.1.3, 5.0 section 3.3.1.3) and, when a new subscription is applied, runs its
filter *in reverse*: over the retained topics instead of a topic over the
filters. Two structures answer it, with one contract (:class:`RetainedTopics`):

- :class:`TopicTrie`, a walk: the topics' levels in a trie of dicts; a
  literal level follows one edge, ``+`` every edge, ``#`` collects the
  subtree (its own node included: ``a/#`` matches ``a``);
- :class:`LevelBitmaps`, per-level inverted bitmaps (the classic design of
  topic matching in message brokers, here turned round): each topic a slot,
  one roaring bitmap per (level, word) of the slots having that word at that
  level, one per level of the slots having that level at all; a filter is the
  intersection of its literal levels' bitmaps, its ``+`` levels' "has the
  level" bitmaps and its length (exactly n levels, or at least n - 1 before a
  trailing ``#``), smallest bitmap first.

Both apply the ``$`` rule (:data:`compiler.mqtt.DOLLAR_RULE`): a filter whose
first level is a wildcard does not match a topic starting with ``$``. Filters
are validated by :func:`compiler.mqtt.parse_filter`; a shared subscription's
filter (``$share/<group>/<filter>``) is answered as its inner filter (the
router delivers none at subscribe time, as MQTT 5.0 says, and does not ask).
Topics are validated by :func:`compiler.mqtt.parse_topic`.

Which one the router uses (:data:`RetainedIndex`) was measured, not assumed:
``python -m benchmarks retained-match`` at 1,000,000 topics, figures in
docs/benchmarks.md ("Retained messages: the reverse match").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from pyroaring import BitMap

from . import mqtt


def _filter_words(text: str) -> tuple[str, ...]:
    return mqtt.parse_filter(text).words


def _excludes_dollar(words: tuple[str, ...]) -> bool:
    return mqtt.DOLLAR_RULE and words[0] in (mqtt.ONE, mqtt.MANY)


class RetainedTopics(Protocol):
    """The retained topics of one MQTT exchange, matched by a filter in reverse."""

    def add(self, topic: str) -> None:
        """Hold ``topic`` (a no-op when held). Raises :class:`~compiler.TopicError`."""

    def discard(self, topic: str) -> None:
        """Forget ``topic`` (a no-op when not held)."""

    def match(self, filter_text: str) -> list[str]:
        """The held topics ``filter_text`` matches, in no particular order.
        Raises :class:`~compiler.FilterError`."""

    def __len__(self) -> int: ...

    def __contains__(self, topic: str) -> bool: ...


_END = ""
"""The trie's key of a node's own topic: no level word is compared with it as a key of a
child dict, because the children live in a dict of their own (see :class:`TopicTrie`)."""


class TopicTrie:
    """:class:`RetainedTopics` as a walk over a trie of the topics' levels.

    A node is ``[children: dict[word, node], topic or None]``; the cost of a match is
    the nodes it visits: one path per literal level, every child at ``+``, the whole
    subtree at ``#``.
    """

    def __init__(self, topics: Iterable[str] = ()) -> None:
        self._root: list = [{}, None]
        self._count = 0
        for topic in topics:
            self.add(topic)

    def __len__(self) -> int:
        return self._count

    def __contains__(self, topic: str) -> bool:
        node = self._root
        for word in topic.split(mqtt.SEPARATOR):
            node = node[0].get(word)
            if node is None:
                return False
        return node[1] is not None

    def add(self, topic: str) -> None:
        node = self._root
        for word in mqtt.parse_topic(topic):
            child = node[0].get(word)
            if child is None:
                child = node[0][word] = [{}, None]
            node = child
        if node[1] is None:
            node[1] = topic
            self._count += 1

    def discard(self, topic: str) -> None:
        path = [self._root]
        for word in topic.split(mqtt.SEPARATOR):
            child = path[-1][0].get(word)
            if child is None:
                return
            path.append(child)
        if path[-1][1] is None:
            return
        path[-1][1] = None
        self._count -= 1
        words = topic.split(mqtt.SEPARATOR)
        for depth in range(len(words), 0, -1):  # drop the nodes left empty
            node = path[depth]
            if node[0] or node[1] is not None:
                break
            del path[depth - 1][0][words[depth - 1]]

    def match(self, filter_text: str) -> list[str]:
        words = _filter_words(filter_text)
        found: list[str] = []
        nodes = [self._root]
        no_dollar = _excludes_dollar(words)
        for level, word in enumerate(words):
            if word == mqtt.MANY:
                for node in nodes:
                    _subtree(node, found, no_dollar and level == 0)
                return found
            following: list[list] = []
            for node in nodes:
                children = node[0]
                if word == mqtt.ONE:
                    if no_dollar and level == 0:
                        following.extend(c for w, c in children.items() if not w.startswith("$"))
                    else:
                        following.extend(children.values())
                else:
                    child = children.get(word)
                    if child is not None:
                        following.append(child)
            nodes = following
            if not nodes:
                return found
        found.extend(node[1] for node in nodes if node[1] is not None)
        return found


def _subtree(node: list, found: list[str], no_dollar_children: bool) -> None:
    """Every topic at or under ``node`` into ``found`` (iteratively: topics may be deep)."""
    if node[1] is not None:
        found.append(node[1])
    stack = [c for w, c in node[0].items() if not (no_dollar_children and w.startswith("$"))]
    while stack:
        current = stack.pop()
        if current[1] is not None:
            found.append(current[1])
        stack.extend(current[0].values())


class LevelBitmaps:
    """:class:`RetainedTopics` as per-level inverted bitmaps (module docstring).

    Each topic has a slot (slots of forgotten topics are reused); ``_words[level][word]``
    holds the slots with ``word`` at ``level``, ``_levels[level]`` the slots with a
    level ``level``, ``_dollar`` the slots of topics starting with ``$``.
    """

    def __init__(self, topics: Iterable[str] = ()) -> None:
        self._slots: dict[str, int] = {}
        self._topics: list[str | None] = []
        self._free: list[int] = []
        self._words: list[dict[str, BitMap]] = []
        self._levels: list[BitMap] = []
        self._dollar = BitMap()
        for topic in topics:
            self.add(topic)

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, topic: str) -> bool:
        return topic in self._slots

    def add(self, topic: str) -> None:
        if topic in self._slots:
            return
        levels = mqtt.parse_topic(topic)
        if self._free:
            slot = self._free.pop()
            self._topics[slot] = topic
        else:
            slot = len(self._topics)
            self._topics.append(topic)
        self._slots[topic] = slot
        while len(self._levels) < len(levels):
            self._levels.append(BitMap())
            self._words.append({})
        for level, word in enumerate(levels):
            self._levels[level].add(slot)
            bitmap = self._words[level].get(word)
            if bitmap is None:
                bitmap = self._words[level][word] = BitMap()
            bitmap.add(slot)
        if topic.startswith("$"):
            self._dollar.add(slot)

    def discard(self, topic: str) -> None:
        slot = self._slots.pop(topic, None)
        if slot is None:
            return
        for level, word in enumerate(topic.split(mqtt.SEPARATOR)):
            self._levels[level].discard(slot)
            bitmap = self._words[level][word]
            bitmap.discard(slot)
            if not bitmap:
                del self._words[level][word]
        self._dollar.discard(slot)
        self._topics[slot] = None
        self._free.append(slot)

    def match(self, filter_text: str) -> list[str]:
        words = _filter_words(filter_text)
        if words[-1] == mqtt.MANY:
            literal, length = words[:-1], None  # at least len(words) - 1 levels
        else:
            literal, length = words, len(words)
        sets: list[BitMap] = []
        for level, word in enumerate(literal):
            if level >= len(self._levels):
                return []
            if word == mqtt.ONE:
                sets.append(self._levels[level])
            else:
                bitmap = self._words[level].get(word)
                if bitmap is None:
                    return []
                sets.append(bitmap)
        exclude: BitMap | None = None
        if length is not None and length < len(self._levels):
            exclude = self._levels[length]  # topics with more levels than the filter
        if _excludes_dollar(words) and self._dollar:
            exclude = self._dollar if exclude is None else exclude | self._dollar
        if sets:
            sets.sort(key=len)
            result = BitMap.intersection(*sets) if len(sets) > 1 else BitMap(sets[0])
        elif self._levels:  # "#": every topic (each has a first level)
            result = BitMap(self._levels[0])
        else:
            return []
        if exclude is not None:
            result -= exclude
        topics = self._topics
        # The bitmaps hold live slots only (a free slot's topic is None).
        return [topic for slot in result if (topic := topics[slot]) is not None]


RetainedIndex = LevelBitmaps
"""The structure the router keeps per MQTT exchange: the faster of the two at
1,000,000 topics (docs/benchmarks.md, "Retained messages: the reverse match")."""

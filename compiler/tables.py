"""The lookup tables a :class:`~compiler.matcher.Matcher` builds from a snapshot.

Per exchange (:class:`ExchangeTables`): one hash table of the exact
(wildcard-free) filters keyed by the whole topic; one hash table per *shape*
(:mod:`compiler.pattern`) keyed by the topic's words at the shape's literal
positions; the catch-all filters (``#``, ``*.#``, ``+/+``) per topic length;
and one automaton (:mod:`compiler.nfa`) for AMQP filters with several ``#``
runs. Every table value is a *hit code* (see :class:`compiler.matcher.Matcher`),
or a tuple of hit codes when several filters share a key.

Per snapshot: each filter slot's subscriptions (:func:`filter_subscriptions`)
and each subscription slot's rank in (subscriber, id) order
(:func:`slot_ranks`), the order of every delivery list.
"""

from __future__ import annotations

import gc
from collections import deque
from contextlib import contextmanager
from types import ModuleType
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .columns import bitmap_of, bool_mask, numpy_of
from .nfa import FilterAutomaton
from .pattern import Shape

FILTER_TUPLE_MAX = 16
"""A filter shared by up to this many subscriptions maps to a tuple of their
slots; beyond, to a roaring bitmap (compact, and unions in C)."""

PLAN_CACHE_MAX_LENGTHS = 512
"""Per exchange, lookup plans are memoised for at most this many topic lengths."""


class Plan(NamedTuple):
    """What to look up for a topic of one length: (key getter, joined, table)
    triples (``joined``: the picked words are joined into the key),
    and the hit codes of the catch-all filters; ``dollar_lookups`` for MQTT
    topics starting with '$' (which no catch-all matches). The ``batch_``
    forms are (literal positions, table) pairs for the same lookups, for
    :func:`compiler.batch.collect_hits`."""

    lookups: tuple
    catch_all: tuple[int, ...]
    dollar_lookups: tuple
    batch_lookups: tuple
    batch_dollar_lookups: tuple


class ExchangeTables:
    """The lookup tables of one exchange (see the module docstring)."""

    __slots__ = (
        "name", "grammar", "parse_topic", "dollar_rule", "separator", "join", "exact", "shaped", "catch_alls",
        "automaton", "_plans", "_safe_chars",
    )

    def __init__(self, name: str, grammar: ModuleType) -> None:
        self.name = name
        self.grammar = grammar
        self.parse_topic = grammar.parse_topic
        self.dollar_rule = grammar.DOLLAR_RULE
        self.separator = grammar.SEPARATOR
        self.join = grammar.SEPARATOR.join
        self.exact: dict[str, int | tuple[int, ...]] = {}
        self.shaped: list[tuple[Shape, dict]] = []
        """Per shape, its table. The key of a topic or filter is its word at
        the shape's one literal position, or its words at the literal
        positions joined by the separator (which no word contains)."""
        self.catch_alls: list[tuple[Shape, tuple[int, ...]]] = []
        self.automaton: FilterAutomaton | None = None
        self._plans: dict[int, Plan] = {}
        self._safe_chars = grammar.MAX_BYTES // 4

    def hits(self, words: list[str], topic: str) -> list[int]:
        """Hit codes of the filters matching the topic (validated, split into ``words``)."""
        out: list[int] = []
        hit = self.exact.get(topic)
        if hit is not None:
            if hit.__class__ is int:
                out.append(hit)
            else:
                out += hit
        plan = self._plans.get(len(words))
        if plan is None:
            plan = self.plan(len(words))
        if self.dollar_rule and topic[0] == "$":
            lookups = plan.dollar_lookups
        else:
            lookups = plan.lookups
            out += plan.catch_all
        join = self.join
        for getter, joined, table in lookups:
            key = getter(words)
            hit = table.get(join(key) if joined else key)
            if hit is not None:
                if hit.__class__ is int:
                    out.append(hit)
                else:
                    out += hit
        if self.automaton is not None:
            out += self.automaton.match(words)
        return out

    def plan(self, length: int) -> Plan:
        """The lookups for topics of ``length`` words (memoised)."""
        plan = self._plans.get(length)
        if plan is not None:
            return plan
        applies = [(shape, table) for shape, table in self.shaped if shape.applies_to(length)]
        dollar = [(shape, table) for shape, table in applies if not shape.first_wild]
        catch_all = tuple(f for shape, fslots in self.catch_alls if shape.applies_to(length) for f in fslots)
        plan = Plan(
            tuple((shape.key_getter(), len(shape.positions) > 1, table) for shape, table in applies),
            catch_all,
            tuple((shape.key_getter(), len(shape.positions) > 1, table) for shape, table in dollar),
            tuple((shape.positions, table) for shape, table in applies),
            tuple((shape.positions, table) for shape, table in dollar),
        )
        if len(self._plans) < PLAN_CACHE_MAX_LENGTHS:
            self._plans[length] = plan
        return plan

    def suspicious_topics(self, column: pa.StringArray) -> list[int]:
        """Indices of the topics that splitting on the separator may get
        wrong: possibly invalid (wildcards or U+0000 in MQTT, maybe too long,
        not ASCII) or the empty AMQP routing key (zero words). The others are
        valid; their words are ``topic.split(separator)``."""
        odd = pc.or_(pc.greater(pc.utf8_length(column), self._safe_chars), pc.invert(pc.string_is_ascii(column)))
        if self.dollar_rule:
            odd = pc.or_(odd, pc.match_substring_regex(column, "^$|[+#\x00]"))
        else:
            odd = pc.or_(odd, pc.equal(column, ""))
        return np.flatnonzero(bool_mask(odd)).tolist()

    def add_exact(self, texts: list[str], codes: list[int]) -> None:
        self.exact.update(hash_table(texts, codes))

    def add_shape(self, shape: Shape, texts: list[str], codes: list[int]) -> None:
        """Add the filters ``texts`` (match parts) of one shape with their hit codes."""
        if shape.catch_all:
            self.catch_alls.append((shape, tuple(codes)))
            return
        getter, split, separator = shape.key_getter(), str.split, self.separator
        if len(shape.positions) == 1:
            keys = [getter(split(x, separator)) for x in texts]
        else:
            keys = [separator.join(getter(split(x, separator))) for x in texts]
        self.shaped.append((shape, hash_table(keys, codes)))

    def add_multi(self, texts: list[str], codes: list[int]) -> None:
        """Add the filters with several ``#`` runs (one automaton per exchange)."""
        grammar = self.grammar
        # Tens of thousands of node dicts and lists, all long-lived: with the
        # collector on, building them re-scanned the whole heap again and
        # again (0.4 of 1.2 CPU s of Matcher() at fanout 1M).
        with gc_paused():
            self.automaton = FilterAutomaton(
                zip((x.split(self.separator) for x in texts), codes), grammar.ONE, grammar.MANY
            )


@contextmanager
def gc_paused():
    """No cyclic garbage collection inside the block (restored after, if it
    was on): for building long-lived tables of many objects, which the
    collector would otherwise re-scan over and over."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def hash_table(keys: list, codes: list[int]) -> dict:
    """``keys[i] -> codes[i]``; a key held by several filters maps to a tuple of their codes."""
    table = dict(zip(keys, codes))
    if len(table) == len(codes):
        return table
    table = {}
    for key, code in zip(keys, codes):
        prev = table.get(key)
        if prev is None:
            table[key] = code
        elif prev.__class__ is int:
            table[key] = (prev, code)
        else:
            table[key] = prev + (code,)
    return table


def slot_ranks(names: pa.StringArray, owners: np.ndarray, ids: pa.StringArray) -> np.ndarray:
    """``rank[slot]``: the position of each subscription slot in (subscriber
    name, id) order, the order of every delivery list. Subscriber names are
    ranked first (there are few), so the big sort compares integers before
    strings."""
    name_rank = np.empty(len(names), dtype=np.int64)
    name_rank[numpy_of(pc.sort_indices(names))] = np.arange(len(names))
    table = pa.table({"owner": name_rank[owners] if len(names) else owners, "id": ids})
    order = numpy_of(pc.sort_indices(table, sort_keys=[("owner", "ascending"), ("id", "ascending")]))
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank


def filter_subscriptions(sub_filter: np.ndarray, live: np.ndarray, n_filters: int) -> tuple[list, np.ndarray, tuple]:
    """The subscriptions of each filter slot, three ways: ``fsubs[filter]`` is
    its only subscription slot, a tuple of a few, or a bitmap of many (-1: a
    free filter slot); ``single[filter]`` the only slot (else -1), as numpy;
    and CSR arrays ``(start, count, slots)`` with the filter's slots at
    ``slots[start:start + count]``."""
    filters = sub_filter[live]
    order = np.argsort(filters, kind="stable")
    by_filter = live[order]
    counts = np.bincount(filters, minlength=n_filters)
    starts = np.zeros(n_filters + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    single = np.full(n_filters, -1, dtype=np.int64)
    ones = counts == 1
    single[ones] = by_filter[starts[:-1][ones]]
    fsubs: list = single.tolist()
    several = np.flatnonzero(counts > 1)
    few = several[counts[several] <= FILTER_TUPLE_MAX]
    if len(few):
        # One C-level pass: a tuple per filter, set into ``fsubs`` in place.
        slots = by_filter.tolist()
        bounds = map(slice, starts[few].tolist(), starts[few + 1].tolist())
        deque(map(fsubs.__setitem__, few.tolist(), map(tuple, map(slots.__getitem__, bounds))), maxlen=0)
    for f in several[counts[several] > FILTER_TUPLE_MAX].tolist():
        fsubs[f] = bitmap_of(by_filter[starts[f]:starts[f + 1]])
    return fsubs, single, (starts[:-1], counts.astype(np.int64), by_filter.astype(np.int64))


def filter_groups(exchanges: np.ndarray, codes: np.ndarray, texts: pa.StringArray):
    """Live filter slots grouped by (exchange, filter code): yields ``(exchange, code, fslots)``."""
    live = np.flatnonzero(bool_mask(pc.is_valid(texts)))
    keys = (exchanges[live].astype(np.uint64) << np.uint64(32)) | codes[live].astype(np.uint64)
    order = np.argsort(keys, kind="stable")
    keys, live = keys[order], live[order]
    bounds = np.flatnonzero(np.diff(keys)) + 1
    for start, end in zip(np.concatenate([[0], bounds]).tolist(), np.concatenate([bounds, [len(keys)]]).tolist()):
        if start < end:
            key = int(keys[start])
            yield key >> 32, key & 0xFFFFFFFF, live[start:end]

"""Building blocks of ``match_frame``: a batch of distinct topics matched
together, resolved and laid out with numpy instead of per-topic Python objects.

:func:`collect_hits` finds every hit code of every topic with C-level loops
(``map`` of ``dict.get``, ``str.split``, ``itemgetter`` over the whole batch)
over the same hash tables :meth:`compiler.matcher.Matcher.match` uses, one
pass per lookup of a topic-length group rather than one Python call per
topic; topics are validated with Arrow kernels and only the suspicious ones
go through the dialect's ``parse_topic`` (for its exact error). What the
batch saves after the lookup: expanding filter slots into subscription slots,
sorting, and building the Arrow output, done once per batch over flat arrays
(:func:`expand`, :class:`Units`). ``benchmarks/compiler_bench.py`` ("batch")
measures this path; run it before changing it.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, repeat

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .columns import bool_mask, numpy_of
from .errors import TopicError

_EMPTY = np.zeros(0, dtype=np.int64)
_MISS = -(1 << 62)
"""``dict.get`` default: no hit code is this small (codes are > -2**33)."""


def collect_hits(table, topics: list[str]) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
    """``(owners, codes, errors)``: every hit code of every topic of
    ``table`` (a :class:`compiler.tables.ExchangeTables`), with the index of
    its topic, and why each invalid topic was refused. Same hits as
    ``table.hits`` topic by topic, in another order.

    Topics are split and their shape keys picked and joined by Arrow kernels
    (no Python list per topic: allocating them also set off the garbage
    collector over the matcher's million objects); only the key lookups
    are Python ``dict.get`` calls, run by ``map``."""
    n = len(topics)
    errors: dict[int, str] = {}
    if n == 0:
        return _EMPTY, _EMPTY, errors
    column = pa.array(topics, type=pa.string())
    parts = pc.split_pattern(column, table.separator)
    offsets = numpy_of(parts.offsets).astype(np.int64)
    starts, ends = offsets[:-1], offsets[1:]
    values = parts.values
    lengths = ends - starts
    odd_words: dict[int, list[str]] = {}
    for t in table.suspicious_topics(column):
        try:
            words = table.parse_topic(topics[t])
        except TopicError as exc:
            errors[t] = str(exc)
            lengths[t] = -1
            continue
        if len(words) != lengths[t]:  # the empty AMQP routing key: no words
            odd_words[t] = words
            lengths[t] = len(words)
    owners: list[np.ndarray] = []
    codes: list[np.ndarray] = []
    _gather(table.exact.get, topics, np.arange(n, dtype=np.int64), owners, codes)
    if table.dollar_rule:
        group_key = lengths * 2 + bool_mask(pc.starts_with(column, "$"))
    else:
        group_key = lengths * 2
    order = np.argsort(group_key, kind="stable")
    keys = group_key[order]
    bounds = np.flatnonzero(np.diff(keys)) + 1
    automaton, separator = table.automaton, table.separator
    for start, end in zip([0, *bounds.tolist()], [*bounds.tolist(), n]):
        key = int(keys[start])
        if key < 0:
            continue  # invalid topics
        members = order[start:end]
        plan = table.plan(key >> 1)
        if key & 1:
            lookups = plan.batch_dollar_lookups
        else:
            lookups = plan.batch_lookups
            if plan.catch_all:
                owners.append(np.repeat(members, len(plan.catch_all)))
                codes.append(np.tile(np.array(plan.catch_all, dtype=np.int64), len(members)))
        if lookups:
            member_starts, member_ends = starts[members], ends[members]
            for positions, lookup in lookups:
                picked = [values.take(pa.array(member_starts + p if p >= 0 else member_ends + p)) for p in positions]
                joined = picked[0] if len(picked) == 1 else pc.binary_join_element_wise(*picked, separator)
                _gather(lookup.get, joined.to_pylist(), members, owners, codes)
        if automaton is not None:
            group_words = [odd_words[t] if t in odd_words else topics[t].split(separator) for t in members.tolist()]
            found = list(map(automaton.match, group_words))
            counts = np.fromiter(map(len, found), dtype=np.int64, count=len(found))
            if counts.any():
                owners.append(np.repeat(members, counts))
                codes.append(np.fromiter(chain.from_iterable(found), dtype=np.int64, count=int(counts.sum())))
    if not owners:
        return _EMPTY, _EMPTY, errors
    return np.concatenate(owners), np.concatenate(codes), errors


def _gather(get, keys, members: np.ndarray, owners: list, codes: list) -> None:
    """Look every key up with ``get`` (a table's ``dict.get``); append the hits'
    topics (``members``) and codes. A table value is a hit code, or a tuple
    of them when several filters share the key."""
    found = list(map(get, keys, repeat(_MISS)))
    try:
        values = np.fromiter(found, dtype=np.int64, count=len(found))
    except TypeError:  # some key held by several filters
        for i, value in enumerate(found):
            if value.__class__ is tuple:
                owners.append(np.full(len(value), members[i], dtype=np.int64))
                codes.append(np.array(value, dtype=np.int64))
                found[i] = _MISS
        values = np.fromiter(found, dtype=np.int64, count=len(found))
    hit = values != _MISS
    if hit.any():
        owners.append(members[hit])
        codes.append(values[hit])


def expand(owners: np.ndarray, starts: np.ndarray, counts: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each ``i``, pair ``owners[i]`` with every value in
    ``values[starts[i]:starts[i] + counts[i]]``; returns the flat (owner,
    value) arrays. A vectorised ragged gather."""
    total = int(counts.sum())
    if total == 0:
        return _EMPTY, values[:0]
    ends = np.cumsum(counts)
    offsets = np.arange(total, dtype=np.int64) + np.repeat(starts - (ends - counts), counts)
    return np.repeat(owners, counts), values[offsets]


class Units:
    """The delivery units of one frame, as one flat slot array and offsets.

    Unit 0 is empty. A *block* adds consecutive units at once from numpy
    arrays; :meth:`add` adds one unit from a Python sequence.
    """

    def __init__(self) -> None:
        self._flats: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = [np.zeros(1, dtype=np.int64)]
        self._singles: list[Sequence[int]] = []
        self._count = 1

    def add_block(self, flat: np.ndarray, offsets: np.ndarray) -> int:
        """Add ``len(offsets) - 1`` units, unit ``k`` being
        ``flat[offsets[k]:offsets[k + 1]]``; returns the index of the first."""
        self._flush()
        base = self._count
        self._flats.append(flat)
        self._lengths.append(np.diff(offsets))
        self._count += len(offsets) - 1
        return base

    def add(self, slots: Sequence[int]) -> int:
        """Add one unit; returns its index."""
        self._singles.append(slots)
        self._count += 1
        return self._count - 1

    def build(self) -> tuple[np.ndarray, np.ndarray]:
        """``(flat, offsets)`` over every unit added, in order."""
        self._flush()
        flat = np.concatenate(self._flats) if self._flats else _EMPTY
        offsets = np.zeros(self._count + 1, dtype=np.int64)
        np.cumsum(np.concatenate(self._lengths), out=offsets[1:])
        return flat, offsets

    def _flush(self) -> None:
        if self._singles:
            lengths = np.fromiter(map(len, self._singles), dtype=np.int64, count=len(self._singles))
            self._flats.append(np.fromiter(chain.from_iterable(self._singles), dtype=np.int64, count=int(lengths.sum())))
            self._lengths.append(lengths)
            self._singles = []

"""Vectorised lookups of many distinct topics at once, for ``match_frame``.

The single-topic path (:meth:`compiler.matcher.Matcher.match`) costs a
Python dict lookup per (topic, shape). A batch instead puts each table of an
exchange (exact keys, one table per shape) behind a pandas hash index and
looks a whole column of keys up in C: per batch, a fixed number of Arrow and
pandas calls per (topic length, shape), plus well under a microsecond per
topic. The keys are the same strings as in the single-topic tables (see
``_Exchange.shaped`` in :mod:`compiler.matcher`), built here with Arrow's
string kernels; catch-alls are expanded per topic length, and AMQP filters
with several ``#`` runs still go through the automaton, one topic at a time.

Precondition of :meth:`BatchExchange.hits`: the topics are distinct, valid in
the exchange's dialect (see :func:`invalid_topics`) and UTF-8 encodable.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .pattern import Shape

_EMPTY = np.zeros(0, dtype=np.int64)


def expand(owners: np.ndarray, starts: np.ndarray, counts: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each ``i``, pair ``owners[i]`` with ``values[starts[i]:starts[i] + counts[i]]``;
    returns the flat (owner, value) arrays. Vectorised ragged gather."""
    total = int(counts.sum())
    if total == 0:
        return _EMPTY, values[:0]
    repeated = np.repeat(owners, counts)
    ends = np.cumsum(counts)
    offsets = np.arange(total, dtype=np.int64) + np.repeat(starts - (ends - counts), counts)
    return repeated, values[offsets]


class KeyIndex:
    """A table ``key -> hit code(s)`` behind a pandas hash index.

    Built from a single-topic table (values an int or a tuple of ints); the
    codes of a key sit in a flat array at ``[start, start + count)``.
    """

    __slots__ = ("_index", "_start", "_count", "_codes", "_single")

    def __init__(self, table: dict) -> None:
        keys = list(table)
        starts, counts, codes = [], [], []
        for value in table.values():
            starts.append(len(codes))
            if value.__class__ is int:
                counts.append(1)
                codes.append(value)
            else:
                counts.append(len(value))
                codes.extend(value)
        self._index = pd.Index(keys, dtype=object)
        self._start = np.array(starts, dtype=np.int64)
        self._count = np.array(counts, dtype=np.int64)
        self._codes = np.array(codes, dtype=np.int64)
        self._single = len(codes) == len(keys)

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(i, code)`` pairs for every ``keys[i]`` present, one per code of the key."""
        found = self._index.get_indexer(keys)
        hit = np.flatnonzero(found >= 0)
        found = found[hit]
        if self._single:
            return hit, self._codes[found]
        return expand(hit, self._start[found], self._count[found], self._codes)


class BatchExchange:
    """The tables of one exchange, indexed for batches. Built on first use."""

    def __init__(
        self,
        grammar,
        exact: dict,
        shaped: list[tuple[Shape, dict]],
        catch_alls: list[tuple[Shape, tuple[int, ...]]],
        automaton,
    ) -> None:
        self._separator = grammar.SEPARATOR
        self._dollar_rule = grammar.DOLLAR_RULE
        self._zero_words_when_empty = not grammar.DOLLAR_RULE  # AMQP: "" has no words
        self._exact = KeyIndex(exact)
        self._shaped = [(shape, KeyIndex(table)) for shape, table in shaped]
        self._catch_alls = catch_alls
        self._automaton = automaton

    def hits(self, topics: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(topic index, hit code)`` pairs of every filter matching each topic."""
        column = pa.array(topics, type=pa.string())
        found_topics, found_codes = self._exact.lookup(np.asarray(topics, dtype=object))
        parts = [(found_topics, found_codes)]
        words = pc.split_pattern(column, self._separator)
        lengths = pc.list_value_length(words).to_numpy().astype(np.int64)
        if self._zero_words_when_empty:
            lengths[pc.equal(column, "").to_numpy(zero_copy_only=False)] = 0
        dollar = None
        if self._dollar_rule:
            dollar = pc.starts_with(column, "$").to_numpy(zero_copy_only=False)
        for length in np.unique(lengths).tolist():
            rows = np.flatnonzero(lengths == length)
            parts += self._length_hits(length, rows, words, dollar)
        if self._automaton is not None:
            parts.append(self._automaton_hits(topics))
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def _length_hits(
        self, length: int, rows: np.ndarray, words: pa.ListArray, dollar: np.ndarray | None
    ) -> Iterable[tuple[np.ndarray, np.ndarray]]:
        plain = rows if dollar is None else rows[~dollar[rows]]
        catch_codes = [c for shape, codes in self._catch_alls if shape.applies_to(length) for c in codes]
        if catch_codes and len(plain):
            codes = np.array(catch_codes, dtype=np.int64)
            yield np.repeat(plain, len(codes)), np.tile(codes, len(plain))
        group = None
        for shape, index in self._shaped:
            if not shape.applies_to(length):
                continue
            selected = plain if shape.first_wild else rows
            if not len(selected):
                continue
            if group is None or group[0] is not selected:
                group = (selected, words.take(pa.array(selected)))
            columns = [pc.list_element(group[1], p if p >= 0 else length + p) for p in shape.positions]
            keys = columns[0] if len(columns) == 1 else pc.binary_join_element_wise(*columns, self._separator)
            at, codes = index.lookup(keys.to_numpy(zero_copy_only=False))
            yield selected[at], codes

    def _automaton_hits(self, topics: list[str]) -> tuple[np.ndarray, np.ndarray]:
        owners: list[int] = []
        codes: list[int] = []
        separator, match = self._separator, self._automaton.match
        for i, topic in enumerate(topics):
            found = match(topic.split(separator) if topic else [])
            owners += [i] * len(found)
            codes += found
        return np.array(owners, dtype=np.int64), np.array(codes, dtype=np.int64)


def invalid_topics(grammar, topics: list[str]) -> np.ndarray:
    """Indexes of ``topics`` (UTF-8 encodable strings) the grammar would refuse,
    found with vectorised checks; :func:`parse_topic` then names the problem."""
    column = pa.array(topics, type=pa.string())
    size = pc.binary_length(column).to_numpy()
    bad = size > grammar.MAX_BYTES
    if grammar.DOLLAR_RULE:  # MQTT: non-empty, no wildcard, no U+0000
        bad |= size == 0
        for char in ("+", "#", "\x00"):
            bad |= pc.match_substring(column, char).to_numpy(zero_copy_only=False)
    return np.flatnonzero(bad)

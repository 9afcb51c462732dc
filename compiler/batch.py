"""The results of one ``Matcher.match_columns`` batch, before they are written out.

The kernel matches the batch's distinct topics (``Kernel.match_keys``,
``Kernel.match_topics``); the Python path adds the results it computes
itself (header criteria, shared groups). :class:`Units` gathers all of them
as one flat slot array with offsets, which ``Kernel.layout`` writes out row
by row as the Arrow column. ``benchmarks/compiler_bench.py`` ("batch")
measures this path; run it before changing it.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)


class Units:
    """The delivery units of one batch, as one flat slot array and offsets.

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
        # One block (a batch the kernel answered whole): its array as is; at
        # fan-out it holds tens of millions of slots.
        flat = self._flats[0] if len(self._flats) == 1 else np.concatenate(self._flats) if self._flats else _EMPTY
        offsets = np.zeros(self._count + 1, dtype=np.int64)
        np.cumsum(np.concatenate(self._lengths), out=offsets[1:])
        return flat, offsets

    def _flush(self) -> None:
        if self._singles:
            lengths = np.fromiter(map(len, self._singles), dtype=np.int64, count=len(self._singles))
            self._flats.append(np.fromiter(chain.from_iterable(self._singles), dtype=np.int64,
                                           count=int(lengths.sum())))
            self._lengths.append(lengths)
            self._singles = []

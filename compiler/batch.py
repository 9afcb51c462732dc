"""Building blocks of ``match_frame``: a batch's matched topics laid out
with numpy instead of per-topic Python objects.

The kernel (``bitroute_kernel.Kernel.match_topics``) matches the distinct
topics; what is left per batch is laying the results out row by row:
:func:`expand` (a vectorised ragged gather) and :class:`Units` (the flat
slot arrays of every distinct result). ``benchmarks/compiler_bench.py``
("batch") measures this path; run it before changing it.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)


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

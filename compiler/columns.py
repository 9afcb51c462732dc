"""Conversions between the column types the index and snapshot use.

Slot numbers are ``uint32``; string columns are Arrow ``string`` arrays
(``int32`` offsets, nulls for free slots); sets of slots are roaring bitmaps.
These helpers keep the conversions vectorised (no per-element Python work),
which is what makes snapshots fast to build and load.
"""

from __future__ import annotations

from array import array
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap, FrozenBitMap

SLOT_DTYPE = np.dtype("<u4")
"""Every slot column: little-endian uint32, the same in memory and on disk."""


def slot_array(values: np.ndarray | array | list[int]) -> np.ndarray:
    """A read-only ``uint32`` numpy copy of ``values``."""
    if isinstance(values, array):
        out = np.frombuffer(values.tobytes(), dtype=np.uint32).astype(SLOT_DTYPE, copy=False)
    else:
        out = np.array(values, dtype=SLOT_DTYPE)
    out.flags.writeable = False
    return out


def bitmap_of(slots: np.ndarray) -> FrozenBitMap:
    """The set of ``slots`` (any integer numpy array of values < 2**32)."""
    packed = array("I")
    packed.frombytes(np.ascontiguousarray(slots, dtype=np.uint32).tobytes())
    return FrozenBitMap(packed)


def mutable_bitmap_of(slots: np.ndarray) -> BitMap:
    """Like :func:`bitmap_of`, mutable."""
    packed = array("I")
    packed.frombytes(np.ascontiguousarray(slots, dtype=np.uint32).tobytes())
    return BitMap(packed)


def string_column(values: list[str | None]) -> pa.StringArray:
    """An Arrow string column from Python strings (``None`` = free slot)."""
    return pa.array(values, type=pa.string())


class StringColumn(NamedTuple):
    """A string column as the kernel reads it: string ``i`` is
    ``data[offsets[i]:offsets[i + 1]]`` (int64 offsets, uint8 data; a null is empty)."""

    offsets: np.ndarray
    data: np.ndarray


def string_buffers(column: pa.StringArray) -> StringColumn:
    """The :class:`StringColumn` of an Arrow string column, without copying the data."""
    if len(column) == 0:
        return StringColumn(np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.uint8))
    _, offsets_buffer, data_buffer = column.buffers()[:3]
    width = 8 if pa.types.is_large_string(column.type) else 4
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64 if width == 8 else np.int32, count=len(column) + 1,
                            offset=width * column.offset).astype(np.int64)
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, dtype=np.uint8)
    return StringColumn(offsets, data)


def live_slots(column: pa.StringArray) -> FrozenBitMap:
    """The slots of ``column`` that hold a value."""
    if column.null_count == 0:
        return FrozenBitMap(range(len(column)))
    valid = bool_mask(pc.is_valid(column))
    return bitmap_of(np.flatnonzero(valid))


def numpy_of(column: pa.Array) -> np.ndarray:
    """A view of a null-free integer Arrow array as numpy. (Arrow's own
    ``to_numpy`` imports pandas, 0.25 s that ``bitroute match`` does not
    otherwise pay.)"""
    dtype = _NUMPY_TYPES[column.type.id]
    if column.null_count:
        raise ValueError("numpy_of needs an array without nulls")
    data = column.buffers()[1]
    if data is None:
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(data, dtype=dtype, count=len(column), offset=column.offset * dtype.itemsize)


_NUMPY_TYPES = {
    pa.type_for_alias(name).id: np.dtype(name) for name in ("int8", "uint8", "int32", "uint32", "int64", "uint64")
}


def bool_mask(column: pa.Array) -> np.ndarray:
    """A boolean Arrow array as a numpy bool array, nulls as False."""
    if column.null_count:
        column = pc.fill_null(column, False)
    return numpy_of(pc.cast(column, pa.uint8())).astype(bool)


"""Immutable, versioned routing-index snapshots and their byte format.

A :class:`Snapshot` is what the compiler hands to the matchers: the state of
the index after the changelog up to ``offsets`` (changelog partition -> next
offset covered), numbered ``version``. It is columnar (see
:class:`SnapshotTables`), so that it serialises to bytes and loads back with
vectorised copies instead of rebuilding millions of Python objects.

Byte format, version 3 (all integers little-endian)
----------------------------------------------------

======  =====================================================================
bytes   content
======  =====================================================================
0-7     magic ``b"BRSNAP\\r\\n"`` (the CR LF catches text-mode mangling)
8-9     format version, uint16 (3)
10-11   reserved, zero
12-15   header length ``H``, uint32
16-19   CRC-32 (``zlib.crc32``) of every byte from offset 20 to the end
20-     header: ``H`` bytes of UTF-8 JSON, then zero padding to a multiple of 8
...     sections, in the order the header lists them, each zero-padded to a
        multiple of 8 bytes
======  =====================================================================

The header is ``{"version": int, "offsets": [[partition, offset], ...],
"exchanges": [[name, dialect], ...], "subscriptions": live count,
"sections": [[name, length], ...]}``. The sections are, for the three slot spaces (subscription,
subscriber, filter):

- ``*_live``: the live slots, a roaring bitmap in pyroaring's portable
  serialisation (CRoaring's portable format);
- string columns as Arrow lays them out: ``*.offsets`` (int32, one more
  than the column length) and ``*.data`` (UTF-8); free slots are empty;
- slot columns: uint32 per slot.

Namely: ``sub_live``, ``sub_ids.offsets``, ``sub_ids.data``, ``sub_filter``,
``sub_subscriber``, ``criteria_slots`` (uint32), ``criteria_ref`` (uint32
index into the next column), ``criteria_json.offsets``,
``criteria_json.data`` (one JSON ``{"match", "criteria"}`` per distinct set
of criteria), ``subscriber_live``, ``subscriber_names.offsets``,
``subscriber_names.data``, ``filter_live``, ``filter_text.offsets``,
``filter_text.data``, ``filter_exchange``, ``option_slots`` (uint32: the subscription
slots whose MQTT options are not the default, ascending) and ``option_flags``
(uint32 per entry of ``option_slots``: :attr:`compiler.options.SubscriptionOptions.flags`).

Version 2 is version 3 without the two option sections (every subscription has
the default options); a build that knows only version 2 refuses version 3 rather
than route without the options.

Version 1 (written by the first releases) is version 2 plus a class per filter that
nothing reads since the Rust kernel: a header field ``"shapes"`` and a
section ``filter_code`` (uint32 per filter slot). :meth:`Snapshot.from_bytes`
reads every version (it skips the two) and the same snapshot routes the same
either way; :meth:`Snapshot.to_bytes` writes version 3.

No Python object graph is pickled. A reader refuses other magic, other format
versions, a CRC mismatch, and sections inconsistent with each other, with
:class:`~compiler.errors.SnapshotFormatError`.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import pyarrow as pa
from pyroaring import FrozenBitMap

from .columns import SLOT_DTYPE, live_slots
from .dialect import Dialect
from .errors import HeaderCriteriaError, SnapshotFormatError
from .headers import HeaderCriteria

MAGIC = b"BRSNAP\r\n"
FORMAT_VERSION = 3
"""The format version :meth:`Snapshot.to_bytes` writes."""
READABLE_VERSIONS = (1, 2, 3)
"""The format versions :meth:`Snapshot.from_bytes` reads (see the module docstring)."""
_PREFIX = struct.Struct("<8sHHII")
_ALIGN = 8

@dataclass(frozen=True, eq=False)
class SnapshotTables:
    """The columnar content of a snapshot. Read-only; shared, never copied.

    Subscription slots index ``sub_*``; subscriber slots index
    ``subscriber_names``; filter slots index ``filter_*``. A free slot has a
    null string in its space's string column; its other columns are
    meaningless. Every live subscription's filter and subscriber slots are
    live. ``criteria_slots[i]`` has the criteria ``criteria_sets[criteria_ref[i]]``;
    ``option_slots[i]`` the MQTT options of flags ``option_flags[i]`` (every other
    subscription the default options).
    """

    exchange_names: tuple[str, ...]
    sub_ids: pa.StringArray
    sub_filter: np.ndarray
    sub_subscriber: np.ndarray
    criteria_slots: np.ndarray
    criteria_ref: np.ndarray
    criteria_sets: tuple[HeaderCriteria, ...]
    subscriber_names: pa.StringArray
    filter_text: pa.StringArray
    filter_exchange: np.ndarray
    option_slots: np.ndarray
    option_flags: np.ndarray


class Snapshot:
    """An immutable routing-index snapshot; build one with
    :meth:`compiler.index.RoutingIndex.snapshot` or :meth:`from_bytes`.

    ``version`` is the compiler's monotonic snapshot number, ``offsets`` the
    changelog position it covers, ``exchanges`` the exchange -> dialect map,
    ``len()`` the number of live subscriptions.
    """

    __slots__ = ("_version", "_offsets", "_exchanges", "_tables", "_count")

    def __init__(
        self,
        version: int,
        offsets: Mapping[int, int],
        exchanges: Mapping[str, Dialect],
        tables: SnapshotTables,
        count: int,
    ) -> None:
        if type(version) is not int or version < 0:
            raise ValueError(f"snapshot version must be a non-negative int, not {version!r}")
        clean: dict[int, int] = {}
        for partition, offset in offsets.items():
            if type(partition) is not int or type(offset) is not int or partition < 0 or offset < 0:
                raise ValueError("offsets must map partition (int >= 0) to offset (int >= 0), "
                                 f"not {partition!r}: {offset!r}")
            clean[partition] = offset
        self._version = version
        self._offsets = MappingProxyType(dict(sorted(clean.items())))
        self._exchanges = MappingProxyType({name: Dialect(d) for name, d in exchanges.items()})
        self._tables = tables
        self._count = count

    @property
    def version(self) -> int:
        return self._version

    @property
    def offsets(self) -> Mapping[int, int]:
        return self._offsets

    @property
    def exchanges(self) -> Mapping[str, Dialect]:
        return self._exchanges

    @property
    def tables(self) -> SnapshotTables:
        """The columnar content, for :class:`~compiler.matcher.Matcher` and the index."""
        return self._tables

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return f"Snapshot(version={self._version}, subscriptions={self._count}, offsets={dict(self._offsets)})"

    def to_bytes(self) -> bytes:
        """Serialise in the documented format (see the module docstring)."""
        t = self._tables
        criteria_json = pa.array(
            [json.dumps(c.to_json(), ensure_ascii=False, sort_keys=True) for c in t.criteria_sets], type=pa.string()
        )
        sections: list[tuple[str, bytes]] = [("sub_live", live_slots(t.sub_ids).serialize())]
        sections += _string_sections("sub_ids", t.sub_ids)
        sections += [
            ("sub_filter", _slots_bytes(t.sub_filter)),
            ("sub_subscriber", _slots_bytes(t.sub_subscriber)),
            ("criteria_slots", _slots_bytes(t.criteria_slots)),
            ("criteria_ref", _slots_bytes(t.criteria_ref)),
        ]
        sections += _string_sections("criteria_json", criteria_json)
        sections.append(("subscriber_live", live_slots(t.subscriber_names).serialize()))
        sections += _string_sections("subscriber_names", t.subscriber_names)
        sections.append(("filter_live", live_slots(t.filter_text).serialize()))
        sections += _string_sections("filter_text", t.filter_text)
        sections.append(("filter_exchange", _slots_bytes(t.filter_exchange)))
        sections += [("option_slots", _slots_bytes(t.option_slots)),
                     ("option_flags", _slots_bytes(t.option_flags))]
        header = json.dumps(
            {
                "version": self._version,
                "offsets": [[p, o] for p, o in self._offsets.items()],
                "exchanges": [[name, self._exchanges[name].value] for name in t.exchange_names],
                "subscriptions": self._count,
                "sections": [[name, len(data)] for name, data in sections],
            },
            ensure_ascii=False,
        ).encode("utf-8")
        parts = [header, _padding(len(header) + _PREFIX.size)]
        for _, data in sections:
            parts += [data, _padding(len(data))]
        body = b"".join(parts)
        return _PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(header), zlib.crc32(body)) + body

    @classmethod
    def from_bytes(cls, data: bytes) -> Snapshot:
        """Load bytes written by :meth:`to_bytes`; raises :class:`SnapshotFormatError`."""
        view = memoryview(data)
        if len(view) < _PREFIX.size:
            raise SnapshotFormatError(f"not a bitroute snapshot: {len(view)} bytes is shorter than the header")
        magic, fmt, _, header_len, crc = _PREFIX.unpack_from(view)
        if magic != MAGIC:
            raise SnapshotFormatError(f"not a bitroute snapshot: bad magic {bytes(magic)!r}")
        if fmt not in READABLE_VERSIONS:
            readable = " and ".join(map(str, READABLE_VERSIONS))
            raise SnapshotFormatError(f"unsupported snapshot format version {fmt}; this build reads "
                                      f"versions {readable}")
        body = view[_PREFIX.size:]
        if zlib.crc32(body) != crc:
            raise SnapshotFormatError("snapshot is corrupt: CRC-32 mismatch")
        try:
            return _Reader(body, header_len, fmt).read(cls)
        except (ValueError, KeyError, TypeError, IndexError, HeaderCriteriaError, pa.ArrowException) as exc:
            # The CRC matched, so these are bytes from a writer that breaks
            # the format, not line noise: report them as a format error.
            raise SnapshotFormatError(f"snapshot is malformed: {exc}") from exc


def _padding(size: int) -> bytes:
    return b"\0" * (-size % _ALIGN)


def _slots_bytes(column: np.ndarray) -> bytes:
    return np.ascontiguousarray(column, dtype=SLOT_DTYPE).tobytes()


def _string_sections(name: str, column: pa.StringArray) -> list[tuple[str, bytes]]:
    _, offsets_buf, data_buf = column.buffers()
    n = len(column)
    if column.offset:
        raise ValueError("string columns of a snapshot are never slices")
    if offsets_buf is None:  # an empty column
        return [(f"{name}.offsets", np.zeros(1, dtype="<i4").tobytes()), (f"{name}.data", b"")]
    offsets = np.frombuffer(offsets_buf, dtype="<i4", count=n + 1)
    end = int(offsets[-1])
    data = b"" if data_buf is None else data_buf.to_pybytes()[:end]
    return [(f"{name}.offsets", offsets.tobytes()), (f"{name}.data", data)]


class _Reader:
    """Decodes the sections of one snapshot body (CRC already checked)."""

    def __init__(self, body: memoryview, header_len: int, format_version: int) -> None:
        self.format = format_version
        if header_len > len(body):
            raise ValueError(f"header length {header_len} exceeds the {len(body)} bytes present")
        self.header = json.loads(bytes(body[:header_len]).decode("utf-8"))
        if not isinstance(self.header, dict):
            raise ValueError("header is not a JSON object")
        position = header_len + (-(header_len + _PREFIX.size) % _ALIGN)
        self.sections: dict[str, memoryview] = {}
        for name, length in self.header["sections"]:
            if type(length) is not int or length < 0 or position + length > len(body):
                raise ValueError(f"section {name!r} of {length} bytes runs past the end")
            self.sections[name] = body[position:position + length]
            position += length + (-length % _ALIGN)
        if position != len(body):
            raise ValueError(f"{len(body) - position} unexpected bytes after the last section")

    def slots(self, name: str, length: int | None = None) -> np.ndarray:
        raw = self.sections[name]
        if len(raw) % 4:
            raise ValueError(f"section {name!r} is not a whole number of uint32")
        out = np.frombuffer(raw, dtype=SLOT_DTYPE)
        if length is not None and len(out) != length:
            raise ValueError(f"section {name!r} has {len(out)} entries, expected {length}")
        return out

    def strings(self, name: str, live: FrozenBitMap | None) -> pa.StringArray:
        offsets_raw = self.sections[f"{name}.offsets"]
        data_raw = self.sections[f"{name}.data"]
        n = len(offsets_raw) // 4 - 1
        if n < 0 or len(offsets_raw) % 4:
            raise ValueError(f"section {name}.offsets is malformed")
        validity = None
        null_count = 0
        if live is not None:
            if len(live) and live.max() >= n:
                raise ValueError(f"{name}: live slot {live.max()} beyond {n} slots")
            mask = np.zeros(n, dtype=bool)
            mask[np.frombuffer(live.to_array(), dtype=np.uint32)] = True
            validity = pa.py_buffer(np.packbits(mask, bitorder="little"))
            null_count = n - len(live)
        column = pa.StringArray.from_buffers(
            n, pa.py_buffer(offsets_raw), pa.py_buffer(data_raw), validity, null_count
        )
        column.validate(full=True)
        return column

    def bitmap(self, name: str) -> FrozenBitMap:
        # pyroaring's stub says bytes; it reads any buffer, the section's view without a copy.
        return FrozenBitMap.deserialize(self.sections[name])  # type: ignore[arg-type]

    def read(self, cls: type[Snapshot]) -> Snapshot:
        h = self.header
        exchanges = {str(name): Dialect(dialect) for name, dialect in h["exchanges"]}
        sub_live = self.bitmap("sub_live")
        sub_ids = self.strings("sub_ids", sub_live)
        n_subs = len(sub_ids)
        subscriber_names = self.strings("subscriber_names", self.bitmap("subscriber_live"))
        filter_live = self.bitmap("filter_live")
        filter_text = self.strings("filter_text", filter_live)
        n_filters = len(filter_text)
        sub_filter = self.slots("sub_filter", n_subs)
        sub_subscriber = self.slots("sub_subscriber", n_subs)
        filter_exchange = self.slots("filter_exchange", n_filters)
        criteria_slots = self.slots("criteria_slots")
        criteria_ref = self.slots("criteria_ref", len(criteria_slots))
        criteria_sets = tuple(
            HeaderCriteria.from_json(json.loads(text)) for text in self.strings("criteria_json", None).to_pylist()
        )
        live = np.frombuffer(sub_live.to_array(), dtype=np.uint32)
        live_filters = np.frombuffer(filter_live.to_array(), dtype=np.uint32)
        if len(live) and (
            not np.isin(sub_filter[live], live_filters).all()
            or sub_subscriber[live].max(initial=0) >= len(subscriber_names)
        ):
            raise ValueError("a live subscription refers to a free or missing filter or subscriber slot")
        if len(live_filters) and filter_exchange[live_filters].max(initial=0) >= len(exchanges):
            raise ValueError("a filter refers to a missing exchange")
        if len(criteria_slots) and (
            criteria_ref.max() >= len(criteria_sets) or not np.isin(criteria_slots, live).all()
        ):
            raise ValueError("criteria refer to a free subscription or a missing criteria set")
        if self.format >= 3:
            option_slots = self.slots("option_slots")
            option_flags = self.slots("option_flags", len(option_slots))
        else:  # versions 1 and 2: every subscription has the default options
            option_slots = option_flags = np.zeros(0, dtype=SLOT_DTYPE)
        if len(option_slots) and not np.isin(option_slots, live).all():
            raise ValueError("options refer to a free subscription")
        if h["subscriptions"] != len(sub_live):
            raise ValueError(f"header counts {h['subscriptions']} subscriptions, {len(sub_live)} are live")
        tables = SnapshotTables(
            exchange_names=tuple(exchanges),
            sub_ids=sub_ids,
            sub_filter=sub_filter,
            sub_subscriber=sub_subscriber,
            criteria_slots=criteria_slots,
            criteria_ref=criteria_ref,
            criteria_sets=criteria_sets,
            subscriber_names=subscriber_names,
            filter_text=filter_text,
            filter_exchange=filter_exchange,
            option_slots=option_slots,
            option_flags=option_flags,
        )
        offsets = {int(p): int(o) for p, o in h["offsets"]}
        return cls(int(h["version"]), offsets, exchanges, tables, len(sub_live))

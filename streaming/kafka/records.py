"""The Kafka records bitroute reads and writes, field by field: the one home of their rules.

Publishes arrive as Kafka records (key = routing key, value = payload,
headers); :class:`PublishColumns` reads a batch of them as Arrow columns and
derives, vectorised:

- the message id ``<topic>/<partition>/<offset>`` (:func:`schemas.records.message_id_column`);
- the exchange: the value of the *last* ``exchange`` header (Kafka's rule: the
  last header of a name wins), else the configured default; a value that is
  not UTF-8 makes the publish invalid, with a reason, never an error;
- text forms for the audit (routing key, header values), invalid UTF-8 shown
  with backslash escapes so that no byte is lost from view.

Records written (:func:`streaming.router.batch.routing.delivery_columns`,
:func:`rejected_headers`): the publish's own headers minus the router's
(:data:`schemas.records.ROUTER_HEADERS`, which a publisher cannot forge), plus
the router's: for a delivery the message id, the matched subscription ids
(JSON array) and the snapshot version (and, in the shared layout, the routing
key); for a rejected record the reason, the source (``publish`` or
``subscription``) and the message id. A delivery's topic and record key:
:class:`streaming.kafka.layout.DeliveryLayout`.

:func:`record_size` is the size the broker checks a record against (its
``max.message.bytes`` applies to the record batch; a record written alone
carries the batch's framing too): the one home of that rule, with
:func:`record_sizes` (the same over Arrow columns) and :func:`header_size`
(what a header adds, for the router's and the layout's own headers).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import pairwise
from typing import overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.records import (
    EXCHANGE_HEADER,
    MESSAGE_ID_HEADER,
    REASON_HEADER,
    ROUTER_HEADERS,
    SOURCE_HEADER,
    message_id_column,
)

Headers = list[tuple[str, bytes | None]]

RECORD_BATCH_OVERHEAD = 61
"""Bytes of a Kafka record batch's header (magic v2), paid by a record written alone."""
RECORD_OVERHEAD = 21
"""Upper bound of one record's own framing in a v2 batch (length, attributes, deltas, counts)."""
HEADER_OVERHEAD = 10
"""Upper bound of one header's framing (two varint lengths)."""


@overload
def header_size(name: str, value_bytes: int = 0) -> int: ...
@overload
def header_size(name: str, value_bytes: np.ndarray) -> np.ndarray: ...
def header_size(name: str, value_bytes: int | np.ndarray = 0) -> int | np.ndarray:
    """The bytes header ``name`` adds to a record whose value is ``value_bytes`` long
    (its framing, its name in UTF-8, its value); vectorised over ``value_bytes``."""
    return HEADER_OVERHEAD + len(name.encode("utf-8", "surrogateescape")) + value_bytes


def record_size(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]]
                ) -> int:
    """An upper bound of the bytes a broker counts for this record written alone."""
    size = RECORD_BATCH_OVERHEAD + RECORD_OVERHEAD + len(key or b"") + len(value or b"")
    for name, value_ in headers:
        size += header_size(name, len(value_ or b""))
    return size


def record_sizes(keys: pa.Array, values: pa.Array, header_lists: Sequence[Headers | None]
                 ) -> np.ndarray:
    """:func:`record_size` of each row of the columns ``keys`` and ``values`` (binary, nulls
    allowed) with headers ``header_lists[i]``, vectorised over the columns (int64)."""
    n = len(keys)
    sizes = (RECORD_BATCH_OVERHEAD + RECORD_OVERHEAD
             + pc.fill_null(pc.binary_length(keys), 0).to_numpy(zero_copy_only=False).astype(np.int64)
             + pc.fill_null(pc.binary_length(values), 0).to_numpy(zero_copy_only=False).astype(np.int64))
    return sizes + np.fromiter((sum(header_size(k, len(v or b"")) for k, v in h) if h else 0
                                for h in header_lists), dtype=np.int64, count=n)


def expiry_error(value: bytes | None) -> str | None:
    """Why ``value`` is not an ``expiry`` header's value (None: it is one): the router's rule
    (kernel/core/src/expiry.rs), for the CLI to refuse what the router would reject."""
    from bitroute_kernel import expiry_states

    state = expiry_states([value], [0], 0)[0]
    return state if isinstance(state, str) else None


def kept_headers(headers: Sequence[tuple[str, bytes | None]] | None) -> Headers:
    """A publish's headers as they are copied onto its deliveries: router headers removed."""
    if not headers:
        return []
    return [(k, v) for k, v in headers if k not in ROUTER_HEADERS]


def rejected_headers(kept: Headers, reason: str, source: str, message_id: str) -> Headers:
    """The headers of a rejected record: ``kept`` plus reason, source and message id."""
    return kept + [(REASON_HEADER, reason.encode("utf-8")), (SOURCE_HEADER, source.encode()),
                   (MESSAGE_ID_HEADER, message_id.encode())]


def rejected_copy(key: bytes | None, value: bytes | None, kept: Headers, reason: str, source: str,
                  message_id: str, limit: int) -> tuple[bytes | None, Headers, str]:
    """The value, headers and reason of a bad record's copy in the rejected topic: whole
    when it fits ``limit`` bytes, else without payload or the record's own headers, the
    reason saying so (a copy the broker would refuse must not stop the router)."""
    headers = rejected_headers(kept, reason, source, message_id)
    if record_size(key, value, headers) <= limit:
        return value, headers, reason
    reason += " (the copy in the rejected topic has no payload or headers: too large)"
    return None, rejected_headers([], reason, source, message_id), reason


def text(values: pa.Array) -> pa.Array:
    """Binary values as strings; invalid UTF-8 is shown with ``\\x..`` escapes (nulls stay null)."""
    try:
        return values.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if v is None else v.decode("utf-8", "backslashreplace")
                         for v in values.to_pylist()], pa.string())


SOURCE_COLUMNS = ("topic", "partition", "offset", "key", "value", "headers", "timestamp")
"""The Spark Kafka source's columns a routing task reads (:class:`PublishColumns`): a live
batch's and a replay's chunk's alike."""


class PublishColumns:
    """One Arrow batch of Kafka source rows, read as publishes.

    Input columns (the Spark Kafka source's): ``topic`` string, ``partition``
    int, ``offset`` long, ``key`` binary, ``value`` binary, ``headers``
    list<struct<key: string, value: binary>>, ``timestamp``. ``incarnation``: the
    topic's, in the message ids (:func:`schemas.records.message_id`).
    """

    def __init__(self, batch: pa.RecordBatch, default_exchange: str, incarnation: int = 0) -> None:
        self.batch = batch
        self.n = batch.num_rows
        columns = {name: batch.column(i) for i, name in enumerate(batch.schema.names)}
        self.keys: pa.Array = columns["key"]
        self.values: pa.Array = columns["value"]
        self.published_at: pa.Array = columns["timestamp"]
        self.message_ids: pa.Array = message_id_column(
            columns["topic"], columns["partition"], columns["offset"], incarnation)
        headers = columns["headers"]
        self.headers: pa.ListArray = headers
        # flatten(), not .values/.field(): both honour a sliced batch's offsets.
        self._names, self._header_values = headers.flatten().flatten()
        self._parents = pc.list_parent_indices(headers).to_numpy(zero_copy_only=False)
        self.exchanges, self.exchange_errors = self._exchanges(default_exchange)

    def _exchanges(self, default: str) -> tuple[list[str | None], dict[int, str]]:
        """Per row the exchange name, and the rows whose exchange header is not UTF-8."""
        exchanges: list[str | None] = [default] * self.n
        errors: dict[int, str] = {}
        named = np.flatnonzero(pc.equal(self._names, EXCHANGE_HEADER).to_numpy(zero_copy_only=False))
        if not len(named):
            return exchanges, errors
        last = {}  # row -> index of its last exchange header
        for row, entry in zip(self._parents[named].tolist(), named.tolist(), strict=True):
            last[row] = entry
        raw = self._header_values.take(pa.array(list(last.values()))).to_pylist()
        for row, value in zip(last, raw, strict=True):
            if value is None:
                exchanges[row] = None
                continue
            try:
                exchanges[row] = value.decode("utf-8")
            except UnicodeDecodeError as exc:
                exchanges[row] = None
                errors[row] = (f"the exchange header is not valid UTF-8 ({exc.reason} at byte "
                               f"{exc.start}): {value[:64]!r}")
        return exchanges, errors

    def last_values(self, name: str) -> tuple[list[int], list[bytes | None]]:
        """The rows with a header ``name`` and the value of each one's last (Kafka's rule)."""
        named = np.flatnonzero(pc.equal(self._names, name).to_numpy(zero_copy_only=False))
        if not len(named):
            return [], []
        last = {}  # row -> index of its last header of the name
        for row, entry in zip(self._parents[named].tolist(), named.tolist(), strict=True):
            last[row] = entry
        return list(last), self._header_values.take(pa.array(list(last.values()))).to_pylist()

    def header_lists(self) -> list[Headers | None]:
        """Per row its headers as ``[(name, value), ...]`` (None when it has none)."""
        if not len(self._names):
            return [None] * self.n
        names = self._names.to_pylist()
        values = self._header_values.to_pylist()
        offsets = self.headers.offsets.to_numpy()
        offsets = (offsets - offsets[0]).tolist()
        return [list(zip(names[a:b], values[a:b], strict=True)) if b > a else None
                for a, b in pairwise(offsets)]

    def kept_header_columns(self) -> tuple[np.ndarray, pa.Array, pa.Array]:
        """The headers :func:`kept_headers` keeps, as columns: ``(offsets, names, values)``,
        row ``r``'s from ``offsets[r]`` to ``offsets[r + 1]`` (int32), in their order."""
        keep = pc.invert(pc.is_in(self._names, pa.array(ROUTER_HEADERS, pa.string())))
        keep = keep.to_numpy(zero_copy_only=False) if len(self._names) else np.zeros(0, bool)
        counts = (np.bincount(self._parents[keep], minlength=self.n) if keep.any()
                  else np.zeros(self.n, np.int64))
        offsets = np.zeros(self.n + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:])
        index = pa.array(np.flatnonzero(keep), pa.int64())
        return offsets, self._names.take(index), self._header_values.take(index)

    def header_map(self) -> pa.MapArray:
        """Per row its headers as map<string, string> for the audit, the last of a name winning."""
        parents = self._parents
        names = self._names
        values = text(self._header_values)
        if len(names):
            # Keep the last entry of each (row, name): reversed, unique, then back in order.
            import pandas as pd

            keep = ~pd.DataFrame({"row": parents, "name": names.to_pandas()}).duplicated(keep="last").to_numpy()
            if not keep.all():
                index = pa.array(np.flatnonzero(keep))
                names, values, parents = names.take(index), values.take(index), parents[keep]
        counts = np.bincount(parents, minlength=self.n) if len(parents) else np.zeros(self.n, np.int64)
        offsets = np.zeros(self.n + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:])
        return pa.MapArray.from_arrays(pa.array(offsets), names, values)

    def payload_bytes(self) -> pa.Array:
        return pc.binary_length(self.values)


def subscription_ids_json(ids: pa.ListArray) -> pa.Array:
    """Per list of subscription ids, its JSON array text (``["a","b"]``), built with Arrow kernels."""
    return _join_lists(ids, _json_strings(ids.values), "[", "]")


_NEEDS_JSON_ESCAPE = r'["\\\x00-\x1f]'


def _json_strings(values: pa.Array) -> pa.Array:
    """Each string as a JSON string literal; only strings that need escaping go through Python."""
    needs_escape = pc.match_substring_regex(values, _NEEDS_JSON_ESCAPE)
    if pc.any(needs_escape).as_py():
        rows = np.flatnonzero(needs_escape.to_numpy(zero_copy_only=False))
        escaped = [json.dumps(values[int(i)].as_py(), ensure_ascii=False)[1:-1] for i in rows]
        values = pc.replace_with_mask(values, needs_escape, pa.array(escaped, pa.string()))
    return pc.binary_join_element_wise('"', values, '"', "")


def _join_lists(lists: pa.ListArray, items: pa.Array, opening: str, closing: str) -> pa.Array:
    """Per list of ``lists``: ``opening``, its ``items`` (aligned with ``lists.values``)
    joined by ``,``, ``closing``."""
    regrouped = pa.ListArray.from_arrays(lists.offsets, items)
    return pc.binary_join_element_wise(opening, pc.binary_join(regrouped, ","), closing, "")

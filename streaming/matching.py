"""Matching one micro-batch of publishes against one snapshot version, in Spark.

The driver ships a snapshot's bytes to the executors once per version with
``SparkContext.broadcast`` (no shared file system needed) and keeps exactly
one broadcast alive (:class:`SnapshotBroadcasts`); a released version's
broadcast is destroyed, which also drops it from the Python workers.

Each Python worker loads a version once: :func:`cached_matcher` keeps the
:class:`compiler.Matcher` of the last :data:`MATCHERS_CACHED` broadcasts in a
module-level cache (a reused worker serves many tasks), so the cost of
``Snapshot.from_bytes`` and of building the matcher's tables is paid once per
version per worker, not per task.

``mapInPandas`` returns one row per publish (``schemas.records.MATCH_RESULT``):
its message id, its deliveries as JSON text ``{"<subscriber>": ["<subscription
id>", ...], ...}`` and its rejection reason; :func:`route` parses the text in
the JVM (``from_json``). The fan-out to one row per (publish, subscriber)
happens in the JVM too (``explode``), because output, not matching, is the
bottleneck on fan-out (see DESIGN.md, measured facts).

Why text: pyspark turns every array-typed value a pandas UDF returns into
Python lists and dicts, row by row, before handing it to Arrow; the matcher's
Arrow list column would lose its vectorised build there. A string column goes
to Arrow as it is, and :func:`deliveries_json` builds it with Arrow compute
kernels. Measured on 100k publishes of the e2e "devices" workload (7.8
deliveries each, local[2]): the match stage took 1.6 s instead of 3.1 s.

Header values reach the Python workers only when the snapshot has header
criteria (``with_headers`` of :func:`route`): converting them to pandas costs
time for nothing otherwise.

The routed frame (:func:`route`) has the columns of :func:`publishes` plus
``deliveries`` (array of ``{subscriber, subscription_ids}``, empty when
unroutable or rejected) and ``error`` (null, or why the publish is rejected).
A bad publish never fails the batch: the matcher turns it into a reason.
"""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import Broadcast, SparkContext
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, MapType, StringType

from compiler import Matcher, Snapshot
from schemas.records import EXCHANGE_HEADER, MATCH_RESULT
from streaming.config import Config

MATCHERS_CACHED = 2
"""Matchers (snapshot versions) a Python worker keeps loaded: the current one
and the previous, so the batch after a version change and a replay of the
batch before it do not reload. A matcher holds its snapshot and a topic cache
bounded by ``compiler.MATCH_CACHE_MAX_BYTES``."""

_matchers: OrderedDict[str, Matcher] = OrderedDict()


def cached_matcher(key: str, load: Callable[[], bytes]) -> Matcher:
    """The worker's matcher for broadcast ``key``, built from ``load()`` on first use.

    Least recently used matchers beyond :data:`MATCHERS_CACHED` are dropped.
    ``key`` names one broadcast (a random id drawn when it was made), so two
    routers in one application never share an entry.
    """
    matcher = _matchers.get(key)
    if matcher is None:
        matcher = Matcher(Snapshot.from_bytes(load()))
        _matchers[key] = matcher
        while len(_matchers) > MATCHERS_CACHED:
            _matchers.popitem(last=False)
    else:
        _matchers.move_to_end(key)
    return matcher


def cached_versions() -> list[int]:
    """Snapshot versions of the matchers this process holds, least recently used first."""
    return [m.version for m in _matchers.values()]


class MatchPartitions:
    """The ``mapInPandas`` function of one snapshot broadcast.

    A module-level class, so that it pickles by reference and the worker's
    calls reach this module's cache rather than a pickled copy of it.
    """

    def __init__(self, broadcast: Broadcast, key: str) -> None:
        self._broadcast = broadcast
        self._key = key

    def __call__(self, frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        matcher = cached_matcher(self._key, lambda: self._broadcast.value)
        for frame in frames:
            matched = matcher.match_frame(frame)
            matched["deliveries"] = pd.Series(
                pd.arrays.ArrowExtensionArray(deliveries_json(_arrow(matched["deliveries"]))),
                index=matched.index)
            yield matched


class SnapshotBroadcasts:
    """The driver's one live snapshot broadcast (not thread-safe; one batch at a time)."""

    def __init__(self, context: SparkContext) -> None:
        self._context = context
        self._version: int | None = None
        self._broadcast: Broadcast | None = None
        self._key = ""

    def function(self, version: int, load: Callable[[], bytes]) -> MatchPartitions:
        """The match function for ``version``, broadcasting ``load()`` unless it is live already.

        The previous broadcast is destroyed: the batch that used it is over
        (batches run one at a time), and a replay broadcasts again.
        """
        if self._version != version or self._broadcast is None:
            broadcast = self._context.broadcast(load())
            self.close()
            self._version, self._broadcast, self._key = version, broadcast, uuid.uuid4().hex
        return MatchPartitions(self._broadcast, self._key)

    def close(self) -> None:
        """Destroy the live broadcast, if any."""
        if self._broadcast is not None:
            self._broadcast.destroy(blocking=False)
        self._version, self._broadcast = None, None


def publishes(batch: DataFrame, config: Config) -> DataFrame:
    """A Kafka source frame as publishes: message_id, exchange, key, value, headers, published_at.

    ``message_id`` is ``<topic>/<partition>/<offset>``; ``exchange`` is the
    last ``exchange`` header's value (Kafka's convention: the last header of a
    name wins), else ``config.exchanges.default``.
    """
    named = F.filter(F.col("headers"), lambda h: h["key"] == F.lit(EXCHANGE_HEADER))
    exchange = F.try_element_at(named, F.lit(-1)).getField("value").cast("string")
    return batch.select(
        F.format_string("%s/%d/%d", "topic", "partition", "offset").alias("message_id"),
        F.coalesce(exchange, F.lit(config.exchanges.default)).alias("exchange"),
        F.col("key"),
        F.col("value"),
        F.col("headers"),
        F.col("timestamp").alias("published_at"),
    )


def route(publish_frame: DataFrame, function: MatchPartitions, with_headers: bool = True) -> DataFrame:
    """``publish_frame`` with ``deliveries`` and ``error`` from matching each row once.

    ``deliveries`` is ``array<struct<subscriber, subscription_ids>>``, in the
    matcher's order. ``with_headers=False`` leaves the publish headers out of
    the matcher's input: only correct when the snapshot has no header criteria.
    """
    columns = ["message_id", "exchange", F.col("key").alias("routing_key")]
    if with_headers:
        columns.append("headers")
    matched = (publish_frame.select(*columns)
               .mapInPandas(function, MATCH_RESULT)
               .select("message_id", _parsed_deliveries(F.col("deliveries")), "error"))
    return publish_frame.join(matched, "message_id")


_DELIVERIES_JSON_TYPE = MapType(StringType(), ArrayType(StringType()))
_NEEDS_JSON_ESCAPE = r'["\\\x00-\x1f]'


def deliveries_json(deliveries: pa.ListArray) -> pa.Array:
    """Per publish, its deliveries (``compiler.DELIVERIES_TYPE``) as one JSON object text:
    ``{"<subscriber>": ["<subscription id>", ...], ...}``, in order; ``{}`` when empty.

    Subscriber names need no escaping (``[A-Za-z0-9._-]``); subscription ids are
    escaped as JSON strings.
    """
    entries = deliveries.values
    subscriber, ids = entries.flatten()
    ids_json = _join_lists(ids, _json_strings(ids.values), "[", "]")
    entry = pc.binary_join_element_wise('"', subscriber, '":', ids_json, "")
    return _join_lists(deliveries, entry, "{", "}")


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


def _arrow(column: pd.Series) -> pa.Array:
    array = pa.array(column.array)
    return array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array


def _parsed_deliveries(text: Column) -> Column:
    # from_json makes every type it parses nullable. The text never holds a
    # null (deliveries_json writes it), and coalesce gives the ids back the
    # non-null element type that the audit tables declare.
    entries = F.map_entries(F.from_json(text, _DELIVERIES_JSON_TYPE))
    return F.transform(entries, lambda e: F.struct(
        e["key"].alias("subscriber"),
        F.transform(e["value"], lambda sub_id: F.coalesce(sub_id, F.lit(""))).alias("subscription_ids"),
    )).alias("deliveries")


def header_map(headers: Column) -> Column:
    """Kafka headers as a map of name to UTF-8 value; for a repeated name the last entry wins."""
    names = F.transform(headers, lambda h: h["key"])
    last = F.filter(headers, lambda h, i: F.size(headers) - F.array_position(F.reverse(names), h["key"]) == i)
    return F.map_from_entries(F.transform(
        last, lambda h: F.struct(h["key"].alias("key"), h["value"].cast("string").alias("value"))))

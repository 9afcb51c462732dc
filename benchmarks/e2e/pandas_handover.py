"""The mapInPandas hand-over of a routing task, with the column layout of issue 20, for
``route_task.py --handover``: what a Python worker would do beyond ``route_batch`` if
the router matched in ``mapInPandas`` instead of ``mapInArrow``.

Layout (the issue's): the publish's Kafka headers reach Python as ONE binary column
(``headers_bin``), built in the Spark plan, so that no nested column crosses into
pandas; the per-publish result leaves as flat columns, its two nested ones
(``deliveries``, ``headers``) as JSON text that the Spark plan would parse back
with ``from_json``.

``headers_bin`` per row: for each header, ``u32 LE`` key length, the key's UTF-8
bytes, ``i32 LE`` value length (-1: null), the value's bytes. In the router the
plan would build it (``aggregate`` over ``headers`` with ``concat``); here
:func:`encode_headers` builds it before the timing, so the JVM's share of the
layout is *not* in the figure.

A timed task (:func:`route_pandas`) does what pyspark's worker does for
``mapInPandas`` (the same conversion functions: ``ArrowBatchTransformer.to_pandas``
in, ``PandasToArrowConversion.convert`` out, configured as ``worker.py``
configures them for ``SQL_MAP_PANDAS_ITER_UDF``) around the function a router
would pass: pandas -> Arrow, headers decoded, ``route_batch``, the result
flattened, -> pandas. Not measured: the Arrow IPC between JVM and worker (the
same bytes for both paths, within a few bytes), and the JVM's plan work.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.conversion import ArrowBatchTransformer, PandasToArrowConversion
from pyspark.sql.types import IntegerType, StringType, StructField, StructType, TimestampType

from streaming.router.routing import route_batch

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))

FLAT_RESULT = StructType([
    StructField("message_id", StringType(), False),
    StructField("exchange", StringType(), True),
    StructField("routing_key", StringType(), True),
    StructField("outcome", StringType(), False),
    StructField("reason", StringType(), True),
    StructField("deliveries_json", StringType(), False),
    StructField("headers_json", StringType(), True),
    StructField("payload_bytes", IntegerType(), True),
    StructField("published_at", TimestampType(), True),
])
"""What the pandas function returns: ``ROUTED_PUBLISH`` with its nested columns as JSON."""


def encode_headers(headers: pa.ListArray) -> pa.BinaryArray:
    """The ``headers_bin`` column of ``headers`` (untimed stand-in for the Spark plan)."""
    out = []
    for row in headers.to_pylist():
        parts = []
        for entry in row or ():
            key = entry["key"].encode("utf-8")
            value = entry["value"]
            parts.append(len(key).to_bytes(4, "little") + key)
            parts.append((-1 if value is None else len(value)).to_bytes(4, "little", signed=True)
                         + (value or b""))
        out.append(b"".join(parts))
    return pa.array(out, pa.binary())


def _u32(data: np.ndarray, at: np.ndarray) -> np.ndarray:
    return (data[at].astype(np.int64) | data[at + 1].astype(np.int64) << 8
            | data[at + 2].astype(np.int64) << 16 | data[at + 3].astype(np.int64) << 24)


def _gather(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bytes ``data[s:s+l]`` of every (s, l), concatenated, and their int32 offsets."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    index = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
    return data[index], offsets.astype(np.int32)


def decode_headers(column: pa.BinaryArray) -> pa.ListArray:
    """``headers_bin`` back to the Kafka source's ``headers`` list<struct<key, value>>."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(column)
    bounds = np.frombuffer(column.buffers()[1], dtype=np.int32)[column.offset:column.offset + n + 1]
    data = np.frombuffer(column.buffers()[2], dtype=np.uint8) if column.buffers()[2] else \
        np.zeros(0, np.uint8)
    cursor = bounds[:-1].astype(np.int64)
    end = bounds[1:].astype(np.int64)
    rows, kstarts, klens, vstarts, vlens = [], [], [], [], []
    active = np.flatnonzero(cursor < end)
    while len(active):  # one round per header position: a few rounds, vectorised over rows
        at = cursor[active]
        klen = _u32(data, at)
        vat = at + 4 + klen
        vlen = _u32(data, vat)
        vlen = np.where(vlen >= 1 << 31, vlen - (1 << 32), vlen)
        rows.append(active)
        kstarts.append(at + 4)
        klens.append(klen)
        vstarts.append(vat + 4)
        vlens.append(vlen)
        cursor[active] = vat + 4 + np.maximum(vlen, 0)
        active = active[cursor[active] < end[active]]
    if rows:
        row = np.concatenate(rows)
        order = np.argsort(row, kind="stable")
        row = row[order]
        kstart, klen = np.concatenate(kstarts)[order], np.concatenate(klens)[order]
        vstart, vlen = np.concatenate(vstarts)[order], np.concatenate(vlens)[order]
    else:
        row = kstart = klen = vstart = vlen = np.zeros(0, np.int64)
    key_bytes, key_offsets = _gather(data, kstart, klen)
    value_bytes, value_offsets = _gather(data, vstart, np.maximum(vlen, 0))
    m = len(row)
    keys = pa.Array.from_buffers(pa.string(), m, [None, pa.py_buffer(key_offsets),
                                                  pa.py_buffer(key_bytes)])
    valid = vlen >= 0
    validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    values = pa.Array.from_buffers(pa.binary(), m, [validity, pa.py_buffer(value_offsets),
                                                    pa.py_buffer(value_bytes)])
    list_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(row, minlength=n), out=list_offsets[1:])
    entries = pa.StructArray.from_arrays([keys, values], names=["key", "value"])
    return pa.ListArray.from_arrays(pa.array(list_offsets), entries)


def _json_text(strings: pa.Array) -> pa.Array:
    """Each string as a JSON string literal (quotes and backslashes escaped; a control
    character sends its row through ``json.dumps``)."""
    escaped = pc.replace_substring(pc.replace_substring(strings, "\\", "\\\\"), '"', '\\"')
    quoted = pc.binary_join_element_wise('"', escaped, '"', "")
    controls = pc.match_substring_regex(strings, r"[\x00-\x1f]")
    if pc.any(controls).as_py():
        fixed = [json.dumps(s) if c else q for s, c, q in
                 zip(strings.to_pylist(), controls.to_pylist(), quoted.to_pylist())]
        return pa.array(fixed, pa.string())
    return quoted


def _join_lists(offsets: pa.Array, items: pa.Array, opening: str, closing: str) -> pa.Array:
    joined = pc.binary_join(pa.ListArray.from_arrays(offsets, items), ",")
    return pc.binary_join_element_wise(opening, joined, closing, "")


def flatten_result(routed: pa.RecordBatch) -> pa.RecordBatch:
    """``ROUTED_ARROW`` rows with ``deliveries`` and ``headers`` as JSON text."""
    columns = dict(zip(routed.schema.names, routed.columns))
    deliveries = columns["deliveries"]
    subscribers, ids = deliveries.flatten().flatten()
    ids_json = _join_lists(ids.offsets, _json_text(ids.flatten()), "[", "]")
    one = pc.binary_join_element_wise('{"subscriber":', _json_text(subscribers),
                                      ',"subscription_ids":', ids_json, "}", "")
    deliveries_json = _join_lists(deliveries.offsets, one, "[", "]")
    headers = columns["headers"]
    pairs = pc.binary_join_element_wise(
        _json_text(headers.keys),
        pc.fill_null(_json_text(headers.items), "null"), ":")
    headers_json = pc.if_else(pc.is_null(headers), pa.scalar(None, pa.string()),
                              _join_lists(headers.offsets, pairs, "{", "}"))
    return pa.RecordBatch.from_arrays(
        [columns["message_id"], columns["exchange"], columns["routing_key"], columns["outcome"],
         columns["reason"], deliveries_json, headers_json, columns["payload_bytes"],
         columns["published_at"]],
        names=[f.name for f in FLAT_RESULT.fields])


def route_pandas(matcher, producer, batch: pa.RecordBatch, settings) -> pa.RecordBatch:
    """One mapInPandas task over ``batch`` (the source columns, ``headers_bin`` instead of
    ``headers``), as pyspark's worker runs it; returns the Arrow batch it sends back."""
    wrapped = pa.RecordBatch.from_arrays([pa.StructArray.from_arrays(batch.columns,
                                                                      batch.schema.names)], ["_0"])
    [frame] = ArrowBatchTransformer.to_pandas(wrapped, timezone="UTC", struct_in_pandas="dict",
                                              df_for_struct=True)
    # --- the router's pandas function ---
    arrow = pa.RecordBatch.from_pandas(frame, preserve_index=False)
    names = arrow.schema.names
    columns = [decode_headers(c) if n == "headers_bin" else c
               for n, c in zip(names, arrow.columns)]
    source = pa.RecordBatch.from_arrays(
        columns, names=["headers" if n == "headers_bin" else n for n in names])
    result = flatten_result(route_batch(matcher, producer, source, settings)).to_pandas()
    # --- back in pyspark's worker ---
    return PandasToArrowConversion.convert(
        [result], StructType([StructField("_0", FLAT_RESULT)]), timezone="UTC", safecheck=True,
        arrow_cast=True, assign_cols_by_name=True)


def _stage_costs(publishes: int, repeats: int) -> None:
    """CPU of each hand-over stage on one batch, without Kafka: the part of a mapInPandas
    task that mapInArrow does not have. Thread CPU, median and range over ``repeats``."""
    import statistics
    import time

    from benchmarks.e2e import route_task, workload
    from compiler import Matcher, RoutingIndex, Subscription
    from streaming.router.routing import plan_batch

    w = workload.generate("devices", workload.SIZES["10k"], 1, publishes)
    index = RoutingIndex({workload.EXCHANGE: "mqtt"})
    for sub_id, subscriber, filt in w.subs:
        index.upsert(Subscription.from_changelog(
            sub_id, workload.changelog_value(workload.EXCHANGE, subscriber, filt)))
    matcher = Matcher(index.snapshot(1, {}))
    batch = route_task.source_batch(w.publishes[:publishes], 0)
    binary = batch.drop_columns(["headers"]).append_column(
        "headers_bin", encode_headers(batch.column("headers")))
    from streaming.kafka.layout import DeliveryLayout
    from streaming.router.routing import ROUTED_ARROW, RouteSettings
    from streaming.router.delivery import ProducerSettings

    settings = RouteSettings(workload.EXCHANGE, DeliveryLayout("d."), "r", 1, False,
                             ProducerSettings("127.0.0.1:1", 1_048_576))
    # A routed result of the right shape without Kafka: every matched delivery "acked".
    plan = plan_batch(matcher, batch, settings)
    from streaming.router.routing import _routed_rows
    import numpy as np
    routed = _routed_rows(plan.publishes, plan.reasons, plan.deliveries, plan.entries, plan.owner,
                          plan.ok[plan.owner] if len(plan.owner) else np.zeros(0, dtype=bool))
    assert routed.schema.equals(ROUTED_ARROW, check_metadata=False)

    def stages() -> dict[str, float]:
        out, t = {}, time.thread_time()
        wrapped = pa.RecordBatch.from_arrays([pa.StructArray.from_arrays(
            binary.columns, binary.schema.names)], ["_0"])
        [frame] = ArrowBatchTransformer.to_pandas(wrapped, timezone="UTC", struct_in_pandas="dict",
                                                  df_for_struct=True)
        out["in: Arrow -> pandas (pyspark)"], t = time.thread_time() - t, time.thread_time()
        arrow = pa.RecordBatch.from_pandas(frame, preserve_index=False)
        out["in: pandas -> Arrow"], t = time.thread_time() - t, time.thread_time()
        decode_headers(arrow.column(arrow.schema.get_field_index("headers_bin")))
        out["in: decode headers_bin"], t = time.thread_time() - t, time.thread_time()
        flat = flatten_result(routed)
        out["out: nested -> JSON columns"], t = time.thread_time() - t, time.thread_time()
        result = flat.to_pandas()
        out["out: Arrow -> pandas"], t = time.thread_time() - t, time.thread_time()
        PandasToArrowConversion.convert(
            [result], StructType([StructField("_0", FLAT_RESULT)]), timezone="UTC",
            safecheck=True, arrow_cast=True, assign_cols_by_name=True)
        out["out: pandas -> Arrow (pyspark)"] = time.thread_time() - t
        return out

    def arrow_path() -> float:  # what mapInArrow's task does besides producing
        t = time.thread_time()
        plan_batch(matcher, batch, settings)
        return time.thread_time() - t

    runs = [stages() for _ in range(repeats)]
    plans = [arrow_path() for _ in range(repeats)]
    deliveries = len(routed.column("deliveries").flatten())
    print(f"{publishes} publishes, {deliveries} deliveries; thread CPU ms, median (min-max) "
          f"of {repeats}")
    total = [sum(r.values()) for r in runs]
    for name in runs[0]:
        values = [r[name] * 1e3 for r in runs]
        print(f"  {name:32s} {statistics.median(values):8.2f} ({min(values):.2f}-{max(values):.2f})")
    print(f"  {'hand-over total':32s} {statistics.median(total) * 1e3:8.2f} "
          f"({min(total) * 1e3:.2f}-{max(total) * 1e3:.2f})")
    print(f"  {'match + plan (both paths)':32s} {statistics.median(plans) * 1e3:8.2f} "
          f"({min(plans) * 1e3:.2f}-{max(plans) * 1e3:.2f})")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="pandas_handover")
    ap.add_argument("--publishes", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    _stage_costs(args.publishes, args.repeats)

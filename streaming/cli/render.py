"""What the verbs print: the library's data (dataclasses, dicts, rows) as text for people
or as JSON.

Every function here is pure: it returns lines or a string and prints nothing
(the verbs print). The library never imports this module: it returns data, and
the shapes below are the command line's, not the library's.
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: a verb imports no more of the library than it calls
    import pyarrow as pa

    from streaming.audit.maintenance import MaintenanceReport, TableReport
    from streaming.kafka.client_verbs import Delivery
    from streaming.ops.inspect import RoutingState
    from streaming.router.batch.report import BatchReport

_TABLE_UNITS = ("B", "KB", "MB", "GB", "TB")


# --- tables (audit, sql, explain, subscriptions) ----------------------------------------

def table(columns: Sequence[str], rows: Sequence[Mapping[str, object]]) -> list[str]:
    """An aligned text table: a header, a rule, one line per row, then ``(N rows)``.

    Lists are joined with ``,``, maps shown as ``name=value`` (``name`` alone
    for a null value), nulls as empty cells.
    """
    cells = [[_cell(row[c]) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()

    return [line(columns), line(["-" * w for w in widths]), *map(line, cells),
            f"({len(rows)} row{'' if len(rows) == 1 else 's'})"]


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ",".join(_cell(v) for v in value)
    if isinstance(value, dict):
        return ",".join(k if v is None else f"{k}={_cell(v)}" for k, v in value.items())
    return str(value)


# --- audit rows, streamed: Arrow record batches as text, a batch at a time -----------------
#
# The same text as ``json.dumps(row, ensure_ascii=False)`` of the rows
# :func:`streaming.audit.queries.run` returns, and as :func:`table` of them, built
# column by column with Arrow compute: no Python object per row or per value.

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
"""strftime of Arrow: ``%S`` of a microsecond timestamp prints ``SS.ffffff``."""
_JSON_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t",
                 "\b": "\\b", "\f": "\\f"}


def json_lines(batch: pa.RecordBatch) -> bytes:
    """``batch``'s rows as JSON lines (one object per row, ``\\n`` after each), byte for
    byte what ``json.dumps(row, ensure_ascii=False)`` prints of each row's JSON value
    (timestamps as ``2025-01-31T12:00:00.000000Z``, lists as arrays, maps as objects)."""
    import pyarrow.compute as pc

    if not batch.num_rows:
        return b""
    parts: list[object] = []
    for i, (name, column) in enumerate(zip(batch.schema.names, batch.columns, strict=True)):
        key = json.dumps(name, ensure_ascii=False)
        parts += [_lit("{" + key + ": " if i == 0 else ", " + key + ": "), _json_values(column)]
    parts.append(_lit("}\n"))
    return _joined(pc.binary_join_element_wise(*parts, _lit("")))


class TableText:
    """An aligned text table written a batch at a time: the header and rule before the
    first batch's rows, ``(N rows)`` after the last (:meth:`end`). The same cells as
    :func:`table`; the columns can only be aligned over the rows seen so far, so each
    column is as wide as its widest cell up to and including the current batch: a
    later, wider value widens its column from that batch on (the header keeps the
    first batch's widths)."""

    def __init__(self, columns: Sequence[str]) -> None:
        self._columns = list(columns)
        self._widths = [len(c) for c in columns]
        self.rows = 0

    def lines(self, batch: pa.RecordBatch) -> bytes:
        """The text of ``batch``'s rows (preceded by the header on the first call)."""
        import pyarrow.compute as pc

        cells = [_cell_values(column) for column in batch.columns]
        widths = [max(w, pc.max(pc.utf8_length(c)).as_py() or 0) if len(c) else w
                  for w, c in zip(self._widths, cells, strict=True)]
        head = b"" if self.rows or not batch.num_rows else self._head(widths)
        self._widths = widths
        self.rows += batch.num_rows
        if not batch.num_rows:
            return head
        parts: list[object] = []
        for i, (cell, width) in enumerate(zip(cells, widths, strict=True)):
            parts += [_lit("  " if i else ""), pc.utf8_rpad(cell, width=width, padding=" ")]
        lines = pc.utf8_rtrim_whitespace(pc.binary_join_element_wise(*parts, _lit("")))
        return head + _joined(pc.binary_join_element_wise(lines, _lit("\n"), _lit("")))

    def end(self) -> bytes:
        """The header (when no row came) and the ``(N rows)`` line."""
        head = b"" if self.rows else self._head(self._widths)
        return head + f"({self.rows} row{'' if self.rows == 1 else 's'})\n".encode()

    def _head(self, widths: Sequence[int]) -> bytes:
        def line(values: Sequence[str]) -> str:
            return "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()

        return (line(self._columns) + "\n" + line(["-" * w for w in widths]) + "\n").encode()


@functools.lru_cache(maxsize=64)
def _lit(text: str) -> pa.Scalar:
    """``text`` as an Arrow string scalar, built from its bytes: pyarrow converts a Python
    value (``pa.scalar``, a ``str`` handed to a compute function) only after importing
    pandas, 0.4-0.7 s of a short command's time."""
    import pyarrow as pa

    data = text.encode()
    offsets = pa.py_buffer(struct.pack("<ii", 0, len(data)))
    return pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(data)])[0]


def _joined(lines: pa.Array | pa.ChunkedArray) -> bytes:
    """The concatenation of ``lines`` (strings, no null): their data buffer's bytes."""
    import pyarrow as pa

    if isinstance(lines, pa.ChunkedArray):
        return b"".join(_joined(chunk) for chunk in lines.chunks)
    if not len(lines):
        return b""
    _, offsets, data = lines.buffers()
    offsets = memoryview(offsets).cast("q" if pa.types.is_large_string(lines.type) else "i")
    start, end = offsets[lines.offset], offsets[lines.offset + len(lines)]
    return data.slice(start, end - start).to_pybytes()


def _json_values(column: pa.Array) -> pa.Array:
    """Each value of ``column`` as JSON text (``null`` for a null)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = pc.binary_join_element_wise(_lit('"'), _json_escaped(column), _lit('"'),
                                           _lit(""))
    elif pa.types.is_integer(kind):
        text = pc.cast(column, pa.string())
    elif pa.types.is_boolean(kind):
        text = pc.if_else(column, _lit("true"), _lit("false"))
    elif pa.types.is_timestamp(kind) and kind.tz is not None:  # Delta's: microseconds, UTC
        text = _times(column, quoted=True)
    elif pa.types.is_list(kind):
        items = _nested(column, _json_values(_child(column, column.values)))
        text = pc.binary_join_element_wise(_lit("["), pc.binary_join(items, _lit(", ")),
                                           _lit("]"), _lit(""))
    elif pa.types.is_map(kind):
        entries = pc.binary_join_element_wise(
            _json_values(_child(column, column.keys)), _lit(": "),
            _json_values(_child(column, column.items)), _lit(""))
        text = pc.binary_join_element_wise(
            _lit("{"), pc.binary_join(_nested(column, entries), _lit(", ")), _lit("}"), _lit(""))
    else:  # no such column in the audit tables: Python's own JSON of each value
        text = pa.array([json.dumps(v, ensure_ascii=False, default=str)
                         for v in column.to_pylist()], pa.string())
    return pc.fill_null(text, _lit("null"))


def _times(column: pa.Array, quoted: bool) -> pa.Array:
    """Timestamps as :data:`TIME_FORMAT` text (JSON-quoted when ``quoted``), each
    distinct value formatted once: Arrow's strftime costs about 2 us a value, and a
    batch's rows share a few (``routed_at`` is one per micro-batch)."""
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(column)
    text = pc.strftime(encoded.dictionary, TIME_FORMAT)
    if quoted:
        text = pc.binary_join_element_wise(_lit('"'), text, _lit('"'), _lit(""))
    return text.take(encoded.indices)


def _json_escaped(strings: pa.Array) -> pa.Array:
    """``strings`` escaped as ``json.dumps(..., ensure_ascii=False)`` escapes them:
    backslash, quote and control characters; other characters as they are."""
    import pyarrow.compute as pc

    if not pc.any(pc.match_substring_regex(strings, r'[\x00-\x1f"\\]')).as_py():
        return strings
    for char, escaped in _JSON_ESCAPES.items():  # the backslash first
        strings = pc.replace_substring(strings, char, escaped)
    for code in range(0x20):
        if chr(code) not in _JSON_ESCAPES:
            strings = pc.replace_substring(strings, chr(code), f"\\u{code:04x}")
    return strings


def _child(column: pa.Array, child: pa.Array) -> pa.Array:
    """The part of list or map ``column``'s ``child`` array (its values, keys or items,
    whole even when ``column`` is a slice) that ``column``'s elements hold."""
    start = column.offsets[0].as_py()
    return child.slice(start, column.offsets[-1].as_py() - start)


def _nested(column: pa.Array, values: pa.Array) -> pa.Array:
    """``values`` (one per element of list or map ``column``: :func:`_child`) as lists
    in ``column``'s shape (its offsets and nulls)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    offsets = pc.subtract(column.offsets, column.offsets[0])  # a new array, from 0
    return pa.ListArray.from_arrays(offsets, values,
                                    mask=column.is_null() if column.null_count else None)


def _cell_values(column: pa.Array) -> pa.Array:
    """Each value of ``column`` as :func:`table` shows it (:func:`_cell` of the JSON value:
    an empty cell for a null, lists joined with ``,``, maps as ``name=value``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = column
    elif pa.types.is_integer(kind):
        text = pc.cast(column, pa.string())
    elif pa.types.is_boolean(kind):
        text = pc.if_else(column, _lit("True"), _lit("False"))
    elif pa.types.is_timestamp(kind) and kind.tz is not None:
        text = _times(column, quoted=False)
    elif pa.types.is_list(kind):
        cells = _cell_values(_child(column, column.values))
        text = pc.binary_join(_nested(column, cells), _lit(","))
    elif pa.types.is_map(kind):
        keys, values = _child(column, column.keys), _child(column, column.items)
        entries = pc.if_else(pc.is_null(values), keys,
                             pc.binary_join_element_wise(keys, _lit("="), _cell_values(values),
                                                         _lit("")))
        text = pc.binary_join(_nested(column, entries), _lit(","))
    else:
        text = pa.array([_cell(v) for v in column.to_pylist()], pa.string())
    return pc.fill_null(text, _lit(""))


# --- tail ----------------------------------------------------------------------------------

def delivery_json(delivery: Delivery) -> str:
    """One JSON object: message_id, routing_key, headers, subscription_ids,
    snapshot_version, payload, payload_encoding (``utf-8`` or ``base64``),
    ``"retained": true`` on a retained message delivered when the subscription was applied,
    and ``"alternate_exchange"`` on a delivery made through an alternate exchange."""
    payload, encoding = delivery.payload_text()
    fields = {
        "message_id": delivery.message_id,
        "routing_key": delivery.routing_key,
        "headers": delivery.headers,
        "subscription_ids": delivery.subscription_ids,
        "snapshot_version": delivery.snapshot_version,
        "payload": payload,
        "payload_encoding": encoding,
    }
    if delivery.retained:
        fields["retained"] = True
    if delivery.alternate_exchange is not None:
        fields["alternate_exchange"] = delivery.alternate_exchange
    return json.dumps(fields, ensure_ascii=False)


def delivery_line(delivery: Delivery) -> str:
    """One human line: ``<message id> <routing key> subs=<ids> v<version> [retained]
    [via=<alternate exchange>] [name=value...] <payload>`` (``retained``: a retained message
    delivered when the subscription was applied; ``via``: made through an alternate exchange).

    Strings with spaces, quotes or control characters are JSON-quoted; a
    payload that is not UTF-8 is shown as ``base64:<data>``.
    """
    payload, encoding = delivery.payload_text()
    parts = [
        delivery.message_id or "-",
        _show(delivery.routing_key) if delivery.routing_key is not None else "-",
        "subs=" + (",".join(map(_show, delivery.subscription_ids))
                   if delivery.subscription_ids is not None else "-"),
        f"v{delivery.snapshot_version}" if delivery.snapshot_version is not None else "v-",
        *(["retained"] if delivery.retained else []),
        *([f"via={_show(delivery.alternate_exchange)}"]
          if delivery.alternate_exchange is not None else []),
        *(f"{_show(n)}={_show(v) if v is not None else ''}" for n, v in delivery.headers.items()),
        _show(payload) if encoding == "utf-8" else f"base64:{payload}",
    ]
    return " ".join(parts)


def _show(text: str) -> str:
    """``text`` as is when it is one plain token, else JSON-quoted."""
    if text and text.isprintable() and not any(c in text for c in ' "\\'):
        return text
    return json.dumps(text, ensure_ascii=False)


# --- explain, subscriptions ------------------------------------------------------------------

def state_source(state: RoutingState) -> str:
    """Where the routing state comes from, in a few words."""
    if state.base_version is None:
        where = f"rebuilt from the changelog ({state.changes_applied} records)"
    elif state.stale is None:
        where = f"snapshot v{state.base_version} + {state.changes_applied} newer changelog records"
    else:
        where = f"snapshot v{state.base_version} only"
    return where if state.stale is None else f"{where}; changelog not read: {state.stale}"


# --- run ------------------------------------------------------------------------------------

def batch_line(report: BatchReport) -> str:
    """The line ``bitroute run`` prints on stdout after each batch."""
    rerun = " (re-run with its pinned version)" if report.rerun else ""
    split = " ".join(f"{k} {v:.2f}s" for k, v in report.stages.items())
    return (f"batch {report.batch_id}: {report.rows} publishes, {report.deliveries} deliveries, "
            f"{report.rejected} rejected, "
            + (f"{report.lost} lost to retention, " if report.lost else "")
            + (f"{report.expired} expired, " if report.expired else "")
            + f"snapshot v{report.snapshot_version}, "
            f"{report.seconds:.2f}s ({split}, routed in the {report.routed_in}){rerun}")


# --- audit maintain --------------------------------------------------------------------------

def maintenance_lines(report: MaintenanceReport) -> list[str]:
    """One line per table, then the pass's outcome."""
    return [_table_line(t) for t in report.tables] + [
        f"pass: {'ok' if report.ok else 'FAILED'}, {report.seconds:.2f}s, "
        f"finished {report.finished_at}"]


def _table_line(t: TableReport) -> str:
    if t.skipped:
        return f"{t.table}: skipped ({t.skipped})"
    text = (f"{t.table}: files {t.files_before} -> {t.files_after}, "
            f"bytes {_bytes(t.bytes_before, 4)} -> {_bytes(t.bytes_after, 4)}; "
            f"compacted {t.files_compacted} files into {t.compacted_into} "
            f"({t.partitions_compacted} partitions); {t.rows_deleted} rows deleted; "
            f"{t.files_vacuumed} files vacuumed; checkpoint "
            f"{'-' if t.checkpoint_version is None else 'v' + str(t.checkpoint_version)}; "
            f"{_count(t.log_entries_removed)} log entries removed, "
            f"{_count(t.log_entries)} left; version {_count(t.version)}; "
            f"{t.seconds:.2f}s")
    if t.error:
        text += f"; FAILED at {t.step}: {t.error}"
    return text


def _count(value: int | None) -> str:
    return "?" if value is None else str(value)


# --- status ---------------------------------------------------------------------------------

_LIMIT_WORDS = {"max_subscriptions_per_exchange": "subscriptions",
                "max_subscriptions_per_subscriber": "most per subscriber",
                "max_filter_levels": "deepest filter (levels)",
                "max_filter_length": "longest filter (bytes)",
                "max_header_criteria": "most header criteria"}
"""How ``bitroute status`` names the use of each limit (``[limits]``): used/limit."""


def status_lines(status: Mapping[str, Any], now: datetime | None = None) -> list[str]:
    """:func:`streaming.ops.status.router_status` (a JSON document) as aligned ``name: value`` lines."""
    now = now or datetime.now(UTC)
    router = status["router"]
    if status.get("stopping"):
        # The watchdog holds the lock until the JVM of an exited driver is gone.
        jvm = router.get("jvm_pid")
        running = (f"stopping: the driver (pid {router.get('pid', '?')}) exited, its JVM "
                   + (f"{jvm} " if jvm is not None else "") + "is ending")
    elif router is not None:
        running = (f"running, pid {router.get('pid', '?')} on {router.get('host', '?')}, "
                   f"since {router.get('started_at', '?')}")
    else:
        running = "NOT RUNNING"
    last = status["last_batch"]
    lines = [("router", running), ("mode", status.get("mode", "microbatch"))]
    realtime = (last or {}).get("realtime")
    if realtime:
        lines.append(("realtime", (
            f"routing view v{realtime.get('view_version')}"
            + (f" (not updated: {realtime['view_failure']})" if realtime.get("view_failure") else "")
            + f"; {realtime.get('audited_publishes', 0)} publishes audited since start"
            + "".join(f"; the {name} query failed, restarting: {realtime[f'{name}_failure']}"
                      for name in ("routing", "audit") if realtime.get(f"{name}_failure"))
            + "".join(f"; {name} query restarted {realtime[f'{name}_restarts']}x"
                      for name in ("routing", "audit") if realtime.get(f"{name}_restarts")))))
    latency = (last or {}).get("latency_ms")
    if latency:
        lines.append(("latency", (
            f"p50 {latency['p50']:.0f} ms, p99 {latency['p99']:.0f} ms, max {latency['max']:.0f} ms "
            "(publish to its deliveries acknowledged, the latest 10,000 publishes)")))
    if last is not None:
        lines.append(("query", f"{last.get('query_id', '?')} (run {last.get('run_id', '?')})"))
        stages = last.get("stages") or {}
        split = ", ".join(f"{name} {seconds:.2f}s" for name, seconds in stages.items())
        if last.get("routed_in"):
            split += f"; routed in the {last['routed_in']}"
        lines.append(("last batch", (
            f"{last.get('batch_id', '?')}: {last.get('publishes', '?')} publishes, "
            f"{last.get('deliveries', '?')} deliveries, {last.get('rejected', '?')} rejected, "
            + (f"{last['lost']} lost to retention, " if last.get("lost") else "")
            + (f"{last['expired']} expired, " if last.get("expired") else "")
            + f"snapshot v{last.get('snapshot_version', '?')}, {_seconds(last.get('seconds'))}"
            + (f" ({split})" if split else "")
            + f", finished {last.get('finished_at', '?')}{_ago(last.get('finished_at'), now)}")))
    else:
        lines.append(("last batch", "none recorded"))
    lines.append(("input lag", _lag_text(status["input_lag"], "publishes not routed",
                                         f"committed batch {status['committed_batch']}"
                                         if status["committed_batch"] is not None
                                         else "no committed batch")))
    gap = status.get("retention_gap")
    if gap is not None and gap.get("records"):
        lines.append(("retention gap", (
            f"{gap['records']} publishes not routed yet were deleted by Kafka (partitions "
            + ", ".join(f"{p}: {n}" for p, n in gap["partitions"].items() if n)
            + "); the router records them as lost when it reaches them "
            "(streaming.on_retention_gap)")))
    if last is not None and last.get("lost_total"):
        lines.append(("lost", f"{last['lost_total']} publishes lost to retention since the "
                              "router started (audit: messages with outcome 'lost')"))
    if last is not None and last.get("expired_total"):
        lines.append(("expired", f"{last['expired_total']} publishes expired before they were "
                                 "routed since the router started (audit: messages with outcome "
                                 "'expired')"))
    version = status["snapshot_version"]
    for replay in status.get("replays") or []:
        rate = replay.get("rate")
        lines.append(("replay", (
            f"{replay['subscription']} ({replay['subscriber']}) from {replay['from']} to "
            + (f"batch {replay['to_batch']}" if replay.get("to_batch") is not None
               else "its first batch (not applied yet)")
            + f": {replay['done']}/{replay['publishes']} publishes read, "
            f"{replay['delivered']} delivered"
            + (f", {rate:,.0f} deliveries/s" if rate is not None else "")
            + (f"; {replay['note']}" if replay.get("note") else ""))))
    lines.append(("changelog lag", _lag_text(status["changelog_lag"], "changes not applied",
                                             f"snapshot v{version}" if version is not None
                                             else "no snapshot")))
    if status["subscriptions"] is not None:
        lines.append(("subscriptions", f"{status['subscriptions']} live, {status['subscribers']} "
                                       f"subscribers (snapshot v{version})"))
    else:
        lines.append(("subscriptions", "unknown (no snapshot)"))
    for exchange, limits in (status.get("limits") or {}).items():
        lines.append((f"limits {exchange}", ", ".join(
            f"{_LIMIT_WORDS[name]} {figures['used']:,}/{figures['limit']:,}"
            for name, figures in limits.items())))
    alternates = status.get("alternate_exchanges")
    if alternates:
        lines.append(("alternates", ", ".join(f"{exchange} -> {alternate}"
                                              for exchange, alternate in alternates.items())
                      + " (a publish its exchange routes to no one goes to the alternate's "
                        "subscribers)"))
    unfed = status.get("unfed_delivery_topics")
    if unfed:
        lines.append(("unfed topics", (
            f"{len(unfed)} delivery topic{'' if len(unfed) == 1 else 's'} no subscription feeds: "
            + ", ".join(unfed[:5]) + (", ..." if len(unfed) > 5 else "")
            + " (`bitroute retire SUBSCRIBER --delete-topic` deletes one)")))
    if last is not None and "audit_pending_batches" in last:
        lag = last.get("audit_lag_seconds")
        lines.append(("audit", f"{last['audit_pending_batches']} batches pending"
                               + ("" if lag is None else f", {_seconds(lag)} behind")))
    for name, table_status in (status.get("audit_tables") or {}).items():
        if "error" in table_status:
            lines.append((f"table {name}", table_status["error"]))
        else:
            lines.append((f"table {name}", (
                f"{table_status['files']} data files, {_bytes(table_status['bytes'])}, "
                f"{'?' if table_status['log_entries'] is None else table_status['log_entries']} "
                f"log entries, version {table_status['version']}")))
    lines.append(("maintenance", _maintenance_text(status.get("maintenance"), now)))
    lease = status.get("lease")
    if lease is not None:
        lines.append(("lease", lease["error"] if "error" in lease else _lease_text(lease)))
    if status["kafka_error"] is not None:
        lines.append(("kafka", status["kafka_error"]))
    lines += [("note", note) for note in status["notes"]]
    width = max(len(name) for name, _ in lines) + 1
    return [f"{name + ':':<{width}} {value}" for name, value in lines]


def _lease_text(lease: Mapping[str, Any]) -> str:
    """The router lease of the publishes topic and warehouse (streaming.state.lease)."""
    age = lease.get("age_seconds")
    state = (f"released {lease['released_at']}" if lease.get("released_at") else
             f"renewed {'?' if age is None else _seconds(max(float(age), 0.0))} ago")
    return (f"router {lease.get('router_id')} on {lease.get('host')} (checkpoint "
            f"{lease.get('checkpoint_dir')}), epoch {lease.get('epoch')}, {state}")


def _lag_text(lag: Mapping[str, Any], what: str, since: str) -> str:
    if lag["records"] is None:
        return f"unknown (Kafka did not answer; {since})"
    return f"{lag['records']} {what} in {lag['topic']} ({since})"


def _maintenance_text(report: Mapping[str, Any] | None, now: datetime) -> str:
    if not report:
        return "no pass recorded yet"
    finished = report.get("finished_at")
    when = f"{finished}{_ago(finished, now)}"
    if not report.get("ok"):
        return f"FAILED, {when}: {report.get('error')}"
    tables = report.get("tables") or []
    done = "; ".join(
        f"{t['table']} {t['files_compacted']} files compacted, {t['rows_deleted']} rows deleted, "
        f"{t['files_vacuumed']} vacuumed, {t.get('log_entries_removed') or 0} log entries removed"
        for t in tables if not t.get("skipped"))
    return f"ok, {when}, {report.get('seconds', 0):.1f}s" + (f" ({done})" if done else "")


def _bytes(n: float, units: int = len(_TABLE_UNITS)) -> str:
    """``n`` bytes in the largest of the first ``units`` of B, KB, MB, GB, TB under 1024."""
    names = _TABLE_UNITS[:units]
    for unit in names:
        if n < 1024 or unit == names[-1]:
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _seconds(value: object) -> str:
    return f"{value:.2f}s" if isinstance(value, (int, float)) else "?"


def _ago(text: object, now: datetime) -> str:
    try:
        then = datetime.fromisoformat(str(text))
    except ValueError:
        return ""
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    return f" ({(now - then).total_seconds():.0f}s ago)"

"""The Python paths of offline matching (:func:`compiler.offline.match_files`),
for the files the kernel does not take: see :mod:`compiler.offline` for the
contract.

The *columnar* path reads a file with Arrow's JSON
reader, validates and classifies the subscriptions per distinct value,
builds the snapshot tables directly, matches the topics in blocks through
:meth:`~compiler.matcher.Matcher.match_topics` and writes the lines with
Arrow string kernels. It takes only files whose every line Arrow and
Python's ``json`` read alike (no ``\\u`` escapes, no line breaks other than
``\\n``, no blank or indented lines, one object a line, ids all strings or
all integers, no headers, no null ``id``/``filter``/``message_id``); any
other file goes through the *record* path, one ``json.loads`` and one
``Matcher.match`` per line. Lines the columnar path finds unusual
(rejections, invalid or null topics, shared groups) are answered by the
record path's own code, so messages are the same.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .columns import bool_mask, numpy_of, object_array
from .errors import CompilerError, FilterError, HeaderCriteriaError, HeaderError, SubscriptionError, TopicError
from .grammar import grammar_for
from .headers import HeaderCriteria
from .index import RoutingIndex
from .matcher import Matcher
from .offline import EXCHANGE, InputFileError, OfflineResult, read_file
from .pattern import CODE_EXACT, CODE_MULTI, CODE_SHAPE_BASE, FilterKind
from .snapshot import Snapshot, SnapshotTables
from .subscription import Subscription, validate_subscriber

BLOCK_ROWS = 8192
"""Topic lines matched and written per block on the columnar path: bounds
memory when each line names thousands of subscriptions."""

READ_BLOCK_BYTES = 16 << 20
"""Arrow JSON reader block size (a line longer than this takes the record path)."""

_NOT_COLUMNAR = (b"\r", b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e", b"\\u", b"\xc2\x85", b"\xe2\x80\xa8", b"\xe2\x80\xa9")
"""Byte strings after which Python's ``str.splitlines``/``json`` and Arrow's
reader may disagree: other line breaks than ``\n``, escapes (lone
surrogates). A multi-byte one is searched only when its first byte occurs."""

_BLANK_OR_INDENTED = re.compile(rb"\n[\n \t]")
"""A blank or indented line: Python skips or strips it, Arrow may not."""

_JSON_PLAIN = r"^[ !#-\[\]-~]*$"
"""Strings that ``json.dumps`` writes as themselves between quotes."""


def python_result(dialect, subscriptions_path: str, topics_path: str) -> OfflineResult:
    """The result through the columnar or the record path (see the module docstring)."""
    subs_data = read_file(subscriptions_path, "subscriptions")
    subs_table = _columnar_table(subs_data, _subscription_columns_ok)
    if subs_table is None:
        subs_records = list(_records(subs_data, subscriptions_path, "subscriptions"))
    topics_data = read_file(topics_path, "topics")
    # Columnar topics need columnar subscriptions (their output texts and order).
    topics_table = _columnar_table(topics_data, _topic_columns_ok) if subs_table is not None else None
    if topics_table is None:
        topics_records = list(_records(topics_data, topics_path, "topics"))
    del subs_data, topics_data

    if subs_table is not None:
        subs = _ColumnarSubscriptions(dialect, subs_table)
    else:
        subs = _RecordSubscriptions(dialect, subs_records)
    if topics_table is not None:
        chunks = _columnar_lines(subs, topics_table)
    else:
        chunks = _record_lines(subs, topics_records)
    return OfflineResult(subs.rejections, chunks)


def _records(data: bytes, path: str, what: str) -> Iterator[tuple[int, dict]]:
    """``(0-based line number, object)`` for each non-blank line."""
    lines = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n").splitlines()
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputFileError(f"{what} file {path}, line {number + 1}: not JSON ({exc})") from None
        if not isinstance(record, dict):
            raise InputFileError(f"{what} file {path}, line {number + 1}: not a JSON object")
        yield number, record


def _columnar_table(data: bytes, columns_ok) -> pa.Table | None:
    """The file as an Arrow table with row ``i`` = line ``i``, or ``None`` when
    the record path must read it (see the module docstring)."""
    if not data:
        return None
    if data[:1] in (b" ", b"\t", b"\n", b"\xef"):  # indented, blank, or a byte-order mark
        return None
    if any(marker[:1] in data and marker in data for marker in _NOT_COLUMNAR) or _BLANK_OR_INDENTED.search(data):
        return None
    import pyarrow.json as pj  # only this path reads JSON with Arrow

    try:
        table = pj.read_json(pa.py_buffer(data), read_options=pj.ReadOptions(block_size=READ_BLOCK_BYTES))
    except pa.ArrowException:
        return None
    lines = data.count(b"\n") + (not data.endswith(b"\n"))
    if table.num_rows != lines or not columns_ok(table):
        return None
    return table


def _subscription_columns_ok(table: pa.Table) -> bool:
    names = table.column_names
    if "id" not in names or "filter" not in names:
        return False
    ids, filters = table.column("id"), table.column("filter")
    if ids.null_count or filters.null_count or not pa.types.is_string(filters.type):
        return False
    if not (pa.types.is_string(ids.type) or pa.types.is_int64(ids.type)):
        return False
    if "subscriber" in names and not _string_or_null(table.column("subscriber").type):
        return False
    return "headers" not in names or pa.types.is_null(table.column("headers").type)


def _topic_columns_ok(table: pa.Table) -> bool:
    names = table.column_names
    if "topic" in names and not _string_or_null(table.column("topic").type):
        return False
    if "message_id" in names:
        column = table.column("message_id")
        if column.null_count or not pa.types.is_string(column.type):
            return False
    return "headers" not in names or pa.types.is_null(table.column("headers").type)


def _string_or_null(dtype: pa.DataType) -> bool:
    return pa.types.is_string(dtype) or pa.types.is_null(dtype)


# -- one record at a time ----------------------------------------------------------


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _subscription(record: dict) -> Subscription:
    if "id" not in record:
        raise SubscriptionError("missing field 'id'")
    given_id = record["id"]
    if not (_is_number(given_id) or (isinstance(given_id, str) and given_id)):
        raise SubscriptionError(f"id must be a non-empty string or a number, not {json.dumps(given_id)}")
    if "filter" not in record:
        raise SubscriptionError("missing field 'filter'")
    if not isinstance(record["filter"], str):
        raise SubscriptionError(f"field 'filter' must be a string, not {json.dumps(record['filter'])}")
    subscriber = record.get("subscriber")
    if subscriber is None:
        subscriber = _implicit_subscriber(given_id)
    headers = None
    if record.get("headers") is not None:
        try:
            headers = HeaderCriteria.from_json(record["headers"])
        except HeaderCriteriaError as exc:
            raise SubscriptionError(str(exc)) from None
    return Subscription(json.dumps(given_id), EXCHANGE, subscriber, record["filter"], headers)


def _implicit_subscriber(given_id: object) -> str:
    name = str(given_id)
    try:
        return validate_subscriber(name)
    except SubscriptionError:
        return "_" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def _message(record: dict, line_number: int) -> tuple[dict[str, str | None] | None, str]:
    headers = record.get("headers")
    if headers is not None:
        if not isinstance(headers, dict) or not all(v is None or isinstance(v, str) for v in headers.values()):
            raise HeaderError(f"headers must be an object of string or null values, not {json.dumps(headers)}")
    message_id = record.get("message_id", str(line_number))
    if not isinstance(message_id, str):
        raise TopicError(f"message_id must be a string, not {json.dumps(message_id)}")
    return headers, message_id


def _id_order(value: object) -> tuple[int, object]:
    return (0, value) if _is_number(value) else (1, value)


def _rejection(given_id: object, reason: str) -> str:
    # ASCII-escaped: a JSON string may carry a lone surrogate ("\udc80"),
    # which a UTF-8 stream cannot encode.
    return json.dumps({"id": given_id, "error": reason})


def _topic_line(topic: object, matcher: Matcher, record: dict, line_number: int, given_ids) -> str:
    """One output line through ``Matcher.match`` (``given_ids``: internal id -> id as given)."""
    try:
        headers, message_id = _message(record, line_number)
        deliveries = matcher.match(EXCHANGE, topic, headers, message_id)
    except CompilerError as exc:
        return json.dumps({"topic": topic, "error": str(exc)}) + "\n"
    ids = [given_ids(sub_id) for delivery in deliveries for sub_id in delivery.subscription_ids]
    ids.sort(key=_id_order)
    return json.dumps({"topic": topic, "subscriptions": ids}) + "\n"


class _RecordSubscriptions:
    """The subscriptions, upserted one record at a time."""

    def __init__(self, dialect, records: list[tuple[int, dict]]) -> None:
        index = RoutingIndex({EXCHANGE: dialect})
        self.rejections: list[str] = []
        self.original_ids: dict[str, object] = {}
        for _, record in records:
            given_id = record.get("id")
            try:
                sub = _subscription(record)
                if sub.id in self.original_ids:
                    raise SubscriptionError(f"duplicate subscription id {json.dumps(given_id)}")
                index.upsert(sub)
            except CompilerError as exc:
                self.rejections.append(_rejection(given_id, str(exc)))
                continue
            self.original_ids[sub.id] = given_id
        self.matcher = Matcher(index.snapshot(0, {}))

    def given_id(self, sub_id: str) -> object:
        return self.original_ids[sub_id]


def _record_lines(subs, records: list[tuple[int, dict]]) -> Iterator[str]:
    lines: list[str] = []
    for line_number, record in records:
        lines.append(_topic_line(record.get("topic"), subs.matcher, record, line_number, subs.given_id))
        if len(lines) >= BLOCK_ROWS:
            yield "".join(lines)
            lines = []
    if lines:
        yield "".join(lines)


# -- columns ---------------------------------------------------------------------


class _ColumnarSubscriptions:
    """The subscriptions of a columnar file, validated per distinct filter
    and subscriber name and laid out as snapshot tables directly."""

    def __init__(self, dialect, table: pa.Table) -> None:
        self.dialect = dialect
        self.grammar = grammar_for(dialect)
        n = table.num_rows
        ids = table.column("id").combine_chunks()
        filters = table.column("filter").combine_chunks()
        string_ids = pa.types.is_string(ids.type)
        # Internal id = json.dumps(given id): also the id's output text.
        if string_ids:
            plain = _mask(pc.match_substring_regex(ids, _JSON_PLAIN))
            id_text = object_array(pc.binary_join_element_wise('"', ids, '"', ""))
            for i in np.flatnonzero(~plain).tolist():
                id_text[i] = json.dumps(ids[i].as_py())
            bad_pre = _mask(pc.equal(pc.utf8_length(ids), 0))
        else:
            id_text = object_array(pc.cast(ids, pa.string()))
            bad_pre = np.zeros(n, dtype=bool)

        subscribers = table.column("subscriber").combine_chunks() if "subscriber" in table.column_names else None
        names = self._subscriber_names(ids, subscribers, string_ids, n)
        name_codes, distinct_names = _encode(names)
        name_ok = np.fromiter(map(_valid_subscriber, distinct_names), dtype=bool, count=len(distinct_names))
        filter_codes, distinct_filters = _encode(filters)
        kinds = self._classify(distinct_filters)
        filter_ok = kinds >= 0

        ok = ~bad_pre & name_ok[name_codes] & filter_ok[filter_codes]
        # Per id, the first row that passes every check is registered; later
        # rows of that id that pass the record checks are duplicates.
        id_codes, _ = _encode(pa.array(id_text, type=pa.string()))
        rows = np.arange(n, dtype=np.int64)
        first = np.full(int(id_codes.max(initial=-1)) + 1, n, dtype=np.int64)
        np.minimum.at(first, id_codes[ok], rows[ok])
        registered = ok & (rows == first[id_codes])
        duplicate = ~bad_pre & (rows > first[id_codes])
        self.rejections = []
        for i in np.flatnonzero(~registered).tolist():
            given_id = ids[i].as_py()
            if duplicate[i]:
                reason = f"duplicate subscription id {json.dumps(given_id)}"
            else:
                reason = self._record_rejection(table, i)
            self.rejections.append(_rejection(given_id, reason))

        live = np.flatnonzero(registered)
        self.id_text = pa.array(id_text[live], type=pa.string())
        live_filters, sub_filter = np.unique(filter_codes[live], return_inverse=True)
        live_names, sub_subscriber = np.unique(name_codes[live], return_inverse=True)
        shapes = tuple(self._shapes)
        snapshot_tables = SnapshotTables(
            exchange_names=(EXCHANGE,),
            shapes=shapes,
            sub_ids=self.id_text,
            sub_filter=_slots(sub_filter),
            sub_subscriber=_slots(sub_subscriber),
            criteria_slots=_slots([]),
            criteria_ref=_slots([]),
            criteria_sets=(),
            subscriber_names=pa.array([distinct_names[k] for k in live_names.tolist()], type=pa.string()),
            filter_text=pa.array([distinct_filters[f] for f in live_filters.tolist()], type=pa.string()),
            filter_exchange=_slots(np.zeros(len(live_filters), dtype=np.int64)),
            filter_code=_slots(kinds[live_filters]),
        )
        self.matcher = Matcher(Snapshot(0, {}, {EXCHANGE: dialect}, snapshot_tables, len(live)))
        # Output order of a slot: numbers numerically, strings by code point
        # (Arrow sorts UTF-8 bytes, which is the same order).
        live_ids = ids.take(pa.array(live))
        self.rank = np.empty(len(live), dtype=np.int64)
        self.rank[numpy_of(pc.sort_indices(live_ids))] = np.arange(len(live))

    def given_id(self, sub_id: str) -> object:
        return json.loads(sub_id)

    def _subscriber_names(self, ids, subscribers, string_ids: bool, n: int) -> np.ndarray:
        """Per row, the subscriber name: given, or implicit from the id."""
        implicit = object_array(pc.cast(ids, pa.string()))
        if string_ids:
            # ids that are not valid names get the surrogate (rare: in Python)
            valid = _mask(pc.match_substring_regex(ids, r"^[A-Za-z0-9._-]{1,200}$")) & ~_mask(
                pc.is_in(ids, pa.array([".", ".."]))
            )
            for i in np.flatnonzero(~valid).tolist():
                implicit[i] = _implicit_subscriber(implicit[i])
        if subscribers is None or pa.types.is_null(subscribers.type):
            return implicit
        given = object_array(subscribers)
        missing = _mask(pc.is_null(subscribers))
        given[missing] = implicit[missing]
        return given

    def _classify(self, texts: list[str]) -> np.ndarray:
        """Filter code per distinct filter text, -1 when invalid. Plain
        wildcard-free filters are recognised with Arrow kernels; the others
        are parsed one by one."""
        grammar = self.grammar
        column = pa.array(texts, type=pa.string())
        if grammar.DOLLAR_RULE:
            odd = pc.or_(
                pc.match_substring_regex(column, "^$|[+#\x00]|^\\$share/"),
                pc.greater(pc.utf8_length(column), grammar.MAX_BYTES // 4),
            )
        else:
            odd = pc.or_(pc.match_substring_regex(column, "[*#]"), pc.greater(pc.binary_length(column), grammar.MAX_BYTES))
        codes = np.full(len(texts), CODE_EXACT, dtype=np.int64)
        self._shapes: list = []
        shape_code: dict = {}
        for f in np.flatnonzero(_mask(odd)).tolist():
            try:
                parsed = grammar.parse_filter(texts[f])
            except FilterError:
                codes[f] = -1
                continue
            if parsed.kind is FilterKind.EXACT:
                continue
            if parsed.kind is FilterKind.MULTI:
                codes[f] = CODE_MULTI
                continue
            code = shape_code.get(parsed.shape)
            if code is None:
                code = shape_code[parsed.shape] = CODE_SHAPE_BASE + len(self._shapes)
                self._shapes.append(parsed.shape)
            codes[f] = code
        return codes

    def _record_rejection(self, table: pa.Table, row: int) -> str:
        """The record path's reason for rejecting line ``row``."""
        record = {name: table.column(name)[row].as_py() for name in ("id", "filter", "subscriber") if name in table.column_names}
        try:
            RoutingIndex({EXCHANGE: self.dialect}).upsert(_subscription(record))
        except CompilerError as exc:
            return str(exc)
        raise AssertionError(f"line {row} was rejected by the columnar checks but not by the record path")


def _columnar_lines(subs, table: pa.Table) -> Iterator[str]:
    """Output chunks of a columnar topics file, one per block of lines."""
    n = table.num_rows
    if "topic" in table.column_names and pa.types.is_string(table.column("topic").type):
        topics = table.column("topic").combine_chunks()
    else:
        topics = pa.nulls(n, type=pa.string())
    message_ids = table.column("message_id").combine_chunks() if "message_id" in table.column_names else None
    for start in range(0, n, BLOCK_ROWS):
        yield _columnar_block(subs, topics.slice(start, BLOCK_ROWS), message_ids, start)


def _columnar_block(subs, topics: pa.StringArray, message_ids, start: int) -> str:
    n = len(topics)
    encoded = pc.dictionary_encode(topics, null_encoding="encode")
    row_topic = numpy_of(encoded.indices).astype(np.int64)
    distinct = encoded.dictionary
    has_null = distinct.null_count > 0
    texts = distinct.to_pylist()
    valid = [t for t in texts if t is not None]
    position = np.full(len(texts), -1, dtype=np.int64)
    position[np.flatnonzero(_mask(pc.is_valid(distinct)))] = np.arange(len(valid))
    (flat, offsets), errors, conditioned = subs.matcher.match_topics(EXCHANGE, valid, subs.rank)
    ids = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), subs.id_text.take(pa.array(flat)))
    joined = pc.binary_join(ids, ", ")
    column = pa.array(valid, type=pa.string())
    topic_json = pc.binary_join_element_wise('"', column, '"', "")
    lines = pc.binary_join_element_wise('{"topic": ', topic_json, ', "subscriptions": [', joined, "]}\n", "")
    plain = _mask(pc.match_substring_regex(column, _JSON_PLAIN))
    special = set(np.flatnonzero(~plain).tolist()) | set(errors) | set(conditioned)
    row_position = position[row_topic]
    row_line = lines.take(pa.array(np.maximum(row_position, 0))) if len(valid) else None
    if not special and not has_null:
        return "" if row_line is None else _concat(row_line).decode("ascii")
    out = row_line.to_pylist() if row_line is not None else [None] * n
    for i in range(n):
        t = int(row_position[i])
        if t >= 0 and t not in special:
            continue
        topic = texts[row_topic[i]]
        record = {"topic": topic}
        if message_ids is not None:
            record["message_id"] = message_ids[start + i].as_py()
        if t >= 0 and t in errors:
            out[i] = json.dumps({"topic": topic, "error": errors[t]}) + "\n"
        elif t >= 0 and t not in conditioned:
            # a topic that json.dumps escapes: the same ids, written by json
            sub_ids = [json.loads(x) for x in subs.id_text.take(pa.array(flat[offsets[t]:offsets[t + 1]])).to_pylist()]
            out[i] = json.dumps({"topic": topic, "subscriptions": sub_ids}) + "\n"
        else:
            out[i] = _topic_line(topic, subs.matcher, record, start + i, subs.given_id)
    return "".join(out)


def _concat(lines: pa.StringArray) -> str:
    """The concatenation of ``lines`` (no nulls), read from the Arrow data buffer."""
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32, count=len(lines) + 1, offset=4 * lines.offset)
    data = lines.buffers()[2]
    return b"" if data is None else data.to_pybytes()[offsets[0]:offsets[-1]]


def _mask(array) -> np.ndarray:
    return bool_mask(array)


def _encode(column) -> tuple[np.ndarray, list]:
    """``(codes, distinct values)`` of an Arrow array (or numpy object array)."""
    if isinstance(column, np.ndarray):
        column = pa.array(column, type=pa.string())
    encoded = pc.dictionary_encode(column)
    return numpy_of(encoded.indices).astype(np.int64), encoded.dictionary.to_pylist()


def _valid_subscriber(name: str) -> bool:
    try:
        validate_subscriber(name)
    except SubscriptionError:
        return False
    return True


def _slots(values) -> np.ndarray:
    out = np.asarray(values, dtype=np.uint32)
    out.flags.writeable = False
    return out

"""The Kafka record rules, no broker needed: reading publishes from Arrow batches as the
Spark Kafka source hands them over, and the JSON of subscription ids."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, strategies as st

from arrow_batches import source_batch
from schemas.records import MESSAGE_ID_PATTERN, message_id, message_id_column
from streaming.kafka.records import (
    HEADER_OVERHEAD,
    PublishColumns,
    header_size,
    kept_headers,
    record_size,
    record_sizes,
    subscription_ids_json,
)


def test_the_last_exchange_header_wins_and_a_missing_one_means_the_default():
    batch = source_batch([(b"a", b"", []), (b"a", b"", [("exchange", b"x"), ("exchange", b"mqtt")]),
                          (b"a", b"", [("other", b"1")])])
    publishes = PublishColumns(batch, "amq.topic")
    assert publishes.exchanges == ["amq.topic", "mqtt", "amq.topic"]
    assert publishes.exchange_errors == {}
    assert publishes.message_ids.to_pylist() == ["p/0/0", "p/0/1", "p/0/2"]


def test_an_exchange_header_that_is_not_utf8_is_a_reason_not_an_error():
    publishes = PublishColumns(source_batch([(b"a", b"", [("exchange", b"\xff\xfe")])]), "amq.topic")
    assert publishes.exchanges == [None]
    assert "not valid UTF-8" in publishes.exchange_errors[0]


def test_the_audit_header_map_keeps_the_last_of_a_name_and_escapes_bytes_that_are_not_utf8():
    batch = source_batch([(b"a", b"", [("k", b"1"), ("k", b"2"), ("bin", b"\xff")]), (b"b", b"", [])])
    sliced = batch.slice(0, 2)
    assert PublishColumns(sliced, "amq.topic").header_map().to_pylist() == [
        [("k", "2"), ("bin", "\\xff")], []]


def test_a_sliced_batch_reads_its_own_rows():
    batch = source_batch([(b"a", b"1", [("exchange", b"mqtt")]), (b"b", b"2", [("h", b"v")])])
    publishes = PublishColumns(batch.slice(1), "amq.topic")
    assert publishes.exchanges == ["amq.topic"]
    assert publishes.header_lists() == [[("h", b"v")]]
    assert publishes.message_ids.to_pylist() == ["p/0/1"]


def test_router_headers_are_not_copied_and_sizes_count_every_byte():
    headers = [("bitroute.message_id", b"forged"), ("trace", b"t")]
    assert kept_headers(headers) == [("trace", b"t")]
    assert record_size(b"key", b"x" * 100, [("trace", b"t")]) >= 3 + 100 + 5 + 1


def test_one_size_rule_for_a_record_its_columns_and_a_header():
    """record_sizes (the router's oversize check) is record_size row by row; a header's
    size counts its name in UTF-8 bytes, not characters."""
    rows = [(b"k", b"v" * 10, [("tracé", b"t"), ("h", None)]), (None, None, []), (b"", b"x", None)]
    sizes = record_sizes(pa.array([r[0] for r in rows], pa.binary()),
                         pa.array([r[1] for r in rows], pa.binary()), [r[2] for r in rows])
    assert sizes.tolist() == [record_size(k, v, h or []) for k, v, h in rows]
    assert header_size("tracé", 3) == HEADER_OVERHEAD + 6 + 3


@given(st.lists(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=3), max_size=6),
       st.integers(0, 3))
def test_subscription_ids_json_is_each_list_in_order_even_from_a_sliced_column(ids, start):
    """Any id text (quotes, backslashes, control characters, non-ASCII) survives, in order."""
    column = pa.array(ids, pa.list_(pa.string())).slice(min(start, len(ids)))
    texts = subscription_ids_json(column).to_pylist()
    assert [json.loads(t) for t in texts] == ids[min(start, len(ids)):]


@given(st.lists(st.tuples(st.from_regex(r"[A-Za-z0-9._/-]{1,20}", fullmatch=True),
                          st.integers(0, 2**31 - 1), st.integers(0, 10**18 - 1)),
                min_size=1, max_size=8))
def test_a_message_id_is_built_alike_from_values_and_columns_and_parses_back(records):
    """Any topic name (even with ``/``), partition and offset of up to 18 digits: the
    pattern gives them back, to Arrow and to Python alike."""
    topics, partitions, offsets = zip(*records, strict=True)
    ids = message_id_column(pa.array(topics), pa.array(partitions, pa.int32()),
                            pa.array(offsets, pa.int64()))
    assert ids.to_pylist() == [message_id(*r) for r in records]
    parsed = pc.extract_regex(ids, MESSAGE_ID_PATTERN).to_pylist()
    assert [(p["topic"], int(p["partition"]), int(p["offset"])) for p in parsed] == records
    for text, record in zip(ids.to_pylist(), records, strict=True):
        match = re.match(MESSAGE_ID_PATTERN, text)
        assert match is not None, text
        assert (match["topic"], int(match["partition"]), int(match["offset"])) == record


def test_a_recreated_topics_message_ids_carry_its_incarnation_and_parse_back():
    """Incarnation 0 keeps ``<topic>/<p>/<o>``; n >= 1 is ``<topic>~<n>/<p>/<o>``, whose
    topic part the pattern gives back whole (and sorts after the first incarnation's)."""
    ids = message_id_column(pa.array(["t.p", "t.p"]), pa.array([0, 3], pa.int32()),
                            pa.array([5, 0], pa.int64()), 2)
    assert ids.to_pylist() == ["t.p~2/0/5", "t.p~2/3/0"] == [message_id("t.p", 0, 5, 2),
                                                           message_id("t.p", 3, 0, 2)]
    assert message_id("t.p", 0, 5, 0) == "t.p/0/5"
    match = re.match(MESSAGE_ID_PATTERN, "t.p~2/3/0")
    assert match is not None and match.group("topic", "partition") == ("t.p~2", "3")
    assert "t.p/9/9" < "t.p~1/0/0"

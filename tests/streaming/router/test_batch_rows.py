"""A driver batch's rows read from Kafka (streaming.router.batch.batch_rows) are the Spark Kafka
source's rows of the same range, column for column."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from streaming.kafka.records import SOURCE_COLUMNS
from streaming.kafka.settings import ClientSettings
from streaming.router.batch.batch_rows import SOURCE_ARROW, BatchRows

pytestmark = pytest.mark.integration


def _spark_rows(spark, bootstrap: str, topic: str, start: dict[int, int],
                end: dict[int, int]) -> pa.Table:
    rows = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic).option("includeHeaders", "true")
            .option("startingOffsets", json.dumps({topic: {str(p): o for p, o in start.items()}}))
            .option("endingOffsets", json.dumps({topic: {str(p): o for p, o in end.items()}}))
            .load().select(*SOURCE_COLUMNS).toArrow())
    return rows.sort_by([("partition", "ascending"), ("offset", "ascending")])


def test_the_rows_are_the_spark_sources_rows_of_the_same_range(kafka_bootstrap, new_topic, spark):
    topic = new_topic(partitions=3)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    records: list[tuple[int, bytes | None, bytes | None, list[tuple[str, str | bytes | None]] | None]] = [
        (0, b"k", b"v", None),                                   # no headers
        (0, None, b"null key", [("exchange", b"amq.topic")]),
        (1, b"k2", None, [("a", b"1"), ("a", None), ("b", b"")]),  # a null value, repeated names
        (1, b"", b"", []),
        (2, "\u00e9".encode(), b"\xff\xfe not utf-8", [("h\u00e9", b"\x00\xff")]),
    ]
    for partition, key, value, headers in records * 4:
        producer.produce(topic, value, key, partition=partition, headers=headers)
    assert producer.flush(30) == 0
    reader = BatchRows(ClientSettings.of(kafka_bootstrap), topic)
    try:
        # A batch of a range inside the log, a partition absent from the start (read from 0),
        # and a partition with nothing in the range.
        start, end = {0: 2, 1: 1}, {0: 7, 1: 6, 2: 4}
        ours = pa.Table.from_batches([reader.read(start, end)])
        theirs = _spark_rows(spark, kafka_bootstrap, topic, {**{2: 0}, **start}, end)
        assert ours.num_rows == theirs.num_rows == 5 + 5 + 4
        assert ours.schema.names == theirs.schema.names
        for name in SOURCE_COLUMNS:
            assert ours[name].to_pylist() == theirs[name].cast(SOURCE_ARROW.field(name).type) \
                .to_pylist(), name
        # Again: the same consumer, another range; an empty range is an empty batch.
        again = reader.read({0: 7, 1: 6, 2: 4}, {0: 8, 1: 6, 2: 4})
        empty = reader.read({0: 8}, {0: 8})
        assert again is not None and empty is not None
        assert again.column("offset").to_pylist() == [7]
        assert empty.num_rows == 0
        assert reader.read(None, {0: 8}) is None
    finally:
        reader.close()

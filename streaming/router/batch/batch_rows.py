"""A small batch's publishes read by the driver straight from Kafka, without a Spark job.

A batch routed in the driver (``streaming.driver_route_max_publishes``) needs its
Kafka rows in the driver's process. ``DataFrame.toArrow`` of the batch brings them
with a Spark job (plan, schedule, a task reading Kafka, the rows through the JVM into
Python): the largest fixed cost of a light batch after Spark's own trigger, a third to
a half of its route stage (docs/benchmarks-history.md, "The micro-batch floor").
:class:`BatchRows` reads the same records, the batch's offset range as Spark's offset
log states it (``offsets/<id-1>`` to ``offsets/<id>``,
:mod:`streaming.state.offsets_log`), with one librdkafka consumer kept for the
router's life, and hands them over in the Spark Kafka source's Arrow layout
(:class:`streaming.kafka.records.PublishColumns` reads either).

Same records as Spark's source, by construction:

- the range is the offset log's, which Spark wrote before calling the batch, so a
  re-run batch reads the same range again;
- ``isolation.level = read_uncommitted``, as Spark's consumer (its end offsets are the
  high watermarks, which a read_committed consumer could not reach past an open
  transaction);
- records Kafka deleted below the range's end (retention) are skipped, as the router's
  source does with ``failOnDataLoss = false``: the consumer resets to the earliest
  offset, and :mod:`streaming.router.topics.retention` records the gap;
- a partition absent from the start (added to the topic) is read from offset 0, as
  :func:`~streaming.state.offsets_log.records_between` counts it.

:meth:`BatchRows.read` returns None when it cannot stand in for the Spark job (the
range unknown, a log that ends below the range's end, a header name that is not UTF-8):
the caller then reads through Spark, so no record of the range is ever left unread.
A Kafka failure raises (``KafkaException``): the batch's step is retried.
"""

from __future__ import annotations

import time

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from streaming.kafka import clients
from streaming.kafka.settings import ClientSettings

SOURCE_ARROW = pa.schema([
    pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()), pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("headers", pa.list_(pa.struct([pa.field("key", pa.string()),
                                            pa.field("value", pa.binary())]))),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
])
"""The Spark Kafka source's columns (``includeHeaders``), as ``toArrow`` hands them over."""
READ_TIMEOUT_S = 30.0
"""How long a batch's range may take to read before the read fails (and is retried)."""
_POLL_S = 0.05
_CONSUMER = {
    "isolation.level": "read_uncommitted",
    "auto.offset.reset": "earliest",
    "enable.partition.eof": True,
    "fetch.wait.max.ms": 10,
    "fetch.min.bytes": 1,
}


class BatchRows:
    """Reads a batch's offset range of ``topic`` (module docstring); :meth:`close` at the end."""

    def __init__(self, settings: ClientSettings, topic: str) -> None:
        self.topic = topic
        self._settings = settings
        self._consumer: clients.BitrouteConsumer | None = None

    def read(self, start: dict[int, int] | None, end: dict[int, int] | None,
             timeout: float = READ_TIMEOUT_S) -> pa.RecordBatch | None:
        """The records from ``start`` to ``end`` (offsets per partition, end exclusive) in
        the source's layout, partition by partition in offset order; None when the range
        is unknown or a record cannot be laid out as Spark would (the caller reads
        through Spark)."""
        if start is None or end is None or not set(start) <= set(end):
            return None
        wanted = {p: (start.get(p, 0), e) for p, e in sorted(end.items()) if e > start.get(p, 0)}
        if not wanted:
            return _empty()
        if self._consumer is None:
            self._consumer = clients.consumer(self._settings, "bitroute-batch-rows", _CONSUMER)
        consumer = self._consumer
        rows: dict[int, list] = {p: [] for p in wanted}
        try:
            consumer.assign([TopicPartition(self.topic, p, s) for p, (s, _) in wanted.items()])
            todo = set(wanted)
            done = {p: s for p, (s, _) in wanted.items()}  # the next offset wanted
            deadline = time.monotonic() + timeout
            while todo:
                if time.monotonic() > deadline:
                    raise KafkaException(KafkaError(KafkaError._TIMED_OUT,
                                                    f"partitions {sorted(todo)} of {self.topic} "
                                                    f"not read to the batch's end in {timeout:.0f}s"))
                # consume() returns once it holds that many events or at its timeout: ask
                # for what is left of the range (an end-of-partition event counts as one),
                # so that the last record ends the wait instead of the timeout.
                left = sum(wanted[p][1] - max(wanted[p][0], done[p]) for p in todo)
                for message in consumer.consume(max(1, min(left, 10_000)), _POLL_S):
                    partition = message.partition()
                    if partition not in todo:
                        continue
                    error = message.error()
                    last = wanted[partition][1] - 1
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            if message.offset() < wanted[partition][1]:
                                # The log ends below the range Spark planned (truncated):
                                # Spark's source decides what that means, not a guess here.
                                return None
                            todo.discard(partition)
                            continue
                        raise KafkaException(error)
                    offset = message.offset()
                    if offset < wanted[partition][0]:
                        continue  # not this range's (librdkafka drops a stale fetch already)
                    if offset > last:
                        todo.discard(partition)
                        continue
                    rows[partition].append(message)
                    done[partition] = offset + 1
                    if offset == last:
                        todo.discard(partition)
                consumer.errors.check()
        except KafkaException:
            self.close()  # stale metadata after a broker restart: a new consumer next time
            raise
        finally:
            if self._consumer is not None:
                self._consumer.unassign()
        try:
            return _layout([m for p in sorted(rows) for m in rows[p]])
        except UnicodeDecodeError:
            return None

    def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            consumer.close()


def _empty() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=SOURCE_ARROW)


def _layout(messages: list) -> pa.RecordBatch:
    """The records as the Spark Kafka source's Arrow columns (:data:`SOURCE_ARROW`)."""
    n = len(messages)
    topics, partitions, offsets, keys, values, stamps = [], [], [], [], [], []
    header_offsets, names, header_values, no_headers = [0], [], [], []
    for m in messages:
        topics.append(m.topic())
        partitions.append(m.partition())
        offsets.append(m.offset())
        keys.append(m.key())
        values.append(m.value())
        stamps.append(m.timestamp()[1] * 1000)
        headers = m.headers()
        no_headers.append(not headers)  # Spark's source: null, not an empty list
        if headers:
            for name, value in headers:
                names.append(name)
                header_values.append(value)
        header_offsets.append(len(names))
    entries = pa.StructArray.from_arrays(
        [pa.array(names, pa.string()), pa.array(header_values, pa.binary())],
        fields=list(SOURCE_ARROW.field("headers").type.value_type))
    headers = pa.ListArray.from_arrays(pa.array(header_offsets, pa.int32()), entries,
                                       mask=pa.array(no_headers, pa.bool_()))
    return pa.RecordBatch.from_arrays([
        pa.array(topics, pa.string()), pa.array(partitions, pa.int32()),
        pa.array(offsets, pa.int64()), pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        headers.cast(SOURCE_ARROW.field("headers").type),
        pa.array(stamps, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
    ], schema=SOURCE_ARROW) if n else _empty()

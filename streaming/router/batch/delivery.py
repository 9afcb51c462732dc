"""Writing deliveries and rejected publishes to Kafka from the routing process (librdkafka).

Each routing process (a Python worker, or the driver for a batch it routes)
keeps one :class:`DeliveryProducer` per settings (:func:`cached_producer`). A task
hands its batch's deliveries over as columns (:class:`DeliveryColumns`: Arrow
buffers, no Python object per record) to the
kernel's delivery writer (``bitroute_kernel.DeliveryWriter``: librdkafka's C
API, the GIL released while it produces and flushes); rejected publishes go
through a confluent-kafka producer, one record at a time. Then
:meth:`DeliveryProducer.flush` waits until Kafka acknowledged every record
(``acks=all``, idempotent producer), so a task that returns has its records
written: at least once (a re-run batch writes them again).

Failures are sorted into two kinds, and only one of them is about a record:

- **record failures** (:data:`~streaming.kafka.errors.RECORD_ERRORS`: too large for the broker or the
  topic, a record the broker calls invalid, a delivery topic that does not
  exist): the failed records are returned to the caller, each naming its
  record (:attr:`FailedRecord.tag`: the delivery's index in its columns, or
  the tag given to :meth:`DeliveryProducer.produce_tagged`), which rejects
  the publishes they belong to and routes the rest;
- **everything else** (broker unreachable past ``message.timeout.ms``, not
  enough in-sync replicas, authorisation, ...): :class:`DeliveryUnavailable`
  is raised, the task fails, and the router retries the batch with backoff.
  Such a failure is never turned into rejections. A credentials refusal
  raises :class:`~streaming.errors.KafkaAccessError` at the flush step
  (:data:`FLUSH_POLL_S`) after librdkafka reports it, instead of waiting out
  ``message.timeout.ms``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from bitroute_kernel import DeliveryWriter
from confluent_kafka import KafkaError, KafkaException

from schemas.records import DELIVERY_ROUTER_HEADERS
from streaming.config import KafkaConfig
from streaming.kafka.clients import (
    ClientErrors,
    access_failure,
    native_config,
    produce_when_room,
    producer,
    syslog_level,
)
from streaming.kafka.errors import RECORD_ERRORS
from streaming.kafka.layout import DeliveryLayout
from streaming.kafka.records import Headers
from streaming.kafka.settings import ClientSettings
from streaming.router.errors import DeliveryUnavailable

FLUSH_POLL_S = 0.5
"""How often a flush looks for a recorded access failure."""


@dataclass(frozen=True)
class ProducerSettings:
    """What a routing process needs to produce: picklable, and the key of its producer cache."""

    bootstrap: str | ClientSettings
    """The connection (:class:`streaming.kafka.ClientSettings`); a bare bootstrap string means
    plaintext."""
    max_record_bytes: int
    linger_ms: int = 1000
    """``kafka.delivery_linger_ms``: how long a record may wait for others to the same
    partition while the task is still producing. A flush sends at once, so a batch never
    waits it out (the key's figures: conf/bitroute.toml)."""
    message_timeout_ms: int = 60_000
    shards: int = 8
    keyed_partitions: bool = False
    """Place keyed records as Kafka's default partitioner does (murmur2 of the key,
    ``streaming.kafka.partitioner``): the shared delivery layout's contract."""

    @classmethod
    def of(cls, kafka: KafkaConfig) -> ProducerSettings:
        """The router's producer settings for ``kafka`` (its deliveries and its rejected
        records: one producer per routing process)."""
        return cls(kafka.client_settings, kafka.max_delivery_bytes,
                   linger_ms=kafka.delivery_linger_ms, keyed_partitions=kafka.layout.shared)

    @property
    def client(self) -> ClientSettings:
        return (self.bootstrap if isinstance(self.bootstrap, ClientSettings)
                else ClientSettings.of(self.bootstrap))

    def librdkafka(self) -> dict[str, object]:
        """This producer's own librdkafka properties (the connection's come from ``client``)."""
        keyed = {"partitioner": "murmur2_random"} if self.keyed_partitions else {}
        return {
            **keyed,
            # acks=all, and retries neither repeat nor reorder a record. An
            # idempotent producer has at most 5 requests in flight per broker and
            # librdkafka sends one request per partition: the shards' connections
            # (one each) are what keeps a batch's many partitions moving.
            "enable.idempotence": True,
            "linger.ms": self.linger_ms,
            # A batch fans out to hundreds of thousands of records: queue them all.
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 1 << 20,
            "batch.num.messages": 10_000,
            "compression.type": "none",  # loopback and LAN: lz4 cost 4x (docs/benchmarks.md)
            # Above the largest record the router lets through, so that the
            # broker, not librdkafka's estimate, has the last word on size.
            "message.max.bytes": self.max_record_bytes + 64 * 1024,
            "message.timeout.ms": self.message_timeout_ms,
            # A missing delivery topic is the router's to create, with the layout's
            # partitions and replication, not the broker's with its defaults; and a
            # topic created by the router is served before it is written to, so a
            # missing one is known as missing in seconds, not librdkafka's 30 s.
            "allow.auto.create.topics": False,
            "topic.metadata.propagation.max.ms": 5_000,
        }


@dataclass(frozen=True)
class FailedRecord:
    """A record Kafka refused for a reason of its own (see :data:`~streaming.kafka.errors.RECORD_ERRORS`), or,
    for a code of :data:`~streaming.kafka.errors.BATCH_ERRORS`, of a record in the same record batch.

    ``tag``: the delivery's index in the :class:`DeliveryColumns` it was produced
    from, or the caller's tag of :meth:`DeliveryProducer.produce_tagged`.
    """

    topic: str
    reason: str
    tag: int
    code: int


_NO_BYTES = np.zeros(0, np.uint8)


@dataclass(frozen=True)
class BinaryColumn:
    """An Arrow binary or string array as the delivery writer reads it, without a copy:
    value ``i`` is ``data[offsets[i]:offsets[i + 1]]``, null where ``valid[i]`` is 0
    (``valid`` empty: none is null)."""

    offsets: np.ndarray  # int32
    data: np.ndarray  # uint8
    valid: np.ndarray  # uint8

    @classmethod
    def of(cls, array: pa.Array) -> BinaryColumn:
        if pa.types.is_large_binary(array.type) or pa.types.is_large_string(array.type):
            array = array.cast(pa.binary())
        n = len(array)
        _, offsets, data = array.buffers()[:3]
        offsets = (np.frombuffer(offsets, np.int32)[array.offset:array.offset + n + 1]
                   if offsets is not None and n else np.zeros(n + 1, np.int32))
        data = np.frombuffer(data, np.uint8) if data is not None else _NO_BYTES
        valid = (array.is_valid().to_numpy(zero_copy_only=False).view(np.uint8)
                 if array.null_count else _NO_BYTES)
        return cls(offsets, data, valid)

    def get(self, i: int) -> bytes | None:
        """Value ``i`` as bytes (None: null)."""
        if len(self.valid) and not self.valid[i]:
            return None
        return self.data[self.offsets[i]:self.offsets[i + 1]].tobytes()

    def text(self, i: int) -> str:
        """Value ``i`` as UTF-8 text, of a column without nulls (topic and header names)."""
        return self.data[self.offsets[i]:self.offsets[i + 1]].tobytes().decode()


@dataclass(frozen=True)
class DeliveryColumns:
    """A batch's deliveries as the kernel's delivery writer produces them (the attributes
    ``bitroute_kernel.DeliveryWriter.produce`` reads; the record contract is
    :func:`streaming.router.batch.routing.delivery_columns`'s).

    Delivery ``i`` belongs to publish ``rows[i]`` and goes to ``topic_names[i]``;
    its key is ``keys[i]`` when ``keys_per_delivery``, else its publish's; its value
    its publish's; its headers: the publish's kept headers (``header_names`` and
    ``header_values`` from ``header_offsets[r]`` to ``header_offsets[r + 1]``), the
    routing key under ``routing_key_header`` when set, then the message id, the
    subscription ids (``subscription_ids[i]``) and the snapshot version, under
    ``header_names_router``.
    """

    topic_names: pa.Array
    rows: np.ndarray  # int64
    keys: BinaryColumn
    keys_per_delivery: bool
    routing_keys: BinaryColumn
    routing_key_header: str | None
    values: BinaryColumn
    header_offsets: np.ndarray  # int32
    header_names: BinaryColumn
    header_values: BinaryColumn
    message_ids: BinaryColumn
    subscription_ids: BinaryColumn
    version: bytes
    header_names_router: tuple[str, str, str] = DELIVERY_ROUTER_HEADERS
    topics: BinaryColumn = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "topics", BinaryColumn.of(self.topic_names))

    def __len__(self) -> int:
        return len(self.rows)

    def record(self, i: int) -> tuple[str, bytes | None, bytes | None, Headers]:
        """Delivery ``i``'s record as Python objects, ``(topic, key, value, headers)``: what
        the kernel's writer produces for it (for the rare record written again on its own).
        The format's home is the kernel (``kernel/src/delivery.rs``); this copy is tested
        byte for byte against it (tests/streaming/router/test_delivery.py)."""
        r = int(self.rows[i])
        names = self.header_names
        own = [(names.text(h), self.header_values.get(h))
               for h in range(self.header_offsets[r], self.header_offsets[r + 1])]
        if self.routing_key_header is not None:
            own.append((self.routing_key_header, self.routing_keys.get(r)))
        mid, ids, version = self.header_names_router
        headers = own + [(mid, self.message_ids.get(r)), (ids, self.subscription_ids.get(i)),
                         (version, self.version)]
        key = self.keys.get(i if self.keys_per_delivery else r)
        return self.topics.text(i), key, self.values.get(r), headers

    @classmethod
    def of_records(cls, topics: list[str], keys: list[bytes | None],
                   values: list[bytes | None]) -> DeliveryColumns:
        """One record per ``(topics[i], keys[i], values[i])``, each as a publish of its own
        without headers (message id ``str(i)``, no subscription ids, snapshot version 0):
        for the writer's tests and benchmarks."""
        n = len(topics)
        return cls(
            topic_names=pa.array(topics, pa.string()), rows=np.arange(n, dtype=np.int64),
            keys=BinaryColumn.of(pa.array(keys, pa.binary())), keys_per_delivery=False,
            routing_keys=BinaryColumn.of(pa.array(keys, pa.binary())), routing_key_header=None,
            values=BinaryColumn.of(pa.array(values, pa.binary())),
            header_offsets=np.zeros(n + 1, np.int32),
            header_names=BinaryColumn.of(pa.array([], pa.string())),
            header_values=BinaryColumn.of(pa.array([], pa.binary())),
            message_ids=BinaryColumn.of(pa.array([str(i) for i in range(n)], pa.string())),
            subscription_ids=BinaryColumn.of(pa.array(["[]"] * n, pa.string())), version=b"0")


def delivery_records(layout: DeliveryLayout, subscribers: pa.Array, rows: np.ndarray,
                     routing_keys: pa.Array, values: pa.Array, header_offsets: np.ndarray,
                     header_names: pa.Array, header_values: pa.Array, message_ids: pa.Array,
                     subscription_ids: pa.Array, version: bytes,
                     mark: tuple[str, bytes] | None = None) -> DeliveryColumns:
    """The one builder of delivery records: live, replayed and retained deliveries alike.

    Delivery ``i`` goes to ``subscribers[i]`` (its topic and record key as ``layout``
    says) and is a copy of row ``rows[i]`` (its routing key, value, message id, and its
    own headers: ``header_names``/``header_values`` from ``header_offsets[r]`` to
    ``header_offsets[r + 1]``); its headers are, in this order, the row's own headers,
    ``mark`` (a feature mark: ``bitroute.replayed: true``, ``bitroute.retained: true``),
    the routing key (shared layout), then :data:`schemas.records.DELIVERY_ROUTER_HEADERS`
    (message id, ``subscription_ids[i]``, ``version``).
    """
    if mark is not None:
        header_offsets, header_names, header_values = _marked(header_offsets, header_names,
                                                              header_values, mark)
    keys, per_delivery = layout.record_keys(subscribers, routing_keys)
    return DeliveryColumns(
        topic_names=layout.topic_column(subscribers), rows=rows,
        keys=BinaryColumn.of(keys), keys_per_delivery=per_delivery,
        routing_keys=BinaryColumn.of(routing_keys),
        routing_key_header=layout.routing_key_header,
        values=BinaryColumn.of(values),
        header_offsets=header_offsets,
        header_names=BinaryColumn.of(header_names), header_values=BinaryColumn.of(header_values),
        message_ids=BinaryColumn.of(message_ids),
        subscription_ids=BinaryColumn.of(subscription_ids),
        version=version)


def _marked(offsets: np.ndarray, names: pa.Array, values: pa.Array,
            mark: tuple[str, bytes]) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """The header columns with ``mark`` after each row's own headers (no Python object per
    header)."""
    n = len(offsets) - 1
    total = len(names) + n
    new_offsets = (np.asarray(offsets, np.int64) + np.arange(n + 1)).astype(np.int32)
    inserted = np.zeros(total, dtype=bool)
    inserted[new_offsets[1:] - 1] = True
    index = np.empty(total, dtype=np.int64)
    index[~inserted] = np.arange(len(names))
    index[inserted] = len(names)
    take = pa.array(index, pa.int64())
    names = pa.concat_arrays([names.cast(pa.string()), pa.array([mark[0]], pa.string())])
    values = pa.concat_arrays([values.cast(pa.binary()), pa.array([mark[1]], pa.binary())])
    return new_offsets, names.take(take), values.take(take)


class DeliveryProducer:
    """A routing process's producer: produce a batch's deliveries (:meth:`produce_deliveries`) and
    single records (:meth:`produce_tagged`), then :meth:`flush` for the verdict.

    The deliveries go through the kernel's writer, whose
    :attr:`ProducerSettings.shards` librdkafka producers each write a share of the
    topics (a hash of the name) and are flushed at once: an idempotent producer
    keeps at most 5 requests in flight per broker and librdkafka sends a request
    per partition, so a single producer flushed a batch to 1,000 topics 1.25-2.7x
    as slowly (docs/benchmarks-history.md, "Records produced natively"). The writer keeps
    one topic handle per delivery topic written to. Its client errors and log
    lines go to a :class:`~streaming.kafka.clients.ClientErrors`, as a Python
    client's do.
    """

    def __init__(self, settings: ProducerSettings) -> None:
        self.settings = settings
        client = settings.client
        self._errors = ClientErrors(client)
        self._writer = DeliveryWriter(native_config(client, settings.librdkafka()),
                                      settings.shards, client.secrets())
        self._epoch = 0
        self._topics: pa.Array | None = None
        self._producer = producer(client, settings.librdkafka())
        self._failed: list[FailedRecord] = []
        self._other: list[str] = []
        self.broken = False
        """True once a fatal error failed this producer: :func:`cached_producer` replaces it."""

    def produce_deliveries(self, columns: DeliveryColumns) -> None:
        """Queue every delivery of ``columns`` (a failure's tag is the delivery's index)."""
        if not len(columns):
            return
        self._topics = columns.topic_names
        self._epoch = self._writer.produce(columns)

    def produce_tagged(self, topic: str, key: bytes | None, value: bytes | None,
                       headers: Headers, tag: int) -> None:
        """Queue one record whose failure, if any, comes back with ``tag``."""
        def delivered(error: KafkaError | None, _message: object) -> None:
            if error is not None:
                self._report(error, topic, tag)

        try:
            produce_when_room(self._producer, topic, value, key, headers, delivered)
        except KafkaException as exc:
            self._report(exc.args[0], topic, tag)

    def flush(self) -> list[FailedRecord]:
        """Wait for every queued record; return the record failures, raise on any other.

        Raises :class:`DeliveryUnavailable` when a record failed for a reason
        that is not about it (some records may be written: the caller's retry
        writes them again, which at-least-once allows), and a recorded access
        failure (``KafkaAccessError``) as soon as it is seen.
        """
        poll_ms = int(FLUSH_POLL_S * 1000)
        while True:
            left = self._writer.flush(poll_ms)
            self._take_events()
            self._errors.check()  # credentials refused: fail now, not at message.timeout.ms
            if not left:
                break
        if len(self._producer):
            try:
                _flush(self._producer)
            except KafkaException as exc:  # a fatal error: no record of it goes through again
                self._report(exc.args[0], "<any delivery topic>", -1)
        failed, other = self._failed, self._other
        self._failed, self._other = [], []
        if other:
            raise DeliveryUnavailable(f"Kafka did not acknowledge {len(other)} records: {other[0]}")
        return failed

    def _take_events(self) -> None:
        failed, errors, logs = self._writer.take_events()
        for level, facility, text in logs:
            self._errors.log(syslog_level(level), "%s %s", facility, text)
        for code, reason in errors:
            self._errors(KafkaError(code, reason))
        topics = self._topics
        for epoch, index, code in failed:
            if epoch == self._epoch and topics is not None:  # else an earlier, failed batch's
                self._report(KafkaError(code), topics[index].as_py(), index)

    def _report(self, error: KafkaError, topic: str, tag: int) -> None:
        if error.fatal() or error.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
            # librdkafka's idempotent producer refused its producer id is fatal: it fails
            # every record from then on, so the next batch gets a new producer.
            self.broken = True
        if error.code() in RECORD_ERRORS:
            self._failed.append(FailedRecord(topic, f"{error.name()}: {error.str()}", tag,
                                             error.code()))
        else:
            denied = access_failure(self.settings.client, error, "Write", "topic", topic)
            self._other.append(str(denied) if denied is not None
                               else f"{topic}: {error.name()}: {error.str()}")


def _flush(client) -> None:
    """Wait until ``client`` has no record left (librdkafka's flush lets go of the GIL)."""
    while client.flush(FLUSH_POLL_S):
        client.errors.check()  # credentials refused: fail now, not at message.timeout.ms


_producers: dict[ProducerSettings, DeliveryProducer] = {}


def cached_producer(settings: ProducerSettings) -> DeliveryProducer:
    """This routing process's producer for ``settings`` (one connection set per process; a
    new one once a fatal error broke the last, so a grant given later is used)."""
    producer = _producers.get(settings)
    if producer is None or producer.broken:
        producer = _producers[settings] = DeliveryProducer(settings)
    return producer

"""Writing deliveries and rejected publishes to Kafka from the Python workers (librdkafka).

Each Python worker process keeps one :class:`DeliveryProducer` per settings
(:func:`cached_producer`); a task produces every record of its publishes and
then :meth:`DeliveryProducer.flush` waits until Kafka acknowledged all of them
(``acks=all``, idempotent producer), so a task that returns has its records
written: at least once (a replayed batch writes them again).

Failures are sorted into two kinds, and only one of them is about a record:

- **record failures** (:data:`RECORD_ERRORS`: too large for the broker or the
  topic, a record the broker calls invalid, a delivery topic that does not
  exist): the failed records are returned to the caller, which rejects the
  publishes they belong to and routes the rest;
- **everything else** (broker unreachable past ``message.timeout.ms``, not
  enough in-sync replicas, authorisation, ...): :class:`DeliveryUnavailable`
  is raised, the task fails, and the router retries the batch with backoff.
  Such a failure is never turned into rejections.

A delivery report names a failed record by topic, key and value only (no
headers, no per-record tag without a per-record callback, which costs about
2 us of Python each): the caller maps failures back to its publishes, and
re-produces ambiguous ones with :meth:`DeliveryProducer.produce_tagged`.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Producer

from streaming.errors import BitrouteError
from streaming.kafka.clients import access_failure, produce_when_room, producer
from streaming.kafka.records import Headers
from streaming.kafka.settings import ClientSettings

RECORD_ERRORS = frozenset({
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.INVALID_RECORD,
    KafkaError._BAD_MSG,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.INVALID_MSG,
    KafkaError.INVALID_MSG_SIZE,
    KafkaError._INVALID_ARG,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError.TOPIC_EXCEPTION,
})
"""librdkafka error codes that are about one record (or its topic), not the cluster."""

FLUSH_POLL_S = 0.5


class DeliveryUnavailable(BitrouteError):
    """Kafka could not take the records for a reason that is not about them; retry the batch."""


@dataclass(frozen=True)
class ProducerSettings:
    """What a worker needs to produce: picklable, and the key of the worker's producer cache."""

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
        }


@dataclass(frozen=True)
class FailedRecord:
    """A record Kafka refused for a reason of its own (see :data:`RECORD_ERRORS`).

    ``tag`` is the caller's tag when the record is known exactly (refused at
    ``produce`` time, or produced with :meth:`DeliveryProducer.produce_tagged`),
    else None: a delivery report names the record by topic, key and value only.
    """

    topic: str
    key: bytes | None
    value: bytes | None
    reason: str
    tag: int | None = None


class DeliveryProducer:
    """A worker's producer: produce many records, then :meth:`flush` for the verdict.

    One delivery callback per librdkafka producer, not one per record: a
    per-record callback object cost about 2 us of Python per record. Records
    are spread over :attr:`ProducerSettings.shards` librdkafka producers by
    topic: librdkafka finds a topic by name in a list on every produce and
    serves each partition with its own requests, so its cost per record grows
    with the topics one producer writes to (11 us of CPU per record over 1,000
    topics, 8 us with 16 producers of ~60 topics each; docs/benchmarks.md).
    """

    def __init__(self, settings: ProducerSettings) -> None:
        self.settings = settings
        self._failed: list[FailedRecord] = []
        self._other: list[str] = []
        self._producers = [producer(settings.client, {**settings.librdkafka(),
                                                      "on_delivery": self._delivered})
                           for _ in range(settings.shards)]
        self._by_topic: dict[str, Producer] = {}
        self._flushers = ThreadPoolExecutor(settings.shards, thread_name_prefix="bitroute-flush")

    def _for(self, topic: str) -> Producer:
        producer = self._by_topic.get(topic)
        if producer is None:
            producer = self._by_topic[topic] = self._producers[
                zlib.crc32(topic.encode()) % len(self._producers)]
        return producer

    def produce_many(self, topics: Iterable[str], keys: Iterable[bytes | None],
                     values: Iterable[bytes | None], headers: Iterable[Headers],
                     tags: Iterable[int]) -> None:
        """Queue one record per aligned item (the hot loop: one Python call per record)."""
        by_topic, shard = self._by_topic, self._for
        for topic, key, value, hdrs, tag in zip(topics, keys, values, headers, tags):
            producer = by_topic.get(topic) or shard(topic)
            try:
                producer.produce(topic, value, key, headers=hdrs)
            except BufferError:  # the local queue is full: serve delivery reports, retry
                self._produce_when_room(topic, key, value, hdrs, tag, None)
            except KafkaException as exc:
                self._report(exc.args[0], topic, key, value, tag)

    def produce_tagged(self, topic: str, key: bytes | None, value: bytes | None,
                       headers: Headers, tag: int) -> None:
        """Queue one record whose failure, if any, comes back with ``tag`` (slower: a callback each)."""
        def delivered(error: KafkaError | None, _message: object) -> None:
            if error is not None:
                self._report(error, topic, key, value, tag)

        try:
            self._for(topic).produce(topic, value, key, headers=headers, on_delivery=delivered)
        except BufferError:
            self._produce_when_room(topic, key, value, headers, tag, delivered)
        except KafkaException as exc:
            self._report(exc.args[0], topic, key, value, tag)

    def flush(self) -> list[FailedRecord]:
        """Wait for every queued record; return the record failures, raise on any other.

        Raises :class:`DeliveryUnavailable` when a record failed for a reason
        that is not about it (some records may be written: the caller's retry
        writes them again, which at-least-once allows).
        """
        busy = [client for client in self._producers if len(client)]  # records or reports left
        if len(busy) == 1:
            _flush(busy[0])
        elif busy:
            # All shards at once: a flush sends its producer's lingering records at
            # once, and one shard after another would wait out the others' acks.
            for done in [self._flushers.submit(_flush, client) for client in busy]:
                done.result()
        failed, other = self._failed, self._other
        self._failed, self._other = [], []
        if other:
            raise DeliveryUnavailable(f"Kafka did not acknowledge {len(other)} records: {other[0]}")
        return failed

    def _produce_when_room(self, topic, key, value, headers, tag, callback) -> None:
        try:
            produce_when_room(self._for(topic), topic, value, key, headers, callback)
        except KafkaException as exc:
            self._report(exc.args[0], topic, key, value, tag)

    def _delivered(self, error: KafkaError | None, message) -> None:
        if error is not None:
            self._report(error, message.topic(), message.key(), message.value(), None)

    def _report(self, error: KafkaError, topic: str, key, value, tag: int | None) -> None:
        if error.code() in RECORD_ERRORS:
            self._failed.append(FailedRecord(topic, key, value, f"{error.name()}: {error.str()}", tag))
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
    """This worker process's producer for ``settings`` (one connection set per worker)."""
    producer = _producers.get(settings)
    if producer is None:
        producer = _producers[settings] = DeliveryProducer(settings)
    return producer

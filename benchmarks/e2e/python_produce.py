"""The delivery write before issue 22's direction 3, kept as the benchmarks' baseline.

Until then a routing task built, per delivery, a Python topic str, key and
value bytes and a header list of tuples, and called confluent-kafka's
``Producer.produce`` once per record: 8 producers ("shards", chosen by crc32
of the topic), linger 1,000 ms, every busy shard flushed at once in a thread
pool. :func:`route_batch_python` is ``streaming.router.routing.route_batch``
with that write (same plan, same rejected-topic write, same rows), so that
``route_task --path ab`` and ``produce_requests --paths`` measure the two in one
run. Benchmark code only: a record failure here raises instead of rejecting
its publish (the benchmarks' records never fail).
"""

from __future__ import annotations

import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
from confluent_kafka import KafkaException

from compiler import Matcher
from schemas.records import MESSAGE_ID_HEADER, ROUTING_KEY_HEADER, SNAPSHOT_VERSION_HEADER, SUBSCRIPTION_IDS_HEADER
from streaming.kafka import clients
from streaming.router.delivery import FLUSH_POLL_S, DeliveryProducer, DeliveryUnavailable, ProducerSettings
from streaming.router.routing import RouteSettings, _report_rejected, _routed_rows, plan_batch


class PythonProducer:
    """The old producer: ``shards`` confluent-kafka producers, one ``produce`` per record."""

    def __init__(self, settings: ProducerSettings, sequential: bool = False) -> None:
        self.settings = settings
        self._errors: list[str] = []
        self._producers = [clients.producer(settings.client, {**settings.librdkafka(),
                                                              "on_delivery": self._delivered})
                           for _ in range(settings.shards)]
        self._by_topic: dict = {}
        self._flushers = None if sequential else ThreadPoolExecutor(settings.shards)
        # Rejected publishes go as in the new path (one confluent-kafka producer).
        self.tagged = DeliveryProducer(settings)

    def _for(self, topic: str):
        producer = self._by_topic.get(topic)
        if producer is None:
            producer = self._by_topic[topic] = self._producers[
                zlib.crc32(topic.encode()) % len(self._producers)]
        return producer

    def produce_many(self, topics, keys, values, headers) -> None:
        by_topic, shard = self._by_topic, self._for
        for topic, key, value, hdrs in zip(topics, keys, values, headers):
            producer = by_topic.get(topic) or shard(topic)
            try:
                producer.produce(topic, value, key, headers=hdrs)
            except BufferError:
                clients.produce_when_room(producer, topic, value, key, hdrs)

    def flush(self) -> None:
        busy = [p for p in self._producers if len(p)]
        if self._flushers is None or len(busy) == 1:
            for client in busy:
                _flush(client)
        else:
            for done in [self._flushers.submit(_flush, client) for client in busy]:
                done.result()
        errors, self._errors = self._errors, []
        if errors:
            raise DeliveryUnavailable(f"{len(errors)} records failed: {errors[0]}")

    def _delivered(self, error, message) -> None:
        if error is not None:
            self._errors.append(f"{message.topic()}: {error.name()}")


def _flush(client) -> None:
    while client.flush(FLUSH_POLL_S):
        client.errors.check()


def delivery_records(plan, settings: RouteSettings):
    """The old per-record lists: topics, keys, values, headers (one list per delivery)."""
    layout = settings.layout
    send = pa.array(plan.send, pa.int64())
    rows = plan.owner[plan.send].tolist()
    values = plan.values
    ids_texts = plan.ids_json.take(send).to_pylist()
    subscribers = plan.subscribers.take(send)
    mids = [(MESSAGE_ID_HEADER, m.encode()) for m in plan.message_ids]
    if layout.shared:
        common = [own + [(ROUTING_KEY_HEADER, key), mid]
                  for own, key, mid in zip(plan.kept, plan.keys, mids)]
        keys = subscribers.cast(pa.binary()).to_pylist()
    else:
        common = [own + [mid] for own, mid in zip(plan.kept, mids)]
        keys = [plan.keys[r] for r in rows]
    version = (SNAPSHOT_VERSION_HEADER, plan.version)
    return (layout.topic_column(subscribers).to_pylist(), keys, [values[r] for r in rows],
            [common[r] + [(SUBSCRIPTION_IDS_HEADER, ids), version] for r, ids in zip(rows, ids_texts)])


def route_batch_python(matcher: Matcher, producer: PythonProducer, batch: pa.RecordBatch,
                       settings: RouteSettings) -> pa.RecordBatch:
    """``route_batch`` with the old write (see the module docstring)."""
    plan = plan_batch(matcher, batch, settings)
    try:
        producer.produce_many(*delivery_records(plan, settings))
    except KafkaException as exc:
        raise DeliveryUnavailable(str(exc)) from exc
    producer.flush()
    owner = plan.owner
    acked = plan.ok[owner] if len(owner) else np.zeros(0, dtype=bool)
    _report_rejected(producer.tagged, settings, plan.reasons, plan.keys, plan.values, plan.kept,
                     plan.message_ids)
    return _routed_rows(plan.publishes, plan.reasons, plan.deliveries, plan.entries, owner, acked)

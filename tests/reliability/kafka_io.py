"""Kafka clients of the campaign: a paced publisher that learns each record's
message id, readers of whole topics up to their end, and the router's progress.

Every function is bounded in time; none hides a failure: a publish Kafka did
not acknowledge is reported as such (and left out of the ledger), a read that
does not reach the end offsets in time raises :class:`CampaignError`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from confluent_kafka import Producer, TopicPartition

from schemas.records import message_id
from streaming import kafka
from streaming.kafka.clients import record_position
from streaming.kafka.settings import ClientSettings
from streaming.state.checkpoint import CheckpointLayout
from streaming.state.offsets_log import OffsetLogError, read_offsets

READ_BATCH = 5000
_QUIET = logging.getLogger("bitroute.reliability.kafka")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False

Record = tuple[bytes | None, bytes | None, list | None]
"""(key, value, headers) of one record to produce."""


class CampaignError(RuntimeError):
    """A step of the campaign could not be carried out (not a failed check)."""


def producer(bootstrap: str | ClientSettings, **extra) -> Producer:
    """An idempotent acks=all producer: a broker failover neither loses nor repeats a record.

    ``bootstrap``, here and below, is the cluster's connection (``config.kafka.client_settings``
    on a secured cluster) or a plaintext ``host:port``."""
    return kafka.producer(ClientSettings.coerce(bootstrap), {
        "enable.idempotence": True, "acks": "all", "linger.ms": 20,
        "message.timeout.ms": 600_000, "queue.buffering.max.messages": 500_000, **extra})


class Publisher:
    """Produces records to one topic in a thread, at ``rate`` records/s (0: as fast as
    Kafka takes them), and calls ``on_ack(index, message_id)`` for each acknowledged
    one, ``on_error(index, error)`` for each that failed.

    :meth:`join` waits until every record is acknowledged or failed.
    """

    def __init__(self, bootstrap: str | ClientSettings, topic: str, records: Iterable[Record], rate: float,
                 on_ack: Callable[[int, str], None], on_error: Callable[[int, str], None],
                 **producer_settings) -> None:
        self.topic = topic
        self.sent = 0
        self.acked = 0
        self.failed = 0
        self.done = threading.Event()
        self._records = records
        self._rate = rate
        self._on_ack, self._on_error = on_ack, on_error
        self._producer = producer(bootstrap, **producer_settings)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"publish-{topic}")

    def start(self) -> Publisher:
        self._thread.start()
        return self

    def _callback(self, index: int):
        def acked(err, record) -> None:
            if err is not None:
                self.failed += 1
                self._on_error(index, str(err))
            else:
                self.acked += 1
                self._on_ack(index, message_id(*record_position(record)))
        return acked

    def _run(self) -> None:
        started = time.monotonic()
        try:
            for index, (key, value, headers) in enumerate(self._records):
                if self._rate > 0:
                    due = started + index / self._rate
                    while time.monotonic() < due:
                        self._producer.poll(min(0.05, max(0.0, due - time.monotonic())))
                kafka.produce_when_room(self._producer, self.topic, value, key, headers,
                                        self._callback(index))
                self.sent += 1
                if index % 1000 == 0:
                    self._producer.poll(0)
            while self._producer.flush(1.0):
                pass
        finally:
            self.done.set()

    def join(self, timeout: float) -> None:
        if not self.done.wait(timeout):
            raise CampaignError(f"publishing to {self.topic} did not finish within {timeout:.0f}s "
                                f"({self.acked:,} of {self.sent:,} acknowledged)")
        self._thread.join(5)


def end_offsets(bootstrap: str | ClientSettings, topics: Sequence[str]) -> dict[tuple[str, int], int]:
    """(topic, partition) -> end offset, for every partition of ``topics``."""
    consumer = kafka.consumer(ClientSettings.coerce(bootstrap), "reliability-offsets")
    try:
        out = {}
        metadata = consumer.list_topics(timeout=30)
        for topic in topics:
            described = metadata.topics.get(topic)
            if described is None:
                continue
            for partition in described.partitions:
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                         timeout=30, cached=False)
                out[(topic, partition)] = high
        return out
    finally:
        consumer.close()


def read_topics(bootstrap: str | ClientSettings, topics: Sequence[str], on_record: Callable, timeout: float) -> int:
    """Call ``on_record(message)`` on every record of ``topics`` from the start up to the
    end offsets fetched now (a transaction marker among them is no record); return how many
    were read. Raises CampaignError on timeout."""
    ends = {tp: end for tp, end in end_offsets(bootstrap, topics).items() if end > 0}
    if not ends:
        return 0
    consumer = kafka.consumer(ClientSettings.coerce(bootstrap), "reliability-reader", {
        "enable.partition.eof": False, "queued.max.messages.kbytes": 262_144})
    todo = dict(ends)
    read = 0
    deadline = time.monotonic() + timeout
    try:
        consumer.assign([TopicPartition(t, p, 0) for t, p in ends])
        while todo:
            if time.monotonic() > deadline:
                raise CampaignError(f"{len(todo)} partitions not read to their end within "
                                    f"{timeout:.0f}s, e.g. {sorted(todo)[:3]}")
            for message in consumer.consume(READ_BATCH, 1.0):
                if message.error() is not None:
                    continue
                tp = (message.topic(), message.partition())
                end = todo.get(tp)
                if end is None or message.offset() >= end:
                    continue
                on_record(message)
                read += 1
                if message.offset() + 1 >= end:
                    del todo[tp]
            # A partition whose last offsets are transaction markers delivers no record at
            # them: its consumer's position passing the end offset says it was read.
            for position in consumer.position([TopicPartition(t, p) for t, p in todo]):
                if position.offset >= todo[(position.topic, position.partition)]:
                    del todo[(position.topic, position.partition)]
    finally:
        consumer.close()
    return read


def topic_names(bootstrap: str | ClientSettings) -> set[str]:
    admin = kafka.admin(ClientSettings.coerce(bootstrap))
    return set(admin.list_topics(timeout=30).topics)


def headers_of(message) -> dict[str, bytes | None]:
    """A record's headers as a dict, the last of a name winning (Kafka's ``lastHeader``)."""
    return dict(message.headers() or [])


MICROBATCH, REALTIME = "microbatch", "realtime"
"""The router's modes (``streaming.mode``): which Spark query's checkpoint says what it routed."""


def query_checkpoint(checkpoint_dir: Path, mode: str = MICROBATCH) -> Path:
    """The Spark checkpoint of the router's query that reads the publishes: the micro-batch
    query's, or realtime mode's routing query's."""
    layout = CheckpointLayout.of(checkpoint_dir)
    return layout.realtime_routing if mode == REALTIME else layout.query


def spark_committed(query: Path) -> dict[str, dict[int, int]]:
    """Topic -> partition -> next offset that the Spark query checkpointed in ``query`` has
    committed (its last ``commits/<n>`` and the ``offsets/<n>`` it closes)."""
    try:
        batches = sorted(int(p.name) for p in (query / "commits").iterdir() if p.name.isdigit())
    except FileNotFoundError:
        return {}
    for batch in reversed(batches):
        try:
            return read_offsets(query / "offsets" / str(batch))
        except (OSError, OffsetLogError):
            continue
    return {}


def committed_offsets(checkpoint_dir: Path, mode: str = MICROBATCH) -> dict[int, int]:
    """Partition -> next offset of the publishes topic that the router's query (of
    ``mode``) has committed."""
    out: dict[int, int] = {}
    for partitions in spark_committed(query_checkpoint(checkpoint_dir, mode)).values():
        out.update(partitions)
    return out


PROGRESS_POLL_S = 0.2
"""How often a wait below reads the router's progress (a few small checkpoint files)."""


def _wait_committed(ends: dict[int, int], committed: Callable[[], dict[int, int]], timeout: float,
                    alive: Callable[[], bool], query: str, records: str, exited: str) -> float:
    """Wait until ``committed()`` (partition -> next offset) reaches ``ends`` in every
    partition, with a deadline of ``timeout`` seconds; return the seconds it took. Raises
    CampaignError on timeout (``query`` did not commit so many ``records``) or, saying
    ``exited``, when ``alive()`` turns false."""
    started = time.monotonic()
    while True:
        done = committed()
        if all(done.get(p, 0) >= o for p, o in ends.items()):
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            lag = sum(o - done.get(p, 0) for p, o in ends.items())
            raise CampaignError(f"{query} did not commit {lag:,} {records} within {timeout:.0f}s")
        if not alive():
            raise CampaignError(exited)
        time.sleep(PROGRESS_POLL_S)


def wait_routed(bootstrap: str | ClientSettings, topic: str, checkpoint_dir: Path, timeout: float,
                alive: Callable[[], bool] = lambda: True, mode: str = MICROBATCH) -> float:
    """Wait until the router's query has committed every publish in ``topic`` now;
    return the seconds it took. Raises CampaignError on timeout or when ``alive()``
    turns false."""
    ends = {p: o for (t, p), o in end_offsets(bootstrap, [topic]).items()}
    return _wait_committed(ends, lambda: committed_offsets(checkpoint_dir, mode), timeout, alive,
                           "the router", "publishes",
                           "the router exited before it had routed every publish")


def wait_audited(bootstrap: str | ClientSettings, routed_topic: str, checkpoint_dir: Path,
                 timeout: float, alive: Callable[[], bool] = lambda: True) -> float:
    """Realtime mode: wait until the audit query has committed every routed record in
    ``routed_topic`` now (its batches are journaled by then, and a stopping router
    commits its journal); return the seconds it took."""
    ends = {p: o for (t, p), o in end_offsets(bootstrap, [routed_topic]).items()}
    audit = CheckpointLayout.of(checkpoint_dir).realtime_audit
    return _wait_committed(ends, lambda: spark_committed(audit).get(routed_topic, {}), timeout,
                           alive, "the audit query", "routed records",
                           "the router exited before it had audited every publish")


def lag(bootstrap: str | ClientSettings, topic: str, checkpoint_dir: Path,
        mode: str = MICROBATCH) -> int:
    """Publishes in ``topic`` not yet committed by the router."""
    done = committed_offsets(checkpoint_dir, mode)
    return sum(max(0, o - done.get(p, 0))
               for (t, p), o in end_offsets(bootstrap, [topic]).items())


def delete_records(bootstrap: str | ClientSettings, topic: str, before: dict[int, int]) -> None:
    """Kafka's DeleteRecords (what retention does): partition -> the offset every record
    before which is deleted. Raises CampaignError unless each low watermark is there."""
    admin = kafka.admin(ClientSettings.coerce(bootstrap))
    asked = [TopicPartition(topic, p, o) for p, o in sorted(before.items())]
    for tp, future in admin.delete_records(asked, request_timeout=60).items():
        low = future.result(timeout=60).low_watermark
        if low != tp.offset:
            raise CampaignError(f"DeleteRecords left {topic} partition {tp.partition} at {low}, "
                                f"not {tp.offset}")


def delete_topic(bootstrap: str | ClientSettings, topic: str, timeout: float = 60.0) -> None:
    """Delete ``topic`` and wait until the cluster's metadata no longer lists it."""
    admin = kafka.admin(ClientSettings.coerce(bootstrap))
    admin.delete_topics([topic], operation_timeout=timeout)[topic].result(timeout)
    deadline = time.monotonic() + timeout
    while topic in admin.list_topics(timeout=30).topics:
        if time.monotonic() > deadline:
            raise CampaignError(f"{topic} still listed {timeout:.0f}s after its deletion")
        time.sleep(0.1)


def create_topic(bootstrap: str | ClientSettings, topic: str, partitions: int,
                 timeout: float = 60.0) -> None:
    """Create ``topic`` (one replica), retrying while the broker still completes an earlier
    deletion of that name."""
    from confluent_kafka.admin import NewTopic

    admin = kafka.admin(ClientSettings.coerce(bootstrap))
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout)
            return
        except Exception as exc:  # noqa: BLE001 - TOPIC_ALREADY_EXISTS while the deletion ends
            if time.monotonic() > deadline:
                raise CampaignError(f"{topic} could not be created again: {exc}") from None
            time.sleep(0.5)


def topic_partitions(bootstrap: str | ClientSettings, topic: str) -> int:
    """Partitions of ``topic``; 0 when it does not exist. (The whole cluster's metadata:
    asking for the topic by name lets a broker with auto.create.topics.enable create it.)"""
    described = kafka.admin(ClientSettings.coerce(bootstrap)).list_topics(
        timeout=30).topics.get(topic)
    if described is None or described.error is not None:
        return 0
    return len(described.partitions)

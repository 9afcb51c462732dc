"""Publishes Kafka deleted before the router read them: found, said once, recorded.

A batch reads each partition of the publishes topic from where the previous
batch ended (Spark's offset log, :func:`streaming.state.offsets_log.batch_start`)
to its own end. When Kafka has deleted the start of that range (retention ran
while the router was down or behind, or an operator called DeleteRecords),
the publishes ``[start, earliest offset Kafka keeps)`` are gone: no one can route them.
The router asks Kafka for the partitions' earliest offsets at the start of
every batch (one ListOffsets request), and for each partition whose earliest
offset is past the batch's start it has a :class:`RetentionGap`:

- ``streaming.on_retention_gap = "resume"`` (the default): the gap is logged in
  one line (:meth:`RetentionGap.line`), recorded as a ``lost`` row of the audit's
  ``messages`` table (:func:`gap_rows`: one row per partition range, message id
  ``<topic>/<partition>/<first lost offset>``, the range, count and time in its
  reason), counted in the batch's report (``bitroute status``, the metrics),
  and the batch routes what Kafka still holds (the Kafka source runs with
  ``failOnDataLoss=false``, so Spark skips the deleted range instead of failing
  the batch forever);
- ``"stop"``: the batch fails with :class:`RetentionGapError`, whose one line
  names the gap and the command that acknowledges it
  (``bitroute run --accept-retention-gap``: that run records the gaps its first
  batch meets and resumes; later gaps stop it again).

The time range: Kafka no longer has the lost records, so their times are
known only from the first record it kept, whose timestamp bounds them from
above (``lost_before``). Records deleted in the instant between this check and
Spark's read of the batch are skipped by Spark with a warning in its log and
counted by the next batch's check only if they lie before its start: the
check is per batch, not per record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from schemas.records import OUTCOME_LOST, message_id
from streaming.kafka import clients
from streaming.kafka.errors import KAFKA_TIMEOUT_S
from streaming.kafka.settings import ClientSettings
from streaming.router.batch.routing import ROUTED_ARROW
from streaming.router.errors import RetentionGapError
from streaming.router.feature import (
    STOP_RETENTION_GAP,
    BatchFeature,
    BatchStep,
    RouterContext,
    StopReason,
)

_log = logging.getLogger(__name__)

ACKNOWLEDGE_COMMAND = "bitroute run --accept-retention-gap"


@dataclass(frozen=True)
class RetentionGap:
    """Offsets ``[first_offset, end_offset)`` of a publishes partition, deleted unread."""

    topic: str
    partition: int
    first_offset: int
    end_offset: int
    lost_before: datetime | None
    """The timestamp of the first record Kafka kept after the gap (None: not known)."""
    incarnation: int = 0
    """The topic's incarnation (:mod:`streaming.router.topics.incarnations`), in the message id."""

    @property
    def records(self) -> int:
        """Offsets lost (an upper bound on publishes: transaction markers take offsets too)."""
        return self.end_offset - self.first_offset

    @property
    def message_id(self) -> str:
        return message_id(self.topic, self.partition, self.first_offset, self.incarnation)

    def describe(self) -> str:
        when = f", published before {self.lost_before.isoformat()}" if self.lost_before else ""
        return (f"{self.topic} partition {self.partition} offsets {self.first_offset}.."
                f"{self.end_offset - 1} ({self.records} publishes{when})")


def gaps_line(gaps: list[RetentionGap]) -> str:
    """One line for a batch's gaps: what was lost, where, and why."""
    lost = sum(g.records for g in gaps)
    return (f"{lost} publishes were deleted by Kafka (retention or DeleteRecords) before the "
            f"router read them: " + "; ".join(g.describe() for g in gaps))


def find_gaps(admin: clients.BitrouteAdmin, consumer: clients.BitrouteConsumer, topic: str,
              start: dict[int, int], end: dict[int, int] | None,
              incarnation: int = 0) -> list[RetentionGap]:
    """The gaps of a batch reading ``topic`` (its incarnation ``incarnation``) from
    ``start`` to ``end`` (per partition): where Kafka's earliest offset is past the start.
    ``end`` None: the range is open."""
    if not start:
        return []
    asked = {TopicPartition(topic, p): OffsetSpec.earliest() for p in start}
    futures = admin.list_offsets(asked, request_timeout=KAFKA_TIMEOUT_S)
    gaps = []
    for tp, future in futures.items():
        earliest = admin.result(future, KAFKA_TIMEOUT_S).offset
        first = start[tp.partition]
        if earliest <= first:
            continue
        stop = earliest if end is None else min(earliest, end.get(tp.partition, earliest))
        if stop > first:
            gaps.append(RetentionGap(topic, tp.partition, first, stop,
                                     _timestamp_at(consumer, topic, tp.partition, earliest),
                                     incarnation))
    return sorted(gaps, key=lambda g: g.partition)


def _timestamp_at(consumer: clients.BitrouteConsumer, topic: str, partition: int,
                  offset: int) -> datetime | None:
    """The timestamp of the record at ``offset`` (the first one kept), None if none comes."""
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        message = consumer.poll(KAFKA_TIMEOUT_S)
    except KafkaException:
        return None
    finally:
        consumer.unassign()
    if message is None or message.error() is not None:
        return None
    kind, millis = message.timestamp()
    return datetime.fromtimestamp(millis / 1000, UTC) if kind and millis >= 0 else None


def gap_rows(gaps: list[RetentionGap]) -> pa.Table:
    """The ``lost`` rows of the gaps, in the routed rows' schema (the audit's ``messages``)."""
    return pa.Table.from_pylist([{
        "message_id": g.message_id,
        "exchange": None,
        "routing_key": None,
        "outcome": OUTCOME_LOST,
        "reason": (f"lost to retention: offsets {g.first_offset}..{g.end_offset - 1} of partition "
                   f"{g.partition} ({g.records} publishes"
                   + (f", published before {g.lost_before.isoformat()}" if g.lost_before else "")
                   + ") were deleted by Kafka before the router read them"),
        "deliveries": [],
        "headers": None,
        "payload_bytes": None,
        "published_at": g.lost_before,
    } for g in gaps], schema=ROUTED_ARROW)


class RetentionWatch:
    """The router's check of each batch's start against Kafka's earliest offsets.

    ``policy``: ``streaming.on_retention_gap``; ``accept_first``: the run acknowledges
    the gaps of its first batch (``bitroute run --accept-retention-gap``).
    """

    def __init__(self, settings: ClientSettings, topic: str, policy: str,
                 accept_first: bool = False) -> None:
        self.topic = topic
        self.policy = policy
        self._settings = settings
        self._accept_first = accept_first
        self._clients: tuple[clients.BitrouteAdmin, clients.BitrouteConsumer] | None = None

    def check(self, batch_id: int, start: dict[int, int] | None,
              end: dict[int, int] | None, incarnation: int = 0) -> list[RetentionGap]:
        """The batch's gaps, said in one line; raises :class:`RetentionGapError` under the
        ``stop`` policy unless acknowledged. Kafka's errors are the caller's to retry."""
        if self._clients is None:
            self._clients = (clients.admin(self._settings),
                             clients.consumer(self._settings, "bitroute-retention"))
        try:
            gaps = find_gaps(*self._clients, self.topic, start or {}, end, incarnation)
        except KafkaException:
            # A broker restarted under the clients can leave their metadata stale for good
            # ("Leader epoch is older than broker epoch" at every attempt): the retry
            # starts from new clients.
            self.close()
            raise
        accept, self._accept_first = self._accept_first, False
        if not gaps:
            return []
        line = f"batch {batch_id}: {gaps_line(gaps)}"
        if self.policy == "stop" and not accept:
            raise RetentionGapError(
                f"{line}. The router stopped (streaming.on_retention_gap = \"stop\"): run "
                f"`{ACKNOWLEDGE_COMMAND}` to record the gap in the audit and route on from "
                "the earliest offset Kafka keeps")
        _log.warning(f"{line}; recorded in the audit (messages, outcome 'lost'), routing on "
                     "from the earliest offset Kafka keeps")
        return gaps

    def close(self) -> None:
        if self._clients is not None:
            self._clients[1].close()
            self._clients = None


class RetentionFeature(BatchFeature):
    """Retention gaps as a feature of the batch loop (:mod:`streaming.router.feature`): each
    batch's start checked (after the publishes topic's check, when the topic is there),
    its gaps left for the batch's audit; under the ``stop`` policy, the query stopped with
    a :data:`~streaming.router.feature.STOP_RETENTION_GAP` reason.

    ``incarnation()`` is the publishes topic's incarnation the router reads."""

    name = "retention"

    def __init__(self, watch: RetentionWatch, incarnation: Callable[[], int]) -> None:
        self.watch = watch
        self._incarnation = incarnation

    @classmethod
    def of(cls, router: RouterContext) -> RetentionFeature:
        """The feature of the router's publishes topic, under ``streaming.on_retention_gap``
        (:mod:`streaming.router.features`)."""
        config = router.config
        incarnation = router.incarnation
        return cls(RetentionWatch(config.kafka.client_settings, config.kafka.publishes_topic,
                                  config.streaming.on_retention_gap, router.accept_retention_gap),
                   lambda: incarnation.number)

    def step(self, batch: BatchStep) -> None:
        if not batch.topic_present or not batch.start:
            return
        try:
            batch.gaps = batch.retrying("the retention check", lambda: self.watch.check(
                batch.batch_id, batch.start, batch.end, self._incarnation()))
        except RetentionGapError as exc:
            self.stop_reason = StopReason(STOP_RETENTION_GAP, str(exc))
            raise

    def close(self) -> None:
        self.watch.close()

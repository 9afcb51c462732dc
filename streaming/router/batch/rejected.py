"""The rejected topic's one writer, and its one failure policy.

Every bad record, a publish the router cannot route (:mod:`streaming.router.batch.routing`)
or a subscription change it cannot apply (:mod:`streaming.router.subscriptions.subscription_sync`),
is copied to ``kafka.rejected_topic`` by :func:`write_rejected`, through the
routing process's :class:`~streaming.router.batch.delivery.DeliveryProducer` (the same
producer and settings as its deliveries: ``acks=all``, idempotent), and waited
for.

The failure policy:

- A copy is the record's key, value and own headers (router headers removed)
  plus the reason, the source and the message id; one larger than
  ``kafka.max_delivery_bytes`` goes without value or own headers, its reason
  saying so (:func:`streaming.kafka.records.rejected_copy`).
- A copy Kafka refuses even so (a record error,
  :data:`~streaming.kafka.errors.RECORD_ERRORS`; one refused with the record batch it
  shared, :data:`~streaming.kafka.errors.BATCH_ERRORS`, is first written again alone,
  and only a refusal then counts) is left out of the topic,
  and its reason says why (``... (not written to <topic>: <Kafka's reason>)``):
  a bad record never stops routing or the subscriptions' catch-up. The reason
  lands where the record is audited (the ``messages`` row of a publish; a
  warning for a subscription change, whose ``subscriptions`` row holds its reason).
- Any other failure (Kafka unreachable past ``message.timeout.ms``, too few
  in-sync replicas) raises :class:`~streaming.router.batch.delivery.DeliveryUnavailable`,
  and a refused credential :class:`~streaming.errors.KafkaAccessError`: the batch
  (or the catch-up) fails and is retried with backoff; copies may then be
  written twice (at least once).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from streaming.kafka.errors import BATCH_ERRORS
from streaming.kafka.records import Headers, rejected_copy
from streaming.router.batch.delivery import DeliveryProducer


@dataclass(frozen=True)
class BadRecord:
    """A record to copy to the rejected topic: its key, value and kept headers
    (:func:`streaming.kafka.records.kept_headers`), why it is rejected, its source
    (``publish`` or ``subscription``) and its message id."""

    key: bytes | None
    value: bytes | None
    headers: Headers
    reason: str
    source: str
    message_id: str


def write_rejected(producer: DeliveryProducer, topic: str, records: Sequence[BadRecord],
                   limit: int) -> tuple[list[str], list[str]]:
    """Write a copy of each of ``records`` to ``topic`` (whole when it fits ``limit`` bytes)
    and wait for Kafka; return each record's final reason, in order, and Kafka's reasons
    for the copies it refused (module docstring: what a refused copy adds to its reason,
    and what raises)."""
    reasons: list[str] = []
    copies: list[tuple[bytes | None, bytes | None, Headers]] = []
    for tag, record in enumerate(records):
        value, headers, reason = rejected_copy(record.key, record.value, record.headers,
                                               record.reason, record.source, record.message_id,
                                               limit)
        reasons.append(reason)
        copies.append((record.key, value, headers))
        producer.produce_tagged(topic, record.key, value, headers, tag)
    if not records:
        return reasons, []
    failed = producer.flush()
    refused = [f for f in failed if f.code not in BATCH_ERRORS]
    for failure in (f for f in failed if f.code in BATCH_ERRORS):
        # A record batch refused whole for one copy in it: each is written again alone.
        producer.produce_tagged(topic, *copies[failure.tag], failure.tag)
        refused += producer.flush()
    for failure in refused:
        reasons[failure.tag] += f" (not written to {topic}: {failure.reason})"
    return reasons, [f.reason for f in refused]

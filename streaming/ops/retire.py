"""Retiring a subscriber (``bitroute retire``): its subscriptions removed, its topic kept or
deleted, the audit saying why.

1. The subscriber's live subscriptions are read from the routing state now
   (:func:`streaming.ops.inspect.load_state`: the router's latest snapshot and
   the changelog after it).
2. Each one's tombstone is written to the changelog with the header
   ``bitroute.reason`` = ``subscriber S retired (bitroute retire; its delivery
   topic T deleted|kept)``; the router records that reason on the ``remove``
   rows of the audit's ``subscriptions`` table. A removal acknowledged before a
   publish applies to it (happens-before), as for ``unsubscribe``.
3. With ``delete_topic``, the subscriber's delivery topic is deleted once the
   router has routed every publish written before the removals (its committed
   position reaches the publishes topic's end offsets taken after the
   tombstones were acknowledged; in realtime mode, its routing query's last
   committed epoch), so no routed delivery is still on its way to
   the topic; a stopped router has nothing on its way (it applies the removals
   before it routes again). A router that does not get there within
   ``wait_s`` leaves the topic in place and the verb says how to finish.

The shared delivery layout has no topic of a subscriber's own: its records in
the shared topic age out with the topic's retention, and ``delete_topic`` is
refused. A batch re-run after a crash with the snapshot pinned before the
removals may deliver to the subscriber once more, which creates its topic
again (docs/operations.md, "Retiring a subscriber").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaException, TopicPartition

from schemas.records import REASON_HEADER
from streaming.config import Config
from streaming.kafka import client_verbs
from streaming.kafka.clients import consumer as kafka_consumer
from streaming.kafka.errors import KAFKA_TIMEOUT_S
from streaming.kafka.topics import admin_client
from streaming.state import lock
from streaming.state.checkpoint import CheckpointLayout
from streaming.state.offsets_log import batch_end, last_committed_batch

POLL_S = 0.5


@dataclass(frozen=True)
class Retirement:
    """What ``retire`` did."""

    subscriber: str
    subscription_ids: list[str]
    topic: str
    topic_deleted: bool


def retire(config: Config, subscriber: str, delete_topic: bool = False, wait_s: float = 60.0,
           progress: Callable[[str], None] | None = None) -> Retirement:
    """Retire ``subscriber`` (module docstring). Raises
    :class:`~streaming.kafka.client_verbs.InvalidRequest` (nothing done) and
    :class:`~streaming.kafka.client_verbs.ClientError` (Kafka failed, or the router did not
    route the earlier publishes within ``wait_s``: the subscriptions are removed, the topic
    kept)."""
    from streaming.ops import inspect

    layout = config.kafka.layout
    topic = layout.topic(subscriber)
    if delete_topic and layout.shared:
        raise client_verbs.InvalidRequest(
            f"--delete-topic: in the shared delivery layout every subscriber's deliveries share "
            f"{topic}; there is no topic of {subscriber}'s own to delete (its records there age "
            "out with the topic's retention)")
    try:
        state = inspect.load_state(config)
    except inspect.InspectError as exc:
        raise client_verbs.ClientError(f"cannot read the routing state: {exc}") from None
    ids = [str(row["subscription_id"]) for row in inspect.subscriptions(state, subscriber)]
    admin = admin_client(config)
    exists = topic in admin.topics(KAFKA_TIMEOUT_S).topics
    if not ids and not (delete_topic and exists):
        raise client_verbs.InvalidRequest(
            f"subscriber {subscriber!r} has no live subscription"
            + (f"; its delivery topic {topic} remains (--delete-topic deletes it)" if exists
               and not layout.shared else ""))
    fate = f"its delivery topic {topic} {'deleted' if delete_topic else 'kept'}"
    reason = f"subscriber {subscriber} retired (bitroute retire; {fate})".encode()
    for sub_id in ids:
        client_verbs.unsubscribe(config, sub_id, [(REASON_HEADER, reason)])
    if delete_topic and exists:
        _wait_routed(config, wait_s, progress, subscriber)
        try:
            admin.result(admin.delete_topics([topic], operation_timeout=KAFKA_TIMEOUT_S)[topic],
                         KAFKA_TIMEOUT_S)
        except KafkaException as exc:
            raise client_verbs.ClientError(
                f"the subscriptions of {subscriber} are removed, but Kafka refused to delete "
                f"{topic}: {exc.args[0].str()}") from None
    return Retirement(subscriber, ids, topic, delete_topic and exists)


def _wait_routed(config: Config, wait_s: float, progress: Callable[[str], None] | None,
                 subscriber: str) -> None:
    """Return once the router has routed every publish written until now, or no router runs."""
    topic = config.kafka.publishes_topic
    ends = _end_offsets(config, topic)
    layout = CheckpointLayout.of(config.streaming.checkpoint_dir)
    deadline = time.monotonic() + wait_s
    told = False
    while lock.holder(config.streaming.checkpoint_dir) is not None:
        position = _committed(layout, topic)
        if all(position.get(p, 0) >= end for p, end in ends.items() if end > 0):
            return
        if time.monotonic() >= deadline:
            raise client_verbs.ClientError(
                f"the subscriptions of {subscriber} are removed, but the router has not routed "
                f"the publishes written before that within {wait_s:g}s (`bitroute status`: input "
                f"lag), so its delivery topic is kept; run `bitroute retire {subscriber} "
                "--delete-topic` again once it has")
        if progress is not None and not told:
            progress("waiting for the router to route the publishes written before the "
                     "removals, then deleting the topic")
            told = True
        time.sleep(POLL_S)


def _end_offsets(config: Config, topic: str) -> dict[int, int]:
    consumer = kafka_consumer(config.kafka.client_settings, "bitroute-retire")
    try:
        found = consumer.topics(KAFKA_TIMEOUT_S, topic).topics.get(topic)
        if found is None or found.error is not None:
            return {}
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), KAFKA_TIMEOUT_S,
                                                  cached=False)[1] for p in found.partitions}
    finally:
        consumer.close()


def _committed(layout: CheckpointLayout, topic: str) -> dict[int, int]:
    """The end offsets of the router's last committed batch (nothing committed: empty); in
    realtime mode (a folder with its routing query's checkpoint), of the routing query's
    last committed epoch, after which Kafka acknowledged the epoch's deliveries."""
    if layout.realtime_routing.is_dir():
        from streaming.realtime.audit import committed_offsets

        return committed_offsets(layout.realtime_routing, topic) or {}
    batch = last_committed_batch(layout)
    return (batch_end(layout, batch, topic) or {}) if batch is not None else {}

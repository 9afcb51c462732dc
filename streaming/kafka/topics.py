"""Kafka topics the router owns: creating them, the delivery topics in either layout.

``ensure_topics`` is idempotent: a topic that exists already is left as it is
(its partitions and settings are not checked or changed). Topics are created
with ``kafka.partitions``, ``kafka.replication_factor`` and, when set,
``kafka.min_insync_replicas``. The subscription
changelog is created compacted (``cleanup.policy=compact``) so that a key's
latest value, or its tombstone, is what a restart rebuilds from.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import NewTopic

from streaming import kafka
from streaming.config import MODE_REALTIME, Config
from streaming.kafka.clients import BitrouteAdmin
from streaming.kafka.errors import AUTHORIZATION_ERRORS, KAFKA_TIMEOUT_S, TopicCreationError
from streaming.kafka.layout import DeliveryLayout
from streaming.kafka.settings import ClientSettings

CREATE_TIMEOUT_S = KAFKA_TIMEOUT_S
SERVED_POLL_S = 0.05
COMPACTED = {"cleanup.policy": "compact"}


def admin_client(config: Config, on_error=None) -> BitrouteAdmin:
    return kafka.admin(config.kafka.client_settings, on_error=on_error)


def ensure_topics(config: Config, names: Iterable[str], settings: dict[str, str] | None = None,
                  admin: BitrouteAdmin | None = None, partitions: int | None = None) -> list[str]:
    """Create the topics of ``names`` that do not exist (with ``partitions``, default
    ``kafka.partitions``); return the ones created.

    Raises :class:`streaming.kafka.KafkaAccessError` when the credentials are refused, or
    may not describe or create a topic.
    """
    topic_config = dict(settings or {})
    if config.kafka.min_insync_replicas:
        topic_config.setdefault("min.insync.replicas", str(config.kafka.min_insync_replicas))
    return create_topics(admin or admin_client(config), names,
                         partitions or config.kafka.partitions, config.kafka.replication_factor,
                         topic_config)


def create_topics(admin: BitrouteAdmin, names: Iterable[str], partitions: int,
                  replication_factor: int, topic_config: dict[str, str]) -> list[str]:
    """Create the topics of ``names`` that do not exist, wait until they are served, and
    return the ones created (:func:`ensure_topics` with every setting explicit)."""
    wanted = sorted(set(names))
    if not wanted:
        return []
    # Created outright: a topic that exists answers TOPIC_ALREADY_EXISTS in the same round
    # trip, where listing every topic first cost a full metadata request per call (45 ms
    # of each changelog catch-up with a new subscriber, on a broker of a few hundred topics).
    futures = admin.create_topics(
        [NewTopic(n, partitions, replication_factor, config=topic_config) for n in wanted],
        operation_timeout=CREATE_TIMEOUT_S,
    )
    created, refused = [], []
    for name, future in futures.items():
        try:
            admin.result(future, CREATE_TIMEOUT_S)
            created.append(name)
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() in AUTHORIZATION_ERRORS:
                refused.append((name, error))
            elif error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise TopicCreationError(f"cannot create topic {name!r}: {error.str()}") from None
    if refused:
        # A principal that may not create topics is refused even for one that exists: what
        # it may describe and is listed exists, and needs no grant.
        existing = set(admin.topics(CREATE_TIMEOUT_S).topics)
        for name, error in refused:
            if name not in existing:
                raise kafka.denied(admin.errors.settings, "Create", "topic", name,
                                   error) from None
    _wait_until_served(admin, created)
    return sorted(created)


def _wait_until_served(admin: BitrouteAdmin, names: list[str]) -> None:
    """Return once the broker's metadata lists every topic of ``names`` with a leader for each
    partition.

    A create request is answered before the brokers serve the new topic: a
    producer writing at once is refused with UNKNOWN_TOPIC_OR_PART (seen for
    half of 10,000 topics created together; benchmarks/subscriber_scale.py),
    which the router would take for a record failure and reject the publish.
    """
    waiting = set(names)
    deadline = time.monotonic() + CREATE_TIMEOUT_S
    while waiting:
        topics = admin.topics(CREATE_TIMEOUT_S).topics
        waiting = {name for name in waiting if not served(topics.get(name))}
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise TopicCreationError(f"{len(waiting)} created topics (e.g. {min(waiting)!r}) have no "
                                     f"partition leader after {CREATE_TIMEOUT_S:.0f}s")
        time.sleep(SERVED_POLL_S)


def served(topic) -> bool:
    """Whether a topic's metadata (``TopicMetadata`` or None) shows it served: no error,
    and a leader for each of its partitions."""
    return (topic is not None and topic.error is None and bool(topic.partitions)
            and all(p.leader >= 0 for p in topic.partitions.values()))


def ensure_router_topics(config: Config, admin: BitrouteAdmin | None = None) -> None:
    """The publishes and rejected topics, the compacted subscription changelog, the
    compacted retained messages, in the shared delivery layout the shared delivery
    topic and, in realtime mode, the routing view and the routed records."""
    admin = admin or admin_client(config)
    layout = config.kafka.layout
    ensure_topics(config, [config.kafka.publishes_topic, config.kafka.rejected_topic], admin=admin)
    ensure_topics(config, [config.kafka.subscriptions_topic], COMPACTED, admin=admin)
    ensure_topics(config, [config.kafka.retained_topic], retained_topic_settings(config),
                  admin=admin)
    if layout.shared_topic is not None:
        ensure_topics(config, [layout.shared_topic], admin=admin, partitions=layout.partitions)
    if config.streaming.mode == MODE_REALTIME:
        # One partition each: the view is read whole, in order, by every executor; the
        # routed records of one publishes partition must stay in their order
        # (streaming.realtime.audit drops a repeat by its offset).
        ensure_topics(config, [config.kafka.routing_view_topic], COMPACTED, admin=admin,
                      partitions=1)
        ensure_topics(config, [config.kafka.routed_topic], admin=admin, partitions=1)


def retained_topic_settings(config: Config) -> dict[str, str]:
    """The retained messages' topic: compacted (a topic's latest retained message, or
    its clearing tombstone, is what a restart reads), taking any record the router
    may deliver (a retained message is a publish's payload and headers)."""
    return {**COMPACTED,
            "max.message.bytes": str(config.kafka.max_delivery_bytes + 64 * 1024)}


def recreate_delivery_topic(settings: ClientSettings, layout: DeliveryLayout, topic: str,
                            admin: BitrouteAdmin | None = None) -> bool:
    """Create the delivery topic ``topic`` again if it is missing (an administrator deleted
    it while subscriptions still feed it), with the layout's partitions, replication and
    ``min.insync.replicas``, and wait until it is served; True when this call created it.

    Raises :class:`streaming.kafka.KafkaAccessError` when the principal may not create it
    (the message names the grant) and :class:`TopicCreationError` for Kafka's other refusals.
    """
    topic_config = ({"min.insync.replicas": str(layout.min_insync_replicas)}
                    if layout.min_insync_replicas else {})
    return bool(create_topics(admin or kafka.admin(settings), [topic], layout.partitions,
                              layout.replication_factor, topic_config))


def ensure_delivery_topics(config: Config, subscribers: Iterable[str],
                           admin: BitrouteAdmin | None = None) -> list[str]:
    """The delivery topics of ``subscribers`` (:attr:`KafkaConfig.layout
    <streaming.config.KafkaConfig.layout>`): each one's own topic with
    ``kafka.delivery_partitions`` partitions, or in the shared layout the
    shared topic with ``kafka.shared_delivery_partitions``."""
    layout = config.kafka.layout
    return ensure_topics(config, {layout.topic(s) for s in subscribers},
                         admin=admin, partitions=layout.partitions)


_URL_SAFE = str.maketrans("+/", "-_")


def topic_id(admin: BitrouteAdmin, topic: str) -> str | None:
    """Kafka's id of ``topic`` (a new one each time a topic of that name is created, as
    Kafka's tools print it: URL-safe base64), None when the topic does not exist.

    Raises :class:`streaming.kafka.KafkaAccessError` when the credentials are refused or
    may not describe the topic (the grant named), ``KafkaException`` for Kafka's other
    errors and ``TimeoutError`` past :data:`KAFKA_TIMEOUT_S` (the caller's to retry, or
    :func:`streaming.kafka.clients.edge`'s to tell)."""
    future = admin.describe_topics(TopicCollection([topic]), request_timeout=KAFKA_TIMEOUT_S)[topic]
    try:
        # Kafka writes a topic id in URL-safe base64 (Uuid.toString); librdkafka in the
        # standard alphabet, whose "/" cannot be in a file name.
        return str(admin.result(future, KAFKA_TIMEOUT_S).topic_id).translate(_URL_SAFE)
    except KafkaException as exc:
        if exc.args and exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None
        refused = kafka.access_failure(admin.errors.settings, exc.args[0], "Describe", "topic",
                                       topic) if exc.args else None
        if refused is not None:
            raise refused from None
        raise

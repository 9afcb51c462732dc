"""The Kafka side of the client verbs: subscribe, unsubscribe, publish, tail.

Every write waits for Kafka's acknowledgement (``acks=all``) before it returns,
so a caller that saw :func:`subscribe` return and then :func:`publish` return
has the router's happens-before guarantee: the subscription is applied to that
publish. Nothing here routes or rejects on the router's behalf except
:func:`subscribe`, which refuses a change the router would reject, using the
compiler's own validation (:class:`compiler.RoutingIndex`) so the rules are the
router's rules. Bad routing keys are left to the router, which rejects them
with a reason.

Errors are :class:`ClientError` (Kafka failed or timed out) and its subclass
:class:`InvalidRequest` (the arguments are wrong; nothing was written), and
:class:`streaming.errors.KafkaAccessError` (credentials refused, or an
operation not granted: which principal, which resource, what to grant),
raised within seconds, each one line naming its cause
(:func:`streaming.kafka.clients.failure`). Every client comes from :mod:`streaming.kafka`.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition

from schemas.records import (
    ALTERNATE_EXCHANGE_HEADER,
    EXCHANGE_HEADER,
    MESSAGE_ID_HEADER,
    RETAINED_HEADER,
    ROUTER_HEADERS,
    ROUTING_KEY_HEADER,
    SNAPSHOT_VERSION_HEADER,
    SUBSCRIPTION_IDS_HEADER,
    message_id,
)
from streaming.config import Config
from streaming.errors import one_line
from streaming.kafka.clients import (
    BitrouteConsumer,
    access_failure,
    consumer as kafka_consumer,
    edge,
    failure,
    producer as kafka_producer,
    record_headers,
    record_position,
)
from streaming.kafka.errors import KAFKA_TIMEOUT_S, ClientError, InvalidRequest
from streaming.kafka.topics import (
    COMPACTED,
    admin_client,
    ensure_delivery_topics,
    ensure_topics,
    served,
)

ACK_TIMEOUT_S = KAFKA_TIMEOUT_S
"""How long a write waits for Kafka's acknowledgement before it is reported failed."""
METADATA_TIMEOUT_S = KAFKA_TIMEOUT_S
POLL_INTERVAL_S = 0.2
"""Longest single consumer poll: bounds how late ``--timeout`` and Ctrl-C are noticed."""
TAIL_METADATA_REFRESH_MS = 5_000
"""``tail``'s librdkafka metadata refresh interval (default 5 minutes): a partition whose
leader the consumer's metadata missed (a topic created moments before) is fetched from
within seconds, not at the next periodic refresh."""


# --- subscriptions ---------------------------------------------------------------

def subscription_record(config: Config, exchange: str, subscriber: str, filter_: str,
                        criteria: dict[str, str | None] | None = None, match: str = "all",
                        sub_id: str | None = None, since=None,
                        options=None) -> tuple[bytes, bytes]:
    """The validated changelog record ``(key, value)`` of one subscription.

    ``sub_id`` defaults to a fresh uuid4 hex. ``criteria`` empty or ``None``
    means no header criteria (the value then has no ``headers`` field). ``options``: a
    :class:`compiler.options.SubscriptionOptions` (None: the default ones).
    Raises :class:`InvalidRequest` for whatever the router would reject.
    """
    from compiler import CompilerError, HeaderCriteria, RoutingIndex, Subscription

    dialects = config.exchanges.dialects
    # The index rejects an unknown exchange too; checked here to name the declared ones.
    if exchange not in dialects:
        raise InvalidRequest(f"unknown exchange {exchange!r}: the configuration declares "
                             f"{', '.join(sorted(dialects))} (exchanges.dialects)")
    if sub_id is not None and not sub_id:
        raise InvalidRequest("--id must not be empty")
    try:
        headers = HeaderCriteria(match, criteria) if criteria else None
        from compiler.options import DEFAULT_OPTIONS

        record = Subscription(sub_id or uuid.uuid4().hex, exchange, subscriber, filter_,
                              headers, since, options or DEFAULT_OPTIONS).to_changelog()
        # The router's own checks, in the router's order: the record as it will
        # be read back from the changelog, then the index (exchange, filter).
        RoutingIndex(dialects).upsert(Subscription.from_changelog(*record))
    except CompilerError as exc:
        raise InvalidRequest(str(exc)) from None
    return record


def subscribe(config: Config, exchange: str, subscriber: str, filter_: str,
              criteria: dict[str, str | None] | None = None, match: str = "all",
              sub_id: str | None = None, since=None, options=None) -> str:
    """Validate, create the subscriber's delivery topic if missing, write the change; return its id.

    Returns once Kafka acknowledged the changelog record. The delivery topic is
    created first, so the router can deliver from the first match on. ``since`` (an
    aware datetime, not in the future: :func:`streaming.router.replay.cli.check_since`
    checks it first) asks for a replay (``subscribe --since``). ``options``: the MQTT
    subscription options (:class:`compiler.options.SubscriptionOptions`; None: the default).
    """
    key, value = subscription_record(config, exchange, subscriber, filter_, criteria, match,
                                     sub_id, since, options)
    _kafka_call(config, lambda: ensure_delivery_topics(config, [subscriber]))
    _ensure(config, [config.kafka.subscriptions_topic], COMPACTED)
    _produce(config, config.kafka.subscriptions_topic, key, value)
    return key.decode("utf-8")


def unsubscribe(config: Config, sub_id: str,
                headers: list[tuple[str, bytes]] | None = None) -> None:
    """Write the tombstone of ``sub_id`` to the changelog and wait for the acknowledgement.

    Removing an id that was never subscribed is not an error: the router
    records it as a no-op. ``headers``: the tombstone's (a ``bitroute.reason``
    header is recorded as the removal's reason in the audit).
    """
    if not sub_id:
        raise InvalidRequest("the subscription id must not be empty")
    _ensure(config, [config.kafka.subscriptions_topic], COMPACTED)
    _produce(config, config.kafka.subscriptions_topic, sub_id.encode("utf-8"), None,
             None if headers is None else list(headers))


# --- publishes -------------------------------------------------------------------

def publish(config: Config, exchange: str, routing_key: str, payload: bytes,
            headers: Sequence[tuple[str, bytes]] = (), incarnation: int = 0) -> str:
    """Produce one publish and return its message id ``<topic>/<partition>/<offset>``
    (``<topic>~<incarnation>/...`` for a recreated topic: :func:`schemas.records.message_id`).

    The record carries ``headers`` plus the exchange header. The exchange and
    routing key are not checked here: the router rejects a bad one with a
    reason (rejected topic and ``messages`` table) under this message id.
    """
    _ensure(config, [config.kafka.publishes_topic])
    record = _produce(config, config.kafka.publishes_topic, routing_key.encode("utf-8"), payload,
                      [*headers, (EXCHANGE_HEADER, exchange.encode("utf-8"))])
    return message_id(*record_position(record), incarnation)


# --- deliveries ------------------------------------------------------------------

@dataclass(frozen=True)
class Delivery:
    """One record of a subscriber's delivery topic, decoded.

    ``headers`` are the original publish's headers (the router's own are
    taken out into the other fields; a repeated name keeps its last value;
    values are decoded as UTF-8, undecodable bytes replaced by U+FFFD, a null
    value is ``None``). A field the record lacks or carries malformed is ``None``.
    """

    message_id: str | None
    routing_key: str | None
    headers: dict[str, str | None]
    subscription_ids: list[str] | None
    snapshot_version: int | None
    payload: bytes
    retained: bool = False
    """A topic's retained message delivered when the subscription was applied (the
    ``bitroute.retained`` header), not a live publish."""
    alternate_exchange: str | None = None
    """The alternate exchange it came through (the ``bitroute.alternate_exchange`` header):
    the publish's own exchange routed it to no one."""

    @classmethod
    def from_message(cls, message: Message) -> Delivery:
        headers: dict[str, str | None] = {}
        router: dict[str, str] = {}
        for name, value in record_headers(message) or []:
            text = None if value is None else value.decode("utf-8", errors="replace")
            if name in ROUTER_HEADERS:
                router[name] = text or ""
            else:
                headers[name] = text
        # The shared layout keys a delivery by subscriber and carries the routing key in a header.
        key = message.key() if ROUTING_KEY_HEADER not in router else None
        routing_key = router.get(ROUTING_KEY_HEADER) if key is None else (
            key.decode("utf-8", errors="replace"))
        return cls(
            message_id=router.get(MESSAGE_ID_HEADER),
            routing_key=routing_key,
            headers=headers,
            subscription_ids=_json_strings(router.get(SUBSCRIPTION_IDS_HEADER)),
            snapshot_version=_decimal(router.get(SNAPSHOT_VERSION_HEADER)),
            payload=message.value() or b"",
            retained=router.get(RETAINED_HEADER) == "true",
            alternate_exchange=router.get(ALTERNATE_EXCHANGE_HEADER),
        )

    def payload_text(self) -> tuple[str, str]:
        """``(text, encoding)``: the payload as UTF-8 text when it decodes, else base64."""
        try:
            return self.payload.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            return base64.b64encode(self.payload).decode("ascii"), "base64"


def tail(config: Config, subscriber: str, from_beginning: bool = False,
         max_records: int | None = None, timeout_s: float | None = None,
         started: Callable[[str], None] = lambda where: None) -> Iterator[Delivery]:
    """Yield the deliveries of ``subscriber`` in arrival order per partition.

    Reads the subscriber's deliveries by explicit assignment (no consumer
    group, no commits): in the default layout every partition of its own
    topic; in the shared layout (``kafka.delivery_layout = "shared"``) the one
    partition of the shared topic its name is keyed to, keeping the records
    whose key is its name. From the start with ``from_beginning``, else from
    the end as it is when the call starts (every delivery Kafka acknowledges
    afterwards is yielded). Stops after ``max_records``, or once no record
    arrived for ``timeout_s`` seconds (a shared partition's records of other
    subscribers do not count as arrivals); with neither, runs until
    interrupted. ``started(where)`` is called once the assignment is made,
    with what is read (e.g. ``bitroute.deliveries.alice (1 partition)``).
    """
    from compiler import CompilerError, validate_subscriber

    try:
        validate_subscriber(subscriber)
    except CompilerError as exc:
        raise InvalidRequest(str(exc)) from None
    kafka, layout = config.kafka, config.kafka.layout
    topic = layout.topic(subscriber)
    wanted_key = layout.subscriber_key(subscriber)
    consumer = kafka_consumer(kafka.client_settings, f"bitroute-tail-{uuid.uuid4().hex}", {
        "enable.auto.offset.store": False,
        "enable.partition.eof": False,
        "topic.metadata.refresh.interval.ms": TAIL_METADATA_REFRESH_MS,
    })
    try:
        partitions = layout.subscriber_partitions(subscriber,
                                                  _partitions(consumer, topic, subscriber))
        if wanted_key is not None:
            where = f"{topic} partition {partitions[0]} (shared layout, records keyed {subscriber})"
        else:
            where = f"{topic} ({len(partitions)} partition{'' if len(partitions) == 1 else 's'})"
        if from_beginning:
            starts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions]
        else:
            starts = [TopicPartition(topic, p, _high_watermark(consumer, topic, p))
                      for p in partitions]
        consumer.assign(starts)
        started(where)
        count = 0
        last = time.monotonic()
        while max_records is None or count < max_records:
            wait = POLL_INTERVAL_S
            if timeout_s is not None:
                left = last + timeout_s - time.monotonic()
                if left <= 0:
                    return
                wait = min(wait, left)
            message = consumer.poll(wait)
            consumer.errors.check()
            if message is None:
                continue
            if message.error() is not None:
                _raise_access(consumer, message.error(), "Read", topic)
                raise ClientError(f"reading {topic}: {message.error().str()}")
            if wanted_key is not None and message.key() != wanted_key:
                continue
            last = time.monotonic()
            count += 1
            yield Delivery.from_message(message)
    except (KafkaException, TimeoutError) as exc:
        consumer.errors.check()
        raise failure(kafka.client_settings, exc, "Read", "topic", topic) from None
    finally:
        consumer.close()


# --- Kafka plumbing --------------------------------------------------------------

def _ensure(config: Config, names: list[str], settings: dict[str, str] | None = None) -> None:
    _kafka_call(config, lambda: ensure_topics(config, names, settings, admin=admin_client(config)))


def _kafka_call(config: Config, call: Callable[[], object]) -> None:
    """``call()``, its failure told in one line (:func:`streaming.kafka.clients.edge`)."""
    with edge(config.kafka.client_settings):
        call()


def _produce(config: Config, topic: str, key: bytes, value: bytes | None,
             headers: list[tuple[str, str | bytes | None]] | None = None) -> Message:
    """Produce one record and return it as acknowledged (with its partition and offset)."""
    producer = kafka_producer(config.kafka.client_settings, {
        "acks": "all",
        "enable.idempotence": True,
        "message.timeout.ms": int(ACK_TIMEOUT_S * 1000),
    })
    reports: list[tuple[KafkaError | None, Message]] = []
    try:
        producer.produce(topic, key=key, value=value, headers=headers,
                         on_delivery=lambda err, msg: reports.append((err, msg)))
    except (KafkaException, BufferError) as exc:
        raise ClientError(f"cannot write to {topic}: {one_line(exc)}") from None
    # The message timeout makes the delivery report arrive within ACK_TIMEOUT_S;
    # the margin only covers the report's own delivery.
    producer.flush_within(ACK_TIMEOUT_S + 5)
    if not reports:
        raise ClientError(f"no acknowledgement from Kafka at {config.kafka.bootstrap} "
                          f"for {topic} within {ACK_TIMEOUT_S:g}s")
    error, message = reports[0]
    if error is not None:
        _raise_access(producer, error, "Write", topic)
        raise ClientError(f"Kafka at {config.kafka.bootstrap} refused the write to {topic}: "
                          f"{error.str()}")
    return message


def _partitions(consumer: BitrouteConsumer, topic: str, subscriber: str) -> list[int]:
    """The topic's partitions once each has a leader in the consumer's own metadata.

    Assigned a partition its metadata lacks a leader for, librdkafka waits for its
    next metadata refresh; waiting here makes the first fetch go at once.
    """
    deadline = time.monotonic() + METADATA_TIMEOUT_S
    while True:
        metadata = consumer.topics(METADATA_TIMEOUT_S, topic).topics.get(topic)
        if metadata is not None and metadata.error is not None:
            _raise_access(consumer, metadata.error, "Read", topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            raise ClientError(f"no delivery topic {topic}: subscriber {subscriber!r} has no "
                              f"subscription yet (bitroute subscribe creates it)")
        if served(metadata):
            return sorted(metadata.partitions)
        if time.monotonic() > deadline:
            raise ClientError(f"{topic} has partitions without a leader after "
                              f"{METADATA_TIMEOUT_S:g}s")
        time.sleep(POLL_INTERVAL_S)


def _high_watermark(consumer: BitrouteConsumer, topic: str, partition: int) -> int:
    _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                             timeout=METADATA_TIMEOUT_S)
    return high


def _raise_access(client, error: KafkaError, operation: str, topic: str) -> None:
    """Raise the one-line :class:`KafkaAccessError` when ``error`` is about access."""
    client.errors.check()
    failure = access_failure(client.errors.settings, error, operation, "topic", topic)
    if failure is not None:
        raise failure


def _json_strings(text: str | None) -> list[str] | None:
    try:
        value = json.loads(text) if text is not None else None
    except json.JSONDecodeError:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return value


def _decimal(text: str | None) -> int | None:
    return int(text) if text is not None and text.isascii() and text.isdecimal() else None

"""``bitroute subscribe --since T``: what the command line checks before it writes anything.

``T`` is read with the command line's one time grammar
(:func:`streaming.cli.times.parse_time`: an ISO-8601 time or a duration back
from now); the changelog record carries the absolute time, so that a record
read again later means the same.
Refused at once, with nothing written: a time in the future, and an ``--id``
that exists with another exchange, subscriber, filter or criteria (read from
the routing state ``bitroute subscriptions`` shows). A time before the oldest
publish Kafka still holds is taken: the replay starts at the retention start
(the earliest offset Kafka keeps), and :func:`retention_start_notice` says so.
"""

from __future__ import annotations

from datetime import UTC, datetime

from compiler.subscription import since_text
from streaming.config import Config
from streaming.kafka.errors import InvalidRequest


def check_since(when: datetime, text: str, now: datetime | None = None) -> None:
    """Refuse ``--since``'s time ``when`` (given as ``text``) when it is in the future:
    raises :class:`InvalidRequest`."""
    now = now or datetime.now(UTC)
    if when > now:
        raise InvalidRequest(f"--since {text!r}: {since_text(when)} is in the future (now is "
                             f"{since_text(now)}): a replay is of publishes already made")


def check_existing(config: Config, sub_id: str | None, exchange: str, subscriber: str,
                   filter_: str, criteria) -> None:
    """Refuse a replay under an ``--id`` that exists with another definition (the router
    rejects such a record too). Skipped when the routing state cannot be read."""
    if sub_id is None:
        return
    from compiler import RoutingIndex
    from streaming.ops.inspect import InspectError, load_state

    try:
        state = load_state(config)
    except (InspectError, OSError):
        return
    existing = RoutingIndex.from_snapshot(state.snapshot).get(sub_id)
    if existing is None:
        return
    if (existing.exchange, existing.subscriber, existing.filter, existing.headers) != (
            exchange, subscriber, filter_, criteria):
        raise InvalidRequest(
            f"subscription {sub_id!r} exists with another definition (exchange "
            f"{existing.exchange!r}, subscriber {existing.subscriber!r}, filter "
            f"{existing.filter!r}): a replay (--since) needs a new --id or the same definition")


def retention_start_notice(config: Config, since: datetime) -> str | None:
    """A line saying the replay starts at the retention start, when ``since`` is before the
    oldest publish Kafka still holds (some were deleted); None otherwise."""
    from confluent_kafka import TopicPartition

    from streaming.kafka.clients import consumer
    from streaming.kafka.errors import KAFKA_TIMEOUT_S

    topic = config.kafka.publishes_topic
    client = consumer(config.kafka.client_settings, "bitroute-cli-replay")
    try:
        metadata = client.topics(KAFKA_TIMEOUT_S, topic).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return None
        millis = int(since.timestamp() * 1000)
        found = client.offsets_for_times(
            [TopicPartition(topic, p, millis) for p in sorted(metadata.partitions)],
            KAFKA_TIMEOUT_S)
        early = []
        for tp in found:
            low, _ = client.get_watermark_offsets(TopicPartition(topic, tp.partition),
                                                  timeout=KAFKA_TIMEOUT_S, cached=False)
            if low > 0 and 0 <= tp.offset <= low:
                early.append(f"{tp.partition}/{low}")
    finally:
        client.close()
    if not early:
        return None
    return (f"--since {since_text(since)} is before the retention start of {topic} "
            f"(Kafka deleted older publishes; partition/offset {', '.join(early)}): the replay "
            "starts at the retention start")

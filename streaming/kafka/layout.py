"""The delivery layout: which topic holds a subscriber's deliveries, and how they are keyed.

The one implementation of ``kafka.delivery_layout`` (the contract is stated in
:mod:`schemas.records`):

- ``topic-per-subscriber`` (the default): subscriber ``s``'s deliveries go to
  its own topic ``kafka.deliveries_topic_prefix + s`` (``kafka.delivery_partitions``
  partitions), keyed by routing key;
- ``shared``: every subscriber's deliveries go to ``kafka.shared_deliveries_topic``
  (``kafka.shared_delivery_partitions`` partitions), keyed by subscriber name, so
  that Kafka's default partitioner (:mod:`streaming.kafka.partitioner`) puts all of
  a subscriber's in one partition; the routing key moves to
  :data:`schemas.records.ROUTING_KEY_HEADER`.

A :class:`DeliveryLayout` is built from the configuration
(:attr:`streaming.config.KafkaConfig.layout`) and handed to what needs it: the
routing tasks (it is pickled into their ``mapInArrow`` function, so it stays a
small frozen value), the audit writer (the ``delivery_topic`` column), topic
creation, ``bitroute tail`` and ``bitroute run``'s start line. Nothing else asks
which layout is configured.

The methods that take Arrow columns load pyarrow when called, so that the client
verbs, which load the configuration, do not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from schemas.records import LAYOUT_SHARED, ROUTING_KEY_HEADER
from streaming.kafka.partitioner import default_partition

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from streaming.config import KafkaConfig


@dataclass(frozen=True, slots=True)
class DeliveryLayout:
    """Where deliveries go: each subscriber's own topic ``topic_prefix + subscriber``
    (``shared_topic`` None), or all in ``shared_topic`` keyed by subscriber.
    ``partitions``, ``replication_factor``, ``min_insync_replicas``: how a delivery topic is
    created (also again, when an administrator deleted it: :mod:`streaming.router.batch.routing`)."""

    topic_prefix: str
    shared_topic: str | None = None
    partitions: int = 1
    replication_factor: int = 1
    min_insync_replicas: int = 0
    """0: the broker's default."""

    @classmethod
    def of(cls, kafka: KafkaConfig) -> DeliveryLayout:
        """The layout ``kafka`` (a validated ``[kafka]`` section) configures."""
        if kafka.delivery_layout == LAYOUT_SHARED:
            return cls(kafka.deliveries_topic_prefix, kafka.shared_deliveries_topic,
                       kafka.shared_delivery_partitions, kafka.replication_factor,
                       kafka.min_insync_replicas)
        return cls(kafka.deliveries_topic_prefix, None, kafka.delivery_partitions,
                   kafka.replication_factor, kafka.min_insync_replicas)

    @property
    def shared(self) -> bool:
        """Whether every subscriber's deliveries share one topic, keyed by subscriber (the
        producer must then place keyed records as Kafka's default partitioner does)."""
        return self.shared_topic is not None

    def topic(self, subscriber: str) -> str:
        """The topic holding ``subscriber``'s deliveries (an already validated name)."""
        return self.shared_topic if self.shared_topic is not None else self.topic_prefix + subscriber

    def subscriber_of(self, topic: str) -> str | None:
        """The subscriber whose own topic ``topic`` is (None: the shared topic, or not one)."""
        if self.shared_topic is not None or not topic.startswith(self.topic_prefix):
            return None
        return topic[len(self.topic_prefix):]

    def topic_column(self, subscribers: pa.Array) -> pa.Array:
        """:meth:`topic` of each subscriber of an Arrow string column."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if self.shared_topic is not None:
            return pa.array([self.shared_topic] * len(subscribers), pa.string())
        return pc.binary_join_element_wise(self.topic_prefix, subscribers, "")

    def record_keys(self, subscribers: pa.Array, routing_keys: pa.Array) -> tuple[pa.Array, bool]:
        """The deliveries' Kafka record keys, and whether there is one per delivery: its
        subscriber's name per delivery to ``subscribers[i]`` (shared), else the routing key
        of its publish (``routing_keys``, one per publish)."""
        if self.shared_topic is not None:
            import pyarrow as pa

            return subscribers.cast(pa.binary()), True
        return routing_keys, False

    @property
    def routing_key_header(self) -> str | None:
        """The header that carries a delivery's routing key, after its publish's own
        headers: :data:`~schemas.records.ROUTING_KEY_HEADER` in the shared layout (where
        the record key is the subscriber), None when the record key is the routing key."""
        return ROUTING_KEY_HEADER if self.shared_topic is not None else None

    def key_bytes(self, subscribers: pa.Array) -> np.ndarray | int:
        """Per delivery to ``subscribers[i]``, the bytes this layout adds to its record beyond
        its publish's routing key, payload and headers: in the shared layout its key (the
        subscriber's name) and the framing of the routing key's header (whose value is the
        routing key, counted with the publish); nothing in a topic of its own."""
        if self.shared_topic is None:
            return 0
        import pyarrow.compute as pc

        from streaming.kafka.records import header_size

        return header_size(ROUTING_KEY_HEADER) + pc.binary_length(subscribers).to_numpy(
            zero_copy_only=False)

    def subscriber_key(self, subscriber: str) -> bytes | None:
        """The record key that marks ``subscriber``'s deliveries in its topic, None when
        every record of the topic is its own."""
        return subscriber.encode("utf-8") if self.shared_topic is not None else None

    def subscriber_partitions(self, subscriber: str, partitions: list[int]) -> list[int]:
        """Of its topic's ``partitions`` (ids, sorted), those holding ``subscriber``'s
        deliveries: all of its own topic's, or the one of the shared topic its name is
        keyed to."""
        key = self.subscriber_key(subscriber)
        if key is None:
            return partitions
        return [partitions[default_partition(key, len(partitions))]]

    def describe(self) -> str:
        """Where deliveries go, for a start line: ``bitroute.deliveries.<subscriber>``, or
        ``bitroute.deliveries (shared, keyed by subscriber)``."""
        if self.shared_topic is not None:
            return f"{self.shared_topic} (shared, keyed by subscriber)"
        return f"{self.topic_prefix}<subscriber>"

"""bitroute's Kafka client layer: every Kafka client bitroute makes is made here.

- :mod:`streaming.kafka.settings`: the connection (``kafka.bootstrap`` and the
  ``[kafka.client]`` properties: TLS, SASL) as librdkafka configuration and as
  the Spark Kafka source's ``kafka.*`` options;
- :mod:`streaming.kafka.clients`: the producer, consumer and admin factories,
  Kafka's log, authentication and authorization failures as one line each, the
  "local queue full, wait for room" loop;
- :mod:`streaming.kafka.records`: the rules of the records bitroute reads and writes;
- :mod:`streaming.kafka.partitioner`: Kafka's default partitioner (shared layout).
"""

from streaming.kafka.clients import (
    KAFKA_LOG,
    ClientErrors,
    KafkaAccessError,
    access_failure,
    admin,
    consumer,
    denied,
    produce_when_room,
    producer,
)
from streaming.kafka.settings import ClientSettings

__all__ = ["KAFKA_LOG", "ClientErrors", "ClientSettings", "KafkaAccessError", "access_failure",
           "admin", "consumer", "denied", "produce_when_room", "producer"]

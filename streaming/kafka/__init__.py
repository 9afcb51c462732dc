"""bitroute's Kafka client layer: every Kafka client bitroute makes is made here.

- :mod:`streaming.kafka.settings`: the connection (``kafka.bootstrap`` and the
  ``[kafka.client]`` properties: TLS, SASL) as librdkafka configuration and as
  the Spark Kafka source's ``kafka.*`` options;
- :mod:`streaming.kafka.clients`: the producer, consumer and admin factories,
  Kafka's log, every Kafka failure as one line naming its cause (:func:`failure`,
  applied at a command's edge by :func:`edge`), the "local queue full, wait for room" loop;
- :mod:`streaming.kafka.errors`: the package's exceptions, Kafka's error classes (what a
  failure means) and the timeouts of blocking calls to Kafka;
- :mod:`streaming.kafka.records`: the rules of the records bitroute reads and writes;
- :mod:`streaming.kafka.layout`: the delivery layout (a subscriber's topic, a delivery's key);
- :mod:`streaming.kafka.partitioner`: Kafka's default partitioner (shared layout);
- :mod:`streaming.kafka.client_verbs`: the Kafka side of the client verbs
  (``bitroute subscribe``, ``unsubscribe``, ``publish``, ``tail``).

The package's names load their module on first use (PEP 562), so that loading
the configuration (which needs :mod:`streaming.kafka.settings` only) does not
load librdkafka for every verb.
"""

from __future__ import annotations

import importlib
from typing import Any

_CLIENT_NAMES = ("KAFKA_LOG", "ClientErrors", "KafkaAccessError", "access_failure", "admin",
                 "consumer", "denied", "edge", "failure", "produce_when_room", "producer")
__all__ = [*_CLIENT_NAMES, "ClientSettings"]


def __getattr__(name: str) -> Any:
    if name in _CLIENT_NAMES:
        return getattr(importlib.import_module("streaming.kafka.clients"), name)
    if name == "ClientSettings":
        return importlib.import_module("streaming.kafka.settings").ClientSettings
    raise AttributeError(f"module 'streaming.kafka' has no attribute {name!r}")

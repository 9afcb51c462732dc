"""The root of every error ``streaming/`` raises on purpose.

``except BitrouteError`` catches what the router, the client verbs and the
CLI report as one line; anything else is a bug or a library's own failure.
Each module keeps its specific subclasses next to the code that raises them.
"""

from __future__ import annotations


class BitrouteError(RuntimeError):
    """An error bitroute raises and explains (the message says what failed and why)."""


class KafkaAccessError(BitrouteError):
    """Kafka refused bitroute's credentials, or refused them an operation: one line naming
    the principal, the resource and what to grant or check (:mod:`streaming.kafka.clients`)."""

"""The operations verbs' exceptions (:mod:`streaming.ops`), all under
:class:`streaming.errors.BitrouteError`; the modules that raise them re-export them."""

from __future__ import annotations

from streaming.errors import BitrouteError


class MetricsError(BitrouteError):
    """The metrics endpoint could not be served (the message names the address)."""


class InspectError(BitrouteError):
    """The routing state could not be read (no snapshot and no changelog, a bad file)."""


class RejectedPublish(InspectError):
    """The router would reject this publish; the message is the router's reason."""


class KafkaUnavailable(BitrouteError):
    """Kafka did not answer within the budget."""

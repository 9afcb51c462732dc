"""The exceptions of :mod:`streaming.realtime`, under :class:`streaming.errors.BitrouteError`;
the modules that raise them re-export them."""

from streaming.errors import BitrouteError


class RealtimeSlotsError(BitrouteError):
    """Spark has fewer task slots than realtime mode holds (the message says how many)."""


class RealtimeJarMissing(BitrouteError):
    """The Spark driver's JVM lacks the realtime jar (``RouteUdf``): a realtime router given
    no ``bitroute-realtime.jar`` (spark-submit without it in ``--jars``)."""


class ViewError(BitrouteError):
    """The routing view could not be written (Kafka refused or did not answer)."""


class AuditWaitInterrupted(BitrouteError):
    """The router stopped while a batch of routed records waited for the routing query's
    checkpoint (the batch is audited at the next start)."""

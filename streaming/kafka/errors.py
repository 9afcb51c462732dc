"""Kafka's failures as bitroute sorts and raises them, and how long it waits for Kafka.

The one home of:

- the **exceptions** of :mod:`streaming.kafka` (all under
  :class:`streaming.errors.BitrouteError`): :class:`KafkaAccessError`,
  :class:`ClientSettingsError`, :class:`BrokerError`, :class:`TopicCreationError`,
  :class:`ClientError` and :class:`InvalidRequest` (the client verbs');
- the **error classes**, sets of librdkafka error codes, that decide what a
  failure means: :data:`AUTHENTICATION_ERRORS` and :data:`AUTHORIZATION_ERRORS`
  (credentials or permissions: one line saying what to grant or check, never
  fixed by waiting), :data:`RECORD_ERRORS` (about one record or its topic: the
  record is rejected, routing goes on), :data:`BATCH_ERRORS` (the record errors a
  broker gives every record of a refused record batch), :data:`MISSING_TOPIC_ERRORS`
  (the record errors of a topic that does not exist: a deleted delivery topic is
  created again, :mod:`streaming.router.batch.routing`), :data:`OUTAGE_ERRORS`
  (the cluster unreachable: waited out, reported once per outage), :data:`TIMEOUT_ERRORS`
  (no answer in time); any other code is a cluster failure that the batch retries;
- the **timeouts** of blocking calls to Kafka: :data:`KAFKA_TIMEOUT_S` and
  the few that differ, each saying why.

The error classes load librdkafka on first use (PEP 562), so that loading the
configuration (which raises :class:`ClientSettingsError`) does not load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streaming.errors import BitrouteError

__all__ = [
    "AUTHENTICATION_ERRORS", "AUTHORIZATION_ERRORS", "BATCH_ERRORS", "RECORD_ERRORS",
    "MISSING_TOPIC_ERRORS", "OUTAGE_ERRORS", "TIMEOUT_ERRORS", "KAFKA_TIMEOUT_S", "PROBE_TIMEOUT_S",
    "STATUS_BUDGET_S", "UNREACHABLE_S", "BrokerError",
    "ClientError", "ClientSettingsError", "InvalidRequest", "KafkaAccessError",
    "TopicCreationError",
]

# --- exceptions --------------------------------------------------------------------------


class KafkaAccessError(BitrouteError):
    """Kafka refused bitroute's credentials, or refused them an operation: one line naming
    the principal, the resource and what to grant or check (:mod:`streaming.kafka.clients`)."""


class ClientSettingsError(BitrouteError, ValueError):
    """A ``[kafka.client]`` value is unknown, unsupported, missing or unreadable; the message
    starts with the key (:func:`streaming.kafka.settings.resolve_properties`)."""


class BrokerError(BitrouteError):
    """The embedded broker could not be started, reached or stopped."""


class TopicCreationError(BitrouteError):
    """A topic could not be created; the message names it and Kafka's reason."""


class ClientError(BitrouteError):
    """A Kafka operation failed; the message says which and why."""


class InvalidRequest(ClientError):
    """The request is invalid (bad filter, unknown exchange, malformed header); nothing was written."""


# --- timeouts ----------------------------------------------------------------------------

KAFKA_TIMEOUT_S = 30.0
"""The longest a blocking call waits for Kafka (metadata, watermarks, topic creation and
its leaders, a client verb's acknowledgement) before it is reported failed: long enough
for a leader election, short enough that a batch's retry reports an outage."""
PROBE_TIMEOUT_S = 2.0
"""``bitroute inspect``'s look at Kafka: it answers from the snapshot alone past this."""
STATUS_BUDGET_S = 1.0
"""``bitroute status``'s whole budget for Kafka (it must answer while Kafka is down)."""
UNREACHABLE_S = 5.0
"""How long a command's Kafka client that has not reached the cluster yet waits once it was
refused a connection (connection refused, no broker up, a name that does not resolve)
before the command fails saying so (:func:`streaming.kafka.clients.edge`): a command is
asked for now, so it says the cluster is unreachable instead of waiting out
:data:`KAFKA_TIMEOUT_S`; a client that reached the cluster waits an outage out."""

# --- error classes (librdkafka error codes; loaded on first use) ---------------------------

if TYPE_CHECKING:
    AUTHENTICATION_ERRORS: frozenset[int]
    AUTHORIZATION_ERRORS: frozenset[int]
    BATCH_ERRORS: frozenset[int]
    RECORD_ERRORS: frozenset[int]
    MISSING_TOPIC_ERRORS: frozenset[int]
    OUTAGE_ERRORS: frozenset[int]
    TIMEOUT_ERRORS: frozenset[int]

_CLASSES: dict[str, frozenset[int]] = {}


def _error_classes() -> dict[str, frozenset[int]]:
    if not _CLASSES:
        from confluent_kafka import KafkaError as E

        batch = frozenset({E.MSG_SIZE_TOO_LARGE, E.INVALID_RECORD, E._BAD_MSG,
                           E.RECORD_LIST_TOO_LARGE, E.INVALID_MSG, E.INVALID_MSG_SIZE})
        _CLASSES.update(
            AUTHENTICATION_ERRORS=frozenset({
                E._AUTHENTICATION, E.SASL_AUTHENTICATION_FAILED, E._SSL,
                E.UNSUPPORTED_SASL_MECHANISM, E.ILLEGAL_SASL_STATE}),
            AUTHORIZATION_ERRORS=frozenset({
                E.TOPIC_AUTHORIZATION_FAILED, E.GROUP_AUTHORIZATION_FAILED,
                E.CLUSTER_AUTHORIZATION_FAILED, E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}),
            # A record that failed with one of these may only have shared a record batch
            # with the culprit (written again on its own, it tells).
            BATCH_ERRORS=batch,
            RECORD_ERRORS=batch | frozenset({E._INVALID_ARG, E.UNKNOWN_TOPIC_OR_PART,
                                             E._UNKNOWN_TOPIC, E._UNKNOWN_PARTITION,
                                             E.TOPIC_EXCEPTION}),
            # _UNKNOWN_PARTITION: the producer's metadata still had the topic when it
            # was deleted (its partitions vanished from under the queued records).
            MISSING_TOPIC_ERRORS=frozenset({E.UNKNOWN_TOPIC_OR_PART, E._UNKNOWN_TOPIC,
                                            E._UNKNOWN_PARTITION}),
            OUTAGE_ERRORS=frozenset({E._ALL_BROKERS_DOWN, E._TRANSPORT, E._RESOLVE}),
            TIMEOUT_ERRORS=frozenset({E._TIMED_OUT, E._TIMED_OUT_QUEUE, E.REQUEST_TIMED_OUT}),
        )
    return _CLASSES


def __getattr__(name: str) -> Any:
    if name in ("AUTHENTICATION_ERRORS", "AUTHORIZATION_ERRORS", "BATCH_ERRORS", "RECORD_ERRORS",
                "MISSING_TOPIC_ERRORS", "OUTAGE_ERRORS", "TIMEOUT_ERRORS"):
        return _error_classes()[name]
    raise AttributeError(f"module 'streaming.kafka.errors' has no attribute {name!r}")

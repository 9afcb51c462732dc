"""The one place librdkafka clients are made, and how their failures are told.

:func:`producer`, :func:`consumer` and :func:`admin` build clients from
:class:`~streaming.kafka.settings.ClientSettings` plus the caller's own
properties (which may not override the connection's). Every client logs to
:data:`KAFKA_LOG` (which ``bitroute`` keeps silent: it reports failures itself)
and may be given a :class:`ClientErrors`, its ``error_cb``.

Authentication and authorization failures become one line each
(:class:`KafkaAccessError`): the principal, the resource, what to grant or
check. librdkafka reports a failed authentication only through ``error_cb``
and keeps retrying, so a blocking call would wait its whole timeout:
the clients' ``topics``, ``flush_within`` and ``result`` wait in short steps
and raise the recorded failure at once (within about :data:`CHECK_EVERY_S`).

:func:`failure` is the one classifier of a Kafka failure (a ``KafkaException``, a
future's timeout, a refused topic creation) as one line: authentication,
authorization (the grant), the cluster unreachable (the bootstrap servers and the
time waited), a missing topic, else Kafka's own words. :func:`edge` applies it to
a command's Kafka work (``bitroute``'s verbs, ``run``'s start), and makes the
clients made inside fail within :data:`UNREACHABLE_S` when they cannot reach the
cluster at all (docs/security.md, "When a command cannot use Kafka").

:func:`produce_when_room` is the "local queue full, wait for room" loop.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, TimeoutError as FutureTimeout
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient

from streaming.errors import BitrouteError, one_line
from streaming.kafka.errors import (
    AUTHENTICATION_ERRORS,
    AUTHORIZATION_ERRORS,
    KAFKA_TIMEOUT_S,
    MISSING_TOPIC_ERRORS,
    OUTAGE_ERRORS,
    TIMEOUT_ERRORS,
    UNREACHABLE_S,
    ClientError,
    KafkaAccessError,
    TopicCreationError,
)
from streaming.kafka.settings import ClientSettings

KAFKA_LOG = logging.getLogger("bitroute.kafka")
"""librdkafka's log lines: nowhere unless the program configures logging (its only handler
is the do-nothing one the logging HOWTO asks of a library, so that Python's last-resort
handler does not print them, in the Spark workers either); ``bitroute`` keeps them off
even a configured root logger (:mod:`streaming.cli.logs`)."""
KAFKA_LOG.addHandler(logging.NullHandler())

CHECK_EVERY_S = 0.25
"""How often a bounded wait looks for a recorded authentication failure."""
MAX_STEP_S = 2.0
QUEUE_FULL_WAIT_S = 0.05

_VERIFY_FAILED = "certificate verify failed"
"""OpenSSL's words, in librdkafka's handshake error, for a peer certificate not verified."""
_SUPPRESSED = re.compile(r"\s*\(after \d+ms in state [A-Z_]+(?:, \d+ identical error\(s\) suppressed)?\)")
_UNREACHABLE_AFTER: ContextVar[float | None] = ContextVar("bitroute_kafka_unreachable_after",
                                                          default=None)
"""Set inside :func:`edge`: the clients made there fail this long after a refused connection."""


def is_access_error(error: KafkaError) -> bool:
    """Whether ``error`` is about credentials or permissions (never fixed by waiting alone)."""
    return error.code() in AUTHENTICATION_ERRORS or error.code() in AUTHORIZATION_ERRORS or (
        error.code() == KafkaError._TRANSPORT and "security.protocol" in error.str())


def authentication_failure(settings: ClientSettings, error: KafkaError) -> KafkaAccessError:
    reason = _SUPPRESSED.sub("", error.str())
    if error.code() == KafkaError._SSL and _VERIFY_FAILED in reason:
        return untrusted_broker(settings)
    return KafkaAccessError(
        f"Kafka at {settings.bootstrap} did not accept {settings.principal()} "
        f"({settings.describe()}): {reason}; check [kafka.client] (security.protocol, "
        "sasl.mechanism, sasl.username, sasl.password, the TLS files) and that the cluster "
        "holds this principal's credential")


def untrusted_broker(settings: ClientSettings) -> KafkaAccessError:
    """The one line for a broker certificate the client does not trust: the client refused
    the broker (not the other way round), so it names the CA file, not the principal."""
    ca = settings.props.get("ssl.ca.location")
    trusted = f"the CA in ssl.ca.location ({ca})" if ca else "a CA the system trusts"
    return KafkaAccessError(
        f"Kafka at {settings.bootstrap} presented a TLS certificate bitroute does not trust "
        f"(SSL handshake failed: {_VERIFY_FAILED}): it must be signed by {trusted} and name the "
        "host in kafka.bootstrap; set [kafka.client] ssl.ca.location to the CA that signed the "
        "brokers' certificates")


def denied(settings: ClientSettings, operation: str, kind: str, name: str,
           error: KafkaError | None = None) -> KafkaAccessError:
    """The one line for ``operation`` (an ACL operation: Read, Write, Describe, Create)
    refused on ``kind`` (topic, group, cluster) ``name``."""
    principal = settings.principal()
    resource = "--cluster" if kind == "cluster" else f"--{kind} {name}"
    code = f" ({error.name()})" if error is not None else ""
    return KafkaAccessError(
        f"Kafka at {settings.bootstrap} does not allow {principal} to {operation} {kind} "
        f"{name}{code}: grant it with kafka-acls.sh --add --allow-principal {principal} "
        f"--operation {operation} {resource}")


def access_failure(settings: ClientSettings, error: KafkaError, operation: str, kind: str,
                   name: str) -> KafkaAccessError | None:
    """The one-line failure when ``error`` is about access, else None."""
    if error.code() in AUTHORIZATION_ERRORS:
        if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            return denied(settings, "Read", "group", name if kind == "group" else "<group>", error)
        if error.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
            # A producer refused the cluster: its idempotent producer id (InitProducerId
            # needs IdempotentWrite on the cluster, or Write on some topic).
            cluster_operation = "IdempotentWrite" if operation == "Write" else operation
            return denied(settings, cluster_operation, "cluster", "kafka-cluster", error)
        return denied(settings, operation, kind, name, error)
    if is_access_error(error):
        return authentication_failure(settings, error)
    return None


_JAVA_TOPIC_REFUSED = re.compile(
    r"TopicAuthorizationException: (?:Not authorized to access topics: \[([^\]]*)\])?")
_JAVA_GROUP_REFUSED = re.compile(r"GroupAuthorizationException: Not authorized to access group: (\S+)")
_JAVA_CLUSTER_REFUSED = "ClusterAuthorizationException"
_JAVA_NOT_AUTHENTICATED = re.compile(
    r"(?:SaslAuthenticationException|SslAuthenticationException|AuthenticationException): ([^\n]*)")


def java_access_failure(settings: ClientSettings, failure: object,
                        source_topic: str) -> KafkaAccessError | None:
    """The one line for a Java Kafka client's access failure inside ``failure``'s text
    (the Spark Kafka source reads ``source_topic`` with Kafka's Java client: its
    refusals reach bitroute as JVM exception text), else None.

    A refused topic is a missing Read (Kafka's Read implies the Describe the
    source also needs); the Java client names the topics only when a fetch was
    refused, a refused metadata request ("Topic authorization failed.") is
    about ``source_topic``. A refused group is a missing group Read.
    """
    text = str(failure)
    if (topics := _JAVA_TOPIC_REFUSED.search(text)) is not None:
        names = [name.strip() for name in (topics.group(1) or "").split(",") if name.strip()]
        return denied(settings, "Read", "topic", ", ".join(names) or source_topic)
    if (group := _JAVA_GROUP_REFUSED.search(text)) is not None:
        return denied(settings, "Read", "group", group.group(1))
    if _JAVA_CLUSTER_REFUSED in text:
        return denied(settings, "Describe", "cluster", "kafka-cluster")
    if (refused := _JAVA_NOT_AUTHENTICATED.search(text)) is not None:
        return KafkaAccessError(
            f"Kafka at {settings.bootstrap} did not accept {settings.principal()} "
            f"({settings.describe()}) for the Spark Kafka source: {refused.group(1).strip()}; "
            "check [kafka.client] (security.protocol, sasl.mechanism, sasl.username, "
            "sasl.password, the TLS files) and that the cluster holds this principal's credential")
    return None


def unreachable(settings: ClientSettings, waited_s: float, reason: str) -> ClientError:
    """The one line for a cluster that did not answer within ``waited_s`` seconds."""
    return ClientError(
        f"cannot reach Kafka at {settings.bootstrap} ({settings.describe()}) within "
        f"{waited_s:g}s: {reason}; check that kafka.bootstrap names brokers that run and are "
        "reachable from here, and that [kafka.client] security.protocol is their listener's")


def failure(settings: ClientSettings, exc: BaseException, operation: str = "Describe",
            kind: str = "cluster", name: str = "kafka-cluster",
            waited_s: float = KAFKA_TIMEOUT_S) -> BitrouteError:
    """``exc``, a failure of Kafka work, as the one-line error that names its cause:

    - refused credentials or permissions: :class:`KafkaAccessError` (:func:`access_failure`;
      ``operation`` on ``kind`` ``name`` is what was asked, for the grant);
    - the cluster unreachable, or no answer within ``waited_s`` (a future's
      ``TimeoutError``, librdkafka's timeouts): :func:`unreachable`;
    - a topic that does not exist (``kind`` ``"topic"``): :class:`ClientError` naming it;
    - a refused topic creation, any other Kafka error: :class:`ClientError` with Kafka's words.

    A :class:`BitrouteError` (already one line) is returned as it is, but a
    :class:`TopicCreationError` becomes a :class:`ClientError`.
    """
    if isinstance(exc, TopicCreationError):
        return ClientError(str(exc))
    if isinstance(exc, BitrouteError):
        return exc
    if isinstance(exc, TimeoutError):  # concurrent.futures.TimeoutError too
        return unreachable(settings, waited_s, "no answer")
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    if not isinstance(error, KafkaError):
        return ClientError(f"Kafka at {settings.bootstrap}: {one_line(exc, typed=True)}")
    refused = access_failure(settings, error, operation, kind, name)
    if refused is not None:
        return refused
    if error.code() in MISSING_TOPIC_ERRORS and kind == "topic":
        return ClientError(f"the topic {name} does not exist on Kafka at {settings.bootstrap}")
    if error.code() in OUTAGE_ERRORS or error.code() in TIMEOUT_ERRORS:
        return unreachable(settings, waited_s, _SUPPRESSED.sub("", error.str()))
    return ClientError(f"Kafka at {settings.bootstrap} failed: {_SUPPRESSED.sub('', error.str())}")


@contextmanager
def edge(settings: ClientSettings, operation: str = "Describe", kind: str = "cluster",
         name: str = "kafka-cluster", unreachable_after_s: float = UNREACHABLE_S) -> Iterator[None]:
    """A command's Kafka work: what escapes it (``KafkaException``, a future's
    ``TimeoutError``, :class:`TopicCreationError`) is raised as :func:`failure`'s one line,
    and every client made inside that has not reached the cluster yet fails
    ``unreachable_after_s`` seconds after a refused connection (:class:`ClientErrors`)."""
    token = _UNREACHABLE_AFTER.set(unreachable_after_s)
    try:
        yield
    except (KafkaException, TimeoutError, TopicCreationError) as exc:
        raise failure(settings, exc, operation, kind, name) from None
    finally:
        _UNREACHABLE_AFTER.reset(token)


OnError = Callable[[KafkaError], None]
"""A client's handler of the errors that are not about access (e.g. the router's outage watch)."""


class ClientErrors:
    """A client's ``error_cb``: records the first access failure, passes the rest on.

    ``then`` (e.g. :meth:`streaming.kafka.broker_watch.BrokerWatch.on_error`) gets
    every error that is not about access. Thread-safe.

    A client made inside :func:`edge` also records the first refused connection
    (:data:`OUTAGE_ERRORS`) until it reaches the cluster (:meth:`reached`): past
    :data:`UNREACHABLE_S` of it, :meth:`check` raises :func:`unreachable`.
    """

    def __init__(self, settings: ClientSettings,
                 then: Callable[[KafkaError], None] | None = None) -> None:
        self.settings = settings
        self._then = then
        self._lock = threading.Lock()
        self.failure: KafkaAccessError | None = None
        self._unreachable_after = _UNREACHABLE_AFTER.get()
        self._refused: tuple[float, KafkaError] | None = None

    def __call__(self, error: KafkaError) -> None:
        if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            return  # bitroute's consumers never use their group (BitrouteConsumer)
        if is_access_error(error):
            with self._lock:
                if self.failure is None:
                    self.failure = authentication_failure(self.settings, error)
            return
        if self._unreachable_after is not None and error.code() in OUTAGE_ERRORS:
            with self._lock:
                if self._refused is None:
                    self._refused = (time.monotonic(), error)
        if self._then is not None:
            self._then(error)

    def reached(self) -> None:
        """The client had an answer from the cluster: an outage from now on is waited out."""
        with self._lock:
            self._unreachable_after = None
            self._refused = None

    def log(self, level: int, fmt: str, *args: object) -> None:
        """librdkafka's ``logger``: forwards to :data:`KAFKA_LOG`, and takes a plaintext
        connection closed by the broker during its first request for what it is."""
        KAFKA_LOG.log(level, fmt, *args)
        text = str(args[-1]) if args else fmt
        if (self.settings.protocol == "PLAINTEXT" and "Disconnected" in text
                and "in state APIVERSION_QUERY" in text):
            with self._lock:
                if self.failure is None:
                    self.failure = KafkaAccessError(
                        f"Kafka at {self.settings.bootstrap} closed a plaintext connection at its "
                        "first request: the listener expects TLS or SASL; set [kafka.client] "
                        "security.protocol (and its credentials) as the cluster requires")

    def check(self) -> None:
        """Raise the access failure recorded since the last check, if any (once: a client
        that keeps failing records it again, one that recovered does not); else, inside
        :func:`edge`, the cluster unreachable for :data:`UNREACHABLE_S` before any answer."""
        with self._lock:
            failure, self.failure = self.failure, None
            refused, after = self._refused, self._unreachable_after
        if failure is not None:
            raise failure
        if refused is not None and after is not None and time.monotonic() - refused[0] >= after:
            raise unreachable(self.settings, after, _SUPPRESSED.sub("", refused[1].str()))


def _own(settings: ClientSettings, props: Mapping[str, object] | None) -> dict[str, object]:
    own = dict(props or {})
    clash = sorted(set(own) & (set(settings.props) | {"bootstrap.servers", "error_cb"}))
    if clash:
        raise ValueError(f"client properties may not override the connection's: {clash}")
    return own


_CONNECT_TIMEOUT = "socket.connection.setup.timeout.ms"


def _config(settings: ClientSettings, props: Mapping[str, object] | None,
            errors: ClientErrors) -> dict[str, object]:
    config = {**settings.librdkafka(), "logger": errors, **_own(settings, props), "error_cb": errors}
    after = _UNREACHABLE_AFTER.get()
    if after is not None and _CONNECT_TIMEOUT not in config:
        # Inside edge(): a broker that drops packets is given as long as one that refuses.
        config[_CONNECT_TIMEOUT] = int(after * 1000)
    return config


def native_config(settings: ClientSettings,
                  props: Mapping[str, object] | None = None) -> list[tuple[str, str]]:
    """The librdkafka properties of a client made outside confluent-kafka (the kernel's
    delivery writer): the connection's plus ``props``, as librdkafka's strings. Its owner
    hands the client's errors and log lines to a :class:`ClientErrors` (with
    :func:`syslog_level`), as :func:`producer` does for its own."""
    merged = {**settings.librdkafka(), **_own(settings, props)}
    return [(name, str(value).lower() if isinstance(value, bool) else str(value))
            for name, value in merged.items()]


def syslog_level(level: int) -> int:
    """librdkafka's log level (syslog's, 0-7) as a ``logging`` level (confluent-kafka's map)."""
    return (logging.CRITICAL if level <= 2 else logging.ERROR if level == 3
            else logging.WARNING if level == 4 else logging.INFO if level <= 6 else logging.DEBUG)


class _Client(Protocol):
    """What :class:`_Bounded` uses of the client it is mixed into."""

    errors: ClientErrors

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any: ...
    def poll(self, timeout: float = -1) -> Any: ...
    def _serve(self) -> None: ...


class _Bounded:
    """Waits of a client that end early on a recorded access failure (mixed into each kind)."""

    errors: ClientErrors

    def topics(self: _Client, timeout: float, topic: str | None = None):
        """``list_topics(topic)`` within ``timeout`` seconds, in steps that raise a recorded
        access failure at once; raises ``KafkaException`` on timeout."""
        deadline = time.monotonic() + timeout
        step = CHECK_EVERY_S
        while True:
            self._serve()
            self.errors.check()
            try:
                # Growing steps: an answer slower than a step is never waited out.
                answer = self.list_topics(topic, timeout=min(step, max(deadline - time.monotonic(),
                                                                       0.001)))
                self.errors.reached()
                return answer
            except KafkaException:
                step = min(step * 2, MAX_STEP_S)
                if time.monotonic() >= deadline:
                    self._serve()
                    self.errors.check()
                    raise

    def _serve(self: _Client) -> None:
        """Serve the client's queued events: librdkafka calls ``error_cb`` only from a poll."""
        self.poll(0)


class BitrouteProducer(Producer, _Bounded):
    def __init__(self, config: dict, errors: ClientErrors) -> None:
        super().__init__(config)
        self.errors = errors

    def flush_within(self, timeout: float) -> int:
        """``flush()`` within ``timeout``; the records left. Raises a recorded access failure."""
        deadline = time.monotonic() + timeout
        while True:
            self.errors.check()
            left = self.flush(min(CHECK_EVERY_S, max(deadline - time.monotonic(), 0)))
            if not left:
                self.errors.reached()
                return left
            if time.monotonic() >= deadline:
                return left


class BitrouteConsumer(Consumer, _Bounded):
    """A consumer that reads by assignment only: it never joins its group nor commits, so
    the coordinator lookup's GROUP_AUTHORIZATION_FAILED (a principal without any group
    ACL) is not an error here and is dropped from ``poll`` and ``consume``."""

    def __init__(self, config: dict, errors: ClientErrors) -> None:
        super().__init__(config)
        self.errors = errors

    def poll(self, timeout: float = -1):
        message = super().poll(timeout)
        if message is not None and _group_refusal(message):
            return None
        return message

    def consume(self, num_messages: int = 1, timeout: float = -1):
        messages = super().consume(num_messages, timeout)
        return [m for m in messages if not _group_refusal(m)]

    def _serve(self) -> None:
        # Only while nothing is assigned: a poll then returns error events, never records.
        if self.assignment():
            return
        message = self.poll(0)
        if message is not None and message.error() is not None:
            self.errors(message.error())


def _group_refusal(message) -> bool:
    error = message.error()
    return error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED


class BitrouteAdmin(AdminClient, _Bounded):
    def __init__(self, config: dict, errors: ClientErrors) -> None:
        super().__init__(config)
        self.errors = errors

    def result(self, future: Future, timeout: float):
        """``future.result()`` within ``timeout``, raising a recorded access failure at once."""
        deadline = time.monotonic() + timeout
        while True:
            self._serve()
            self.errors.check()
            try:
                answer = future.result(timeout=min(CHECK_EVERY_S,
                                                   max(deadline - time.monotonic(), 0)))
            except FutureTimeout:
                if time.monotonic() >= deadline:
                    raise
                continue
            self.errors.reached()
            return answer


def producer(settings: ClientSettings, props: Mapping[str, object] | None = None,
             on_error: Callable[[KafkaError], None] | None = None) -> BitrouteProducer:
    """A producer; ``on_error`` gets the client's errors that are not about access."""
    errors = ClientErrors(settings, on_error)
    return BitrouteProducer(_config(settings, props, errors), errors)


def consumer(settings: ClientSettings, group: str, props: Mapping[str, object] | None = None,
             on_error: Callable[[KafkaError], None] | None = None) -> BitrouteConsumer:
    """A consumer with group id ``group`` (librdkafka requires one; bitroute's consumers
    read by assignment and never join nor commit, so it needs no group ACL)."""
    errors = ClientErrors(settings, on_error)
    return BitrouteConsumer(_config(settings, {"group.id": group, "enable.auto.commit": False,
                                               **(props or {})}, errors), errors)


def admin(settings: ClientSettings, props: Mapping[str, object] | None = None,
          on_error: Callable[[KafkaError], None] | None = None) -> BitrouteAdmin:
    errors = ClientErrors(settings, on_error)
    return BitrouteAdmin(_config(settings, props, errors), errors)


def record_position(message: Message) -> tuple[str, int, int]:
    """``(topic, partition, offset)`` of a consumed record. confluent-kafka types each
    optional, for its error events; a record has all three."""
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    if topic is None or partition is None or offset is None:
        raise ValueError(f"not a consumed record (topic {topic}, partition {partition}, offset {offset})")
    return topic, partition, offset


def record_headers(message: Message) -> list[tuple[str, bytes | None]] | None:
    """A consumed record's headers in order (None: it has none). confluent-kafka types
    them as anything a producer may pass (a dict, str values); a consumer returns this."""
    headers = message.headers()
    if headers is None:
        return None
    if isinstance(headers, dict):
        headers = list(headers.items())
    return [(name, value.encode() if isinstance(value, str) else value) for name, value in headers]


def produce_when_room(client: Producer, topic: str, value: bytes | None, key: bytes | None,
                      headers=None, on_delivery=None) -> None:
    """``client.produce(...)``, serving delivery reports while librdkafka's local queue is
    full (``BufferError``) until the record fits. ``KafkaException`` is the caller's."""
    kwargs = {} if on_delivery is None else {"on_delivery": on_delivery}
    while True:
        try:
            client.produce(topic, value, key, headers=headers, **kwargs)
            return
        except BufferError:
            client.poll(QUEUE_FULL_WAIT_S)

"""``bitroute run``: the router as a long-lived process.

:func:`serve` starts the embedded broker when configured, takes the state
folder's lock (:mod:`streaming.state.lock`: a second router on the same folders is
refused with the other's pid; the router is handed the lock and holds it until
it stops), starts Spark and the JVM watchdog
(:mod:`streaming.state.watchdog`: the JVM ends with this process, even after a
SIGKILL), routes until SIGINT or SIGTERM, printing each batch's progress line
(:class:`streaming.cli.progress.BatchLines`, a report listener of
:mod:`streaming.router.batch.report`; with ``--json``, one JSON object per batch instead,
:class:`~streaming.cli.progress.BatchJson`, and every other line on stderr),
and exits:

- 0 after a signal: the batch in progress is finished first; a second signal
  ends the process at once (status 1), as a kill would, and the interrupted
  batch is re-run at the next start with its pinned version;
- 1 when the router could not start or its query failed, with one line on
  stderr saying what failed and what to do. Kafka refusing the router's
  credentials, or not reachable, is found before Spark starts (a refused start
  costs no JVM) and told as every command tells it
  (:func:`streaming.kafka.clients.failure`).

Kafka refusing the publishes topic to the router's principal (an ACL or a
credential the Spark Kafka source is refused) does not end the process: the
line says what to grant, and the query is started again every
:data:`ACCESS_RETRY_S` seconds until the grant lands or a signal stops it.
In realtime mode the router itself starts a failed query again, whatever failed
(:mod:`streaming.realtime.supervisor`: Real-Time Mode does not retry a task, so one
failed task fails the routing query), with backoff and the same lines; the
process ends with status 1 only when the Spark JVM is gone or a query was
stopped from outside.

The Kafka clients' own connection logs are kept off the terminal
(:mod:`streaming.kafka.broker_watch` reports an outage in two lines instead). A
changelog catch-up longer than two seconds (at start, or after a bulk load of
subscriptions) reports its progress on stderr, and each batch prints one line on
stdout (:mod:`streaming.cli.progress`). With ``metrics.port`` set, the
Prometheus endpoint of :mod:`streaming.ops.metrics` is bound before Spark starts (a
port in use: status 1) and served until the process ends.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import TextIO

from confluent_kafka import KafkaException
from py4j.protocol import Py4JError
from pyspark.errors import StreamingQueryException

from streaming.audit.storage import StorageError
from streaming.cli.progress import BatchJson, BatchLines, CatchUpProgress
from streaming.config import MODE_REALTIME, Config
from streaming.errors import RealtimeBuildError, one_line
from streaming.kafka import clients
from streaming.kafka.clients import java_access_failure
from streaming.kafka.errors import KAFKA_TIMEOUT_S, ClientError, KafkaAccessError
from streaming.kafka.topics import TopicCreationError
from streaming.ops.exposition import MetricsError
from streaming.ops.metrics import RouterMetrics
from streaming.realtime.errors import RealtimeJarMissing, RealtimeSlotsError
from streaming.router.errors import RetentionGapError, RouterModeError
from streaming.router.feature import STOP_RECREATED
from streaming.router.service import Router
from streaming.router.subscriptions.changelog import ChangelogError
from streaming.router.subscriptions.snapshots import SnapshotStoreError
from streaming.state.lock import RouterLock, RouterLockedError

ACCESS_RETRY_S = 10.0
"""How long ``bitroute run`` waits before starting a query Kafka refused again."""
_STARTUP_ERRORS = (TopicCreationError, ChangelogError, SnapshotStoreError, KafkaException,
                   TimeoutError, KafkaAccessError, RouterLockedError, StorageError,
                   RouterModeError, RealtimeSlotsError, RealtimeBuildError, RealtimeJarMissing)


def serve(config: Config, json_lines: bool = False, accept_retention_gap: bool = False) -> int:
    """Route until stopped; see the module docstring for the exit statuses.

    ``accept_retention_gap``: the first batch records and passes a retention gap even
    under ``streaming.on_retention_gap = "stop"`` (:mod:`streaming.router.topics.retention`).

    ``json_lines``: each batch as one JSON object on stdout (:class:`BatchJson`) instead
    of its progress line, and every other line this prints on stderr, so that stdout
    is only JSON (``bitroute run --json``).
    """
    from streaming.cli.logs import quiet_kafka_client_logs
    from streaming.kafka.broker import BrokerError, EmbeddedBroker
    from streaming.session import spark_session
    from streaming.state.watchdog import start_watchdog

    if config.broker.embedded:
        broker = EmbeddedBroker.from_config(config.broker)
        try:
            broker.start()
        except BrokerError as exc:
            print(f"bitroute: error: {exc}", file=sys.stderr)
            return 1
        if broker.bootstrap != config.kafka.bootstrap:
            print(f"bitroute: warning: the embedded broker listens on {broker.bootstrap} but "
                  f"kafka.bootstrap is {config.kafka.bootstrap}", file=sys.stderr)

    info = sys.stderr if json_lines else sys.stdout
    stop_requested = threading.Event()

    def request_stop(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if stop_requested.is_set():
            # Raising here could cut a py4j call in half; end the process the
            # way a kill does, which the checkpoints and pins are made for.
            print(f"bitroute: {name} again: exiting without waiting for the current batch",
                  file=sys.stderr, flush=True)
            os._exit(1)
        print(f"bitroute: {name}: stopping after the current batch (again to stop now)", file=info, flush=True)
        stop_requested.set()

    # The lock is taken before Spark starts (a refused second router costs no JVM)
    # and handed to the router, which holds it until it stops: taken once.
    lock = RouterLock(config.streaming.checkpoint_dir)
    try:
        lock.acquire()
    except RouterLockedError as exc:
        print(f"bitroute: error: cannot start the router: {exc}", file=sys.stderr)
        return 1

    metrics = None
    try:
        # Bound before Spark starts, like the lock: a port in use costs no JVM.
        if config.metrics.port:
            metrics = RouterMetrics(config.metrics)
            try:
                metrics.start()
            except MetricsError as exc:
                print(f"bitroute: error: {exc} (metrics.port)", file=sys.stderr)
                return 1
        refused = _kafka_refusal(config)
        if refused is not None:
            print(f"bitroute: error: cannot start the router: {refused}", file=sys.stderr)
            return 1
        spark = spark_session(config)
        quiet_kafka_client_logs(spark)
        # After the session: creating a SparkContext installs pyspark's own SIGINT
        # handler, which cancels jobs through py4j from inside the signal and breaks
        # the call the main thread is making.
        previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
        router = Router(config, spark, lock, accept_retention_gap=accept_retention_gap)
        router.report_listeners.append(BatchJson() if json_lines else BatchLines())
        router.catch_up_progress = CatchUpProgress
        if metrics is not None:
            metrics.observe(router)
        try:
            return _route_until_stopped(router, stop_requested, start_watchdog, metrics, info)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            try:
                spark.stop()
            except Py4JError:
                pass  # the JVM is gone already
    finally:
        lock.release()  # released by the router's stop already, unless it never started
        if metrics is not None:
            metrics.close()


def _route_until_stopped(router: Router, stop_requested: threading.Event, start_watchdog,
                         metrics: RouterMetrics | None, info: TextIO) -> int:
    try:
        router.open()
        jvm_pid = _jvm_pid(router)
        start_watchdog(jvm_pid, router.lock.fd)
        router.lock.note(jvm_pid=jvm_pid)
        query = router.start()
    except _STARTUP_ERRORS as exc:
        router.stop()
        said = (clients.failure(router.config.kafka.client_settings, exc)
                if isinstance(exc, (KafkaException, TimeoutError, TopicCreationError)) else exc)
        print(f"bitroute: error: cannot start the router: {one_line(said)}", file=sys.stderr)
        return 1
    except RetentionGapError as exc:  # realtime mode's, at its start: on_retention_gap = "stop"
        router.stop()
        print(f"bitroute: error: {exc}", file=sys.stderr)
        return 1
    if metrics is not None:
        metrics.router_started(router)
    _announce(router, metrics, info)
    try:
        ended = _await_query(router, query, stop_requested, info)
    except Py4JError:
        print("bitroute: error: the Spark JVM ended unexpectedly; start the router again "
              "(the unfinished batch is re-run)", file=sys.stderr)
        return 1
    if ended is not None:
        return ended
    if not stop_requested.is_set():
        router.stop()
        print("bitroute: error: the router's query was stopped from outside", file=sys.stderr)
        return 1
    router.stop_after_current_batch()
    print("bitroute: stopped", file=info, flush=True)
    return 0


def _await_query(router: Router, query, stop_requested: threading.Event,
                 info: TextIO) -> int | None:
    """Wait for a stop request or the query's end; the exit status when the router
    ended here, None when the query ended (or a stop was requested) otherwise.

    A query Kafka refused (an ACL or credential of the router's principal) is
    reported in one line and started again every :data:`ACCESS_RETRY_S`; a query
    stopped on a recreated publishes topic is started again on the new topic.
    """
    if router.realtime is not None:
        return _await_realtime(router, stop_requested)
    refused_since = 0.0
    while True:
        try:
            while not stop_requested.is_set() and not query.awaitTermination(1):
                pass
            return None
        except StreamingQueryException as exc:
            if stop_requested.is_set():
                router.stop()
                print("bitroute: stopped (the unfinished batch is re-run at the next start)",
                      file=info, flush=True)
                return 0
            reason = router.stop_reason  # a feature's (streaming.router.feature)
            if reason is not None and reason.kind == STOP_RECREATED:
                # The publishes topic was deleted and created again: the router follows
                # the new incarnation (streaming.router.topics.incarnations), said in its line.
                query = router.follow_recreated_topic()
                continue
            refused = java_access_failure(router.config.kafka.client_settings, exc,
                                          router.config.kafka.publishes_topic)
            if refused is None:
                router.stop()
                print(f"bitroute: error: {reason.line}" if reason is not None else
                      f"bitroute: error: the router's query failed: {_failure_line(router, exc)}",
                      file=sys.stderr)
                return 1
            refused_since = refused_since or time.monotonic()
            print(f"bitroute: reading the publishes failed (for "
                  f"{time.monotonic() - refused_since:.0f}s): {refused}; retrying in "
                  f"{ACCESS_RETRY_S:g}s", file=sys.stderr, flush=True)
            if stop_requested.wait(ACCESS_RETRY_S):
                router.stop()
                print("bitroute: stopped", file=info, flush=True)
                return 0
            query = router.start()


def _await_realtime(router: Router, stop_requested: threading.Event) -> int | None:
    """Realtime mode's :func:`_await_query`: the router starts a failed query again itself
    (:mod:`streaming.realtime.supervisor`: Kafka refusing access included, its line naming
    the grant), so this waits for a stop request, or for the end that is no failure (the
    Spark JVM gone, a query stopped from outside): status 1 with its line."""
    realtime = router.realtime
    if realtime is None:
        raise RuntimeError("the router runs no realtime query: start() it in realtime mode")
    while not stop_requested.is_set():
        ended = realtime.ended(1.0)
        if ended is not None and not stop_requested.is_set():
            router.stop()
            print(f"bitroute: error: {ended}", file=sys.stderr)
            return 1
    return None


def _kafka_refusal(config: Config) -> str | None:
    """Why Kafka refuses the router (its credentials, the publishes topic not even to be
    described, the cluster unreachable: one line, :func:`streaming.kafka.clients.failure`),
    or None. One metadata request of the publishes topic, by a consumer (whose request
    never creates the topic); a missing topic is the router's to create."""
    settings, topic = config.kafka.client_settings, config.kafka.publishes_topic
    try:
        with clients.edge(settings, "Describe", "topic", topic):
            consumer = clients.consumer(settings, "bitroute-run-probe")
            try:
                found = consumer.topics(KAFKA_TIMEOUT_S, topic).topics.get(topic)
            finally:
                consumer.close()
            if found is not None and found.error is not None:
                refused = clients.access_failure(settings, found.error, "Describe", "topic", topic)
                if refused is not None:
                    return str(refused)
    except (KafkaAccessError, ClientError) as exc:
        return str(exc)
    return None


def _jvm_pid(router: Router) -> int:
    jvm = router.spark.sparkContext._jvm
    if jvm is None:
        raise RuntimeError("the router's Spark session has no JVM")
    return int(jvm.java.lang.ProcessHandle.current().pid())


def _failure_line(router: Router, failure: BaseException) -> str:
    """What failed, on which input if known, and what to do: one line."""
    last = router.reports[-1] if router.reports else None
    after = f"after batch {last.batch_id}" if last is not None else "before its first batch"
    return (f"{one_line(failure)} ({after}; the checkpoint in "
            f"{router.layout.query} is intact: fix the cause and start the router again, "
            "the unfinished batch is re-run)")


def _mode_line(config: Config) -> str:
    streaming = config.streaming
    if streaming.mode == MODE_REALTIME:
        return (f"mode realtime: Spark's Real-Time Mode, a long task per publishes partition, "
                f"checkpointed every {streaming.realtime_checkpoint_interval}; the audit follows "
                "each checkpoint (docs/running.md, \"Choosing a mode\")")
    return f"mode microbatch: a batch every {streaming.trigger_interval} at most"


def _announce(router: Router, metrics: RouterMetrics | None, info: TextIO) -> None:
    config = router.config
    kafka = config.kafka
    subscriptions = router.subscriptions
    if subscriptions is None:
        raise RuntimeError("the router is not open: announced after start()")
    lines = [
        f"reading publishes from {kafka.publishes_topic} and subscriptions from "
        f"{kafka.subscriptions_topic} at {kafka.bootstrap}"
        + ("" if kafka.client_settings.protocol == "PLAINTEXT"
           else f" ({kafka.client_settings.describe()})"),
        f"writing deliveries to {kafka.layout.describe()}, rejected to {kafka.rejected_topic}",
        f"audit tables in {config.delta.warehouse}, checkpoints in {config.streaming.checkpoint_dir}",
        _mode_line(config),
    ]
    if metrics is not None:
        lines.append(f"metrics at {metrics.server.url}")
    lines.append(f"snapshot v{subscriptions.version} with {len(subscriptions)} subscriptions; "
                 "Ctrl-C stops after the current batch")
    for line in lines:
        print(f"bitroute: {line}", file=info, flush=True)

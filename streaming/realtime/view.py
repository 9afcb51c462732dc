"""The routing view: the applied subscriptions, handed from the driver to the
executors' matchers in realtime mode.

In micro-batch mode each batch pins a snapshot version and broadcasts it. A
realtime task never ends, so the driver publishes the subscription state as it
changes instead, to ``kafka.routing_view_topic`` (compacted, one partition,
written only here), and every executor JVM follows it
(``realtime/src/main/java/io/bitroute/realtime/RoutingView.java``):

- key ``sub:<subscription id>``: the applied subscription, JSON
  ``{"id", "exchange", "subscriber", "filter", "headers": {"match", "criteria"} | null}``;
  a tombstone (null value) removes it;
- key ``mark``: JSON ``{"version", "changelog": {"<partition>": next offset},
  "default_exchange", "exchanges": [{"name", "dialect", "share_prefix", "alternate"}],
  "retained_refused"}``, written
  after the ``sub:`` records of each applied step. Every changelog record below
  ``changelog[p]`` is applied (or was rejected) in the state the mark closes.

Happens-before: an executor routes a publish only once its view's mark covers
the changelog's end offsets as read after the publish was written
(``RoutingView.lease``), so a subscription Kafka acknowledged before a
publish is applied to it, exactly as in micro-batch mode. The driver's part is
to publish each catch-up promptly: :class:`ViewFollower` catches the changelog up
every :data:`FOLLOW_INTERVAL_S`.

The compiler validates every change before it reaches the view (a rejected
change only advances the mark), so the executors never meet a bad subscription.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from compiler import Dialect, Snapshot
from compiler.grammar import grammar_for
from schemas.records import CHANGE_REMOVE, CHANGE_UPSERT
from streaming.config import Config
from streaming.kafka import clients as kafka
from streaming.kafka.errors import KAFKA_TIMEOUT_S
from streaming.realtime.errors import ViewError
from streaming.retry import Backoff
from streaming.router.subscriptions.changelog import Change
from streaming.worker import Worker

_log = logging.getLogger(__name__)

SUB_PREFIX = "sub:"
MARK_KEY = b"mark"
FOLLOW_INTERVAL_S = 0.1
"""The longest the driver goes without a changelog catch-up in realtime mode; a change
wakes it at once (:class:`ChangelogWatch`)."""
VIEW_BACKOFF = Backoff(base_s=FOLLOW_INTERVAL_S, cap_s=2.0)
"""The view thread's delays after a failed step: short (a publish waits for a view that
covers the changelog's end), reported as every worker's failures are (every 30 s)."""


def subscription_record(sub_id: str, exchange: str, subscriber: str, filter_: str,
                        header_match: str | None,
                        header_criteria: Mapping[str, str | None] | None,
                        no_local: bool | None = None) -> bytes:
    """The view value of one applied subscription (``no_local`` only when true: the routing
    table's MQTT No Local, kernel/core/src/route.rs)."""
    headers = None if header_match is None else {"match": header_match,
                                                 "criteria": dict(header_criteria or {})}
    value: dict[str, object] = {"id": sub_id, "exchange": exchange, "subscriber": subscriber,
                                "filter": filter_, "headers": headers}
    if no_local:
        value["no_local"] = True
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def exchanges_of(config: Config) -> list[dict[str, object]]:
    """The configured exchanges as the view's mark lists them (``alternate``: the
    exchange's alternate exchange, None when it names none)."""
    return [{"name": name, "dialect": dialect,
             "share_prefix": grammar_for(Dialect(dialect)).SHARE_PREFIX,
             "alternate": config.exchanges.alternate(name)}
            for name, dialect in sorted(config.exchanges.dialects.items())]


RETAINED_REFUSED = ('a retained publish (retain: true) is served by streaming.mode = '
                    '"microbatch", not by the realtime mode this router runs')
"""Why realtime mode rejects a retained publish to an MQTT exchange (it keeps no retained
state: delivering it without retaining it would drop the retain silently)."""


def mark_record(config: Config, version: int, offsets: Mapping[int, int]) -> bytes:
    """The view value closing an applied step: ``version`` covers ``offsets``."""
    return json.dumps({"version": version,
                       "changelog": {str(p): o for p, o in sorted(offsets.items())},
                       "default_exchange": config.exchanges.default,
                       "exchanges": exchanges_of(config),
                       "retained_refused": RETAINED_REFUSED},
                      separators=(",", ":")).encode("utf-8")


class RoutingViewPublisher:
    """Writes the subscription state to the routing view (module docstring).

    :meth:`note` is a :class:`~streaming.router.subscriptions.snapshots.BatchSnapshots` commit
    listener: it keeps each committed version's changes until :meth:`publish`
    writes them and the mark. :meth:`reset` writes the whole state (at open: the
    view may hold another run's state). Not thread-safe: one caller at a time.
    """

    def __init__(self, config: Config, on_error: Callable | None = None) -> None:
        self._config = config
        self._topic = config.kafka.routing_view_topic
        self._producer = kafka.producer(config.kafka.client_settings,
                                        {"linger.ms": 0, "enable.idempotence": True}, on_error)
        self._pending: list[tuple[bytes, bytes | None]] = []
        self._marked: tuple[int, dict[int, int]] | None = None
        self.published_version: int | None = None
        """The version of the latest mark Kafka acknowledged."""

    def note(self, changes: Iterable[Sequence]) -> None:
        """Keep the view records of a committed version's changes (a commit listener)."""
        fields = Change._fields
        for change in changes:
            # Not strict: changes persisted before a field existed are shorter (no_local).
            row = dict(zip(fields, change, strict=False))
            key = (SUB_PREFIX + row["subscription_id"]).encode("utf-8")
            if row["change"] == CHANGE_UPSERT:
                self._pending.append((key, subscription_record(
                    row["subscription_id"], row["exchange"], row["subscriber"], row["filter"],
                    row["header_match"], row["header_criteria"], row.get("no_local"))))
            elif row["change"] == CHANGE_REMOVE:
                self._pending.append((key, None))

    def reset(self, snapshot: Snapshot, offsets: Mapping[int, int]) -> None:
        """Make the view hold exactly ``snapshot``'s subscriptions, marked with its version
        and ``offsets``: the keys the view holds and the snapshot lacks get tombstones."""
        from streaming.ops.inspect import RoutingState, subscriptions

        live = {row["subscription_id"]: row for row in
                subscriptions(RoutingState(snapshot, snapshot.version, 0, None))}
        stale = self._keys() - {(SUB_PREFIX + sub_id).encode("utf-8") for sub_id in live}
        tombstones: list[tuple[bytes, bytes | None]] = [(key, None) for key in sorted(stale)]
        self._pending = tombstones + [
            ((SUB_PREFIX + sub_id).encode("utf-8"), subscription_record(
                sub_id, row["exchange"], row["subscriber"], row["filter"], row["header_match"],
                row["header_criteria"], row["no_local"])) for sub_id, row in live.items()]
        self._marked = None
        self.publish(snapshot.version, offsets)

    def publish(self, version: int, offsets: Mapping[int, int]) -> bool:
        """Write the kept records and a mark of ``version`` covering ``offsets``, and wait
        for Kafka's acks; nothing when neither changed since the last mark. True when a
        mark was written. Raises :class:`ViewError` when Kafka did not take them all."""
        offsets = dict(offsets)
        if not self._pending and self._marked == (version, offsets):
            return False
        failures: list[str] = []

        def acked(error, _message) -> None:
            if error is not None:
                failures.append(str(error))

        for key, value in [*self._pending, (MARK_KEY, mark_record(self._config, version, offsets))]:
            kafka.produce_when_room(self._producer, self._topic, value, key, on_delivery=acked)
        left = self._producer.flush(KAFKA_TIMEOUT_S)
        if left or failures:
            raise ViewError(f"the routing view {self._topic!r} did not take "
                            f"{left + len(failures)} records"
                            + (f": {failures[0]}" if failures else " in time"))
        self._pending = []
        self._marked = (version, offsets)
        self.published_version = version
        return True

    def _keys(self) -> set[bytes]:
        """The ``sub:`` keys whose latest record in the view is not a tombstone."""
        settings = self._config.kafka.client_settings
        reader = kafka.consumer(settings, "bitroute-routing-view", {"enable.partition.eof": True})
        try:
            from confluent_kafka import TopicPartition

            low, high = reader.get_watermark_offsets(TopicPartition(self._topic, 0),
                                                     timeout=KAFKA_TIMEOUT_S)
            keys: set[bytes] = set()
            if high <= low:
                return keys
            reader.assign([TopicPartition(self._topic, 0, low)])
            position = low
            while position < high:
                message = reader.poll(KAFKA_TIMEOUT_S)
                if message is None:
                    raise ViewError(f"the routing view {self._topic!r} could not be read to "
                                    f"its end ({position} of {high})")
                if message.error():
                    continue  # end of partition events
                position = message.offset() + 1
                key = message.key()
                if key is None or not key.startswith(SUB_PREFIX.encode()):
                    continue
                if message.value() is None:
                    keys.discard(key)
                else:
                    keys.add(key)
            return keys
        finally:
            reader.close()

    def close(self) -> None:
        self._producer.flush(KAFKA_TIMEOUT_S)



class ChangelogWatch:
    """Waits for the changelog to change: a consumer at the changelog's end whose fetch
    the broker answers as soon as a record arrives, so that a subscription change wakes
    the view thread within a round trip instead of at its next round. It only wakes: the
    catch-up (:class:`~streaming.router.subscriptions.changelog.ChangelogReader`) reads the records."""

    def __init__(self, config: Config) -> None:
        from confluent_kafka import OFFSET_END, TopicPartition

        topic = config.kafka.subscriptions_topic
        self._consumer = kafka.consumer(config.kafka.client_settings, "bitroute-changelog-watch",
                                        {"fetch.wait.max.ms": int(FOLLOW_INTERVAL_S * 1000)})
        metadata = self._consumer.list_topics(topic, timeout=KAFKA_TIMEOUT_S).topics[topic]
        self._consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in metadata.partitions])

    def wait(self, timeout: float) -> None:
        """Return once a changelog record arrived, or after ``timeout`` seconds."""
        self._consumer.consume(1, timeout)

    def close(self) -> None:
        self._consumer.close()


class ViewFollower:
    """The driver's thread that keeps the routing view current in realtime mode, a
    :class:`~streaming.worker.Worker`: it calls ``step`` (a changelog catch-up that publishes
    what it applied) as soon as ``watch`` sees a change, and at least every
    :data:`FOLLOW_INTERVAL_S`. A failure is retried after :data:`VIEW_BACKOFF`'s delay,
    with the worker policy's lines (``updating the routing view failed ...; retrying``, then
    ``... succeeded at attempt n``). It ends once ``stopping`` (the router's) is set, or
    at :meth:`stop`."""

    def __init__(self, step: Callable[[], None], stopping: threading.Event,
                 watch: Callable[[float], None] | None = None) -> None:
        self._step = step
        self._stopping = stopping
        self._watch = watch
        self._worker = Worker("routing-view", self._turn, what="updating the routing view",
                              log=_log, backoff=VIEW_BACKOFF)

    @property
    def failure(self) -> str | None:
        """The latest step's failure, as one line, while the steps fail (else None)."""
        return self._worker.failure

    def start(self) -> None:
        self._worker.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._worker.stop(timeout)

    def _turn(self) -> float | None:
        if self._stopping.is_set():
            return None
        if self._watch is not None:
            self._watch(FOLLOW_INTERVAL_S)
        if self._stopping.is_set():
            return None
        self._step()
        return 0.0 if self._watch is not None else FOLLOW_INTERVAL_S

"""Whether a router runs on a configuration and what it last did (``bitroute status``).

Read only, from what the router leaves on disk (the paths of
:mod:`streaming.state.checkpoint`) and from Kafka's offsets; it never talks to
the router itself, so it answers the same whether the router is up, stuck or
gone:

- ``<streaming.checkpoint_dir>/router.lock``: held by the running router for
  its lifetime (:mod:`streaming.state.lock`), then by its watchdog until its JVM is
  gone; running = the lock is held and its driver process lives (on another
  host that cannot be checked: held = running); stopping = held, driver exited.
- ``<checkpoint_dir>/router/status.json``: the router's last batch, replaced
  atomically after each one (``query_id``, ``run_id``, ``batch_id``,
  ``publishes``, ``deliveries``, ``rejected``, ``lost``, ``expired``, ``snapshot_version``,
  ``seconds``, ``stages``, ``routed_in``, ``finished_at``, ``subscriptions``,
  ``audit_pending_batches``, ``audit_lag_seconds``, ``lost_total``, ``expired_total``, ``mode``,
  ``latency_ms``, and ``realtime`` in realtime mode: :mod:`streaming.router.batch.report`).
- the audit tables (:func:`streaming.audit.table_stats.table_stats`): each
  one's live data files, bytes, ``_delta_log`` entries and Delta version, read
  from its newest checkpoint and the commits after it (milliseconds on a
  maintained table); and ``<checkpoint_dir>/router/maintenance.json``, the
  last maintenance pass (when, what it did per table, or its error).
- ``<checkpoint_dir>/publishes/{offsets,commits}/<batch>``: Spark's
  checkpoint, read by :mod:`streaming.state.offsets_log`. The offsets of the
  last committed batch are where routing stands: input lag = the publishes topic's end offsets minus those (a
  partition the checkpoint does not name yet counts from its earliest offset,
  as the router's ``startingOffsets=earliest`` reads it).
- the latest persisted snapshot (:func:`streaming.ops.inspect.latest_snapshot`,
  through the store's read-only view):
  subscription and subscriber counts, and changelog lag = the changelog's end
  offsets minus the snapshot's offsets.

Kafka is asked with a deadline of :data:`KAFKA_BUDGET_S` in all; a broker that
does not answer in time makes the lags unknown (``None``) and
``kafka_error`` says why, the rest is still reported.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from confluent_kafka import KafkaException, TopicPartition

from streaming.config import MODE_REALTIME, Config
from streaming.errors import BitrouteError
from streaming.kafka.clients import access_failure, consumer as kafka_consumer, failure
from streaming.kafka.errors import STATUS_BUDGET_S, KafkaAccessError
from streaming.ops.errors import KafkaUnavailable
from streaming.router.subscriptions.limits import usage as limits_usage
from streaming.state import lock
from streaming.state.checkpoint import CheckpointLayout
from streaming.state.offsets_log import OffsetLogError, last_committed_batch, read_offsets

if TYPE_CHECKING:
    from compiler import Snapshot

KAFKA_BUDGET_S = STATUS_BUDGET_S
"""All of status's Kafka requests together get this long (the verb answers in under 2 s)."""


def router_status(config: Config) -> dict[str, Any]:
    """The status as one JSON-ready dict (see the module docstring; ``None`` = unknown).

    Keys: ``mode`` (``streaming.mode``), ``running``, ``stopping`` (the lock is held but its driver exited: the
    JVM is ending), ``router`` (the lock holder ``{pid, host, started_at, jvm_pid}``
    or None), ``last_batch`` (status.json as the router wrote it, or None),
    ``input_lag`` and ``changelog_lag`` (``{topic, records, partitions}``,
    ``records`` None when Kafka did not answer), ``retention_gap`` (the same
    shape: publishes after the committed batch that Kafka deleted unread), ``committed_batch``,
    ``snapshot_version``, ``subscriptions``, ``subscribers``, ``unfed_delivery_topics``
    (the topics under the deliveries prefix that no live subscription feeds, sorted: a
    retired subscriber's kept topic; None when unknown or in the shared layout),
    ``kafka_error``, ``audit_tables`` (per table ``{files, bytes, log_entries,
    version}`` or ``{error}``), ``maintenance`` (the last pass's report as
    recorded, or None), ``lease`` (the router lease of the publishes topic and
    warehouse: :mod:`streaming.state.lease`'s record plus ``age_seconds``, or
    ``{error}``, or None), ``replays`` (the replays of ``subscribe --since`` in progress:
    :func:`_replays`), ``limits`` (per exchange, per limit of ``[limits]``: ``{limit, used}``,
    the largest use in the snapshot: :func:`streaming.router.subscriptions.limits.usage`; None without a
    snapshot), ``alternate_exchanges`` (exchange -> its alternate exchange, as configured:
    ``[exchanges.alternates]``), ``notes`` (why something is missing).
    """
    kafka = config.kafka
    # Kafka's round trips and the Delta log reads overlap the local reads (librdkafka
    # and delta-rs wait without the GIL).
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="bitroute-status") as pool:
        asked = pool.submit(_watermarks, config, [kafka.publishes_topic, kafka.subscriptions_topic])
        delivery_topics = pool.submit(_delivery_topics, config)
        tables = pool.submit(_audit_tables, config)
        local = _local_state(config)
        audit_tables, maintenance, lease = tables.result()
        kafka_error = None
        try:
            ends = asked.result()
        except KafkaUnavailable as exc:
            kafka_error, ends = str(exc), {}
        try:
            topics = delivery_topics.result()
        except KafkaUnavailable:
            topics = None
    holder, last, committed_batch, committed, snapshot, notes = local
    publishes_at = committed.get(kafka.publishes_topic, {}) if committed is not None else {}
    if config.streaming.mode == MODE_REALTIME:
        from streaming.realtime.audit import committed_offsets

        publishes_at = committed_offsets(CheckpointLayout.of(
            config.streaming.checkpoint_dir).realtime_routing, kafka.publishes_topic) or {}
    changelog_at = dict(snapshot.offsets) if snapshot is not None else {}
    subscribers = unfed = None
    if snapshot is not None:
        names = snapshot.tables.subscriber_names
        subscribers = len(names) - names.null_count
        if topics is not None and not kafka.layout.shared:
            fed = {kafka.layout.topic(n) for n in names.drop_null().to_pylist()}
            unfed = sorted(topics - fed)
    stopping = holder is not None and lock.driver_alive(holder) is False
    return {
        "mode": config.streaming.mode,
        "running": holder is not None and not stopping,
        "stopping": stopping,
        "router": holder,
        "last_batch": last,
        "committed_batch": committed_batch,
        "input_lag": _lag(kafka.publishes_topic, ends, publishes_at, kafka_error),
        "changelog_lag": _lag(kafka.subscriptions_topic, ends, changelog_at, kafka_error),
        "retention_gap": _retention_gap(kafka.publishes_topic, ends, publishes_at, kafka_error),
        "snapshot_version": None if snapshot is None else snapshot.version,
        "subscriptions": None if snapshot is None else len(snapshot),
        "subscribers": subscribers,
        "limits": None if snapshot is None else limits_usage(snapshot, config.limits),
        "alternate_exchanges": dict(sorted(config.exchanges.alternates.items())),
        "unfed_delivery_topics": unfed,
        "kafka_error": kafka_error,
        "audit_tables": audit_tables,
        "maintenance": maintenance,
        "lease": lease,
        "replays": _replays(CheckpointLayout.of(config.streaming.checkpoint_dir)),
        "notes": notes,
    }


def _replays(layout: CheckpointLayout) -> list[dict]:
    """The replays in progress (``subscribe --since``) as ``router/replays.json`` records
    them (:mod:`streaming.router.replay.replay`): ``subscription``, ``subscriber``, ``from``,
    ``to_batch`` (None: not applied yet), ``publishes``, ``done``, ``delivered``, ``rate``
    (deliveries/s of the last chunk), ``note``."""
    try:
        recorded = json.loads(layout.replays_file.read_bytes()).get("replays", [])
    except (OSError, ValueError):
        return []
    rows = []
    for replay in recorded:
        request, start = replay["request"], replay.get("start") or {}
        end, position = replay.get("end") or {}, replay.get("position") or {}
        rows.append({
            "subscription": request["subscription_id"], "subscriber": request["subscriber"],
            "from": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(request["since_ms"] / 1000)),
            "to_batch": replay.get("boundary"),
            "publishes": sum(max(0, end.get(p, 0) - s) for p, s in start.items()),
            "done": sum(max(0, min(position.get(p, s), end.get(p, 0)) - s)
                        for p, s in start.items()),
            "delivered": replay.get("delivered", 0), "rate": replay.get("rate"),
            "note": replay.get("note")})
    return rows


def _audit_tables(config: Config) -> tuple[dict[str, dict], dict | None, dict | None]:
    from deltalake.exceptions import TableNotFoundError

    from schemas.records import AUDIT_TABLE_NAMES
    from streaming.audit.maintenance import read_report
    from streaming.audit.storage import StorageError, storage_options
    from streaming.audit.table_stats import table_stats

    tables: dict[str, dict] = {}
    try:
        storage = storage_options(config.delta)
    except StorageError as exc:
        return ({name: {"error": str(exc)} for name in AUDIT_TABLE_NAMES}, read_report(config),
                {"error": str(exc)})
    for name in AUDIT_TABLE_NAMES:
        try:
            stats = table_stats(config.delta.table_path(name), storage=storage)
            tables[name] = {"files": stats.files, "bytes": stats.bytes,
                            "log_entries": stats.log_entries, "version": stats.version}
        except TableNotFoundError:
            tables[name] = {"error": "no table yet"}
        except Exception as exc:  # noqa: BLE001 (status reports what it can)
            tables[name] = {"error": f"{type(exc).__name__}: {str(exc).strip()[:200]}"}
    return tables, read_report(config), _lease(config)


def _lease(config: Config) -> dict | None:
    """The router lease of this publishes topic and warehouse as recorded, with its age
    (:mod:`streaming.state.lease`), ``{error}`` when unreadable, None when there is none."""
    from streaming.state import lease

    try:
        record = lease.read(config)
    except BitrouteError as exc:
        return {"error": str(exc)}
    if record is not None:
        record["age_seconds"] = lease.age_seconds(record)
    return record


class _Local(NamedTuple):
    """What status reads from the checkpoint folder."""

    holder: dict | None
    last: dict | None
    committed_batch: int | None
    committed: dict[str, dict[int, int]] | None
    snapshot: Snapshot | None  # compiler is imported late (it is slow): a name for mypy only
    notes: list[str]


def _local_state(config: Config) -> _Local:
    from streaming.ops.inspect import InspectError, latest_snapshot

    layout = CheckpointLayout.of(config.streaming.checkpoint_dir)
    notes: list[str] = []
    holder = lock.holder(layout.root)
    last = _read_json(layout.status_file, notes)
    committed_batch, committed = _committed_offsets(layout, notes)
    try:
        snapshot = latest_snapshot(config)
    except InspectError as exc:
        notes.append(str(exc))
        snapshot = None
    if snapshot is None:
        notes.append(f"no persisted snapshot in {layout.state}: the router has not run "
                     "on this checkpoint folder")
    return _Local(holder, last, committed_batch, committed, snapshot, notes)


# --- the pieces ----------------------------------------------------------------------

def _read_json(path: Path, notes: list[str]) -> dict | None:
    try:
        value = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        notes.append(f"{path} is unreadable: {exc}")
        return None
    if not isinstance(value, dict):
        notes.append(f"{path} is not a JSON object")
        return None
    return value


def _committed_offsets(layout: CheckpointLayout, notes: list[str]
                       ) -> tuple[int | None, dict[str, dict[int, int]] | None]:
    """The last committed batch id and its end offsets per topic and partition."""
    batch = last_committed_batch(layout)
    if batch is None:
        return None, None
    path = layout.offsets_file(batch)
    try:
        return batch, read_offsets(path)
    except OffsetLogError as exc:
        notes.append(str(exc))
    except OSError as exc:
        notes.append(f"{path}: not a Spark offset log of the Kafka source ({exc})")
    return batch, None


def _watermarks(config: Config, topics: list[str]) -> dict[str, dict[int, tuple[int, int]]]:
    """Per topic that exists, per partition, its (earliest, end) offsets, within the budget."""
    deadline = time.monotonic() + KAFKA_BUDGET_S
    consumer = kafka_consumer(config.kafka.client_settings, "bitroute-status", {
        "socket.connection.setup.timeout.ms": int(KAFKA_BUDGET_S * 1000),
    })
    try:
        out: dict[str, dict[int, tuple[int, int]]] = {}
        for topic in topics:
            metadata = consumer.topics(_left(deadline), topic)
            found = metadata.topics.get(topic)
            if found is not None and found.error is not None:
                denied = access_failure(consumer.errors.settings, found.error, "Describe",
                                        "topic", topic)
                if denied is not None:
                    raise KafkaUnavailable(str(denied))
            if found is None or found.error is not None:
                continue
            out[topic] = {}
            for partition in sorted(found.partitions):
                out[topic][partition] = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=_left(deadline), cached=False)
        return out
    except KafkaAccessError as exc:
        raise KafkaUnavailable(str(exc)) from None
    except KafkaException as exc:
        raise KafkaUnavailable(str(failure(config.kafka.client_settings, exc,
                                           waited_s=KAFKA_BUDGET_S))) from None
    finally:
        consumer.close()


def _delivery_topics(config: Config) -> set[str]:
    """The names of the topics under ``kafka.deliveries_topic_prefix``, within the budget."""
    consumer = kafka_consumer(config.kafka.client_settings, "bitroute-status", {
        "socket.connection.setup.timeout.ms": int(KAFKA_BUDGET_S * 1000),
    })
    try:
        topics = consumer.topics(KAFKA_BUDGET_S).topics
    except (KafkaException, KafkaAccessError) as exc:
        raise KafkaUnavailable(str(failure(config.kafka.client_settings, exc,
                                           waited_s=KAFKA_BUDGET_S))) from None
    finally:
        consumer.close()
    prefix = config.kafka.deliveries_topic_prefix
    return {name for name in topics if name.startswith(prefix)}


def _left(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.001)


def _retention_gap(topic: str, ends: Mapping[str, Mapping[int, tuple[int, int]]],
                   position: Mapping[int, int], kafka_error: str | None) -> dict[str, object]:
    """Records of ``topic`` after ``position`` that Kafka deleted before the router read them
    (its earliest offset is past the position: :mod:`streaming.router.topics.retention`)."""
    if kafka_error is not None:
        return {"topic": topic, "records": None, "partitions": None}
    partitions = {p: max(low - position[p], 0)
                  for p, (low, _) in ends.get(topic, {}).items() if p in position}
    return {"topic": topic, "records": sum(partitions.values()),
            "partitions": {str(p): n for p, n in partitions.items()}}


def _lag(topic: str, ends: Mapping[str, Mapping[int, tuple[int, int]]],
         position: Mapping[int, int], kafka_error: str | None) -> dict[str, object]:
    """Records of ``topic`` after ``position`` (partition -> next offset read) per partition."""
    if kafka_error is not None:
        return {"topic": topic, "records": None, "partitions": None}
    partitions = {p: max(end - max(position.get(p, low), low), 0)
                  for p, (low, end) in ends.get(topic, {}).items()}
    return {"topic": topic, "records": sum(partitions.values()),
            "partitions": {str(p): n for p, n in partitions.items()}}

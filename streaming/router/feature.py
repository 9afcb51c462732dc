"""The router's features as its batch loop sees them: one small interface.

:class:`~streaming.router.service.Router` is the loop (open, then per batch: pin,
route, audit, report; then close). Everything else that acts at those points
(the publishes topic's check, retention gaps, MQTT retained messages, replays)
is a :class:`BatchFeature`, and the router names none of them: it runs the
features :mod:`streaming.router.features` lists, in that order, through these
hooks (each does nothing by default):

- :meth:`BatchFeature.open`, at each open of the router's state, given a
  :class:`RouterContext` (what the router has opened: config, Spark, state folder,
  snapshots, subscription state, audit, router id...), before the changelog's
  first catch-up: a feature makes its per-open objects here and registers its
  listeners (a version's changes, :attr:`BatchSnapshots.commit_listeners
  <streaming.router.subscriptions.snapshots.BatchSnapshots.commit_listeners>`; a
  pending version, :attr:`SubscriptionSync.on_version
  <streaming.router.subscriptions.subscription_sync.SubscriptionSync.on_version>`);
- :meth:`BatchFeature.start`, once the open caught the changelog up: its threads;
- :meth:`BatchFeature.prepare`, for a batch seen for the first time, after its
  changelog catch-up and before its pin is written, under the pin lock, inside
  the catch-up's retry (a raise retries the catch-up): what must be durable
  before the batch's version is (a re-run batch id skips it);
- :meth:`BatchFeature.pinned`, every run of a batch, right after its pin, still
  under the pin lock, given its :class:`BatchPin` (the pinned version);
- :meth:`BatchFeature.step`, each batch, after its pin and before its routing,
  given the batch's :class:`BatchStep`: its id and offset range, the batch's retry
  (a failure not about a record is retried with backoff, counted in the batch's
  attempts), and what the feature leaves for the routing (the publishes topic
  missing, the retention gaps to record as ``lost`` rows);
- :meth:`BatchFeature.idle`, while no batch runs: the router applied the changelog
  itself (holding the pin lock, :class:`IdleCatchUp`: the version and the next batch
  it bounds), so that what a new subscription asks for starts without a publish. It
  runs in the thread of the feature that asks for it
  (:attr:`RouterContext.idle_catch_up`: the replays' thread), never during a batch;
- :attr:`BatchFeature.stop_reason`: a feature that stops the query raises from
  its step after setting it, a :class:`StopReason` whose kind says what the
  caller does (``bitroute run``: follow a recreated publishes topic, or exit with
  the reason's line);
- :meth:`BatchFeature.close`, at the router's stop (and before it follows a new
  incarnation of the publishes topic, which opens it again): its threads stopped,
  its clients closed. Features close in the reverse order.

A feature object lives as long as its router: made once, at the first open, by its
factory in :mod:`streaming.router.features` (which may leave it out: None), then
opened and closed with the router's state. Features run in the order listed there:
a step may read what an earlier one left in the :class:`BatchStep`.

Adding a feature: a class that overrides the hooks it needs, in the module of its
concept, and its factory (``Callable[[RouterContext], BatchFeature | None]``) added to
:data:`streaming.router.features.FEATURES` where its order says; the loop is not
edited. A test can run a router with other features
(:class:`~streaming.router.service.Router`'s ``features`` argument).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from streaming.router.subscriptions.snapshots import SnapshotFiles
from streaming.state.offsets_log import batch_end, batch_start

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from streaming.audit.writer import AuditTables
    from streaming.config import Config
    from streaming.kafka.clients import OnError
    from streaming.router.subscriptions.snapshots import BatchSnapshots, SnapshotStore
    from streaming.router.subscriptions.subscription_sync import SubscriptionSync
    from streaming.router.topics.incarnations import IncarnationWatch
    from streaming.router.topics.retention import RetentionGap
    from streaming.state.checkpoint import CheckpointLayout

STOP_RECREATED = "publishes_topic_recreated"
"""The publishes topic was deleted and created again: the router follows the new one."""
STOP_RETENTION_GAP = "retention_gap"
"""Publishes were lost to retention under ``streaming.on_retention_gap = "stop"``."""


@dataclass(frozen=True)
class StopReason:
    """Why a feature stopped the query: its ``kind`` (one of the ``STOP_`` names) and its
    one ``line``, as the router logs it and ``bitroute run`` prints it."""

    kind: str
    line: str


@dataclass(frozen=True)
class RouterContext:
    """What the router has opened, as its features see it (one per open of its state:
    following a recreated publishes topic opens a new router id, audit and snapshots)."""

    config: Config
    spark: SparkSession
    layout: CheckpointLayout
    """The state folder (:mod:`streaming.state.checkpoint`)."""
    store: SnapshotStore
    router_id: str
    snapshots: BatchSnapshots
    subscription_sync: SubscriptionSync
    audit: AuditTables
    """The audit tables under :attr:`router_id`."""
    incarnation: IncarnationWatch
    """The publishes topic's incarnation the router reads (its ``number`` is in message ids)."""
    accept_retention_gap: bool
    """``bitroute run --accept-retention-gap``: the first batch records and passes a gap."""
    stopping: threading.Event
    """Set once the router stops: a feature's waits end."""
    on_error: OnError
    """Kafka clients' error callback (the broker watch's outage lines)."""
    audit_committed: Callable[[int], bool]
    """``audit_committed(batch_id)``: whether every batch up to it with audit rows is in Delta."""
    idle_catch_up: Callable[[], None]
    """The router's idle catch-up (:meth:`BatchFeature.idle`), for the feature whose thread
    runs while no batch comes to call; it does nothing unless the router is idle."""


@dataclass(frozen=True)
class BatchPin:
    """A batch's pin as the features see it: at :meth:`BatchFeature.prepare`, the version
    its catch-up made current (about to be pinned); at :meth:`BatchFeature.pinned`, the
    version pinned."""

    batch_id: int
    version: int
    start: dict[int, int] | None
    """The batch's start offsets per partition (None when unknown: Spark's offset log)."""


@dataclass
class BatchStep:
    """One batch as the features' steps see it, and what they leave for its routing."""

    batch_id: int
    start: dict[int, int] | None
    """The batch's start offsets per partition (None when unknown: Spark's offset log)."""
    end: dict[int, int] | None
    retrying: Callable[[str, Callable[[], Any]], Any]
    """``retrying(stage, step)``: ``step()`` under the batch's retry policy, named
    ``batch <id>: <stage>`` in its failure lines."""
    topic_present: bool = True
    """False while the publishes topic is deleted and not created again."""
    gaps: list[RetentionGap] = field(default_factory=list)
    """Publishes lost to retention before this batch: recorded with its audit."""


@dataclass
class IdleCatchUp:
    """An idle catch-up as the features see it: no batch runs, the router holds the pin
    lock and made ``version`` current. The next batch to pin routes with it or a later
    version: what the features do now is bounded by it (read lazily from the state folder)."""

    version: int
    layout: CheckpointLayout
    topic: str
    """The publishes topic (its offsets in Spark's offset log)."""
    planned: int | None
    """The latest batch Spark planned (None: none yet)."""

    @cached_property
    def _planned_pinned(self) -> bool:
        return self.planned is not None and SnapshotFiles(self.layout).pinned(self.planned) is not None

    @cached_property
    def next_batch(self) -> int:
        """The id of the next batch to pin: the latest batch Spark planned if it is not
        pinned yet (it waits on the pin lock), else the one after it (0: none planned)."""
        if self.planned is None:
            return 0
        return self.planned + 1 if self._planned_pinned else self.planned

    @cached_property
    def next_start(self) -> dict[int, int] | None:
        """The next batch's start offsets: the planned batch's start, or the end of the
        pinned one; None when no batch is planned yet (its first one bounds what waits)
        or the offset log does not say."""
        if self.planned is None:
            return None
        if self._planned_pinned:
            return batch_end(self.layout, self.planned, self.topic)
        return batch_start(self.layout, self.planned, self.topic)


class BatchFeature:
    """A feature of the router's batch loop (module docstring); the defaults do nothing."""

    name = "feature"
    stop_reason: StopReason | None = None

    def open(self, router: RouterContext) -> None:
        """The router opened its state (its changelog not caught up yet)."""

    def start(self) -> None:
        """The router's open caught the changelog up: start what runs beside the batches."""

    def prepare(self, pin: BatchPin) -> None:
        """A batch seen for the first time caught the changelog up to ``pin.version``,
        about to be pinned to it; raise to retry the catch-up."""

    def pinned(self, pin: BatchPin) -> None:
        """The batch routes with ``pin.version`` (pinned now or by an earlier run)."""

    def step(self, batch: BatchStep) -> None:
        """Act on ``batch`` before its routing; raise (after setting :attr:`stop_reason`)
        to stop the query."""

    def idle(self, idle: IdleCatchUp) -> None:
        """No batch runs, and the router applied the changelog (``idle.version``)."""

    def close(self) -> None:
        """Release what the feature holds (the router stops, or reopens its state)."""

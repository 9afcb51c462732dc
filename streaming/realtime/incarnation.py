"""Realtime mode and a recreated publishes topic: refused in one line, at open and while running.

Micro-batch mode follows a publishes topic deleted and created again
(:mod:`streaming.router.topics.incarnations`: the old checkpoint moved aside, a new router id,
message ids ``<topic>~<n>/<partition>/<offset>``). Realtime mode does not, because its
audit cannot tell the incarnations apart: :mod:`streaming.realtime.audit` leaves a
routed record out as a repeat when its publishes partition and offset lie at or below
the highest audited, and the new topic's offsets start again at 0, so the new topic's
publishes would go unaudited; and the routed records the routing query wrote after its
last checkpoint of the deleted topic can neither be routed again nor committed. So:

- at open (:func:`refuse_recreated_topic`), a state folder whose publishes topic id is
  not the topic's now is refused with one line, before anything is moved or routed
  (what its realtime audit journal holds is committed first);
- while running (:class:`PublishesTopicWatch`, one DescribeTopics request a second: a
  batch's check in micro-batch mode, here on a clock), a new topic id stops the routing
  query at once (so that it routes nothing of the new topic under the old ids) and
  ends the router with the same line (``bitroute run`` exits 1 with it).

The line names the mode that follows the topic: micro-batch mode, on this state folder
if it was never routed in realtime mode, else on a new ``streaming.checkpoint_dir``.
A topic deleted and not yet created again is no end: the routing query has nothing to
read meanwhile. The routed records of the deleted topic after the routing query's last
checkpoint are never committed, so the audit batch holding them (and the publishes
audited with them) waits until the router stops: those publishes have no audit rows.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from streaming.config import Config
from streaming.errors import one_line
from streaming.kafka import clients
from streaming.kafka.clients import BitrouteAdmin
from streaming.kafka.settings import ClientSettings
from streaming.kafka.topics import topic_id
from streaming.realtime.restored import commit_journal, realtime_tables
from streaming.router.errors import RouterModeError
from streaming.router.subscriptions.snapshots import SnapshotStore
from streaming.state.checkpoint import CheckpointLayout

_log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 1.0
"""How often the driver asks Kafka for the publishes topic's id while realtime mode runs."""


def recreation_line(layout: CheckpointLayout, topic: str, old: str, new: str) -> str:
    """Why realtime mode does not go on with the publishes topic ``topic`` recreated, and
    what to run instead: one line."""
    folder = (" and a new streaming.checkpoint_dir (this one was routed in realtime mode)"
              if layout.realtime_routing.is_dir() else "")
    return (f"the publishes topic {topic} was deleted and created again (topic id {old} -> "
            f"{new}): realtime mode does not follow a recreated publishes topic (its audit "
            "tells a repeat by partition and offset, which start again at 0 on the new "
            "topic); micro-batch mode does: start the router with streaming.mode = "
            f"\"microbatch\"{folder} (docs/operations.md, \"A recreated publishes topic\")")


def refuse_recreated_topic(config: Config, layout: CheckpointLayout, store: SnapshotStore,
                           admin: BitrouteAdmin) -> None:
    """At open in realtime mode: raise :class:`RouterModeError` with
    :func:`recreation_line` when the state folder read another incarnation of the publishes
    topic than the one Kafka has now, after committing what the realtime audit journal
    holds (the folder is left for good). Changes nothing else."""
    try:
        seen = layout.publishes_topic_id_file.read_text().strip() or None
    except FileNotFoundError:
        return
    topic = config.kafka.publishes_topic
    current = topic_id(admin, topic)
    if seen is None or current is None or current == seen:
        return
    if layout.realtime.is_dir():
        tables = realtime_tables(config, store)
        try:
            commit_journal(config, layout, tables)
        finally:
            tables.close()
    raise RouterModeError(recreation_line(layout, topic, seen, current))


class PublishesTopicWatch:
    """The running realtime router's check that the publishes topic is the incarnation it
    opened (module docstring). ``on_recreated`` is called once, from the watch's thread,
    when it is not (it stops the routing query); :meth:`ended` then gives the line."""

    def __init__(self, settings: ClientSettings, topic: str, opened_topic_id: str | None,
                 layout: CheckpointLayout, stopping: threading.Event,
                 on_recreated: Callable[[], None]) -> None:
        self._settings = settings
        self._topic = topic
        self._opened = opened_topic_id
        self._layout = layout
        self._stopping = stopping
        self._on_recreated = on_recreated
        self._ended = threading.Event()
        self.end: str | None = None
        self._thread = threading.Thread(target=self._run, name="bitroute-publishes-topic-watch",
                                        daemon=True)

    def start(self) -> PublishesTopicWatch:
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def ended(self, timeout: float = 0.0) -> str | None:
        """Wait up to ``timeout`` for a recreation to be found; its line, else None."""
        return self.end if self._ended.wait(timeout) else None

    def _run(self) -> None:
        admin: BitrouteAdmin | None = None
        missing = False
        while not self._stopping.wait(WATCH_INTERVAL_S):
            try:
                admin = admin or clients.admin(self._settings)
                current = topic_id(admin, self._topic)
            except Exception as exc:  # noqa: BLE001 - Kafka away: asked again next round
                admin = None  # stale metadata after a broker restart: a new client
                _log.debug(f"could not describe the publishes topic: {one_line(exc)}")
                continue
            if current is None and not missing:
                _log.warning(f"the publishes topic {self._topic} does not exist (deleted?): "
                             "realtime mode routes nothing until it is back")
            missing = current is None
            if current is not None and self._opened is not None and current != self._opened:
                self._recreated(current)
                return

    def _recreated(self, current: str) -> None:
        self.end = recreation_line(self._layout, self._topic, self._opened or "?", current)
        _log.error(self.end)
        try:
            self._on_recreated()
        finally:
            self._ended.set()

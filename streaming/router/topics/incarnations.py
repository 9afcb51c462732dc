"""The publishes topic's incarnations: message ids stay unique when the topic is recreated.

A topic deleted and created again under the same name starts again at offset
0, so ``<topic>/<partition>/<offset>`` would name two different messages: a
consumer that drops repeats by message id would drop new ones, and the audit
would hold two messages under one id. Kafka gives every topic it creates a new
topic id; the router records, with the audit, the ids of the publishes topic it
has read, in order, and numbers them:

    <delta.warehouse>/_bitroute/topics/<kafka.publishes_topic>.json
    {"topic": ..., "incarnations": [{"topic_id": ..., "number": 0, "first_seen": ...}, ...]}

Incarnation 0 (the first the router saw) keeps ids ``<topic>/<p>/<o>``;
incarnation n >= 1 has ids ``<topic>~<n>/<p>/<o>``
(:func:`schemas.records.message_id`). The record lives in the warehouse, not
in a state folder, because the ids must stay unique for every router that
writes that audit (a new state folder included); it is replaced by
compare-and-swap (:mod:`streaming.audit.warehouse_objects`) and holds one entry
per recreation, so it stays small.

The state folder records which topic id Spark's checkpoint reads
(``router/publishes-topic-id``). A recreated topic is found:

- at open (:func:`follow_incarnation`): the topic's id is not the
  checkpoint's. The checkpoint's offsets are of a topic that is gone, so it
  is moved aside (``publishes.<old topic id>``, for the operator to delete),
  the router takes a new router id (its batch ids start again at 0), and the
  query reads the new incarnation from its earliest offset. One line says so.
- while running (:class:`IncarnationWatch`, one DescribeTopics request per
  batch, before the batch routes anything): the batch raises
  :class:`PublishesTopicRecreated`, the query stops, and the router closes its
  state, opens it again (the case above) and starts the query again
  (``bitroute run``: :meth:`streaming.router.service.Router.follow_recreated_topic`).

Publishes the old incarnation still held, unread, when it was deleted are gone
with it: Kafka no longer has them, nor their count.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime

from confluent_kafka import KafkaException

from schemas.records import message_id_topic
from streaming.atomic import write_atomically
from streaming.audit.warehouse_objects import Conflict, location, warehouse_object
from streaming.config import Config
from streaming.kafka import clients
from streaming.kafka.clients import BitrouteAdmin
from streaming.kafka.settings import ClientSettings
from streaming.kafka.topics import topic_id
from streaming.router.errors import PublishesTopicRecreated
from streaming.router.feature import (
    STOP_RECREATED,
    BatchFeature,
    BatchStep,
    RouterContext,
    StopReason,
)
from streaming.state.checkpoint import CheckpointLayout

_log = logging.getLogger(__name__)

INCARNATIONS_FOLDER = "topics"
"""The incarnation records' folder, under ``<delta.warehouse>/_bitroute``."""
CAS_ATTEMPTS = 5


class IncarnationRecord:
    """The incarnations of one publishes topic, as recorded with the audit (module docstring)."""

    def __init__(self, config: Config, topic: str | None = None) -> None:
        self.topic = topic or config.kafka.publishes_topic
        self._object = warehouse_object(config.delta, INCARNATIONS_FOLDER, f"{self.topic}.json")
        self.location = location(config.delta, INCARNATIONS_FOLDER, f"{self.topic}.json")

    def incarnations(self) -> list[dict]:
        """The recorded incarnations, oldest first (empty: none recorded)."""
        found = self._object.read()
        return _parse(found[0]) if found is not None else []

    def peek(self, kafka_topic_id: str) -> int:
        """The number of ``kafka_topic_id``'s incarnation, or the number it gets when the
        router first reads it; writes nothing (``bitroute publish``)."""
        return _number(self.incarnations(), kafka_topic_id)

    def number_of(self, kafka_topic_id: str) -> int:
        """The number of ``kafka_topic_id``'s incarnation, recorded first if it is new."""
        for _ in range(CAS_ATTEMPTS):
            found = self._object.read()
            known = _parse(found[0]) if found is not None else []
            number = _number(known, kafka_topic_id)
            if number < len(known) and known[number]["topic_id"] == kafka_topic_id:
                return number
            known.append({"topic_id": kafka_topic_id, "number": number,
                          "first_seen": datetime.now(UTC).isoformat(
                              timespec="milliseconds")})
            data = (json.dumps({"topic": self.topic, "incarnations": known}, indent=1)
                    + "\n").encode()
            try:
                if found is None:
                    self._object.create(data)
                else:
                    self._object.replace(data, found[1])
                return number
            except Conflict:
                continue  # another writer meanwhile: read again
        raise PublishesTopicRecreated(f"{self.location} kept changing while the router recorded "
                                      f"the incarnation {kafka_topic_id} of {self.topic}")


def _number(known: list[dict], kafka_topic_id: str) -> int:
    for entry in known:
        if entry.get("topic_id") == kafka_topic_id:
            return int(entry["number"])
    return max((int(e["number"]) for e in known), default=-1) + 1


def _parse(data: bytes) -> list[dict]:
    try:
        value = json.loads(data.decode("utf-8"))
        return [dict(e) for e in value["incarnations"]]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise PublishesTopicRecreated(f"the incarnation record is not bitroute's: {exc}") from None


def follow_incarnation(config: Config, layout: CheckpointLayout, admin: BitrouteAdmin) -> tuple[str, int]:
    """At open, the publishes topic existing: its topic id and incarnation number. When
    Spark's checkpoint in ``layout`` reads another incarnation, the checkpoint is moved
    aside (the caller then forgets the old batches) and one line says so."""
    topic = config.kafka.publishes_topic
    current = topic_id(admin, topic)
    if current is None:
        raise PublishesTopicRecreated(f"the publishes topic {topic} does not exist")
    number = IncarnationRecord(config).number_of(current)
    try:
        seen = layout.publishes_topic_id_file.read_text().strip() or None
    except FileNotFoundError:
        seen = None
    if seen is not None and seen != current:
        aside = layout.retired_query(seen)
        if layout.query.exists():
            os.replace(layout.query, aside)
        ids = message_id_topic(topic, number)
        _log.warning(
            f"the publishes topic {topic} was deleted and created again (topic id {seen} -> "
            f"{current}): the router reads the new topic from its earliest offset, its "
            f"messages have ids {ids}/<partition>/<offset>; Spark's checkpoint of the old "
            f"topic is kept in {aside} (delete it when no longer wanted); publishes the old "
            "topic held unread are gone with it")
    if seen != current:
        layout.state.mkdir(parents=True, exist_ok=True)
        write_atomically(layout.publishes_topic_id_file, f"{current}\n".encode())
    return current, number


class IncarnationWatch:
    """The check, before each batch routes, that the publishes topic is still the
    incarnation the router opened (one DescribeTopics request)."""

    def __init__(self, settings: ClientSettings, topic: str) -> None:
        self.topic = topic
        self.topic_id: str | None = None
        """The incarnation the router reads (set at open, :func:`follow_incarnation`)."""
        self.number = 0
        self._settings = settings
        self._admin: BitrouteAdmin | None = None

    def check(self, batch_id: int) -> bool:
        """True when the topic is the one opened; False when it is missing (deleted, not
        yet created again: the batch has nothing of it to read). Raises
        :class:`PublishesTopicRecreated` for another incarnation, and Kafka's errors
        (the caller's to retry)."""
        if self._admin is None:
            self._admin = clients.admin(self._settings)
        try:
            current = topic_id(self._admin, self.topic)
        except KafkaException:
            self._admin = None  # stale metadata after a broker restart: new client
            raise
        if current is None:
            return False
        if self.topic_id is not None and current != self.topic_id:
            raise PublishesTopicRecreated(
                f"batch {batch_id}: the publishes topic {self.topic} was deleted and created "
                f"again (topic id {self.topic_id} -> {current}): following the new topic")
        return True


def publishing_incarnation(config: Config) -> int:
    """The incarnation number the publishes topic's messages get now (``bitroute publish``
    names its message's id): 0 while no router recorded an incarnation; else the topic's
    recorded number, or the next one for a topic the router has not read yet."""
    record = IncarnationRecord(config)
    known = record.incarnations()
    if not known:
        return 0
    current = topic_id(clients.admin(config.kafka.client_settings), record.topic)
    return _number(known, current or "")


class IncarnationFeature(BatchFeature):
    """The publishes topic's incarnation as a feature of the batch loop
    (:mod:`streaming.router.feature`): before each batch routes, whether the topic is there
    (left in :attr:`BatchStep.topic_present <streaming.router.feature.BatchStep.topic_present>`);
    another incarnation stops the query with a
    :data:`~streaming.router.feature.STOP_RECREATED` reason, said in one warning."""

    name = "incarnation"

    def __init__(self, watch: IncarnationWatch) -> None:
        self.watch = watch

    @classmethod
    def of(cls, router: RouterContext) -> IncarnationFeature:
        """The feature of the incarnation the router reads (:mod:`streaming.router.features`)."""
        return cls(router.incarnation)

    def step(self, batch: BatchStep) -> None:
        try:
            batch.topic_present = batch.retrying("the publishes topic check",
                                                 lambda: self.watch.check(batch.batch_id))
        except PublishesTopicRecreated as exc:
            _log.warning(str(exc))
            self.stop_reason = StopReason(STOP_RECREATED, str(exc))
            raise

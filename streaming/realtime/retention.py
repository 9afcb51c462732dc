"""Realtime mode's routing query moved past publishes Kafka deleted before it read them.

Real-Time Mode's Kafka reader does not skip deleted offsets, ``failOnDataLoss =
false`` notwithstanding (Spark 4.2: ``KafkaDataConsumer``'s real-time iterator
rethrows ``OffsetOutOfRangeException``): a routing query whose checkpoint lies
below a partition's earliest offset (retention ran while the router was down or
behind, or an operator called DeleteRecords) would fail at every start, for ever.
So before the routing query starts (the first start and every restart), the
router compares the checkpoint's committed position with Kafka's earliest
offsets (:func:`skip_deleted`); when a partition lies below, the checkpoint
folder is moved aside and a new routing query starts from the committed
position, each partition raised to its earliest offset: what micro-batch mode's
Kafka source does by itself. The publishes skipped are recorded as ``lost`` rows
by the audit (:mod:`streaming.realtime.audit_batch`), which finds the jump in the
routed records' offsets.

Under ``streaming.on_retention_gap = "stop"`` the gap stops the router instead, as it
does a micro-batch router (:mod:`streaming.router.topics.retention`): the routing query
is not started, the checkpoint stays where it is, and :class:`RetentionGapError`'s one
line names the gap and the command that acknowledges it (``bitroute run
--accept-retention-gap``, whose first start of the routing query moves past the gap as
``"resume"`` does).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

from confluent_kafka import TopicPartition
from confluent_kafka.admin import OffsetSpec

from streaming.kafka import clients
from streaming.kafka.errors import KAFKA_TIMEOUT_S
from streaming.kafka.settings import ClientSettings
from streaming.router.errors import RetentionGapError
from streaming.router.topics.retention import ACKNOWLEDGE_COMMAND
from streaming.state.offsets_log import read_offsets

_log = logging.getLogger(__name__)

SET_ASIDE = ".before-gap-"
"""A checkpoint moved aside is renamed ``<checkpoint>.before-gap-<n>`` (kept for a look)."""


def committed_offsets(query_checkpoint: Path, topic: str) -> dict[int, int] | None:
    """The routing query's committed boundary: the end offsets of its latest committed
    epoch (Real-Time Mode writes an epoch's end offsets to the offset log when the epoch
    ends, after its tasks flushed their deliveries, then commits it), below which
    Kafka acknowledged every publish's deliveries; None before the first commit."""
    commits = query_checkpoint / "commits"
    if not commits.is_dir():
        return None
    ids = [int(name) for name in (p.name for p in commits.iterdir()) if name.isdigit()]
    if not ids:
        return None
    return read_offsets(query_checkpoint / "offsets" / str(max(ids))).get(topic)


def earliest_offsets(admin: clients.BitrouteAdmin, topic: str,
                     partitions: list[int]) -> dict[int, int]:
    """Kafka's earliest offsets of ``topic``'s ``partitions`` (one ListOffsets request)."""
    if not partitions:
        return {}
    futures = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.earliest()
                                  for p in partitions}, request_timeout=KAFKA_TIMEOUT_S)
    return {tp.partition: admin.result(future, KAFKA_TIMEOUT_S).offset
            for tp, future in futures.items()}


def skip_deleted(settings: ClientSettings, topic: str, checkpoint: Path,
                 stop: bool = False) -> str | None:
    """The starting offsets (Spark's JSON) of a new routing query past a retention gap,
    the old ``checkpoint`` moved aside; None when the checkpoint's committed position is
    within what Kafka holds (or there is none): the query resumes from it. With ``stop``
    (``streaming.on_retention_gap = "stop"``, not acknowledged) a gap raises
    :class:`RetentionGapError` instead, the checkpoint left in place."""
    committed = committed_offsets(checkpoint, topic)
    if not committed:
        return None
    admin = clients.admin(settings)
    earliest = earliest_offsets(admin, topic, sorted(committed))
    behind = {p: o for p, o in committed.items() if o < earliest.get(p, 0)}
    if not behind:
        return None
    deleted = ", ".join(f"{topic} partition {p} offsets {o}..{earliest[p] - 1}"
                        for p, o in sorted(behind.items()))
    if stop:
        raise RetentionGapError(
            f"realtime mode: Kafka deleted publishes the routing query had not read ({deleted})."
            " The router stopped (streaming.on_retention_gap = \"stop\"): run "
            f"`{ACKNOWLEDGE_COMMAND}` to record the gap in the audit and route on from the "
            "earliest offset Kafka keeps")
    start = {p: max(o, earliest.get(p, 0)) for p, o in committed.items()}
    aside = _aside(checkpoint)
    checkpoint.rename(aside)
    _log.warning(
        f"realtime mode: Kafka deleted publishes the routing query had not read ({deleted}); "
        f"the routing query starts again past them from a new checkpoint (the old one "
        f"kept as {aside.name}); the audit records them as lost")
    return starting_json(topic, start)


def starting_json(topic: str, offsets: Mapping[int, int]) -> str:
    return json.dumps({topic: {str(p): o for p, o in sorted(offsets.items())}})


def _aside(checkpoint: Path) -> Path:
    n = 1
    while (checkpoint.parent / f"{checkpoint.name}{SET_ASIDE}{n}").exists():
        n += 1
    return checkpoint.parent / f"{checkpoint.name}{SET_ASIDE}{n}"

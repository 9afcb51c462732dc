"""Spark's offset log of the router's query, read back: the one parser of its format.

Spark writes ``<query checkpoint>/offsets/<batch id>`` (its write-ahead log,
``OffsetSeqLog``) before it runs the batch: a version line (``v1``, or ``v2``
from Spark 4.1 on), a metadata line (JSON, possibly empty), then one line per
source of the query: its end offsets as JSON, or ``-`` when the source has
none; version 2 prefixes each source line with ``<source id>:``. The Kafka
source's offsets are ``{"<topic>": {"<partition>": <end offset>}}``.

The router's query has one source, so its offsets are the third line; this
parser reads every source line after the metadata (skipping ``-``) and merges
their topics, so it stays right for either version and for a query of several
sources.

Two readers use it:

- :func:`batch_records`: how many publishes a batch holds before it runs. The
  batch reads, per partition, from the previous batch's end offset to its own,
  so the difference is the number of records (an upper bound: transaction
  markers and compacted-away offsets count too). The router routes a small
  batch in the driver, without a Python worker round trip
  (:mod:`streaming.router.service`); when the figure cannot be known (the
  first batch, a purged or unreadable entry) it is None and the batch is
  distributed, which is always correct.
- :func:`batch_start`: where a batch starts reading, per partition, which the
  router compares with the earliest offsets Kafka still holds
  (:mod:`streaming.router.topics.retention`). For batch 0 it is the starting offsets
  the Kafka source wrote at the query's first start (``sources/0/0``: a NUL
  byte, ``v1``, then the same JSON).
- ``bitroute status``: where routing stands, the end offsets of
  :func:`last_committed_batch` (:mod:`streaming.ops.status`).
"""

from __future__ import annotations

import json
from pathlib import Path

from streaming.state.checkpoint import CheckpointLayout
from streaming.state.errors import OffsetLogError

VOID_OFFSET = "-"
"""Spark's line for a source without offsets in a batch."""


def read_offsets(path: Path) -> dict[str, dict[int, int]]:
    """The end offsets per topic and partition in the offset log entry ``path``.

    Raises :class:`OffsetLogError` for a file that is not an offset log entry of
    Kafka sources, and ``OSError`` (``FileNotFoundError``) when it cannot be read.
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    if len(lines) < 2 or lines[0] not in ("v1", "v2"):
        raise OffsetLogError(f"{path}: not a Spark offset log entry (first line "
                             f"{lines[0] if lines else ''!r})")
    offsets: dict[str, dict[int, int]] = {}
    for line in lines[2:]:
        if lines[0] == "v2":
            _, _, line = line.partition(":")
        if line.strip() == VOID_OFFSET:
            continue
        try:
            source = json.loads(line)
            for topic, partitions in source.items():
                offsets[topic] = {int(p): int(o) for p, o in partitions.items()}
        except (ValueError, AttributeError, TypeError) as exc:
            raise OffsetLogError(f"{path}: not a Spark offset log of the Kafka source ({exc})") from None
    return offsets


def batch_records(layout: CheckpointLayout, batch_id: int, topic: str) -> int | None:
    """Records of ``topic`` that batch ``batch_id`` reads, or None when unknown."""
    if batch_id < 1:
        return None
    return records_between(batch_start(layout, batch_id, topic), batch_end(layout, batch_id, topic))


def records_between(start: dict[int, int] | None, end: dict[int, int] | None) -> int | None:
    """Records from ``start`` to ``end`` (offsets per partition), None when either is
    unknown or ``end`` lacks a partition of ``start``."""
    if end is None or start is None or not set(start) <= set(end):
        return None
    return sum(offset - start.get(partition, 0) for partition, offset in end.items())


def batch_start(layout: CheckpointLayout, batch_id: int, topic: str) -> dict[int, int] | None:
    """The offsets per partition of ``topic`` where batch ``batch_id`` starts reading, or None
    when unknown (an entry purged or unreadable)."""
    try:
        if batch_id >= 1:
            return read_offsets(layout.offsets_file(batch_id - 1)).get(topic)
        text = layout.initial_offsets_file.read_text(encoding="utf-8").lstrip("\0")
        version, _, source = text.partition("\n")
        if version != "v1":
            return None
        return {int(p): int(o) for p, o in json.loads(source).get(topic, {}).items()}
    except (OSError, OffsetLogError, ValueError, AttributeError, TypeError):
        return None


def batch_end(layout: CheckpointLayout, batch_id: int, topic: str) -> dict[int, int] | None:
    """The end offsets per partition of ``topic`` of batch ``batch_id``, or None when unknown."""
    try:
        return read_offsets(layout.offsets_file(batch_id)).get(topic)
    except (OSError, OffsetLogError):
        return None


def last_planned_batch(layout: CheckpointLayout) -> int | None:
    """The last batch in the offset log (planned, committed or not), None before the first."""
    return _last_batch(layout.offsets)


def last_committed_batch(layout: CheckpointLayout) -> int | None:
    """The last batch Spark committed (its ``commits/<batch id>``), None before the first."""
    return _last_batch(layout.commits)


def _last_batch(log: Path) -> int | None:
    try:
        return max((int(p.name) for p in log.iterdir() if p.name.isdigit()), default=None)
    except FileNotFoundError:
        return None

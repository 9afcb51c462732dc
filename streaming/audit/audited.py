"""How far each audit table reaches, recorded in its commits: the marks a restored router reads.

A table's exactly-once rests on its ``txn`` version per router id
(:mod:`streaming.audit.writer`). That is right as long as a router's state
folder only moves forward. A router restarted on an older copy of its state
folder (a restore from backup) routes the batches after the copy again, with
other boundaries, while the tables already hold the audit of the batches the
router ran after the copy. So every commit also records, in its Delta
``commitInfo`` (delta-rs ``CommitProperties.custom_metadata``, key
:data:`METADATA_KEY`), an :class:`AuditedMark`: the router that committed it,
the routers its state was restored from, and the offsets its table's audit
reaches:

- ``messages``, ``deliveries``: per publishes partition, the next offset not
  yet audited (every publish below it has its rows);
- ``subscriptions``: per changelog partition, the next offset not yet
  audited;
- every table: the highest snapshot version its rows name (a restored router
  numbers its versions above it).

A mark is the maximum of the mark the router took over at open and what it
committed since, so the newest commit of a lineage holds the lineage's
all-time reach. Reading it costs a few commits (:func:`latest_mark`: the
newest commits of the table, never its whole log). A router that took over a
mark leaves out of the audit every row below it (:func:`already_audited`):
its Kafka deliveries are repeats (at least once), its audit rows are in the
table already. :mod:`streaming.router.restore` decides which mark a router
takes over.

The lineage key is the publishes topic: one router at a time routes a topic
into a warehouse (:mod:`streaming.state.lease`), so the newest mark of a
topic is the running lineage's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from schemas.records import MESSAGE_ID_PATTERN

METADATA_KEY = "bitroute.audited"
"""The ``commitInfo`` key of a commit's mark (its value: JSON text)."""
MARK_SEARCH_COMMITS = 200
"""Newest commits of a table searched for its lineage's mark (maintenance commits, and
another publishes topic's router sharing the warehouse, come between)."""
FIRST_READ_COMMITS = 8
"""Newest commits read first, before the deeper search."""


@dataclass(frozen=True)
class AuditedMark:
    """One commit's record: who committed it and how far its table's audit reaches.

    ``offsets``: partition -> the next offset not yet audited (publishes
    partitions for the publish tables, changelog partitions for
    ``subscriptions``). ``snapshot_version``: the highest snapshot version the table's
    rows name.
    """

    topic: str
    router_id: str
    ancestors: tuple[str, ...] = ()
    offsets: Mapping[int, int] = field(default_factory=dict)
    snapshot_version: int | None = None

    @property
    def lineage(self) -> frozenset[str]:
        """The router ids whose audit this mark covers: its router and its ancestors."""
        return frozenset((self.router_id, *self.ancestors))

    def advanced(self, offsets: Mapping[int, int] | None, router_id: str,
                 ancestors: tuple[str, ...], snapshot_version: int | None = None) -> AuditedMark:
        """This mark, recorded by ``router_id`` (with ``ancestors``) after it audited up to
        ``offsets`` (None: not known) and ``snapshot_version``; it never moves back."""
        merged = dict(self.offsets)
        for partition, offset in (offsets or {}).items():
            merged[partition] = max(offset, merged.get(partition, 0))
        version = self.snapshot_version
        if snapshot_version is not None:
            version = snapshot_version if version is None else max(version, snapshot_version)
        return AuditedMark(self.topic, router_id, ancestors, merged, version)

    def metadata(self) -> dict[str, str]:
        """The commit's custom metadata carrying this mark."""
        record: dict[str, object] = {"topic": self.topic, "router_id": self.router_id,
                  "ancestors": list(self.ancestors),
                  "offsets": {str(p): o for p, o in sorted(self.offsets.items())}}
        if self.snapshot_version is not None:
            record["snapshot_version"] = self.snapshot_version
        return {METADATA_KEY: json.dumps(record, separators=(",", ":"))}

    @classmethod
    def of_commit(cls, commit: Mapping[str, object]) -> AuditedMark | None:
        """The mark a ``commitInfo`` (as ``DeltaTable.history`` returns it) carries, if any."""
        text = commit.get(METADATA_KEY)
        if not isinstance(text, str):
            return None
        try:
            record = json.loads(text)
            return cls(str(record["topic"]), str(record["router_id"]),
                       tuple(str(a) for a in record.get("ancestors", ())),
                       {int(p): int(o) for p, o in record.get("offsets", {}).items()},
                       None if record.get("snapshot_version") is None
                       else int(record["snapshot_version"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None  # not ours to read: the table's audit is not limited by it


def latest_mark(table: DeltaTable, topic: str,
                depth: int = MARK_SEARCH_COMMITS) -> AuditedMark | None:
    """The mark of the newest commit of ``topic``'s routers among the table's ``depth``
    newest commits, or None. The newest few are read first: usually the newest commit
    is the router's own (each commit read is a GET on an object store)."""
    for limit in dict.fromkeys((min(FIRST_READ_COMMITS, depth), depth)):
        for commit in table.history(limit=limit):
            mark = AuditedMark.of_commit(commit)
            if mark is not None and mark.topic == topic:
                return mark
    return None


def offsets_of(message_ids: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, pa.Array]:
    """The partitions and offsets (int64) in a column of message ids."""
    parts = pc.extract_regex(message_ids, MESSAGE_ID_PATTERN)
    return (pc.cast(pc.struct_field(parts, "partition"), pa.int64()),
            pc.cast(pc.struct_field(parts, "offset"), pa.int64()))


def already_audited(partitions: pa.Array | pa.ChunkedArray, offsets: pa.Array | pa.ChunkedArray,
                    mark: Mapping[int, int]) -> pa.Array:
    """Whether each (partition, offset) lies below ``mark`` (its row is audited already)."""
    below = pa.array(np.zeros(len(partitions), dtype=bool))
    for partition, end in mark.items():
        below = pc.or_(below, pc.and_(pc.equal(partitions, partition), pc.less(offsets, end)))
    return below


def rows_not_audited(rows: pa.Table, mark: Mapping[int, int] | None,
                     id_column: str = "message_id") -> pa.Table:
    """``rows`` (a publish table's, or routed rows) without those whose message id lies
    below ``mark``."""
    if not mark or not rows.num_rows:
        return rows
    partitions, offsets = offsets_of(rows[id_column])
    return rows.filter(pc.invert(already_audited(partitions, offsets, mark)))


def changes_not_audited(changes: pa.Table, mark: Mapping[int, int] | None) -> pa.Table:
    """``subscriptions`` rows without those whose changelog offset lies below ``mark``."""
    if not mark or not changes.num_rows:
        return changes
    below = already_audited(changes["changelog_partition"], changes["changelog_offset"], mark)
    return changes.filter(pc.invert(below))


def span_against(start: Mapping[int, int] | None, end: Mapping[int, int] | None,
                 mark: Mapping[int, int] | None) -> str:
    """Where a batch reading ``start`` to ``end`` (None: unknown) lies against ``mark``:
    ``"after"`` (nothing of it audited: the usual case, no row is read), ``"before"``
    (all of it audited) or ``"across"`` (its rows are to be sorted)."""
    if not mark:
        return "after"
    if start is not None and all(start.get(p, 0) >= end for p, end in mark.items()):
        return "after"
    if end is not None and all(o <= mark.get(p, 0) or (start is not None and start.get(p, 0) >= o)
                               for p, o in end.items()):
        return "before"
    return "across"


def next_offsets(partitions: pa.Array | pa.ChunkedArray,
                 offsets: pa.Array | pa.ChunkedArray) -> dict[int, int]:
    """Per partition, one past the highest of ``offsets``."""
    if not len(partitions):
        return {}
    grouped = pa.table({"p": partitions, "o": offsets}).group_by("p").aggregate([("o", "max")])
    return {p: o + 1 for p, o in zip(grouped["p"].to_pylist(), grouped["o_max"].to_pylist(), strict=True)}

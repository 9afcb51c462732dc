"""A router started on an older copy of its state folder (a restore): found at open, made safe.

A restore puts back a copy of ``streaming.checkpoint_dir`` taken at batch K
while the router had run on to batch M > K, the warehouse left as it is (and
the changelog topic whole). Spark then routes the publishes after batch K
again, in batches with other boundaries (``maxOffsetsPerTrigger`` meets more
data now), and the subscription changelog is read again from the copy's
snapshot. Kafka may repeat deliveries (at least once); the audit must not.
But the audit's exactly-once is keyed by (router id, batch id) and (router id,
snapshot version), and the tables already hold those ids up to M: kept as it
is, Delta would skip the new batches up to M (losing the rows of publishes
that were not in the old batch of the same id) and add the later ones twice.

:func:`open_audit`, called by the router at open before anything is routed,
finds a restored state, in O(1) of the tables' history (their ``txn``
versions and newest commits): the audit holds a batch id of this router above
the last batch of the checkpoint's offset log, or a snapshot version above
the checkpoint's newest, or a router that was restored from this state before
ran on (:class:`streaming.audit.audited.AuditedMark` ancestors). Then it:

1. commits what the copy's audit journal holds (leftovers the tables mostly
   have already, skipped by their ``txn``);
2. records the router's lineage (``router/lineage``: the router ids this
   state descends from) and takes a new router id, so that Delta takes the
   new batch ids and snapshot versions as new;
3. takes over each table's newest mark of the lineage: the offsets its audit
   reaches. The rows of publishes below the mark and the subscription changes
   below it are left out of the audit (they are in it), the rest is audited
   once, as usual (:mod:`streaming.audit.writer`);
4. renumbers the newest snapshot above every version audited, so that a
   snapshot version in the audit names one set of subscriptions;

and says so in one line. Realtime mode adds its own signs, its audit query's batch ids
(:mod:`streaming.realtime.restored`). Every open takes over the lineage's newest marks, so
a restored router killed before it caught up still leaves those rows out
after its restart; for a router that was never restored the marks are its own
and leave nothing out (its batches after its last commit start at its mark).

Limits: the lineage is followed through the newest commits of the publishes
topic's routers (:data:`streaming.audit.audited.MARK_SEARCH_COMMITS`); a copy
of a router whose lineage another router (a fresh state folder) has replaced
on the topic is not recognised as a restore, and its repeats are audited
again, as a fresh state folder's are.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from schemas.records import AUDIT_TABLE_NAMES, DELIVERIES, MESSAGES, SUBSCRIPTIONS
from streaming.atomic import write_atomically
from streaming.audit.audited import AuditedMark
from streaming.audit.committer import AuditCommitter
from streaming.audit.writer import AuditTables
from streaming.router.subscriptions.snapshots import SnapshotStore, SnapshotVersion
from streaming.state.checkpoint import CheckpointLayout
from streaming.state.offsets_log import last_planned_batch

_log = logging.getLogger(__name__)


def read_lineage(layout: CheckpointLayout) -> tuple[str, ...]:
    """The router ids this state folder was restored from, oldest first (none: never)."""
    try:
        return tuple(str(i) for i in json.loads(layout.lineage_file.read_text()))
    except FileNotFoundError:
        return ()


def open_audit(layout: CheckpointLayout, store: SnapshotStore,
               committer_for: Callable[[], AuditCommitter],
               restored: Callable[[], list[str]] = list) -> AuditCommitter:
    """The router's audit committer (from ``committer_for``, under the store's router id),
    with the lineage's marks taken over; on a restored state, after the steps of the module
    docstring (the committer is then under a new router id). ``restored`` gives more signs
    of a restored state, after the journal's leftovers were committed (realtime mode's:
    :func:`streaming.realtime.restored.realtime_restored`). Holds the state folder's lock."""
    committer = committer_for()
    tables = committer.tables
    me, ancestors = tables.router_id, read_lineage(layout)
    newest = {name: tables.latest_mark(name) for name in AUDIT_TABLE_NAMES}
    _take_over(tables, ancestors, newest)
    committer.recover()  # the journal's leftovers, under the id that journaled them
    found = _restored(layout, store, tables, newest) + restored()
    if not found:
        return committer
    lineage = list(ancestors)
    for mark in newest.values():
        for router in (*(mark.ancestors if mark else ()), mark.router_id if mark else None, me):
            if router is not None and router not in lineage:
                lineage.append(router)
    write_atomically(layout.lineage_file, json.dumps(lineage).encode())
    new_id = store.renew_router_id()
    tables.close()
    committer = committer_for()
    _take_over(committer.tables, tuple(lineage), newest)
    marks = committer.tables.marks
    version = _renumber(store, max((m.snapshot_version for m in marks.values()
                                    if m.snapshot_version is not None), default=None))
    _log.warning(
        f"restored state: {'; '.join(found)}. The router goes on as router {new_id} (was "
        f"{me}) from the copy's offsets: publishes of {tables.topic} below offsets "
        f"{_offsets(marks, MESSAGES, DELIVERIES)} go to Kafka again (repeats, same message "
        "ids) but not to the audit, which has them, nor do subscription changes below "
        f"changelog offsets {_offsets(marks, SUBSCRIPTIONS)}"
        + (f"; snapshot versions go on from {version}" if version is not None else ""))
    return committer


def _take_over(tables: AuditTables, ancestors: tuple[str, ...],
               newest: dict[str, AuditedMark | None]) -> None:
    """Give ``tables`` its lineage and each table's newest mark of that lineage."""
    tables.ancestors = ancestors
    lineage = {tables.router_id, *ancestors}
    tables.marks = {name: mark for name, mark in newest.items()
                    if mark is not None and mark.lineage & lineage}


def _restored(layout: CheckpointLayout, store: SnapshotStore, tables: AuditTables,
              newest: dict[str, AuditedMark | None]) -> list[str]:
    """Why this state folder is an older copy than the audit's router reached (none: it is
    not)."""
    me, found = tables.router_id, []
    last = last_planned_batch(layout)
    batches = [v for v in (tables.publishes_version(n) for n in (MESSAGES, DELIVERIES))
               if v is not None]
    if batches and max(batches) > (-1 if last is None else last):
        found.append(f"the audit holds batch {max(batches)} of this router but the checkpoint "
                     f"folder's offset log ends at batch {last}")
    versions = store.versions()
    audited = tables.changelog_version()
    if audited is not None and audited > (versions[-1] if versions else -1):
        found.append(f"the audit holds snapshot version {audited} of this router but the "
                     f"checkpoint folder's newest is {versions[-1] if versions else None}")
    successors = sorted({m.router_id for m in newest.values() if m is not None
                         and me in m.ancestors and m.router_id != me})
    if successors:
        found.append(f"router {', '.join(successors)} was restored from this state before "
                     "and ran on")
    return found


def _renumber(store: SnapshotStore, audited: int | None) -> int | None:
    """Save the newest snapshot again as the version after ``audited`` (the highest version
    the audit names), when it is not above it already; return that version (None: left as
    it is)."""
    current = store.latest()
    if audited is None or current is None or current.version > audited:
        return None
    from compiler import RoutingIndex, Snapshot, SnapshotFormatError  # late: slow to import

    try:
        snapshot = Snapshot.from_bytes(current.data)
    except SnapshotFormatError:
        return None  # rebuilt from the changelog at open, as any unreadable snapshot is
    version = audited + 1
    index = RoutingIndex.from_snapshot(snapshot)
    store.save(SnapshotVersion.of(index.snapshot(version, snapshot.offsets)), [])
    return version


def _offsets(marks: dict[str, AuditedMark], *tables: str) -> dict[int, int]:
    """The lowest of the ``tables``' marks, per partition (what is audited in all of them)."""
    found = [marks[t].offsets for t in tables if t in marks]
    partitions = set().union(*found) if found else set()
    return {p: min(m.get(p, 0) for m in found) for p in sorted(partitions)}

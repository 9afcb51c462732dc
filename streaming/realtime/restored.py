"""Realtime mode on a restored state folder: found at open beside micro-batch mode's signs.

A restore puts back an older copy of ``streaming.checkpoint_dir``
(:mod:`streaming.router.restore`). Micro-batch mode finds it at open by its batch ids
and snapshot versions, then goes on under a new router id. Realtime mode's audit query
numbers its batches itself, under its own Delta app id
(``bitroute-<router id>-realtime-publishes``), so a copy is also found by them:
:func:`realtime_restored` says why a copy is one when the audit holds a realtime batch of
this router above the copy's audit checkpoint (``realtime/audit``). Kept under the same
id, Delta would skip the copy's new audit batches up to the ids it holds, losing rows.

Before that, it commits the copy's realtime audit journal under the copy's router id
(as :func:`streaming.router.restore.open_audit` does the micro-batch journal): under the
new id its batches would be appended a second time. Once the router took a new id, the
realtime audit leaves out the publishes below the audit's newest mark
(:mod:`streaming.realtime.audit`), and audits the rest once.
"""

from __future__ import annotations

from schemas.records import MESSAGES
from streaming.audit.committer import AuditCommitter
from streaming.audit.journal import AuditJournal
from streaming.audit.writer import AuditTables
from streaming.config import Config
from streaming.router.subscriptions.snapshots import SnapshotStore
from streaming.state.checkpoint import CheckpointLayout

AUDIT_STREAM = "realtime-publishes"
"""The Delta app id stem of realtime mode's audit batches (their ids are the audit query's)."""


def realtime_tables(config: Config, store: SnapshotStore) -> AuditTables:
    """Realtime mode's audit tables under the store's router id."""
    return AuditTables(config, store.router_id(), store.snapshot_audit_id(),
                       publishes_stream=AUDIT_STREAM)


def last_audit_batch(layout: CheckpointLayout) -> int | None:
    """The last batch in the realtime audit query's offset log (None: none yet)."""
    try:
        return max((int(p.name) for p in (layout.realtime_audit / "offsets").iterdir()
                    if p.name.isdigit()), default=None)
    except FileNotFoundError:
        return None


def realtime_restored(config: Config, layout: CheckpointLayout, store: SnapshotStore) -> list[str]:
    """Commit the realtime audit journal's leftovers under the store's router id, then say
    why the folder is a restored copy by its realtime audit (none: it is not, or it was
    never routed in realtime mode). Holds the state folder's lock."""
    if not layout.realtime.is_dir():
        return []
    tables = realtime_tables(config, store)
    try:
        commit_journal(config, layout, tables)
        return audit_ahead(layout, tables)
    finally:
        tables.close()


def commit_journal(config: Config, layout: CheckpointLayout, tables: AuditTables) -> None:
    """Commit what realtime mode's audit journal holds (a crash's leftovers) to ``tables``."""
    tables.ensure()
    journal = AuditJournal(layout.realtime_audit_journal)
    if len(journal):
        AuditCommitter(tables, journal, config.audit.commit_interval_s,
                       config.audit.max_pending_batches).recover()


def audit_ahead(layout: CheckpointLayout, tables: AuditTables) -> list[str]:
    """Why ``tables`` (realtime mode's) are ahead of the folder's audit checkpoint, if they are."""
    audited = tables.publishes_version(MESSAGES)
    last = last_audit_batch(layout)
    if audited is None or (last is not None and audited <= last):
        return []
    return [f"the audit holds realtime batch {audited} of this router but the checkpoint "
            f"folder's realtime audit log ends at batch {last}"]

"""Realtime mode on a restored state folder: refused in one line when its audit would lose rows.

A restore puts back an older copy of ``streaming.checkpoint_dir``
(:mod:`streaming.router.restore`). Micro-batch mode finds it at open by its batch ids
and snapshot versions and goes on under a new router id. Realtime mode's audit query
numbers its batches itself, under its own Delta app id
(``bitroute-<router id>-realtime-publishes``): a copy whose audit checkpoint
(``realtime/audit``) is behind the audit's batches would have Delta skip the new
batches up to the ids it already holds, losing the rows of the publishes in them that
the old batches of the same ids did not hold. When the router's restore check has not
taken a new router id already (it does when the copy's snapshot versions are behind),
:func:`refuse_restored_audit` refuses the start with one line instead.
"""

from __future__ import annotations

from schemas.records import MESSAGES
from streaming.audit.writer import AuditTables
from streaming.router.checkpoint import CheckpointLayout
from streaming.router.errors import RouterModeError


def last_audit_batch(layout: CheckpointLayout) -> int | None:
    """The last batch in the realtime audit query's offset log (None: none yet)."""
    try:
        return max((int(p.name) for p in (layout.realtime_audit / "offsets").iterdir()
                    if p.name.isdigit()), default=None)
    except FileNotFoundError:
        return None


def refuse_restored_audit(layout: CheckpointLayout, tables: AuditTables) -> None:
    """Raise :class:`RouterModeError` when ``tables`` (realtime mode's, under this folder's
    router id) hold an audit batch above the folder's audit checkpoint (module docstring)."""
    audited = tables.publishes_version(MESSAGES)
    last = last_audit_batch(layout)
    if audited is None or (last is not None and audited <= last):
        return
    raise RouterModeError(
        f"restored state: the audit holds realtime batch {audited} of router "
        f"{tables.router_id} but the state folder {layout.root} has its audit checkpoint at "
        f"batch {last}: realtime mode does not resume a restored state folder (its audit "
        "would skip rows); start it with a new streaming.checkpoint_dir (it routes the "
        "publishes topic again from its earliest offset, repeats in Kafka, and audits only "
        "what the audit lacks)")

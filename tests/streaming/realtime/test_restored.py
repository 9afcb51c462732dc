"""Realtime mode on a restored state folder (streaming/realtime/restored.py): found by its
realtime audit, once the copy's realtime journal is committed under the copy's router id.
Real Delta tables (delta-rs) in a temporary folder, no Spark, no Kafka."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from deltalake import DeltaTable

from schemas.records import MESSAGES
from streaming.audit.journal import AuditJournal
from streaming.audit.writer import PublishBatch
from streaming.config import load, parse_set_flags
from streaming.realtime.restored import AUDIT_STREAM, realtime_restored, realtime_tables
from streaming.router.subscriptions.snapshots import SnapshotStore
from streaming.state.checkpoint import CheckpointLayout
from tests.streaming.audit.test_writer import routed

pytestmark = pytest.mark.integration  # Delta tables


def _batch(batch_id: int) -> PublishBatch:
    return PublishBatch(batch_id, 1, datetime.now(UTC), routed(batch_id))


def test_a_copy_behind_its_realtime_audit_is_found_after_its_journal_is_committed(tmp_path):
    config = load(None, parse_set_flags([f"delta.warehouse={tmp_path / 'delta'}",
                                         f"streaming.checkpoint_dir={tmp_path / 'cp'}"]), environ={})
    layout = CheckpointLayout.of(config.streaming.checkpoint_dir)
    store = SnapshotStore(layout)
    assert realtime_restored(config, layout, store) == []  # never routed in realtime mode
    offsets = layout.realtime_audit / "offsets"
    offsets.mkdir(parents=True)
    for batch in range(4):
        (offsets / str(batch)).write_text("v1\n")
    tables = realtime_tables(config, store)
    tables.ensure()
    tables.append_publishes([_batch(3)])
    tables.close()
    AuditJournal(layout.realtime_audit_journal).write(_batch(2))  # a copy's leftover
    assert realtime_restored(config, layout, store) == []  # the folder that audited batch 3
    app = f"bitroute-{store.router_id()}-{AUDIT_STREAM}"
    messages = DeltaTable(config.delta.table_path(MESSAGES))
    assert messages.transaction_version(app) == 3  # batch 2 committed under the copy's id (skipped: in)
    assert len(AuditJournal(layout.realtime_audit_journal)) == 0
    for batch in (2, 3):
        (offsets / str(batch)).unlink()
    assert realtime_restored(config, layout, store) == [
        "the audit holds realtime batch 3 of this router but the checkpoint folder's realtime "
        "audit log ends at batch 1"]

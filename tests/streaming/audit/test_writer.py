"""The audit appender's table objects are bounded: reloaded after TABLE_RELOAD_COMMITS versions.

Real Delta tables (delta-rs) in a temporary folder, no Spark, no Kafka.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from schemas.tables import ROUTED_PUBLISH, arrow_schema
from streaming.audit import writer as delta_sink
from streaming.audit.writer import AuditTables, PublishBatch
from streaming.config import load, parse_set_flags

ROUTED = arrow_schema(ROUTED_PUBLISH)


def routed(batch_id: int, publishes: int = 2, subscribers: int = 3) -> pa.Table:
    now = datetime.now(UTC)
    return pa.Table.from_pylist([{
        "message_id": f"bitroute.publishes/0/{batch_id * publishes + i}",
        "exchange": "mqtt", "routing_key": "site1/dev1/temp", "outcome": "routed", "reason": None,
        "deliveries": [{"subscriber": f"app{j}", "subscription_ids": [f"d{j}"]}
                       for j in range(subscribers)],
        "headers": None, "payload_bytes": 8, "published_at": now,
    } for i in range(publishes)], schema=ROUTED)


def append(audit: AuditTables, batch_id: int) -> None:
    """Batch ``batch_id`` committed alone (a group of one, as the committer commits it)."""
    audit.append_publishes([PublishBatch(batch_id, 1, datetime.now(UTC), routed(batch_id))])


@pytest.fixture
def audit(tmp_path):
    config = load(None, parse_set_flags([f"delta.warehouse={tmp_path / 'delta'}",
                                         f"streaming.checkpoint_dir={tmp_path / 'cp'}"]), environ={})
    tables = AuditTables(config, "test-router")
    tables.ensure()
    yield tables
    tables.close()


def test_table_objects_are_reloaded_after_the_bound_and_rows_stay_exactly_once(audit, monkeypatch):
    monkeypatch.setattr(delta_sink, "TABLE_RELOAD_COMMITS", 3)
    seen = []
    for batch_id in range(1, 8):
        append(audit, batch_id)
        seen.append(audit._tables.get("messages"))
    # Versions 3 and 6 (created at 0) reached the bound: the object was dropped, the next
    # append loaded a new one.
    assert seen[2] is None and seen[5] is None
    assert seen[0] is seen[1] and seen[3] is seen[4] and seen[6] is not None
    assert len({id(t) for t in (seen[0], seen[3], seen[6])}) == 3
    # A re-run of a batch committed before the reload is still recognised as one.
    append(audit, 5)
    append(audit, 7)
    messages = DeltaTable(audit.path("messages")).to_pyarrow_table()
    deliveries = DeltaTable(audit.path("deliveries")).to_pyarrow_table()
    assert messages.num_rows == 7 * 2
    assert deliveries.num_rows == 7 * 2 * 3
    assert len(set(messages["message_id"].to_pylist())) == 7 * 2


def test_reruns_do_not_count_towards_the_bound(audit, monkeypatch):
    monkeypatch.setattr(delta_sink, "TABLE_RELOAD_COMMITS", 2)
    append(audit, 1)
    table = audit._tables["messages"]
    for _ in range(5):
        append(audit, 1)  # re-runs: nothing committed
    assert audit._tables["messages"] is table


def test_an_earlier_deliveries_table_gains_the_retained_column_and_takes_retained_rows(tmp_path):
    """A deliveries table made before the ``retained`` column: opening adds it (nullable,
    last), its old rows read null, and a batch's retained rows append once, in its order."""
    config = load(None, parse_set_flags([f"delta.warehouse={tmp_path / 'delta'}",
                                         f"streaming.checkpoint_dir={tmp_path / 'cp'}"]), environ={})
    old = pa.schema([f for f in delta_sink.ARROW_SCHEMAS["deliveries"] if f.name != "retained"])
    now = datetime.now(UTC)
    old_rows = delta_sink.deliveries_rows(routed(0), 1, 0, now, config.kafka.layout)
    DeltaTable.create(config.delta.table_path("deliveries"), schema=old,
                      partition_by=["routed_date"])
    from deltalake import write_deltalake

    write_deltalake(config.delta.table_path("deliveries"), old_rows.select(old.names),
                    mode="append")
    tables = AuditTables(config, "test-router")
    tables.ensure()
    try:
        assert DeltaTable(config.delta.table_path("deliveries")).schema().fields[-1].name == "retained"
        rows = delta_sink.deliveries_rows(routed(5, publishes=1, subscribers=1), 2, 5, now,
                                          config.kafka.layout, retained=True)
        tables.append_retained(rows, 5)
        tables.append_retained(rows, 5)  # a re-run batch: nothing more
        read = DeltaTable(config.delta.table_path("deliveries")).to_pyarrow_table().to_pylist()
        assert sorted((r["batch_id"], r["retained"]) for r in read) == [(0, None)] * 6 + [(5, True)]
    finally:
        tables.close()

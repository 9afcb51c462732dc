"""Reading what the router wrote into a :class:`~.ledger.Ledger`: every delivery topic
and the rejected topic from Kafka, the three audit tables from Delta (with delta-rs,
no Spark).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from deltalake import DeltaTable

from schemas.records import MESSAGE_ID_HEADER, REASON_HEADER, SOURCE_HEADER, SOURCE_SUBSCRIPTION
from streaming.config import Config
from tests.reliability.kafka_io import headers_of, read_topics, topic_names
from tests.reliability.ledger import Ledger

READ_TIMEOUT_S = 1800.0


@dataclass
class Rejections:
    """The rejected topic, by source: message id -> reason (the last one read)."""

    publishes: dict[str, str] = field(default_factory=dict)
    subscriptions: dict[str, str] = field(default_factory=dict)
    without_reason: int = 0


def read_deliveries(config: Config, ledger: Ledger) -> int:
    """Count every record of every delivery topic into ``ledger``; return how many."""
    prefix = config.kafka.deliveries_topic_prefix
    topics = sorted(t for t in topic_names(config.kafka.client_settings) if t.startswith(prefix))
    cut = len(prefix)

    def on_record(message) -> None:
        headers = message.headers() or []
        ids = [v for k, v in headers if k == MESSAGE_ID_HEADER]
        if len(ids) > 1:
            ledger.forged_kept += 1
        mid = ids[-1] if ids else None
        ledger.delivered(mid.decode() if mid else "", message.topic()[cut:])

    return read_topics(config.kafka.client_settings, topics, on_record, READ_TIMEOUT_S)


def read_rejected(config: Config, ledger: Ledger | None = None) -> Rejections:
    """The rejected topic; publishes are also counted into ``ledger``."""
    out = Rejections()

    def on_record(message) -> None:
        headers = headers_of(message)
        mid = (headers.get(MESSAGE_ID_HEADER) or b"").decode()
        reason = (headers.get(REASON_HEADER) or b"").decode("utf-8", "replace")
        if not reason:
            out.without_reason += 1
        if headers.get(SOURCE_HEADER) == SOURCE_SUBSCRIPTION.encode():
            out.subscriptions[mid] = reason
        else:
            out.publishes[mid] = reason
            if ledger is not None:
                ledger.rejected(mid, reason)

    read_topics(config.kafka.client_settings, [config.kafka.rejected_topic], on_record, READ_TIMEOUT_S)
    return out


def read_audit(config: Config, ledger: Ledger) -> None:
    """Count the ``deliveries`` and ``messages`` rows into ``ledger``."""
    deliveries = DeltaTable(config.delta.table_path("deliveries")).to_pyarrow_table(
        columns=["message_id", "subscriber"])
    for mid, subscriber in zip(deliveries["message_id"].to_pylist(),
                               deliveries["subscriber"].to_pylist(), strict=True):
        ledger.audit_delivery(mid, subscriber)
    messages = DeltaTable(config.delta.table_path("messages")).to_pyarrow_table(
        columns=["message_id", "outcome", "reason", "deliveries"])
    for mid, outcome, reason, count in zip(*(messages[c].to_pylist() for c in messages.column_names), strict=True):
        ledger.audit_message(mid, outcome, reason, count)


def subscription_rows(config: Config) -> dict[tuple[int, int], list[tuple[str, str | None, str]]]:
    """(changelog partition, offset) -> [(change, reason, subscription id), ...] of the
    ``subscriptions`` table (a list: more than one row for a record is a repeat)."""
    table = DeltaTable(config.delta.table_path("subscriptions")).to_pyarrow_table(
        columns=["changelog_partition", "changelog_offset", "change", "reason", "subscription_id"])
    out: dict[tuple[int, int], list] = {}
    for p, o, change, reason, sid in zip(*(table[c].to_pylist() for c in table.column_names), strict=True):
        out.setdefault((p, o), []).append((change, reason, sid))
    return out


def repeated_subscription_rows(rows: dict) -> int:
    """Changelog records with more than one row in the ``subscriptions`` table."""
    return sum(1 for found in rows.values() if len(found) > 1)


def changes_by_kind(rows: dict) -> Counter:
    return Counter(change for found in rows.values() for change, _, _ in found)

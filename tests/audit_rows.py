"""Routed rows (``ROUTED_PUBLISH``, what a routing step returns) for the audit tests."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa

from streaming.router.batch.routing import ROUTED_ARROW

PUBLISHED_AT = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def routed_rows(batch_id: int, publishes: int = 3, fanout: int = 2,
                published_at: datetime = PUBLISHED_AT) -> pa.Table:
    """``publishes`` routed publishes of batch ``batch_id`` (ids ``p/0/<batch_id * 100 + i>``),
    each delivered to subscribers ``s0`` .. ``s<fanout - 1>`` (unroutable when 0)."""
    return pa.Table.from_pylist([{
        "message_id": f"p/0/{batch_id * 100 + i}", "exchange": "amq.topic",
        "routing_key": "a.b", "outcome": "routed" if fanout else "unroutable", "reason": None,
        "deliveries": [{"subscriber": f"s{j}", "subscription_ids": [f"i{j}"]}
                       for j in range(fanout)],
        "headers": None, "payload_bytes": 5, "published_at": published_at,
    } for i in range(publishes)], schema=ROUTED_ARROW)

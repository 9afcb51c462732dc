"""Arrow batches shaped like the Spark Kafka source's rows, for routing and record tests
that need no Spark."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pyarrow as pa

HEADERS = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


def source_batch(rows: Sequence[tuple[bytes | None, bytes | None, Sequence]]) -> pa.RecordBatch:
    """A batch shaped like the Spark Kafka source's rows (topic p, partition 0): each row
    is (key, value, [(header name, header value), ...])."""
    n = len(rows)
    return pa.RecordBatch.from_arrays([
        pa.array(["p"] * n), pa.array([0] * n, pa.int32()), pa.array(range(n), pa.int64()),
        pa.array([r[0] for r in rows], pa.binary()), pa.array([r[1] for r in rows], pa.binary()),
        pa.array([[{"key": k, "value": v} for k, v in r[2]] for r in rows], HEADERS),
        pa.array([datetime(2025, 1, 1, tzinfo=UTC)] * n, pa.timestamp("us", tz="UTC")),
    ], names=["topic", "partition", "offset", "key", "value", "headers", "timestamp"])

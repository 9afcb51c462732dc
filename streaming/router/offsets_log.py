"""How many publishes a micro-batch holds, read from the query's offset log before it runs.

Spark writes ``<query checkpoint>/offsets/<batch id>`` (its write-ahead log)
before it runs the batch: a version line, a metadata line, then one JSON line
per source, for the Kafka source ``{"<topic>": {"<partition>": <end offset>}}``.
The batch reads, per partition, from the previous batch's end offset to its
own, so the difference is the number of records it holds (an upper bound:
transaction markers and compacted-away offsets count too).

The router uses the figure to route a small batch in the driver, without a
Python worker round trip (:mod:`streaming.router.service`); when it cannot be known
(the first batch, a purged or unreadable log entry) it returns None and the
batch is distributed, which is always correct.
"""

from __future__ import annotations

import json
from pathlib import Path


def batch_records(query_checkpoint: Path, batch_id: int, topic: str) -> int | None:
    """Records of ``topic`` that batch ``batch_id`` reads, or None when unknown."""
    if batch_id < 1:
        return None
    end, start = (_end_offsets(query_checkpoint / "offsets" / str(b), topic)
                  for b in (batch_id, batch_id - 1))
    if end is None or start is None or not set(start) <= set(end):
        return None
    return sum(offset - start.get(partition, 0) for partition, offset in end.items())


def _end_offsets(path: Path, topic: str) -> dict[str, int] | None:
    try:
        lines = path.read_text().splitlines()
        offsets = json.loads(lines[2])[topic]
        return {str(p): int(o) for p, o in offsets.items()}
    except (OSError, IndexError, KeyError, TypeError, ValueError):
        return None

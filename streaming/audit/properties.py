"""What every audit table carries, from its creation on: its Delta table properties
(how long its log keeps commits and its removed files stay, from ``[audit]``) and the
Parquet writer properties of its files (the same layout for the appends, the
maintenance's rewrites and the migration's), so that all files of a table are alike.
:mod:`streaming.audit.writer` sets both at creation and on every append,
:mod:`streaming.audit.maintenance` keeps the table properties in line and rewrites
with the writer properties.
"""

from __future__ import annotations

import math

from deltalake import BloomFilterProperties, ColumnProperties, WriterProperties

from schemas.records import SUBSCRIPTIONS
from streaming.audit.files import BLOOM_FILTER_FPP, ROW_GROUP_ROWS
from streaming.config import AuditConfig


def table_properties(audit: AuditConfig) -> dict[str, str]:
    """The Delta table properties every audit table carries, from ``[audit]``: how long
    the log keeps commits (``log_retention``) and removed files stay (``file_retention``),
    and expired-log cleanup on. Set at creation and kept in line by the maintenance."""
    return {
        "delta.logRetentionDuration": _delta_interval(audit.log_retention_s),
        "delta.deletedFileRetentionDuration": _delta_interval(audit.file_retention_s),
        "delta.enableExpiredLogCleanup": "true",
    }


def _delta_interval(seconds: float) -> str:
    """A duration as Delta's interval text (whole seconds, at least one)."""
    return f"interval {max(1, math.ceil(seconds))} seconds"


def writer_properties(table: str, rows: int | None = None) -> WriterProperties:
    """The Parquet writer properties of every file written to audit table ``table``:
    appends (:mod:`streaming.audit.writer`; ``rows``: the rows written), rewrites by
    the maintenance's compaction and the migration (``rows`` None: full row groups), so
    that all files of a table have the same layout.

    ``deliveries`` and ``messages`` carry a bloom filter on ``message_id``: a
    look-up by message id (``bitroute audit ... --message-id``, no time bound)
    then skips the row groups whose filter rules the id out, where min/max
    statistics of ids in no particular order (a compacted file) rule nothing
    out (docs/benchmarks-history.md, "Audit over time, part 1": 19.0 -> 6.2 ms on one
    file of 1M rows). The filter is sized for the row group's rows, at most
    :data:`ROW_GROUP_ROWS` (about 150 KB per full row group at 1% false positives).
    """
    if table == SUBSCRIPTIONS:
        return WriterProperties(compression="SNAPPY", max_row_group_size=ROW_GROUP_ROWS)
    ndv = max(1, min(ROW_GROUP_ROWS, rows if rows is not None else ROW_GROUP_ROWS))
    bloom = BloomFilterProperties(True, fpp=BLOOM_FILTER_FPP, ndv=ndv)
    return WriterProperties(compression="SNAPPY", max_row_group_size=ROW_GROUP_ROWS,
                            column_properties={"message_id": ColumnProperties(
                                bloom_filter_properties=bloom)})

"""What one audit maintenance pass costs and buys on a table of N small appends.

    python -m benchmarks.audit_maintenance_bench [--batches N] [--folder DIR]

Appends N batches (4 publishes x 3 subscribers each) through the router's own
writer (``streaming.audit.writer.AuditTables``), then prints, for the
``deliveries`` table: data files and ``_delta_log`` entries before and after
one pass (:func:`streaming.audit.maintenance.maintain`), the pass's seconds per
table, a full read's seconds before and after, and the median append latency
alone, while a pass runs in another thread, and after it (the figures are from one run:
see docs/benchmarks.md for how noisy this machine is).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from streaming.audit.maintenance import maintain, table_stats
from streaming.audit.writer import AuditTables, PublishBatch
from streaming.cli.render import maintenance_lines
from streaming.config import load
from streaming.router.routing import ROUTED_ARROW


def routed(batch_id: int) -> pa.Table:
    now = datetime.now(timezone.utc)
    return pa.Table.from_pylist([{
        "message_id": f"p/0/{batch_id * 4 + i}", "exchange": "amq.topic", "routing_key": "a.b",
        "outcome": "routed", "reason": None,
        "deliveries": [{"subscriber": f"s{k}", "subscription_ids": [f"id{k}"]} for k in range(3)],
        "headers": {"k": "v"}, "payload_bytes": 100, "published_at": now,
    } for i in range(4)], ROUTED_ARROW)


def read_seconds(path: str) -> float:
    started = time.perf_counter()
    DeltaTable(path).to_pyarrow_table()
    return time.perf_counter() - started


def append_one(sink: AuditTables, batch_id: int) -> None:
    """Batch ``batch_id`` committed alone (one commit per batch: the worst case)."""
    sink.append_publishes([PublishBatch(batch_id, 1, datetime.now(timezone.utc), routed(batch_id))])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=1000)
    ap.add_argument("--folder", type=Path, default=None)
    args = ap.parse_args()
    folder = args.folder or Path(tempfile.mkdtemp(prefix="bitroute-maint-"))
    config = load(overrides={"delta.warehouse": str(folder / "delta"),
                             "streaming.checkpoint_dir": str(folder / "checkpoints")}, environ={})
    sink = AuditTables(config, "bench")
    sink.ensure()
    try:
        path = config.delta.table_path("deliveries")
        print(f"appending {args.batches} batches ...", flush=True)
        for batch_id in range(args.batches):
            append_one(sink, batch_id)
        before, read_before = table_stats(path), read_seconds(path)
        alone = []
        batch_id = args.batches
        for _ in range(20):
            started = time.perf_counter()
            append_one(sink, batch_id)
            alone.append(time.perf_counter() - started)
            batch_id += 1
        report_box = []
        thread = threading.Thread(target=lambda: report_box.append(maintain(config)))
        thread.start()
        during = []
        while thread.is_alive():
            started = time.perf_counter()
            append_one(sink, batch_id)
            during.append(time.perf_counter() - started)
            batch_id += 1
        thread.join()
        report = report_box[0]
        after, read_after = table_stats(path), read_seconds(path)
        later = []
        for _ in range(20):
            started = time.perf_counter()
            append_one(sink, batch_id)
            later.append(time.perf_counter() - started)
            batch_id += 1
        print("\n".join(maintenance_lines(report)))
        print(f"deliveries: data files {before.files} -> {after.files}, log entries "
              f"{before.log_entries} -> {after.log_entries}, full read {read_before:.2f}s -> "
              f"{read_after:.2f}s ({read_before / read_after:.1f}x)")
        print(f"append of one batch (both tables), median: alone {statistics.median(alone) * 1e3:.0f} ms,"
              f" during the pass {statistics.median(during) * 1e3:.0f} ms ({len(during)} appends, "
              f"{statistics.median(during) / statistics.median(alone):.1f}x), after it "
              f"{statistics.median(later) * 1e3:.0f} ms "
              f"({statistics.median(later) / statistics.median(alone):.2f}x)")
    finally:
        sink.close()
        if args.folder is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()

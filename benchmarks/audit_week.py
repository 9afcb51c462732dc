"""A week in an hour: the publish audit path after 100, 1k, 10k and 100k micro-batches.

    python -m benchmarks audit-week [--batches 100000] [--rate 100] [--workdir DIR]

Drives ``--batches`` micro-batches' audit (``--publishes`` publishes x
``--fanout`` deliveries each: 40 x 8 is a busy 100 ms trigger) through the
router's real audit path, with the maintenance running beside it, as fast as
a router running ``--speedup`` times faster than real time would:

- each batch goes through ``AuditCommitter.submit`` (the router's audit
  stage: the journal write, and the wait when the journal is full): its rows,
  as a batch routed in the driver, or with ``--tasks N`` the records of the
  audit files ``N`` routing tasks wrote first (``write_task_audit``, as a
  batch routed on the executors: a file per task, table and day);
- the committer group-commits the journal to ``messages`` and ``deliveries``
  every ``audit.commit_interval / speedup``;
- ``BackgroundMaintenance`` runs every ``audit.maintenance_interval / speedup``
  (compaction, vacuum, checkpoint, expired-log cleanup), with
  ``--file-retention`` and ``--log-retention`` (wall clock: short, so that
  the run reaches the steady state a router reaches after those durations);
- ``routed_at`` advances ``--simulated-span`` over the run, so the day
  partitions of a week of traffic appear.

At each milestone (100, 1k, 10k, 100k batches, and the last) it prints the
audit stage of the last 100 batches (median, p99), the last 20 group commits
(median, per table), the two look-ups a user runs (``bitroute audit
deliveries --subscriber S --since <an hour before the newest row>`` and
``bitroute audit messages --message-id M`` for a publish of the first batch,
each the installed command in a new process, as a user runs it), each
table's data files (in the table, and on disk) and ``_delta_log`` entries,
the journal and the process's RSS. The verdict compares the last milestone
with the first: the issue's target is at most 1.5x for the audit stage, and
<= 1 s for each look-up.

Runs by hand (not CI). Its own temporary folders; nothing outside them is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

MILESTONES = (100, 1_000, 10_000, 100_000)
REAL_BATCHES_PER_S = 10
"""A busy router at the default 100 ms trigger: what --speedup 1 means."""


def routed_batch(template: pa.Table, batch_id: int, publishes: int) -> pa.Table:
    """The template batch with its own message ids (``bench/0/<offset>``)."""
    first = batch_id * publishes
    ids = pa.array([f"bench/0/{first + i}" for i in range(publishes)], pa.string())
    return template.set_column(template.schema.get_field_index("message_id"), "message_id", ids)


def template_batch(publishes: int, fanout: int, subscribers: int) -> pa.Table:
    from streaming.router.batch.routing import ROUTED_ARROW

    now = datetime.now(UTC)
    return pa.Table.from_pylist([{
        "message_id": f"bench/0/{i}", "exchange": "amq.topic",
        "routing_key": f"sensors.d{i}.temperature", "outcome": "routed", "reason": None,
        "deliveries": [{"subscriber": f"s{(i * fanout + j) % subscribers}",
                        "subscription_ids": [f"sub-{(i * fanout + j) % subscribers}"]}
                       for j in range(fanout)],
        "headers": {"unit": "celsius"}, "payload_bytes": 120, "published_at": now,
    } for i in range(publishes)], schema=ROUTED_ARROW)


def task_files_batch(config, batch_id: int, routed_at: datetime, routed: pa.Table,
                     tasks: int):
    """``routed`` as ``tasks`` routing tasks write it (``write_task_audit`` on a slice each,
    the executors' path): the :class:`~streaming.audit.writer.FileBatch` the driver journals."""
    from streaming.audit.writer import FileBatch
    from streaming.router.batch.delivery import ProducerSettings
    from streaming.router.batch.routing import RouteSettings, TaskAudit, write_task_audit

    settings = RouteSettings("amq.topic", config.kafka.layout, "rejected", 1, False,
                             ProducerSettings("127.0.0.1:1", 1 << 20),
                             TaskAudit(config.delta, batch_id, routed_at,
                                       frozenset({"messages", "deliveries"})))
    step = -(-routed.num_rows // tasks)
    rows = [write_task_audit(routed.slice(i, step), settings)
            for i in range(0, routed.num_rows, step)]
    files = pa.Table.from_struct_array(pa.concat_arrays([r.column("files").flatten() for r in rows]))
    return FileBatch(batch_id, 1, routed_at, files, routed.num_rows)


def timed_command(args: list[str]) -> tuple[float, int]:
    """Seconds the command took, and the rows its ``--json`` output held."""
    started = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"audit_week: {' '.join(args[:3])} failed: {done.stderr.strip()}")
    return seconds, sum(1 for line in done.stdout.splitlines() if line.strip())


def rss_mb() -> float:
    """This process's resident memory now, in MB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def table_files(path: Path) -> tuple[int, int, int]:
    """(data files in the table's current version, parquet files on disk, _delta_log entries)."""
    from deltalake import DeltaTable

    active = len(DeltaTable(str(path)).file_uris())
    on_disk = sum(1 for p in path.rglob("*.parquet") if "_delta_log" not in p.parts)
    log = sum(1 for p in (path / "_delta_log").iterdir() if not p.name.startswith("."))
    return active, on_disk, log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=100.0,
                        help="batches per second to drive (default 100: a 10x speed-up of a "
                             "busy router's 10 batches/s)")
    parser.add_argument("--publishes", type=int, default=40)
    parser.add_argument("--fanout", type=int, default=8)
    parser.add_argument("--subscribers", type=int, default=200)
    parser.add_argument("--simulated-span", type=float, default=7.0,
                        help="days of routed_at the run covers (default 7)")
    parser.add_argument("--file-retention", default="2 minutes")
    parser.add_argument("--log-retention", default="10 minutes")
    parser.add_argument("--tasks", type=int, default=0,
                        help="write each batch as this many routing tasks' audit files (the "
                             "executors' path); 0 (default): journal its rows (the driver's)")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--smoke", action="store_true", help="toy size, seconds (what CI runs)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.batches, args.rate, args.publishes, args.subscribers = 200, 1000.0, 10, 20

    from streaming import config as bitroute_config
    from streaming.audit.committer import AuditCommitter
    from streaming.audit.journal import AuditJournal
    from streaming.audit.maintenance import BackgroundMaintenance
    from streaming.audit.writer import AuditTables, PublishBatch, writer_properties
    from streaming.state.checkpoint import CheckpointLayout

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bitroute-week-"))
    speedup = args.rate / REAL_BATCHES_PER_S
    defaults = bitroute_config.AuditConfig()
    overrides = {
        "delta.warehouse": str(workdir / "delta"),
        "streaming.checkpoint_dir": str(workdir / "checkpoints"),
        "audit.commit_interval": f"{defaults.commit_interval_s / speedup} seconds",
        "audit.maintenance_interval": f"{max(1.0, defaults.maintenance_interval_s / speedup)} seconds",
        "audit.file_retention": args.file_retention,
        "audit.log_retention": args.log_retention,
    }
    config = bitroute_config.load(overrides=overrides, environ={})
    set_flags = [flag for key, value in overrides.items() for flag in ("--set", f"{key}={value}")]
    bitroute = str(Path(sys.executable).with_name("bitroute"))
    print(f"audit_week: {args.batches:,} batches of {args.publishes} publishes x {args.fanout} "
          f"deliveries at {args.rate:g} batches/s ({speedup:g}x a router's {REAL_BATCHES_PER_S}/s); "
          f"commit every {config.audit.commit_interval}, maintenance every "
          f"{config.audit.maintenance_interval}, file retention {args.file_retention}, log "
          f"retention {args.log_retention}; {args.simulated_span:g} simulated days; "
          f"{f'{args.tasks} task files per table and batch' if args.tasks else 'rows journaled'}; "
          f"in {workdir}",
          flush=True)

    tables = AuditTables(config, "week")
    tables.ensure()
    commit_seconds: dict[str, deque[float]] = {"rounds": deque(maxlen=20)}
    append = tables.append_publishes

    def timed_append(batches):
        started = time.monotonic()
        append(batches)
        commit_seconds["rounds"].append(time.monotonic() - started)

    # Timed on this instance only (mypy calls an instance attribute over a method an assignment to it).
    tables.append_publishes = timed_append  # type: ignore[method-assign]
    journal = AuditJournal(CheckpointLayout.of(workdir / "checkpoints").audit_journal)
    committer = AuditCommitter(tables, journal, config.audit.commit_interval_s,
                               config.audit.max_pending_batches)
    committer.recover()
    committer.start()
    maintenance = BackgroundMaintenance(config, writer_properties=writer_properties)
    passes: list[float] = []
    maintenance.listeners.append(lambda report: passes.append(report.seconds))
    maintenance.start()

    template = template_batch(args.publishes, args.fanout, args.subscribers)
    stage: deque[float] = deque(maxlen=100)
    span = timedelta(days=args.simulated_span)
    start_at = datetime.now(UTC) - span
    step = span / args.batches
    milestones = sorted({m for m in MILESTONES if m <= args.batches} | {args.batches})
    results: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        for batch_id in range(args.batches):
            due = started + batch_id / args.rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            routed_at = start_at + step * batch_id
            routed = routed_batch(template, batch_id, args.publishes)
            batch = (task_files_batch(config, batch_id, routed_at, routed, args.tasks) if args.tasks
                     else PublishBatch(batch_id, 1, routed_at, routed))
            begun = time.monotonic()
            committer.submit(batch)
            stage.append(time.monotonic() - begun)
            done = batch_id + 1
            if done % 5_000 == 0 and done not in milestones:
                print(f"  ... {done:,} batches, {time.monotonic() - started:.0f}s, "
                      f"{committer.pending_batches} pending", file=sys.stderr, flush=True)
            if done not in milestones:
                continue
            newest = routed_at
            since = (newest - timedelta(hours=1)).isoformat()
            deliveries_s, deliveries_rows = timed_command(
                [bitroute, "audit", "deliveries", "--subscriber", "s7", "--since", since, "--json",
                 *set_flags])
            messages_s, messages_rows = timed_command(
                [bitroute, "audit", "messages", "--message-id", "bench/0/3", "--json", *set_flags])
            files = {name: table_files(Path(config.delta.table_path(name)))
                     for name in ("messages", "deliveries")}
            row = {
                "batches": done, "elapsed_s": round(time.monotonic() - started, 1),
                "stage_median_ms": round(statistics.median(stage) * 1000, 2),
                "stage_p99_ms": round(sorted(stage)[int(len(stage) * 0.99) - 1] * 1000, 2),
                "commit_median_ms": round(statistics.median(commit_seconds["rounds"]) * 1000, 1)
                if commit_seconds["rounds"] else None,
                "pending": committer.pending_batches,
                "query_deliveries_s": round(deliveries_s, 3), "query_deliveries_rows": deliveries_rows,
                "query_message_s": round(messages_s, 3), "query_message_rows": messages_rows,
                "files": files, "maintenance_passes": len(passes),
                "rss_mb": rss_mb(),
            }
            results.append(row)
            print(f"{done:>7,} batches  audit stage {row['stage_median_ms']:.2f} ms "
                  f"(p99 {row['stage_p99_ms']:.2f})  group commit {row['commit_median_ms']} ms  "
                  f"--since 1h {deliveries_s:.2f}s ({deliveries_rows} rows)  --message-id "
                  f"{messages_s:.2f}s ({messages_rows})  files/on disk/log: "
                  + "  ".join(f"{n} {a}/{d}/{lg}" for n, (a, d, lg) in files.items())
                  + f"  passes {len(passes)}  RSS {row['rss_mb']} MB", flush=True)
    finally:
        maintenance.stop()
        committer.stop()
        tables.close()
    first, last = results[0], results[-1]
    ratio = last["stage_median_ms"] / first["stage_median_ms"]
    print(f"verdict: audit stage {ratio:.2f}x from {first['batches']:,} to {last['batches']:,} "
          f"batches (target <= 1.5x); look-ups at the end {last['query_deliveries_s']:.2f}s and "
          f"{last['query_message_s']:.2f}s (target <= 1 s); maintenance passes "
          f"{len(passes)}, median {statistics.median(passes) if passes else 0:.2f}s", flush=True)
    (workdir / "audit_week.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"samples: {workdir / 'audit_week.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

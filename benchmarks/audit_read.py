"""How fast ``bitroute audit`` hands rows back: one subscriber's deliveries at 10k, 100k, 1M rows.

    python -m benchmarks audit-read [--rows 10000 100000 1000000] [--files 2000]
                                    [--baseline DIR] [--workdir DIR]

For each size it builds a ``deliveries`` table with the audit writer's own
code (``AuditTables.append_publishes``: one commit, hence one Parquet file per
day, per micro-batch, as a router on small batches leaves them until the
maintenance compacts them): ``--files`` batches (fewer at small sizes: at
least 25 rows of the subscriber per batch), one second of ``routed_at``
apart, each publish delivered to the subscriber ``s7`` and to one other, so
the query keeps half of what it scans, and checkpoints the tables (as the
maintenance does). Then it runs ``bitroute audit deliveries --subscriber s7
--json`` and the table form, each the command in a new process as a user
runs it (``python -m streaming.cli``, so that ``PYTHONPATH`` picks the code),
stdout read from a pipe a megabyte at a time and dropped: seconds to the end
(rows/s) and to the first line; and ``--json --limit 100`` (the newest hundred).

``--baseline DIR`` runs the same commands with ``PYTHONPATH=DIR`` as well (a
checkout of an earlier commit, e.g. ``git archive <commit> streaming schemas conf |
tar -x -C DIR``), in the same run on the same tables: the before and after.
The tables are kept in ``--workdir`` and reused when it already holds them.

Runs by hand (not CI); each command is bounded by ``--timeout``.
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import pyarrow as pa

SUBSCRIBER = "s7"


def build(warehouse: Path, rows: int, files: int) -> int:
    """A deliveries table in ``warehouse`` with ``rows`` rows of :data:`SUBSCRIBER` (as many
    of others) in up to ``files`` micro-batches; the number of batches written."""
    from streaming import config as bitroute_config
    from streaming.audit.writer import AuditTables, PublishBatch
    from streaming.router.batch.routing import ROUTED_ARROW

    batches = max(1, min(files, rows // 25))
    per_batch = -(-rows // batches)
    config = bitroute_config.load(overrides={"delta.warehouse": str(warehouse)}, environ={})
    tables = AuditTables(config, "bench")
    tables.ensure()
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=batches)
    delivery_type = ROUTED_ARROW.field("deliveries").type
    written = 0
    try:
        for batch_id in range(batches):
            n = min(per_batch, rows - written)
            if n <= 0:
                break
            first = written
            routed_at = start + timedelta(seconds=batch_id)
            routed = pa.table({
                "message_id": pa.array([f"bench/0/{first + i}" for i in range(n)]),
                "exchange": pa.array(["amq.topic"] * n),
                "routing_key": pa.array([f"sensors.d{(first + i) % 1000}.temperature"
                                         for i in range(n)]),
                "outcome": pa.array(["routed"] * n),
                "reason": pa.nulls(n, pa.string()),
                "deliveries": pa.array([[{"subscriber": SUBSCRIBER, "subscription_ids": ["sub-7"]},
                                         {"subscriber": f"s{(first + i) % 100 + 100}",
                                          "subscription_ids": ["sub-x", "sub-y"]}]
                                        for i in range(n)], delivery_type),
                "headers": pa.array([[("unit", "celsius")]] * n,
                                    ROUTED_ARROW.field("headers").type),
                "payload_bytes": pa.array([120] * n, pa.int32()),
                "published_at": pa.array([routed_at - timedelta(milliseconds=5)] * n,
                                         ROUTED_ARROW.field("published_at").type),
                "alternate_exchange": pa.nulls(n, pa.string()),
            }, schema=ROUTED_ARROW)
            tables.append_publishes([PublishBatch(batch_id, 1, routed_at, routed)])
            written += n
    finally:
        tables.close()
    checkpoint(warehouse)
    return batches


def compacted(warehouse: Path) -> Path:
    """A copy of ``warehouse`` after one pass of the router's maintenance (compaction into
    ``audit.target_file_size`` files, checkpoint), made once and kept beside it."""
    import shutil

    from streaming import config as bitroute_config
    from streaming.audit.maintenance import maintain

    copy = warehouse.with_name(warehouse.name + "-compacted")
    if not (copy / "deliveries" / "_delta_log").exists():
        shutil.copytree(warehouse, copy)
        config = bitroute_config.load(
            overrides={"delta.warehouse": str(copy),
                       "streaming.checkpoint_dir": str(copy / "checkpoints")}, environ={})
        report = maintain(config, tables=["deliveries"], record=False)
        if not report.ok:
            raise SystemExit(f"audit_read: compaction of {copy} failed: {report.error}")
    return copy


def checkpoint(warehouse: Path) -> None:
    """A checkpoint of each publish table, as the maintenance leaves the tables of a
    running router: a query then reads the log from it, not from every commit."""
    from deltalake import DeltaTable

    for name in ("deliveries", "messages"):
        DeltaTable(str(warehouse / name)).create_checkpoint()


def timed(command: list[str], env: dict[str, str],
          timeout: float) -> tuple[float, float, int, float] | None:
    """(seconds to the command's end, seconds to its first line, bytes written, CPU
    seconds it used): its stdout read from a pipe a megabyte at a time and dropped; None
    when it ran out of time. The CPU seconds are the figure to compare on a busy machine,
    where the wall clock measures the other tenants as well."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    first = None
    size = 0
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=env) as process:
        # PIPEs: a buffered reader each (read1: what is there, for the first line's time).
        stdout, stderr = cast(io.BufferedReader, process.stdout), cast(io.BufferedReader, process.stderr)
        while chunk := stdout.read1(1 << 20):
            if first is None and b"\n" in chunk:
                first = time.monotonic() - started
            size += len(chunk)
            if time.monotonic() - started > timeout:
                process.kill()
                return None
        error = stderr.read().decode().strip()
    if process.returncode != 0:
        raise SystemExit(f"audit_read: {' '.join(command)} failed: {error}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return time.monotonic() - started, first or 0.0, size, cpu


def measure(rows: int, layout: str, warehouse: Path, code: dict[str, str],
            timeout: float) -> None:
    """Time the commands over the deliveries table of ``warehouse`` with each code."""
    from deltalake import DeltaTable

    files = len(DeltaTable(str(warehouse / "deliveries")).file_uris())
    print(f"{rows:>9,} rows{layout}: {files} files in the deliveries table", flush=True)
    base = [sys.executable, "-m", "streaming.cli", "audit", "deliveries", "--subscriber",
            SUBSCRIBER, "--set", f"delta.warehouse={warehouse}"]
    for name, path in code.items():
        env = {**os.environ, "PYTHONPATH": path}
        for form, extra in (("--json", ["--json"]), ("table", [])):
            measured = timed(base + extra, env, timeout)
            if measured is None:
                print(f"{rows:>9,} rows  {name:>3}  {form:<6}  over {timeout:g}s", flush=True)
                continue
            whole, first, size, cpu = measured
            print(f"{rows:>9,} rows  {name:>3}  {form:<6}  {whole:6.2f}s  "
                  f"{rows / whole:>9,.0f} rows/s  first line {first:5.2f}s  CPU {cpu:6.2f}s "
                  f"({rows / cpu:>9,.0f} rows per CPU s)  {size / 2**20:6.1f} MB", flush=True)
        if name == "new":
            measured = timed(base + ["--json", "--limit", "100"], env, timeout)
            if measured is not None:
                print(f"{rows:>9,} rows  {name:>3}  --json --limit 100  {measured[0]:6.2f}s  "
                      f"CPU {measured[3]:.2f}s", flush=True)


def breakdown(rows: int, layout: str, warehouse: Path) -> None:
    """Where the current code's CPU time goes, in this process (imports done): reading
    (to the first batch, and all of it) and writing the rows as JSON lines and as a table
    (the rendering alone, to memory)."""
    from streaming import config as bitroute_config
    from streaming.audit import queries
    from streaming.cli.render import TableText, json_lines

    config = bitroute_config.load(overrides={"delta.warehouse": str(warehouse)}, environ={})
    started = time.process_time()
    answer = queries.read(config, queries.AuditQuery("deliveries", subscriber=SUBSCRIBER))
    batches, first = [], None
    for batch in answer.batches:
        first = time.process_time() - started if first is None else first
        batches.append(batch)
    read = time.process_time() - started
    started = time.process_time()
    for batch in batches:
        json_lines(batch)
    as_json = time.process_time() - started
    started = time.process_time()
    text = TableText(answer.columns)
    for batch in batches:
        text.lines(batch)
    as_table = time.process_time() - started
    print(f"{rows:>9,} rows{layout}  new, in process: read {read:.2f} CPU s (first batch "
          f"{first or 0:.2f})  JSON {as_json:.2f} CPU s ({rows / as_json:,.0f} rows/s)  table "
          f"{as_table:.2f} CPU s ({rows / as_table:,.0f} rows/s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--files", type=int, default=2000,
                        help="micro-batches (files) per table at most (default 2000)")
    parser.add_argument("--baseline", type=Path,
                        help="a checkout of the code to compare with (put first on PYTHONPATH)")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--compacted", action="store_true",
                        help="also measure each table after a maintenance pass compacted it")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds a command may run (default 600)")
    parser.add_argument("--smoke", action="store_true", help="toy size, seconds (what CI runs)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rows, args.files, args.timeout = [1000], 20, 120.0

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bitroute-audit-read-"))
    code = {"new": os.environ.get("PYTHONPATH", "")}
    if args.baseline is not None:
        code = {"old": str(args.baseline.absolute()), **code}
    print(f"audit_read: {', '.join(f'{n:,}' for n in args.rows)} rows of {SUBSCRIBER}, at most "
          f"{args.files} files per table, in {workdir}", flush=True)
    for rows in args.rows:
        warehouse = workdir / f"rows-{rows}"
        if not (warehouse / "deliveries" / "_delta_log").exists():
            started = time.monotonic()
            batches = build(warehouse, rows, args.files)
            print(f"{rows:>9,} rows: built in {time.monotonic() - started:.0f}s "
                  f"({batches} batches, files of {rows // batches:,} rows of {SUBSCRIBER})",
                  flush=True)
        layouts = [("", warehouse)]
        if args.compacted:
            layouts.append((" compacted", compacted(warehouse)))
        for layout, where in layouts:
            measure(rows, layout, where, code, args.timeout)
            breakdown(rows, layout, where)
    return 0


if __name__ == "__main__":
    sys.exit(main())

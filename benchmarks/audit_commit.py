"""The audit stage of one batch as the tables grow, before and after the journal (issue 18).

    python -m benchmarks.audit_commit [--batches 3000] [--group 20] [--workdir DIR]
    python -m benchmarks.audit_commit --bloom [--rows 2000000]

Batches of 40 publishes x 8 deliveries (a busy 100 ms trigger), routed_at
spread over the last ``--hours`` hours. Three figures at 10 and at
``--batches`` earlier batches:

- before: ``AuditTables.append_batch`` of the merge base with main (the
  synchronous delta-rs append of both tables per batch, post-commit hooks on),
  run in a child process on that commit's own files (``git archive``);
- after: the audit stage now, the journal write (``AuditCommitter.submit``);
- after: one group commit of ``--group`` journaled batches (what the committer
  does every ``audit.commit_interval``: 20 batches = 2 s at 10 batches/s),
  post-commit hooks off (the maintenance checkpoints).

Then ``bitroute audit deliveries --subscriber S --since <an hour ago> --json``
(the installed command, a new process each time) on both tables.

``--bloom`` instead measures a message-id look-up on one large file of
``--rows`` deliveries in row groups of 100,000, ids in random order (as after
a compaction), with and without a Parquet bloom filter on ``message_id``.

Medians of ``--repeat`` samples; the machine is shared, figures are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
BITROUTE = Path(sys.executable).with_name("bitroute")
PUBLISHES, FANOUT = 40, 8


def routed(batch_id: int) -> pa.Table:
    from streaming.router.routing import ROUTED_ARROW

    now = datetime.now(timezone.utc)
    return pa.Table.from_pylist([{
        "message_id": f"bench/0/{batch_id * PUBLISHES + i}", "exchange": "amq.topic",
        "routing_key": "sensors.k.temp", "outcome": "routed", "reason": None,
        "deliveries": [{"subscriber": f"s{(i + j) % 64}", "subscription_ids": [f"sub-{j}"]}
                       for j in range(FANOUT)],
        "headers": {"trace": "t"}, "payload_bytes": 100, "published_at": now,
    } for i in range(PUBLISHES)], schema=ROUTED_ARROW)


def routed_at(batch_id: int, batches: int, hours: float) -> datetime:
    """Batch times spread evenly over the last ``hours``, the last batch now."""
    return datetime.now(timezone.utc) - timedelta(hours=hours * (1 - batch_id / batches))


def _ms(seconds: list[float]) -> str:
    return f"{statistics.median(seconds) * 1000:.1f} ms"


def config(root: Path):
    from streaming.config import Config, DeltaConfig, StreamingConfig

    return Config(delta=DeltaConfig(warehouse=str(root / "delta")),
                  streaming=StreamingConfig(checkpoint_dir=root / "checkpoints"))


def run_before(root: Path, batches: int, repeat: int, hours: float) -> dict:
    """In the child process on the merge base's files: append_batch per batch, timed
    after 10 earlier batches (a fresh table) and after ``batches`` (a table filled to
    that; one left by an interrupted run is continued, not refilled)."""
    from streaming.audit import writer as delta_sink

    print(f"before: streaming.audit.writer from {delta_sink.__file__}", file=sys.stderr)
    samples: dict[str, list[float]] = {}
    for mark, folder in ((10, root / "at-10"), (batches, root)):
        tables = delta_sink.AuditTables(config(folder), "bench")
        tables.ensure()
        done = tables._table("messages").transaction_version("bitroute-bench-publishes")
        batch_id = 0 if done is None else done + 1
        while batch_id < mark:
            tables.append_batch(routed(batch_id), 1, batch_id, routed_at(batch_id, batches, hours))
            batch_id += 1
        taken = []
        for _ in range(repeat):
            start = time.perf_counter()
            tables.append_batch(routed(batch_id), 1, batch_id, routed_at(batch_id, batches, hours))
            taken.append(time.perf_counter() - start)
            batch_id += 1
        samples[str(mark)] = taken
        print(f"before: {mark:,} batches: append_batch {_ms(taken)}", file=sys.stderr)
        tables.close()
    return samples


def run_after(root: Path, batches: int, group: int, repeat: int, hours: float) -> dict:
    from streaming.audit.committer import AuditCommitter
    from streaming.audit.journal import AuditJournal
    from streaming.audit.writer import AuditTables, PublishBatch

    tables = AuditTables(config(root), "bench")
    tables.ensure()
    committer = AuditCommitter(tables, AuditJournal(root / "journal"), 2.0, 10 * group)
    committer.recover()
    result: dict[str, dict[str, list[float]]] = {}
    batch_id = 0

    def submit(timed: list[float] | None) -> None:
        nonlocal batch_id
        batch = PublishBatch(batch_id, 1, routed_at(batch_id, batches, hours), routed(batch_id))
        start = time.perf_counter()
        committer.submit(batch)
        if timed is not None:
            timed.append(time.perf_counter() - start)
        batch_id += 1

    for target in (10, batches):
        while batch_id < target:
            submit(None)
            if committer.pending_batches >= group:
                committer.flush()
        committer.flush()
        journal, commits = [], []
        for _ in range(repeat):
            for _ in range(group):
                submit(journal)
            start = time.perf_counter()
            committer.flush()
            commits.append(time.perf_counter() - start)
        result[str(target)] = {"journal": journal, "commit": commits}
        print(f"after: {target:,} batches: journal write {_ms(journal)}, group commit of "
              f"{group} batches {_ms(commits)}", file=sys.stderr)
    tables.close()
    return result


def query(root: Path, repeat: int) -> list[float]:
    since = (datetime.now(timezone.utc) - timedelta(hours=1)).isoformat()
    taken = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = subprocess.run([str(BITROUTE), "audit", "deliveries", "--subscriber", "s7",
                              "--since", since, "--json",
                              "--set", f"delta.warehouse={root / 'delta'}"],
                             capture_output=True, text=True, timeout=300, check=True)
        taken.append(time.perf_counter() - start)
    rows = len(out.stdout.splitlines())
    print(f"query on {root.name}: {_ms(taken)} ({rows} rows)", file=sys.stderr)
    return taken


def files(root: Path) -> dict[str, int]:
    table = root / "delta" / "deliveries"
    return {"data_files": sum(1 for _ in table.rglob("*.parquet")),
            "log_files": sum(1 for _ in (table / "_delta_log").iterdir())}


def bloom(rows: int, repeat: int, workdir: Path) -> None:
    from deltalake import (
        BloomFilterProperties,
        ColumnProperties,
        DeltaTable,
        QueryBuilder,
        WriterProperties,
        write_deltalake,
    )

    ids = [f"bench/{i % 16}/{i}" for i in range(rows)]
    random.Random(1).shuffle(ids)
    now = datetime.now(timezone.utc)
    data = pa.table({"message_id": ids, "subscriber": [f"s{i % 64}" for i in range(rows)],
                     "routed_at": pa.array([now] * rows, pa.timestamp("us", "UTC"))})
    wanted = ids[rows // 2]
    for name, props in (("plain", WriterProperties(max_row_group_size=100_000)),
                        ("bloom", WriterProperties(max_row_group_size=100_000, column_properties={
                            "message_id": ColumnProperties(
                                bloom_filter_properties=BloomFilterProperties(
                                    True, fpp=0.01, ndv=100_000))}))):
        path = workdir / f"bloom-{name}" / "deliveries"
        write_deltalake(path, data, writer_properties=props)
        delta = DeltaTable(path)
        taken = []
        for _ in range(repeat):
            start = time.perf_counter()
            found = pa.table(QueryBuilder().register("d", delta).execute(
                f"SELECT * FROM d WHERE message_id = '{wanted}'"))
            taken.append(time.perf_counter() - start)
        size = sum(p.stat().st_size for p in path.rglob("*.parquet"))
        print(f"bloom: {name}: {rows:,} rows, {size / 1e6:.1f} MB, message-id look-up "
              f"{_ms(taken)} ({found.num_rows} row)", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=3000)
    ap.add_argument("--group", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--hours", type=float, default=2.0,
                    help="routed_at spread over this many hours before now")
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--bloom", action="store_true")
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--before-child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.before_child:
        result = run_before(args.before_child, args.batches, args.repeat, args.hours)
        print(json.dumps(result))
        return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="audit-commit-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if args.bloom:
        bloom(args.rows, args.repeat, workdir)
        return 0

    base = subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.strip()
    old = workdir / "main-src"
    old.mkdir(exist_ok=True)
    archive = subprocess.run(["git", "archive", base, "streaming", "schemas"], cwd=REPO,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
    here = Path(__file__).resolve()
    argv = [str(here), "--before-child", str(workdir / "before"), "--batches",
            str(args.batches), "--repeat", str(args.repeat), "--hours", str(args.hours)]
    # The merge base's streaming/ and schemas/ first on the path, this file run as main.
    child = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.argv = {argv!r}; "
         f"sys.path.insert(0, {str(old)!r}); sys.path.insert(1, {str(REPO)!r}); "
         "import runpy; runpy.run_path(sys.argv[0], run_name='__main__')"],
        capture_output=True, text=True, timeout=3600, check=False)
    sys.stderr.write(child.stderr)
    if child.returncode:
        return child.returncode
    before = json.loads(child.stdout.splitlines()[-1])
    after = run_after(workdir / "after", args.batches, args.group, args.repeat, args.hours)
    q_before = query(workdir / "before", args.repeat)
    q_after = query(workdir / "after", args.repeat)
    print(f"merge base {base[:7]}; {PUBLISHES} publishes x {FANOUT} deliveries per batch; "
          f"medians of {args.repeat}; noisy shared machine")
    print("| earlier batches | before: append_batch | after: journal write | after: group commit "
          f"of {args.group} batches |")
    print("| --- | --- | --- | --- |")
    for mark in ("10", str(args.batches)):
        print(f"| {int(mark):,} | {_ms(before[mark])} | {_ms(after[mark]['journal'])} | "
              f"{_ms(after[mark]['commit'])} |")
    print(f"`bitroute audit deliveries --subscriber s7 --since <1 h ago> --json` after "
          f"{args.batches:,} batches: before {_ms(q_before)} ({files(workdir / 'before')}), "
          f"after {_ms(q_after)} ({files(workdir / 'after')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

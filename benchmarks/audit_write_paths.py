"""The two ways executors can write a batch's audit, per batch, on this machine (issue 28).

    python -m benchmarks audit-write [--publishes 1000,30000] [--fanout 10]
                                           [--tasks 2] [--batches 5]

- ``delta-spark``: Delta Lake's own writer inside foreachBatch: the routed rows as a
  cached DataFrame over ``--tasks`` partitions (what the routing tasks return),
  ``messages`` and ``deliveries`` derived with Spark SQL and appended with
  ``txnAppId``/``txnVersion`` (the executors write the files, the driver commits the log
  entry), one Spark job and one Delta commit per table per batch.
- ``task-files`` (what the router does): each of ``--tasks`` slices written by
  :func:`streaming.router.batch.routing.write_task_audit` (what a routing task runs after
  Kafka's acks; :func:`benchmarks.audit_week.task_files_batch`), then the driver's commit of the files' records
  (:meth:`streaming.audit.writer.AuditTables.append_publishes`, one transaction per
  table).

Both in local mode on one machine, into fresh tables under a temporary folder. Printed
per path and batch size: the median wall time per batch, the CPU seconds per batch of the
whole process tree (this Python process and its Spark JVM, which runs the local
executors), and for ``task-files`` the driver's part (the commit) alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

from benchmarks.audit_week import task_files_batch, template_batch
from benchmarks.e2e.procstat import children, cpu_seconds
from schemas.records import DELIVERIES, MESSAGES
from streaming.audit.writer import AuditTables
from streaming.config import load


def tree_cpu() -> float:
    """CPU seconds of this process and all its descendants (the Spark JVM)."""
    pids, todo = [], [os.getpid()]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(children(pid))
    return sum(cpu_seconds(p) for p in pids)


def task_files(folder: Path, routed: pa.Table, tasks: int, batches: int) -> dict[str, float]:
    config = load(overrides={"delta.warehouse": str(folder / "delta"),
                             "streaming.checkpoint_dir": str(folder / "cp")}, environ={})
    tables = AuditTables(config, "bench")
    tables.ensure()
    walls, cpus, driver = [], [], []
    for batch_id in range(1, batches + 1):
        cpu, start = tree_cpu(), time.perf_counter()
        batch = task_files_batch(config, batch_id, datetime.now(UTC), routed, tasks)
        commit = time.perf_counter()
        tables.append_publishes([batch])
        end = time.perf_counter()
        walls.append(end - start)
        driver.append(end - commit)
        cpus.append(tree_cpu() - cpu)
    tables.close()
    return {"wall": _timed(walls), "cpu": _timed(cpus), "driver_wall": _timed(driver)}


def delta_spark(folder: Path, routed: pa.Table, tasks: int, batches: int) -> dict[str, float]:
    from pyspark.sql import functions as F

    from streaming.audit.sql import DELTA_SETTINGS
    from streaming.session import spark_session

    config = load(overrides={"delta.warehouse": str(folder / "delta"),
                             "streaming.checkpoint_dir": str(folder / "cp"),
                             "spark.master": f"local[{tasks}]", "spark.log_level": "ERROR"},
                  environ={})
    spark = spark_session(config, "delta", DELTA_SETTINGS)
    frame = spark.createDataFrame(routed).repartition(tasks).cache()
    frame.count()
    walls, cpus = [], []
    for batch_id in range(1, batches + 1):
        cpu, start = tree_cpu(), time.perf_counter()
        routed_at = F.lit(datetime.now(UTC)).cast("timestamp")
        messages = frame.select(
            "message_id", "exchange", "routing_key", "outcome",
            F.size("deliveries").alias("deliveries"), "reason", "headers", "payload_bytes",
            F.lit(1).cast("long").alias("snapshot_version"),
            F.lit(batch_id).cast("long").alias("batch_id"), "published_at",
            routed_at.alias("routed_at"), F.to_date(routed_at).alias("routed_date"))
        deliveries = frame.select(
            "message_id", "exchange", "routing_key", "published_at",
            F.explode("deliveries").alias("d")).select(
            "message_id", F.col("d.subscriber").alias("subscriber"),
            F.col("d.subscription_ids").alias("subscription_ids"), "exchange", "routing_key",
            F.concat(F.lit("bitroute.deliveries."), F.col("d.subscriber")).alias("delivery_topic"),
            F.lit(1).cast("long").alias("snapshot_version"),
            F.lit(batch_id).cast("long").alias("batch_id"), "published_at",
            routed_at.alias("routed_at"), F.to_date(routed_at).alias("routed_date"))
        for name, rows in ((MESSAGES, messages), (DELIVERIES, deliveries)):
            (rows.write.format("delta").mode("append").partitionBy("routed_date")
             .option("txnAppId", "bench-publishes").option("txnVersion", batch_id)
             .save(str(folder / "delta" / name)))
        walls.append(time.perf_counter() - start)
        cpus.append(tree_cpu() - cpu)
    spark.stop()
    return {"wall": _timed(walls), "cpu": _timed(cpus)}


def _timed(seconds: list[float]) -> float:
    """The median over the batches after the first, which warms up (imports, table loads,
    the JVM's JIT) and is not counted; the first alone when it is all there is (``--smoke``)."""
    return statistics.median(seconds[1:] or seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--publishes", default="1000,30000",
                        help="comma-separated batch sizes in publishes (default 1000,30000)")
    parser.add_argument("--fanout", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--batches", type=int, default=5, help="timed batches per path and size")
    parser.add_argument("--smoke", action="store_true",
                        help="toy size, seconds (what CI runs): one batch of 100 publishes per "
                             "path, the warm-up one alone")
    args = parser.parse_args(argv)
    if args.smoke:
        args.publishes, args.batches = "100", 0
    results = []
    for publishes in (int(p) for p in args.publishes.split(",")):
        routed = template_batch(publishes, args.fanout, subscribers=200)
        with tempfile.TemporaryDirectory(prefix="bitroute-writepaths-") as tmp:
            files = task_files(Path(tmp) / "files", routed, args.tasks, args.batches + 1)
            spark = delta_spark(Path(tmp) / "spark", routed, args.tasks, args.batches + 1)
        results.append((publishes, files, spark))
        print(f"{publishes:>7,} publishes, {publishes * args.fanout:>9,} deliveries per batch: "
              f"task-files {files['wall']:.3f} s wall, {files['cpu']:.2f} CPU s "
              f"(driver's commit {files['driver_wall']:.3f} s); delta-spark "
              f"{spark['wall']:.3f} s wall, {spark['cpu']:.2f} CPU s; delta-spark / task-files: "
              f"{spark['wall'] / files['wall']:.1f}x wall, {spark['cpu'] / files['cpu']:.1f}x CPU",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

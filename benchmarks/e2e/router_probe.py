"""Run the router as ``bitroute run`` does, printing each batch's report as JSON.

Each batch prints ``PROBE {json}`` on stdout: the router's own
:class:`streaming.router.report.BatchReport` (id, publishes, deliveries, version,
seconds) with its per-stage split (``catch_up``: the changelog catch-up,
compile, snapshot and subscriptions audit; ``route``: the Spark job that reads
the publishes, matches them in the Python workers and produces every delivery
to Kafka, acked; ``audit``: the Delta appends), and the wall-clock end. Usage:
``python -m benchmarks.e2e.router_probe [--config FILE] [--set section.key=value]...
[--timings DIR]``; SIGTERM stops after the current batch. ``--timings DIR`` runs
:class:`benchmarks.e2e.cycle_timing.TimedRouter` instead: ``DIAG`` lines of Spark's
own per-batch durations and of the whole ``foreachBatch`` call, and the routing calls'
steps in ``DIR`` (:mod:`benchmarks.e2e.cycle_timing`).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

from streaming.config import load, parse_set_flags
from streaming.router.report import BatchReport
from streaming.router.service import Router


def _print_probe(report: BatchReport) -> None:
    print("PROBE " + json.dumps({"batch": report.batch_id, "rows": report.rows,
                                 "deliveries": report.deliveries, "version": report.snapshot_version,
                                 "seconds": report.seconds, "end": time.time(), **report.stages}),
          flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="router_probe")
    parser.add_argument("--config")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--timings", help="time the batch cycle into this folder")
    args = parser.parse_args(argv)
    config = load(args.config, parse_set_flags(args.set))

    from streaming.cli.logs import configure_logging, quiet_kafka_client_logs
    from streaming.router.session import spark_session

    configure_logging()  # the router's logs on stderr, as `bitroute run` has them

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    spark = spark_session(config)
    quiet_kafka_client_logs(spark)
    if args.timings:
        from benchmarks.e2e.cycle_timing import SparkProgress, TimedRouter

        router = TimedRouter(config, spark, timings=args.timings)
        spark.streams.addListener(SparkProgress())
    else:
        router = Router(config, spark)
    router.report_listeners.append(_print_probe)
    t = time.time()
    query = router.start()
    print(f"STARTED {json.dumps({'open_s': time.time() - t, 'subscriptions': len(router.subscriptions), 'version': router.subscriptions.version})}",
          flush=True)
    return serve(router, query, stop)


def serve(router, query, stop) -> int:
    """Run ``router``'s started ``query`` until ``stop`` is set (0: stopped after the batch
    in progress) or the query ends on its own (1, its error on stderr)."""
    while not stop.is_set() and not query.awaitTermination(0.5):
        pass
    if stop.is_set():
        router.stop_after_current_batch()
        return 0
    router.stop()
    print(f"router query ended: {query.exception()}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())

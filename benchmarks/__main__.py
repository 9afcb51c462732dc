"""``python -m benchmarks <scenario> [options]``: every benchmark worth rerunning, by name.

    python -m benchmarks --list
    python -m benchmarks <scenario> --help
    python -m benchmarks [--bootstrap HOST:PORT] <scenario> [options] [--smoke]

Each scenario prints its figures (with the ratio to a baseline measured in the same
run where it has one) between two machine lines: the load average, the cores and
the commit (:func:`benchmarks.harness.print_machine`). ``--smoke`` runs it at toy size
in seconds: what CI runs (tests/benchmarks/test_scenarios.py), so that a scenario a
refactor broke fails the day it breaks. Today's figures and the command of each are
in docs/benchmarks.md. Scenarios start everything they use on loopback (the embedded
broker, ``bitroute run``, Spark) and stop it all when they end. ``--bootstrap HOST:PORT``
(or the environment variable ``BITROUTE_BENCH_BOOTSTRAP``): a running broker instead of
one of their own, their topics named apart (``bench-<pid>-<time>.*``) and deleted when
they end; what the CI smoke test does with its session broker, since a broker's start
was much of a toy-size run (a figure that measures the broker itself then leaves it out).
"""

from __future__ import annotations

import importlib
import os
import sys

from benchmarks.harness import BOOTSTRAP_ENV, delete_own_topics, print_machine

SCENARIOS: dict[str, tuple[str, str]] = {
    "compiler": ("benchmarks.compiler_bench",
                 "the routing index: build, load, cold match and the task's batch path "
                 "(match_columns) against a Python trie and the naive scan"),
    "route-task": ("benchmarks.e2e.route_task",
                   "one routing task alone (route_batch) producing to a real broker, no Spark"),
    "batch-cycle": ("benchmarks.batch_cycle",
                    "the router's micro-batch cycle: per-stage seconds of full batches "
                    "draining a backlog, from bitroute run --json"),
    "e2e": ("benchmarks.e2e.__main__",
            "end to end against its peers (Kafka Streams, RabbitMQ, Mosquitto): sustained "
            "rate, latency at 50% and 90%, time to the first routed publish"),
    "subscribe-latency": ("benchmarks.subscribe_latency",
                          "how soon a new subscription applies: subscribe, then at once a "
                          "publish it matches, timed to its delivery, per mode"),
    "soak": ("benchmarks.soak", "memory and state of a router over time at half its rate"),
    "audit-week": ("benchmarks.audit_week",
                   "a week in an hour: the audit path after 100 to 100k micro-batches"),
    "audit-write": ("benchmarks.audit_write_paths",
                    "the executors' audit write: task files (today's) against delta-spark"),
    "audit-read": ("benchmarks.audit_read", "bitroute audit's read of one subscriber's rows"),
    "subscriber-scale": ("benchmarks.subscriber_scale",
                         "topic per subscriber against the shared layout; 100k subscribers"),
    "driver-cost": ("benchmarks.driver_cost",
                    "the driver's CPU per delivery when the executors route (a Spark cluster)"),
    "replay": ("benchmarks.replay",
               "subscribe --since: replay rate against the live rate, live p99 beside a replay"),
    "pack-start": ("benchmarks.pack_start",
                   "the executors' packed environment: size, build, first task"),
    "passthrough": ("benchmarks.passthrough",
                    "Spark's own floor: a Kafka -> Kafka copy without Python, micro-batch and "
                    "Real-Time Mode, publish-to-receive p50/p99 (--bitroute: the router beside it)"),
    "retained-match": ("benchmarks.retained_match",
                       "retained messages' reverse match at 1M topics: trie walk against "
                       "per-level bitmaps"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    if argv[0] == "--list":
        width = max(map(len, SCENARIOS))
        for name, (_module, what) in SCENARIOS.items():
            print(f"{name:<{width}}  {what}")
        return 0
    if argv[0] == "--bootstrap" or argv[0].startswith("--bootstrap="):
        bootstrap, argv = ((argv[1] if len(argv) > 1 else ""), argv[2:]) \
            if argv[0] == "--bootstrap" else (argv[0].split("=", 1)[1], argv[1:])
        if not bootstrap or not argv:
            print("python -m benchmarks: error: --bootstrap takes HOST:PORT, then the scenario",
                  file=sys.stderr)
            return 2
        os.environ[BOOTSTRAP_ENV] = bootstrap
    name, rest = argv[0], argv[1:]
    if name not in SCENARIOS:
        print(f"python -m benchmarks: error: unknown scenario {name!r}; "
              f"choose from {', '.join(SCENARIOS)} (--list)", file=sys.stderr)
        return 2
    module = importlib.import_module(SCENARIOS[name][0])
    print(f"scenario {name}: python -m benchmarks {' '.join(argv)}", flush=True)
    print_machine("before")
    try:
        status = module.main(rest)
    finally:
        print_machine("after")
        delete_own_topics()
    return status or 0


if __name__ == "__main__":
    sys.exit(main())

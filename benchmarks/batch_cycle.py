"""The router's micro-batch cycle: where a full batch's seconds go.

    python -m benchmarks batch-cycle [--size 10k] [--backlog 100000] [--batch 20000]
                                     [--set section.key=value]... [--smoke]

The embedded broker and the real ``bitroute run --json`` (:mod:`benchmarks.harness`);
the devices workload's subscriptions (:mod:`benchmarks.workload`) written to the
changelog before the router starts, then a backlog of ``--backlog`` publishes produced
as fast as the load driver can (:mod:`benchmarks.e2e.kafka_load`), drained by batches of
``--batch`` publishes (``streaming.max_offsets_per_trigger``). From the router's own
batch reports: per full batch (after the first, which also pays the JIT and the
workers' start) the median seconds of each stage (``catch_up``: changelog, compile,
snapshot; ``route``: the Spark job that reads, matches and produces every delivery,
acked; ``audit``: the audit's submission) and of the whole batch, the share of the
batch each stage takes, and the sustained rate. Without ``--set``, the router routes
where its defaults say (``routed_in`` is printed); vary it with ``--set`` as an
operator would (e.g. ``streaming.driver_route_max_publishes=0``: on the executors).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import workload
from benchmarks.e2e import bitroute_run

STAGES = ("catch_up", "route", "audit")


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks batch-cycle", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(workload.SIZES), default="10k")
    ap.add_argument("--backlog", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=20_000, help="publishes per batch at most")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--smoke", action="store_true", help="toy size: 100 subscriptions, 1,000 publishes in batches of "
                                                         "500")
    args = ap.parse_args(argv)
    subscriptions = workload.SIZES[args.size]
    if args.smoke:
        subscriptions, args.backlog, args.batch = 100, 1000, 500
    w = workload.generate("devices", subscriptions, 1, min(args.backlog, 50_000))
    sets = [f"streaming.max_offsets_per_trigger={args.batch}", *args.set]
    with tempfile.TemporaryDirectory(prefix="bitroute-batch-cycle-") as folder:
        env = bitroute_run.Env(Path(folder), sets)
        try:
            env.bring_up(w, _log)
            phase = bitroute_run._saturate(env, w, args.backlog, 1, 1, _log)
        finally:
            env.stop()
    print(report(phase.batches, phase.publishes_per_s, phase.deliveries_per_s, args))
    return 0


def report(batches: list[dict], publishes_per_s: float, deliveries_per_s: float,
           args: argparse.Namespace) -> str:
    """The table of median stage seconds over the full batches after the first."""
    top = max((b["rows"] for b in batches), default=0)
    full = [b for b in batches if b["rows"] >= 0.9 * top][1:] or batches
    total = statistics.median(b["seconds"] for b in full)
    lines = [f"## batch cycle: {len(full)} full batches of {top:,} publishes "
             f"(--size {args.size} --backlog {args.backlog:,} --batch {args.batch:,}), "
             f"routed in the {', '.join(sorted({b['routed_in'] for b in full}))}", "",
             "| stage | median s | share of the batch |", "|---|---:|---:|"]
    for stage in STAGES:
        s = statistics.median(b.get(stage, 0.0) for b in full)
        lines.append(f"| {stage} | {s:.3f} | {s / total:.0%} |")
    lines += [f"| batch | {total:.3f} | 100% |", "",
              f"sustained: {publishes_per_s:,.0f} publishes/s, {deliveries_per_s:,.0f} deliveries/s"]
    return "\n".join(lines)

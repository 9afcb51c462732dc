"""Where a micro-batch's time goes, at given publish rates, for one or more router settings.

    python -m benchmarks.e2e.batch_cycle [--size 100k] [--rates 500,5500] [--warmup 5]
        [--measure 15] [--variant NAME:section.key=value,...]... [--rounds 1] [--workdir DIR]

One embedded Kafka broker on loopback and one changelog (the devices workload,
default layout) serve every run. Each variant (``default:`` when none is
given) is a router of its own (``router_probe --timings``: the real router,
timed from inside, :mod:`benchmarks.e2e.cycle_timing`) on its own publishes
topic and checkpoint; the variants run in turn, the order rotated each round.
For each rate the paced publishers and the delivery consumer of the e2e
harness measure publish-to-delivery latency (p50/p99), and every batch of the
measured window is split into:

- Spark's ``durationMs``: ``latestOffset``, ``getBatch``, ``queryPlanning``,
  ``walCommit`` (the offsets WAL), ``addBatch`` (the ``foreachBatch`` call),
  ``commitOffsets`` (the commit log), ``triggerExecution`` (the whole trigger),
  and the gap from one trigger's end to the next one's start;
- inside ``foreachBatch``: ``catch_up`` (the changelog and the pin),
  ``route`` split into ``launch`` (the Spark job submitted until the first
  routing call starts: job, stage, task and Python worker start), ``python``
  (the first call's start to the last call's end) and ``collect`` (the last
  call's end until the driver has the rows, ``toArrow``), ``audit`` (the
  journal write) and ``report`` (the report listeners);
- the routing calls' steps, summed over the batch's tasks: ``wait_in`` (rows
  from the JVM: the Kafka read), ``matcher``, ``plan`` (read, match, validate),
  ``records`` (the Kafka records built), ``produce``, ``flush`` (the acks),
  ``rows`` (result rows), ``wait_out``.

Printed: one table per rate, a column per variant (means over the window's
batches, ms), with the load average; ``<workdir>/batch_cycle.json`` holds
every batch. Run by hand; bound it with ``timeout``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

from benchmarks.e2e import bitroute_run, kafka_load, workload
from benchmarks.e2e.bitroute_run import Env, RouterProcess
from benchmarks.e2e.cycle_timing import read_route_timings
from benchmarks.e2e.workload import EXCHANGE
from streaming.config import load, parse_set_flags
from streaming.kafka.broker import EmbeddedBroker, free_port
from streaming.kafka.topics import ensure_router_topics

SPARK_STEPS = ("latestOffset", "getBatch", "queryPlanning", "walCommit", "addBatch",
               "commitOffsets", "triggerExecution")
CALL_STEPS = ("wait_in", "matcher", "plan", "records", "produce", "flush", "rows", "wait_out")


class CycleEnv(Env):
    """A router of its own on a shared broker (``bootstrap``), timed into ``folder/timings``."""

    def __init__(self, folder: Path, user_sets: list[str], bootstrap: str, name: str) -> None:
        super().__init__(folder, user_sets, name=name)
        self.bootstrap = bootstrap

    def start_broker(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "timings").mkdir(exist_ok=True)
        self.sets = ["broker.embedded=false", f"kafka.bootstrap={self.bootstrap}",
                     f"kafka.publishes_topic=bitroute.publishes.{self.folder.name}",
                     f"delta.warehouse={self.folder / 'delta'}",
                     f"streaming.checkpoint_dir={self.folder / 'checkpoints'}",
                     *(s for s in self.user_sets if not s.startswith("env."))]
        self.config = load(None, parse_set_flags(self.sets))
        ensure_router_topics(self.config)

    def start_router(self) -> dict:
        # A variant's "env.NAME=VALUE" items are the router process's environment.
        env = {s[4:].partition("=")[0]: s.partition("=")[2] for s in self.user_sets
               if s.startswith("env.")}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            self.router = RouterProcess(self.sets, self.folder / "router.log",
                                        args=("--timings", str(self.folder / "timings"))).start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return self.router.wait_started()


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def _stamp(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def split_batches(env: CycleEnv, probes: list[dict], window: tuple[float, float]) -> list[dict]:
    """One dict of figures (seconds) per batch that ended inside ``window`` and routed rows."""
    diags = env.router.diagnostics
    driver = {d["batch"]: d for d in diags if d["kind"] == "batch"}
    spark = {d["batch"]: d for d in diags if d["kind"] == "spark"}
    calls = read_route_timings(env.folder / "timings")
    rows = []
    for p in probes:
        b = p["batch"]
        if not p["rows"] or not window[0] <= p["end"] <= window[1] or b not in driver:
            continue
        d = driver[b]
        f = {"batch": b, "publishes": p["rows"], "deliveries": p["deliveries"],
             "routed_in": d["routed_in"], "foreachBatch": d["end"] - d["start"],
             "catch_up": p["catch_up"], "route": p["route"], "audit": p["audit"],
             "report": d["report"],
             **{"part." + k: v for k, v in d.get("parts", {}).items()}}
        route_start = d["start"] + p["catch_up"]
        route_end = route_start + p["route"]
        tasks = calls.get(b, [])
        if tasks:
            first, last = min(t["start"] for t in tasks), max(t["end"] for t in tasks)
            f.update(tasks=len(tasks), launch=first - route_start, python=last - first,
                     collect=route_end - last)
            for step in CALL_STEPS:
                f[step] = sum(c.get(step, 0.0) for t in tasks for c in t["calls"]) + (
                    sum(t["matcher"] for t in tasks) if step == "matcher" else 0.0)
            f["arrow_batches"] = sum(len(t["calls"]) for t in tasks)
        s = spark.get(b)
        if s is not None:
            for step in SPARK_STEPS:
                f["spark." + step] = s["durations"].get(step, 0) / 1000
            start = _stamp(s["timestamp"])
            nxt = spark.get(b + 1)
            if nxt is not None:
                f["gap_to_next"] = _stamp(nxt["timestamp"]) - (start + f["spark.triggerExecution"])
        rows.append(f)
    return rows


def measure(env: CycleEnv, w, rate: float, warmup: float, seconds: float, log) -> dict:
    probes0 = len(env.router.probes)
    load_before = _load()
    t_start = time.time()
    phase = bitroute_run._paced(env, w, rate, warmup, seconds, 1, 1, log)
    # The batches that ended after the warm-up: the window's publishes and the drain.
    window = (t_start + 10.0 + warmup, float("inf"))
    batches = split_batches(env, env.router.probes[probes0:], window)
    return {"rate": rate, "publishes_per_s": phase.publishes_per_s, "p50_ms": phase.p50_ms,
            "p99_ms": phase.p99_ms, "load_before": load_before, "load_after": _load(),
            "cores": phase.cores, "batches": batches}


def summary(result: dict) -> dict[str, float]:
    """Means over the batches (ms), plus the phase's figures."""
    b = result["batches"]
    keys = sorted({k for x in b for k, v in x.items() if isinstance(v, float)})
    out = {k: 1000 * statistics.fmean(x[k] for x in b if k in x) for k in keys}
    out["batches"] = len(b)
    out["publishes/batch"] = statistics.fmean(x["publishes"] for x in b) if b else 0
    out["in driver"] = sum(x["routed_in"] == "driver" for x in b)
    out["tasks/batch"] = statistics.fmean(x.get("tasks", 0) for x in b) if b else 0
    return out


ORDER = ("batches", "publishes/batch", "in driver", "tasks/batch", "spark.triggerExecution",
         "spark.latestOffset", "spark.getBatch", "spark.queryPlanning", "spark.walCommit",
         "spark.addBatch", "spark.commitOffsets", "gap_to_next", "foreachBatch", "catch_up",
         "part.changelog", "part.pin", "part.prune", "part.journal",
         "route", "launch", "python", "collect", "audit", "report", *CALL_STEPS)


def print_table(rate: float, results: dict[str, dict]) -> None:
    names = list(results)
    sums = {n: summary(results[n]) for n in names}
    print(f"\n## {rate:,.0f} publishes/s (means per batch, ms)")
    print("| | " + " | ".join(names) + " |")
    print("| --- |" + " ---: |" * len(names))
    for label, get in [("publishes/s", lambda r: f"{r['publishes_per_s']:,.0f}"),
                       ("p50 / p99 ms", lambda r: f"{r['p50_ms']:,.0f} / {r['p99_ms']:,.0f}"),
                       ("load average before / after", lambda r: f"{r['load_before']} / {r['load_after']}")]:
        print(f"| {label} | " + " | ".join(get(results[n]) for n in names) + " |")
    for key in ORDER:
        if any(key in sums[n] for n in names):
            print(f"| {key} | " + " | ".join(
                f"{sums[n][key]:,.1f}" if key in sums[n] else "" for n in names) + " |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="batch_cycle", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(workload.SIZES), default="100k")
    ap.add_argument("--profile", choices=sorted(workload.PROFILES), default="devices")
    ap.add_argument("--rates", default="500,5500", help="publishes/s, comma-separated")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--measure", type=float, default=15.0)
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME:section.key=value,... (repeatable; default one 'default:'); "
                         "an item env.NAME=VALUE sets the router process's environment")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args(argv)
    variants = {}
    for spec in args.variant or ["default:"]:
        name, _, sets = spec.partition(":")
        variants[name] = [s for s in sets.split(",") if s]
    rates = [float(r) for r in args.rates.split(",")]
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="batch-cycle-"))
    workdir.mkdir(parents=True, exist_ok=True)

    def log(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')} load {_load()}] {message}", flush=True)

    w = workload.generate(args.profile, workload.SIZES[args.size], 1, 20_000)
    broker = EmbeddedBroker(workdir / "kafka", "127.0.0.1", free_port(), free_port())
    broker.start()
    results: dict[float, dict[str, dict]] = {r: {} for r in rates}
    try:
        base = load(None, parse_set_flags([f"kafka.bootstrap={broker.bootstrap}",
                                           "broker.embedded=false"]))
        ensure_router_topics(base)
        kafka_load.load_changelog(base.kafka.client_settings, base.kafka.subscriptions_topic, w,
                                  EXCHANGE)
        log(f"{w.n:,} subscriptions in the changelog; variants {variants}")
        names = list(variants)
        for k in range(args.rounds):
            order = names[k % len(names):] + names[:k % len(names)]
            for name in order:
                run_name = f"{name}-{k}" if args.rounds > 1 else name
                env = CycleEnv(workdir / run_name, variants[name], broker.bootstrap, run_name)
                try:
                    env.start_broker()
                    started = env.start_router()
                    log(f"{run_name}: router up (open {started['open_s']:.1f}s)")
                    # Warm: the Python workers' and the driver's matchers and producers
                    # (1,000 topics' metadata), as the e2e harness warms up.
                    bitroute_run._paced(env, w, 2000, 2, 5, 1, 1, log)
                    bitroute_run._paced(env, w, 100, 1, 3, 1, 1, log)
                    log(f"{run_name}: warmed up")
                    for rate in rates:
                        r = measure(env, w, rate, args.warmup, args.measure, log)
                        results[rate][run_name] = r
                        (workdir / "batch_cycle.json").write_text(json.dumps(
                            {str(r): v for r, v in results.items()}, indent=1, default=str))
                        s = summary(r)
                        log(f"{run_name} at {rate:,.0f}/s: p50 {r['p50_ms']:,.0f} p99 "
                            f"{r['p99_ms']:,.0f} ms, {s['batches']} batches of "
                            f"{s['publishes/batch']:,.0f}, trigger "
                            f"{s.get('spark.triggerExecution', float('nan')):,.0f} ms")
                finally:
                    env.stop()
        for rate in rates:
            print_table(rate, results[rate])
        print(f"\nevery batch: {workdir / 'batch_cycle.json'}")
    finally:
        broker.stop()
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

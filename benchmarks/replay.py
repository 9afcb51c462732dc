"""Replay (``subscribe --since``): its rate against the live rate, and live latency beside it.

    python -m benchmarks replay [--publishes 1000000] [--rate 1000] [--seconds 30]
                                [--set section.key=value]... [--smoke]
    python -m benchmarks replay --workers 1,2 [--replays 4] [--publishes 50000] ...

The embedded broker and the real ``bitroute run --json`` (:mod:`benchmarks.harness`).
Three phases on one router:

1. **live**: a backlog of ``--publishes`` publishes (MQTT topics, one in ten
   ``hit/<n>``, the others ``miss/<n>``, 64-byte payloads), produced as fast as the load
   driver can, drained by the router with one live subscription ``hit/#`` (10% of the
   publishes match): the live rate in deliveries/s over its full batches
   (:func:`benchmarks.e2e.bitroute_run.full_batch_rates`);
2. **baseline latency**: ``--rate`` publishes/s to ``lat/<n>`` for ``--seconds``, each
   delivered to a subscriber of ``lat/#``: the publish-to-delivery latency's p50 and p99;
3. **replay**: the same load again while new subscriptions ``hit/#`` with ``since`` before
   the backlog (each for a subscriber of its own) replay the backlog one after the other,
   for the whole window: each replay's rate (deliveries per second, from its start to its
   last chunk, from ``router/replays.json``) and the live latency under it, as a ratio to
   the baseline (target: p99 within 1.25x).

``--workers 1,2`` runs, for each count in turn, on a Spark standalone cluster of that
many one-core workers (:func:`benchmarks.driver_cost.standalone_cluster`; every live batch
routed on the executors, ``streaming.driver_route_max_publishes=0``), with CPU sampled
per role (:class:`benchmarks.driver_cost.CpuTimeline`: the driver's Python and JVM, the
executors' JVMs and Python workers). The backlog's publishes (``hit/<n>``) all match
``--replays`` live subscriptions, and the phases are:

1. **live**: the backlog drained (``--replays`` deliveries per publish): the driver's CPU
   per million live deliveries;
2. **baseline latency** (as above), then 10 s without publishes: the idle driver's CPU
   per second, which the phases' rows also subtract (the driver's CPU above idle);
3. **replay alone**: ``--replays`` new subscriptions ``hit/#`` with ``since`` before the
   backlog, asked together (they share their reads): their deliveries/s from the first
   one's start to the last one's end, and the driver's CPU per million replayed
   deliveries and its share of the router's CPU (driver + executors) over that span;
4. **replay beside the live load**: rounds of ``--replays`` more while the latency
   window runs: the live p50/p99 against the baseline's.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import Producer

from benchmarks import harness
from benchmarks.e2e import bitroute_run, kafka_load
from benchmarks.workload import EXCHANGE, Workload
from streaming.router.replay.replay import ReplayLedger, state_path
from streaming.state.checkpoint import CheckpointLayout


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _subscribe(env: bitroute_run.Env, sub_id: str, subscriber: str, filter_: str,
               since: datetime | None = None) -> None:
    value = {"exchange": EXCHANGE, "subscriber": subscriber, "filter": filter_}
    if since is not None:
        value["since"] = since.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    producer = Producer({"bootstrap.servers": env.config.kafka.bootstrap})
    producer.produce(env.config.kafka.subscriptions_topic, json.dumps(value).encode(),
                     sub_id.encode())
    assert producer.flush(30) == 0


def _workload(topics: list[str]) -> Workload:
    return Workload("replay", 0, 0, [], topics, "replay benchmark")


def _latency(env: bitroute_run.Env, rate: float, seconds: float, idle: float = 5.0) -> dict:
    """``rate`` publishes/s to ``lat/<n>`` for ``seconds``: the latency to subscriber lat
    (its consumer ends ``idle`` seconds after the last delivery)."""
    start_at = time.time() + 3.0
    window = (start_at + 1.0, start_at + seconds)
    consumers, cout = kafka_load.start_consumers(
        env.config.kafka.client_settings, [env.config.kafka.layout.topic("lat")],
        env.delivery_partitions(), window, start_at + seconds + 120, 1, idle=idle)
    procs, pout, _ = kafka_load.start_publishers(
        env.config.kafka.client_settings, env.config.kafka.publishes_topic, EXCHANGE,
        _workload([f"lat/{i}" for i in range(10)]), rate, seconds, 1, start_at=start_at)
    kafka_load.join_publishers(procs, pout, timeout=seconds + 300)
    return kafka_load.join_consumers(consumers, cout, timeout=seconds + 300)


def _batches_between(env: bitroute_run.Env, t0: float, t1: float) -> dict:
    """The live batches that ended in [t0, t1): how many, and median seconds per stage."""
    import statistics

    chosen = [b for b in env.router.batches if t0 <= _epoch(b["end"]) < t1]
    out: dict[str, float] = {"batches": len(chosen)}
    for stage in ("seconds", "catch_up", "route", "audit"):
        out[stage] = statistics.median(b.get(stage, 0.0) for b in chosen) if chosen else 0.0
    return out


def _epoch(end) -> float:
    if isinstance(end, (int, float)):
        return float(end)
    return datetime.fromisoformat(str(end)).timestamp()


def _replays(env: bitroute_run.Env, since: datetime, until: float, finished: list[dict],
             stop: threading.Event) -> None:
    """Replay the backlog again and again (a new subscriber each time) until ``until``."""
    path = state_path(CheckpointLayout.of(env.config.streaming.checkpoint_dir))
    k = 0
    while time.time() < until and not stop.is_set():
        sub_id = f"replay-{k}"
        _subscribe(env, sub_id, sub_id, "hit/#", since)
        asked = time.time()
        while not stop.is_set():
            done = [f for f in ReplayLedger.load(path).finished if f["subscription"] == sub_id]
            if done:
                finished.append({**done[0], "asked": asked, "at": done[0]["finished_at"],
                                 "done": done[0]["finished_at"]})
                break
            time.sleep(0.1)
        k += 1


def _replay_round(env: bitroute_run.Env, prefix: str, count: int, since: datetime,
                  timeout: float = 1800) -> list[dict]:
    """``count`` replays of the backlog asked together (subscribers ``<prefix>-<k>``): each
    one's entry of the ledger's finished replays once all are done."""
    path = state_path(CheckpointLayout.of(env.config.streaming.checkpoint_dir))
    ids = [f"{prefix}-{k}" for k in range(count)]
    # One flush for all: the router applies them in one version, so they share one range.
    producer = Producer({"bootstrap.servers": env.config.kafka.bootstrap})
    for sub_id in ids:
        value = {"exchange": EXCHANGE, "subscriber": sub_id, "filter": "hit/#",
                 "since": since.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
        producer.produce(env.config.kafka.subscriptions_topic, json.dumps(value).encode(),
                         sub_id.encode())
    assert producer.flush(30) == 0
    asked, deadline = time.time(), time.time() + timeout
    while time.time() < deadline:
        done = {f["subscription"]: f for f in ReplayLedger.load(path).finished}
        if all(i in done for i in ids):
            return [{**done[i], "asked": asked} for i in ids]
        time.sleep(0.2)
    raise RuntimeError(f"the replays {prefix}-* did not finish in {timeout:.0f}s")


def _span(rounds: list[dict]) -> tuple[float, float, int]:
    """(first start, last end, deliveries) of replays that ran together."""
    return (min(f["started_at"] for f in rounds), max(f["finished_at"] for f in rounds),
            sum(f["delivered"] for f in rounds))


def _cpu_line(name: str, cpu: dict, deliveries: int, seconds: float, idle_per_s: float) -> str:
    """A phase's row: its driver CPU per million deliveries as measured, and above what the
    idle router's driver spends in as many seconds (``idle_per_s``: the streaming query's
    triggers, the lease, the watches, whatever it routes)."""
    driver = cpu["driver Python"] + cpu["driver JVM"]
    executors = cpu["executor JVMs"] + cpu["executor Python"]
    per_million = driver / max(deliveries, 1) * 1e6
    above_idle = max(0.0, driver - idle_per_s * seconds) / max(deliveries, 1) * 1e6
    share = driver / max(driver + executors, 1e-9)
    return (f"| {name} | {deliveries:,} | {seconds:.1f} | {deliveries / max(seconds, 1e-9):,.0f} "
            f"| {cpu['driver Python']:.1f} + {cpu['driver JVM']:.1f} | {executors:.1f} "
            f"| {per_million:.2f} | {above_idle:.2f} | {share:.0%} |")


IDLE_S = 10.0
"""The quiet span (no publishes, no replay) the driver's idle CPU is measured over."""


def cluster_run(args, workers: int) -> str:
    """One run on a standalone cluster of ``workers`` one-core workers (module docstring)."""
    from benchmarks.driver_cost import CpuTimeline, router_roles, standalone_cluster

    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="bitroute-replay-") as folder:
        root = Path(folder)
        with standalone_cluster(root, str(Path(__file__).resolve().parent.parent),
                                workers) as cluster:
            env = bitroute_run.Env(root / "run", [
                f"spark.master={cluster.url}", "streaming.driver_route_max_publishes=0",
                "spark.options.spark.executor.memory=512m", "spark.log_level=WARN", *args.set])
            timeline = None
            try:
                env.start_broker()
                for k in range(args.replays):
                    _subscribe(env, f"live-{k}", f"live-{k}", "hit/#")
                _subscribe(env, "lat", "lat", "lat/#")
                since = datetime.now(UTC) - timedelta(seconds=1)
                procs, pout, _ = kafka_load.start_publishers(
                    env.config.kafka.client_settings, env.config.kafka.publishes_topic, EXCHANGE,
                    _workload([f"hit/{j}" for j in range(100)]), 0, 3600, 1,
                    count=args.publishes)
                pub = kafka_load.join_publishers(procs, pout, timeout=1800)
                _log(f"{workers} workers: backlog of {pub['sent']:,} publishes")
                env.start_router()
                router, broker = env.router, env.broker
                assert isinstance(router, harness.RouterRun) and broker is not None
                timeline = CpuTimeline(router_roles(router, cluster, broker), 0.5).start()
                if not env.router.wait_routed(pub["sent"], timeout=1800):
                    raise RuntimeError("the backlog was not drained in time")
                drained = [b for b in env.router.batches if b["rows"]]
                t0 = _epoch(drained[0]["end"]) - drained[0]["seconds"]
                t1 = _epoch(drained[-1]["end"])
                live = (timeline.between(t0, t1), sum(b["deliveries"] for b in drained), t1 - t0)
                loads.append(os.getloadavg()[0])
                _log(f"{workers} workers: live drain {live[1]:,} deliveries in {live[2]:.1f}s")
                base = _latency(env, args.rate, args.seconds)
                loads.append(os.getloadavg()[0])
                _log(f"{workers} workers: baseline p99 {base['p99_ms']:.0f} ms")
                time.sleep(3.0)  # the last latency batches' audit
                quiet = time.time()
                time.sleep(IDLE_S)
                idle = timeline.between(quiet, quiet + IDLE_S)
                idle_per_s = (idle["driver Python"] + idle["driver JVM"]) / IDLE_S
                alone = _replay_round(env, "replay-a", args.replays, since)
                r0, r1, replayed = _span(alone)
                replay = (timeline.between(r0, r1), replayed, r1 - r0)
                loads.append(os.getloadavg()[0])
                _log(f"{workers} workers: replay {replayed:,} deliveries in {r1 - r0:.1f}s")
                rounds: list[list[dict]] = []
                stop = threading.Event()
                until = time.time() + 3.0 + args.seconds

                def beside() -> None:
                    k = 0
                    while time.time() < until and not stop.is_set():
                        rounds.append(_replay_round(env, f"replay-b{k}", args.replays, since))
                        k += 1

                runner = threading.Thread(target=beside, daemon=True)
                runner.start()
                under = _latency(env, args.rate, args.seconds)
                loads.append(os.getloadavg()[0])
                runner.join(timeout=1800)
                stop.set()
            finally:
                if timeline is not None:
                    timeline.stop()
                env.stop()
    lines = [f"### {workers} one-core worker(s): --publishes {args.publishes:,} --replays "
             f"{args.replays} --rate {args.rate:,.0f} --seconds {args.seconds:g}", "",
             "| phase | deliveries | s | deliveries/s | driver CPU s (Python + JVM) "
             "| executors CPU s | driver CPU s per million deliveries | the same above idle "
             "| driver share |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
             _cpu_line("live (backlog drain)", *live, idle_per_s),
             _cpu_line(f"replay ({args.replays} together, alone)", *replay, idle_per_s), "",
             f"the idle router's driver: {idle_per_s:.3f} CPU s per second ({IDLE_S:.0f} s "
             "without publishes)", "",
             "| live latency at "
             f"{args.rate:,.0f} publishes/s | p50 ms | p99 ms | deliveries |", "|---|---:|---:|---:|",
             f"| without a replay | {base['p50_ms']:.1f} | {base['p99_ms']:.1f} | {base['latency_n']:,} |",
             f"| with replays running ({len(rounds)} rounds) | {under['p50_ms']:.1f} | "
             f"{under['p99_ms']:.1f} | {under['latency_n']:,} |", "",
             f"live p99 with / without replays: {under['p99_ms'] / base['p99_ms']:.2f}x; "
             "load average (1 min) at start, after each phase: "
             + ", ".join(f"{x:.1f}" for x in loads)]
    for k, round_ in enumerate(rounds):
        a, b, n = _span(round_)
        lines.append(f"- round {k} beside the live load: {n:,} deliveries in {b - a:.1f}s "
                     f"({n / max(b - a, 1e-9):,.0f}/s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks replay", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--publishes", type=int, default=1_000_000)
    ap.add_argument("--rate", type=float, default=1000.0, help="live publishes/s while measuring latency")
    ap.add_argument("--seconds", type=float, default=30.0, help="each latency window")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--smoke", action="store_true",
                    help="toy size: 2,000 publishes, 100/s for 2 s")
    ap.add_argument("--workers", metavar="N[,N...]",
                    help="on a standalone cluster of N one-core workers, each N in turn, "
                         "with the driver's CPU (module docstring)")
    ap.add_argument("--replays", type=int, default=4,
                    help="--workers: replays asked together (and live subscriptions)")
    args = ap.parse_args(argv)
    idle = 5.0  # the latency consumers' end, after the last delivery
    if args.smoke:
        args.publishes, args.rate, args.seconds, idle = 2000, 100.0, 2.0, 2.0
    if args.workers:
        for workers in (int(n) for n in args.workers.split(",")):
            print(cluster_run(args, workers), flush=True)
        return 0
    with tempfile.TemporaryDirectory(prefix="bitroute-replay-") as folder:
        env = bitroute_run.Env(Path(folder), list(args.set))
        try:
            env.start_broker()
            _subscribe(env, "live-hit", "live", "hit/#")
            _subscribe(env, "lat", "lat", "lat/#")
            started = env.start_router()
            _log(f"router running (open {started['open_s']:.1f}s); log {env.router.log_path}")
            since = datetime.now(UTC) - timedelta(seconds=1)
            backlog = [f"{'hit' if i == 0 else 'miss'}/{j}" for j in range(10) for i in range(10)]
            procs, pout, start_at = kafka_load.start_publishers(
                env.config.kafka.client_settings, env.config.kafka.publishes_topic, EXCHANGE,
                _workload(backlog), 0, 3600, 1, count=args.publishes)
            routed0, batches0 = env.router.routed(), len(env.router.batches)
            pub = kafka_load.join_publishers(procs, pout, timeout=1800)
            _log(f"backlog: {pub['sent']:,} publishes in {pub['seconds']:.1f}s")
            if not env.router.wait_routed(routed0 + pub["sent"], timeout=1800):
                raise RuntimeError("the backlog was not drained in time")
            drained = env.router.batches[batches0:]
            live_pub_s, live_dlv_s = bitroute_run.full_batch_rates(drained)
            _log(f"live: {live_pub_s:,.0f} publishes/s, {live_dlv_s:,.0f} deliveries/s over "
                 f"{len(drained)} batches")
            t0 = time.time()
            base = _latency(env, args.rate, args.seconds, idle)
            base["stages"] = _batches_between(env, t0 + 4, t0 + 3 + args.seconds)
            _log(f"baseline latency: p50 {base['p50_ms']:.1f} ms, p99 {base['p99_ms']:.1f} ms "
                 f"({base['latency_n']:,} deliveries)")
            finished: list[dict] = []
            stop = threading.Event()
            until = time.time() + 3.0 + args.seconds
            runner = threading.Thread(target=_replays, args=(env, since, until, finished, stop),
                                      daemon=True)
            runner.start()
            t0 = time.time()
            under = _latency(env, args.rate, args.seconds, idle)
            under["stages"] = _batches_between(env, t0 + 4, t0 + 3 + args.seconds)
            runner.join(timeout=600)
            stop.set()
        finally:
            env.stop()
    print(report(args, pub["sent"], live_pub_s, live_dlv_s, base, under, finished))
    return 0


def report(args, publishes: int, live_pub_s: float, live_dlv_s: float, base: dict, under: dict,
           finished: list[dict]) -> str:
    rates = [f["delivered"] / max(f["at"] - f["started_at"], 1e-6) for f in finished]
    scans = [f["publishes"] / max(f["at"] - f["started_at"], 1e-6) for f in finished]
    latencies = [f["done"] - f["asked"] for f in finished]
    lines = [f"## replay: {publishes:,} publishes Kafka keeps, 10% matching "
             f"(--publishes {args.publishes:,} --rate {args.rate:,.0f} --seconds {args.seconds:g})",
             "", "| | deliveries/s | publishes read/s |", "|---|---:|---:|",
             f"| live (backlog drain) | {live_dlv_s:,.0f} | {live_pub_s:,.0f} |"]
    if rates:
        best = max(range(len(rates)), key=lambda i: rates[i])
        lines.append(f"| replay (best of {len(rates)}) | {rates[best]:,.0f} | {scans[best]:,.0f} |")
        lines.append(f"| replay (median) | {sorted(rates)[len(rates) // 2]:,.0f} | "
                     f"{sorted(scans)[len(scans) // 2]:,.0f} |")
        lines.append("")
        lines.append(f"replay: {len(rates)} replays of {finished[0]['delivered']:,} deliveries, "
                     f"subscribe to last delivery {sorted(latencies)[len(latencies) // 2]:.1f} s "
                     f"(median); replay / live deliveries/s = {rates[best] / live_dlv_s:.2f}")
    else:
        lines.append("| replay | none finished | |")
    lines += ["", "| live latency at "
              f"{args.rate:,.0f} publishes/s | p50 ms | p99 ms | deliveries |", "|---|---:|---:|---:|",
              f"| without a replay | {base['p50_ms']:.1f} | {base['p99_ms']:.1f} | {base['latency_n']:,} |",
              f"| with replays running | {under['p50_ms']:.1f} | {under['p99_ms']:.1f} | "
              f"{under['latency_n']:,} |", "",
              f"live p99 with / without a replay: {under['p99_ms'] / base['p99_ms']:.2f}x "
              "(target: within 1.25x)", "",
              "| live batches (median s) | batches | batch | catch_up | route | audit |",
              "|---|---:|---:|---:|---:|---:|"]
    for name, phase in (("without a replay", base), ("with replays running", under)):
        st = phase["stages"]
        lines.append(f"| {name} | {st['batches']} | {st['seconds']:.3f} | {st['catch_up']:.3f} "
                     f"| {st['route']:.3f} | {st['audit']:.3f} |")
    return "\n".join(lines)

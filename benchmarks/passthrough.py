"""Spark's own floor: a Kafka -> Kafka copy with no Python operator, in micro-batch mode and in
Real-Time Mode, measured through raw Kafka the way bitroute is (publish time -> receive time).

    python -m benchmarks passthrough [--rate 1000] [--seconds 30] [--warmup 10]
                                     [--modes microbatch,realtime] [--trigger "100 milliseconds"]
                                     [--realtime-checkpoint "5 minutes"]
                                     [--bitroute --size 100k] [--smoke]

The embedded broker (:func:`benchmarks.harness.start_broker`), a publishes topic with the
router's partitions (``kafka.partitions``) and a copy topic of one partition. Per mode, a
child process builds the router's own Spark session (:func:`streaming.session.spark_session`:
the same jars, settings and master) and runs a query that reads the publishes with their
headers and writes ``key``, ``value`` and ``headers`` unchanged to the copy topic: in
micro-batch mode with bitroute's trigger (``streaming.trigger_interval``, or ``--trigger``),
in Real-Time Mode with ``trigger(realTime=...)`` (a 5-minute checkpoint interval, or
``--realtime-checkpoint``; one slot per partition plus two). A Real-Time Mode query's tasks
end and start again at each checkpoint, so the interval bounds its tail: "5 seconds", the
router's ``streaming.realtime_checkpoint_interval``, compares the copy with the router at
the same interval. The load driver and the delivery reader are the end-to-end
benchmark's (:mod:`benchmarks.e2e.kafka_load`): ``--rate`` publishes/s stamped with their
publish time in a header, which the copy carries, for ``--warmup + --seconds``; p50/p99/max
of the ``--seconds`` window.

``--bitroute``: the router itself too (``bitroute run``, the devices workload's ``--size``
subscriptions), started first and warmed up (``--bitroute-warmup`` seconds at the rate,
waited for until routed); every query then runs on its broker beside it, idle: the copies,
bitroute's window at the same rate, and the micro-batch copy once more right after it,
since the machine is shared and its load moves within minutes. Its ratios are to the
micro-batch copy measured before and after it (issue 36's aim: p99 <= 1.25x).
``--smoke``: both modes at 200 publishes/s, 1 s of warm-up and a 2 s window, the load
starting 5 s after the query (CI).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness, workload
from benchmarks.e2e import bitroute_run, kafka_load

MODES = ("microbatch", "realtime")
REALTIME_CHECKPOINT = "5 minutes"
STARTED_LINE = "passthrough: query started"
AFTER = "microbatch, after bitroute"
QUERY_START_TIMEOUT_S = 300.0
LEAD_S = 8.0
"""From a copy query's start to its load's: the query's first trigger, the publishers' spawn."""
SMOKE_LEAD_S = 5.0


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _config(bootstrap: str, folder: Path, mode: str):
    from streaming.config import load, parse_set_flags

    return load(None, parse_set_flags([
        "broker.embedded=false", f"kafka.bootstrap={bootstrap}",
        f"streaming.checkpoint_dir={folder}", f"delta.warehouse={folder / 'delta'}",
        f"streaming.mode={mode}"]))


def query_main(argv: list[str]) -> int:
    """The child: ``--query MODE BOOTSTRAP SOURCE SINK FOLDER TRIGGER CHECKPOINT``; runs until
    stdin closes."""
    mode, bootstrap, source, sink, folder, trigger, checkpoint = argv
    from streaming.session import spark_session

    config = _config(bootstrap, Path(folder), mode)
    spark = spark_session(config)
    rows = (spark.readStream.format("kafka")
            .options(**config.kafka.client_settings.spark_options())
            .option("subscribe", source).option("startingOffsets", "latest")
            .option("includeHeaders", "true").option("failOnDataLoss", "false").load()
            .select("key", "value", "headers"))
    writer = (rows.writeStream.format("kafka")
              .options(**config.kafka.client_settings.spark_options())
              .option("topic", sink).option("checkpointLocation", f"{folder}/query")
              .outputMode("update"))
    if mode == "realtime":
        # pyspark's overloads of trigger() lack realTime, which it takes (Real-Time Mode).
        writer = writer.trigger(realTime=checkpoint)  # type: ignore[call-overload]
    else:
        writer = writer.trigger(processingTime=trigger)
    query = writer.start()
    print(f"{STARTED_LINE} ({spark.sparkContext.master})", flush=True)
    try:
        sys.stdin.read()  # the parent closes it to stop the query
    finally:
        query.stop()
        spark.stop()
    return 0


def _measure_copy(bootstrap: str, mode: str, trigger: str, partitions: int, rate: float,
                  warmup: float, seconds: float, folder: Path, w: workload.Workload,
                  label: str = "", checkpoint: str = REALTIME_CHECKPOINT,
                  lead: float = LEAD_S) -> dict:
    """One mode's copy query started in a child process, the paced load through it
    (``label`` names a second measurement of the mode apart: its topics, its folder)."""
    from streaming import kafka
    from streaming.kafka.topics import create_topics

    prefix = f"{harness.topic_prefix()}.passthrough.{mode}{label}"
    source, sink = f"{prefix}.in", f"{prefix}.out"
    admin = kafka.admin(kafka.ClientSettings.of(bootstrap))
    create_topics(admin, [source], partitions, 1, {})
    create_topics(admin, [sink], 1, 1, {})
    work = folder / f"{mode}{label}"
    work.mkdir(parents=True, exist_ok=True)
    log = open(work / "query.log", "w")
    child = subprocess.Popen([sys.executable, "-m", "benchmarks.passthrough", "--query", mode,
                              bootstrap, source, sink, str(work), trigger, checkpoint],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                             cwd=harness.ROOT, start_new_session=True)
    assert child.stdin is not None and child.stdout is not None  # PIPEs
    try:
        deadline = time.monotonic() + QUERY_START_TIMEOUT_S
        line = ""
        while STARTED_LINE not in line:
            line = child.stdout.readline()
            if not line or time.monotonic() > deadline:
                raise RuntimeError(f"the {mode} copy query did not start; see {work / 'query.log'}")
        _log(f"{mode}: {line.strip()}")
        start_at = time.time() + lead
        w0, w1 = start_at + warmup, start_at + warmup + seconds
        # idle_after_first: a copy whose first batch comes late is waited for (until the
        # deadline), not measured as no delivery at all.
        consumers, cout = kafka_load.start_consumers(bootstrap, [sink], 1, (w0, w1), w1 + 60,
                                                     idle=3.0, idle_after_first=True)
        procs, pout, _ = kafka_load.start_publishers(bootstrap, source, workload.EXCHANGE, w,
                                                     rate, warmup + seconds + 0.5, 1,
                                                     start_at=start_at)
        pub = kafka_load.join_publishers(procs, pout, timeout=warmup + seconds + 120)
        got = kafka_load.join_consumers(consumers, cout, timeout=180)
        return {"sent": pub["sent"], **got}
    finally:
        child.stdin.close()
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, 9)
            child.wait()
        log.close()


def _warm_bitroute(env: bitroute_run.Env, w: workload.Workload, rate: float,
                   warmup: float) -> None:
    """``warmup`` seconds of ``rate`` through the router, until it has routed all of it (its
    first minute is slower: the JVM's warm-up, the first deliveries to each topic)."""
    warm = bitroute_run._paced(env, w, rate, 1.0, warmup, 1, 1, _log, lead=5.0, idle=3.0)
    _log(f"bitroute: warm-up of {warmup:.0f} s done (p50 {warm.p50_ms:.0f} ms, p99 "
         f"{warm.p99_ms:.0f} ms, routed {warm.lag_after_s:.1f} s after its last publish)")


def _row(name: str, p50: float, p99: float, mx: float, n: int, base: dict | None) -> str:
    ratio = (f"{p50 / base['p50_ms']:.2f}x | {p99 / base['p99_ms']:.2f}x"
             if base else "- | -")
    return f"| {name} | {n:,} | {p50:.0f} | {p99:.0f} | {mx:.0f} | {ratio} |"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--query":
        return query_main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m benchmarks passthrough", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=1000.0, help="publishes/s")
    ap.add_argument("--seconds", type=float, default=30.0, help="the measured window")
    ap.add_argument("--warmup", type=float, default=10.0, help="paced load before the window")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--trigger", default=None,
                    help="micro-batch trigger (default: bitroute's streaming.trigger_interval)")
    ap.add_argument("--realtime-checkpoint", default=REALTIME_CHECKPOINT,
                    help="the Real-Time Mode copy's checkpoint interval")
    ap.add_argument("--bitroute", action="store_true",
                    help="also bitroute run at the same rate, ratios to the micro-batch copy")
    ap.add_argument("--bitroute-warmup", type=float, default=60.0,
                    help="seconds of paced load before bitroute's window (its first minute)")
    ap.add_argument("--size", choices=sorted(workload.SIZES), default="100k",
                    help="bitroute's subscriptions (devices workload)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="bitroute run's settings (with --bitroute)")
    ap.add_argument("--smoke", action="store_true", help="toy size: 200/s for 2 s, both modes")
    args = ap.parse_args(argv)
    lead = LEAD_S
    if args.smoke:
        args.rate, args.seconds, args.warmup, args.bitroute_warmup = 200.0, 2.0, 1.0, 2.0
        lead = SMOKE_LEAD_S
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        ap.error(f"--modes: unknown {', '.join(sorted(unknown))} (known: {', '.join(MODES)})")
    from streaming.config import Config

    defaults = Config()
    trigger = args.trigger or defaults.streaming.trigger_interval
    partitions = defaults.kafka.partitions
    subscriptions = 100 if args.smoke else workload.SIZES[args.size]
    w = workload.generate("devices", subscriptions, 1, 50_000)
    results: dict[str, dict] = {}
    bitroute = None
    with tempfile.TemporaryDirectory(prefix="bitroute-passthrough-") as tmp:
        folder = Path(tmp)
        # With --bitroute every query runs on the router's broker, the router warm and idle
        # beside the copies, and the micro-batch copy is measured again right after the
        # router: the machine is shared, and its load moves within minutes.
        env = bitroute_run.Env(folder / "bitroute", args.set) if args.bitroute else None
        broker = None
        try:
            if env is not None:
                env.bring_up(w, _log)
                _warm_bitroute(env, w, args.rate, args.bitroute_warmup)
                bootstrap = env.config.kafka.bootstrap
            else:
                broker = harness.start_broker(folder / "kafka")
                bootstrap = broker.bootstrap

            def copy(mode: str, name: str, label: str = "") -> None:
                got = _measure_copy(bootstrap, mode, trigger, partitions, args.rate, args.warmup,
                                    args.seconds, folder, w, label, args.realtime_checkpoint, lead)
                _log(f"{name} copy: p50 {got['p50_ms']:.0f} ms p99 {got['p99_ms']:.0f} "
                     f"ms ({got['latency_n']:,} of {got['sent']:,} sent)")
                results[name] = got

            for mode in modes:
                copy(mode, mode)
            if env is not None:
                bitroute = bitroute_run._paced(env, w, args.rate, 5.0, args.seconds, 1, 1, _log,
                                               lead=5.0, idle=5.0)
                _log(f"bitroute: p50 {bitroute.p50_ms:.0f} ms p99 {bitroute.p99_ms:.0f} ms")
                if "microbatch" in modes:
                    copy("microbatch", AFTER, "-after")
        finally:
            if env is not None:
                env.stop()
            if broker is not None:
                broker.stop()
            harness.delete_own_topics()
    base = results.get("microbatch")
    print(f"\n## pass-through at {args.rate:,.0f} publishes/s, {args.seconds:.0f} s window "
          f"(micro-batch trigger {trigger}, realtime checkpoint {args.realtime_checkpoint}, "
          f"{partitions} partitions)\n")
    print("| query | latencies | p50 ms | p99 ms | max ms | p50 / micro-batch copy | "
          "p99 / micro-batch copy |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode, got in results.items():
        print(_row(f"Spark copy, {mode}", got["p50_ms"], got["p99_ms"], got["max_ms"],
                   got["latency_n"], base if mode != "microbatch" else None))
    after = results.get(AFTER)
    if bitroute is not None:
        mode = env.config.streaming.mode if env is not None else "microbatch"
        print(_row(f"bitroute {mode}, {subscriptions:,} subscriptions", bitroute.p50_ms,
                   bitroute.p99_ms, bitroute.max_ms, bitroute.consumer.get("latency_n", 0), base))
        realtime = results.get("realtime")
        if mode == "realtime" and realtime is not None:
            print(f"\nbitroute / the Real-Time Mode copy: p50 "
                  f"{bitroute.p50_ms / realtime['p50_ms']:.2f}x, p99 "
                  f"{bitroute.p99_ms / realtime['p99_ms']:.2f}x")
        if after is not None:
            print(f"\nbitroute / the micro-batch copy measured after it: p50 "
                  f"{bitroute.p50_ms / after['p50_ms']:.2f}x, p99 "
                  f"{bitroute.p99_ms / after['p99_ms']:.2f}x")
        batches = bitroute.batches
        if batches:
            import statistics

            stages = {s: statistics.median(b.get(s, 0.0) for b in batches)
                      for s in ("catch_up", "route", "audit", "seconds")}
            print(f"\nbitroute's batches in the window: {len(batches)}, median "
                  + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in stages.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

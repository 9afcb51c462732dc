"""``python -m benchmarks e2e``: the end-to-end table in one run.

    python -m benchmarks e2e [--profile devices] [--size 100k] [--first-route 1m]
                             [--systems bitroute,bitroute-realtime,kstreams,rabbitmq,mosquitto]
                             [--set section.key=value]... [--kstreams-set key=value]...

``bitroute`` is the router in micro-batch mode (the default), ``bitroute-realtime`` the
same router with ``streaming.mode = "realtime"``, each on a broker of its own.
Everything listens on loopback and is started and stopped by this command;
``benchmarks/e2e/run.sh`` installs the brokers and clients first. Run by hand,
never in CI. Results go to stdout (the table) and ``<workdir>/results.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks import workload
from benchmarks.e2e import bitroute_run, compare, kstreams_run

MB = 1 << 20
SYSTEMS = ("bitroute", "bitroute-realtime", "kstreams", "rabbitmq", "mosquitto")
#: Systems whose sustained rate is a backlog's drain (bitroute_run.measure_phases).
KAFKA_SYSTEMS = ("bitroute", "bitroute-realtime", "kstreams")
BITROUTE = tuple(bitroute_run.MODES)


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks e2e", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", choices=sorted(workload.PROFILES), default="devices")
    ap.add_argument("--size", choices=sorted(workload.SIZES), default="100k")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--systems", default=None,
                    help="comma-separated, among " + ", ".join(SYSTEMS) + " (default: all; "
                         "with --smoke: bitroute)")
    ap.add_argument("--first-route", choices=["none", *sorted(workload.SIZES)], default="1m",
                    help="changelog size for the time-to-first-routed-publish phase")
    ap.add_argument("--publishes", type=int, default=400_000,
                    help="distinct publishes generated (the drivers cycle through them)")
    ap.add_argument("--backlog", type=int, default=0,
                    help="bitroute and kstreams saturation backlog in publishes (default 300,000; "
                         "for fanout use far fewer, with a smaller "
                         "streaming.max_offsets_per_trigger)")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--measure", type=float, default=20.0)
    ap.add_argument("--publishers", type=int, default=2,
                    help="bitroute and kstreams load-driver processes")
    ap.add_argument("--consumers", type=int, default=1,
                    help="bitroute and kstreams delivery-consumer processes")
    ap.add_argument("--rabbit-threads", type=int, default=4)
    ap.add_argument("--mqtt-clients", type=int, default=0,
                    help="MQTT subscriber connections (default: one per subscriber)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="router configuration override (repeatable), as for bitroute run; "
                         "kstreams takes its topic names, partitions and exchanges from it too")
    ap.add_argument("--kstreams-set", action="append", default=[], metavar="KEY=VALUE",
                    help="Kafka Streams or client setting of the kstreams peer (repeatable), e.g. "
                         "num.stream.threads=1 or producer.linger.ms=20")
    ap.add_argument("--config", type=Path, default=None, metavar="FILE",
                    help="bitroute side on an existing Kafka cluster: FILE's [kafka] and "
                         "[kafka.client] (TLS, SASL; secrets as env:NAME) instead of a broker "
                         "of its own (needs --first-route none)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--smoke", action="store_true",
                    help="toy size, bitroute alone (or the bitroute modes --systems names): "
                         "100 subscriptions, a 2,000-publish backlog, the 90%% phase alone "
                         "(2 s), no warm-up nor first-route phase")
    args = ap.parse_args(argv)
    if args.smoke:
        if args.systems and set(args.systems.split(",")) - set(BITROUTE):
            ap.error(f"--smoke runs bitroute alone: --systems among {', '.join(BITROUTE)}")
        args.systems = args.systems or "bitroute"
        args.first_route, args.publishes, args.backlog = "none", 2000, 2000
        args.warmup, args.measure, args.publishers = 1.0, 2.0, 1
    if args.config is not None and args.first_route != "none":
        ap.error("--config runs on an existing cluster; the first-route phase needs a fresh "
                 "broker of its own: add --first-route none")
    signal.signal(signal.SIGTERM, _interrupt)

    systems = [s.strip() for s in (args.systems or ",".join(SYSTEMS)).split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        ap.error(f"--systems: unknown {', '.join(unknown)} (known: {', '.join(SYSTEMS)})")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bitroute-e2e-"))
    workdir.mkdir(parents=True, exist_ok=True)
    n = 100 if args.smoke else workload.SIZES[args.size]
    t = time.monotonic()
    w = workload.generate(args.profile, n, args.seed, args.publishes)
    files = workload.write_files(w, workdir / "workload")
    matches, per_publish = workload.match_stats(w)
    _log(f"workload {args.profile} {args.size}: {w.description}; {matches:.1f} matching "
         f"subscriptions, {per_publish:.2f} deliveries per publish (generated in "
         f"{time.monotonic() - t:.1f}s)")
    results: dict = {"profile": args.profile, "size": args.size, "n": n, "seed": args.seed,
                     "description": w.description, "matches_per_publish": matches,
                     "deliveries_per_publish": per_publish, "sets": args.set,
                     "kstreams_sets": args.kstreams_set,
                     "machine": _machine(), "loadavg": {"start": os.getloadavg()}}
    backlog = args.backlog or 300_000
    try:
        for system in BITROUTE:
            if system in systems:
                results[system] = asdict(bitroute_run.run(
                    workdir / system, w, args.set, backlog, args.warmup, args.measure,
                    args.publishers, args.consumers, _log, args.config, smoke=args.smoke,
                    system=system))
        if "kstreams" in systems:
            results["kstreams"] = asdict(kstreams_run.run(
                workdir / "kstreams", w, args.set, args.kstreams_set, backlog, args.warmup,
                args.measure, args.publishers, args.consumers, _log))
        if "mosquitto" in systems:
            results["mosquitto"] = asdict(compare.mosquitto(
                workdir / "mosquitto", files, per_publish, args.warmup, args.measure,
                args.mqtt_clients or len(w.subscribers), _log))
        if "rabbitmq" in systems:
            results["rabbitmq"] = asdict(compare.rabbitmq(
                workdir / "rabbitmq", files, per_publish, args.warmup, args.measure,
                args.rabbit_threads, _log))
        if args.first_route != "none" and "bitroute" in systems:
            big = workload.generate(args.profile, workload.SIZES[args.first_route], args.seed, 1000)
            results["first_route"] = asdict(bitroute_run.first_route(
                workdir / "first-route", big, args.set, _log))
    except KeyboardInterrupt:
        _log("interrupted: everything started has been stopped")
        return 130
    finally:
        results["loadavg"]["end"] = os.getloadavg()
        (workdir / "results.json").write_text(json.dumps(results, indent=1, default=str))
        _log(f"results in {workdir / 'results.json'}")
    print(table(results))
    if not args.keep and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _machine() -> str:
    import os
    import platform

    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, {platform.platform()}"


def _f(x: float, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.{digits}f}"


def _lat(run: dict) -> str:
    return f"{_f(run['p50_ms'], 1)} / {_f(run['p99_ms'], 1)}"


def _busiest(cores: dict[str, float]) -> str:
    if not cores:
        return "-"
    name, v = max(cores.items(), key=lambda kv: kv[1])
    return f"{name} {v:.2f}"


def table(r: dict) -> str:
    cols = [s for s in SYSTEMS if s in r]
    rows: list[tuple[str, list[str]]] = []

    def sustained(s: str) -> tuple[float, float]:
        if s in KAFKA_SYSTEMS:
            sat = r[s]["saturation"]
            return sat["publishes_per_s"], sat["deliveries_per_s"]
        return r[s]["sustained_publishes"], r[s]["sustained_deliveries"]

    def at(s: str, key: str) -> dict:
        return r[s][key]

    rows.append(("sustained publishes/s", [_f(sustained(s)[0]) for s in cols]))
    rows.append(("sustained deliveries/s", [_f(sustained(s)[1]) for s in cols]))
    rows.append(("  measured at", [r[s]["saturation"].get("rate_source", "router")
                                   if s in KAFKA_SYSTEMS else "client" for s in cols]))
    rows.append(("  delivery side deliveries/s", [
        _f(_delivery_side(r[s]["saturation"])) if s in KAFKA_SYSTEMS else "-" for s in cols]))
    rows.append(("p50 / p99 ms at 50% rate", [_lat(at(s, "at50")) for s in cols]))
    rows.append(("p50 / p99 ms at 90% rate", [_lat(at(s, "at90")) for s in cols]))
    rows.append(("deliveries/s at 90% rate", [_f(at(s, "at90")["deliveries_per_s"]) for s in cols]))

    def rss(s: str, role: str) -> str:
        run = r[s]["saturation"] if s in KAFKA_SYSTEMS else r[s]["full"]
        v = run["peak_rss"].get(role)
        return _f(v / MB) if v else "-"

    rows.append(("broker RSS MB (peak, full speed)",
                 [rss(s, "Kafka broker") if s in KAFKA_SYSTEMS else rss(s, "broker")
                  for s in cols]))

    def busiest(s: str) -> str:
        run = r[s]["saturation"] if s in KAFKA_SYSTEMS else r[s]["full"]
        return _busiest(run["max_core"])

    rows.append(("busiest process at full speed (cores)", [busiest(s) for s in cols]))
    rows.append(("router CPU us per delivery (saturated)", [
        _f(1e6 * cpu_per_delivery(r[s]["saturation"]), 1) if s in KAFKA_SYSTEMS else "-"
        for s in cols]))
    for mine in BITROUTE:
        if mine not in r:
            continue
        b = sustained(mine)[1]
        for s in ("bitroute", "kstreams", "rabbitmq", "mosquitto"):
            if s != mine and s in r and sustained(s)[1]:
                rows.append((f"{mine}/{s} deliveries/s", [
                    f"{b / sustained(s)[1]:.2f}x" if c == mine else "" for c in cols]))
    width = max(len(name) for name, _ in rows) + 2
    cw = max(12, *(len(v) for _, vals in rows for v in vals)) + 2
    load = r.get("loadavg", {})
    out = [f"End to end: {r['profile']} {r['size']} ({r['n']:,} subscriptions, seed {r['seed']}, "
           f"{r['deliveries_per_publish']:.2f} deliveries per publish); {r['machine']}",
           "load average (1 min) at start / end: "
           + " / ".join(f"{load[k][0]:.1f}" for k in ("start", "end") if k in load),
           f"router settings: {' '.join(r['sets']) or '(defaults)'}"
           + (f"; Kafka Streams overrides: {' '.join(r.get('kstreams_sets') or []) or '(none)'}"
              if "kstreams" in r else ""), "",
           "".ljust(width) + "".join(c.rjust(cw) for c in cols)]
    out += [name.ljust(width) + "".join(v.rjust(cw) for v in vals) for name, vals in rows]

    for system in BITROUTE:
        if system in r:
            out += _bitroute_lines(system, r[system], r["n"])
    if "first_route" in r:
        fr = r["first_route"]
        out.append(f"bitroute first routed publish after a {fr['subscriptions']:,}-subscription "
                   f"changelog: {fr['first_route_s']:.1f}s after Kafka acked it (written in "
                   f"{fr['write_s']:.1f}s; router catch-up {fr['catch_up_s']:.1f}s, that batch "
                   f"{fr['batch_s']:.1f}s); restart open {_f(fr['open_s_restart'], 1)}s")
    if "kstreams" in r:
        ks = r["kstreams"]
        sat = ks["saturation"]
        out.append(f"kstreams start with {r['n']:,} subscriptions in the changelog: changelog "
                   f"written in {ks['changelog_write_s']:.1f}s, topology running after "
                   f"{ks['open_s']:.1f}s; saturated: "
                   + ", ".join(f"{k} {sat['cores'].get(k, 0):.2f} cores (peak RSS "
                               f"{_f(v / MB)} MB)" for k, v in sat["peak_rss"].items()))
        for key in ("at50", "at90"):
            phase = ks[key]
            out.append(f"kstreams at {key[2:]}%: {phase['publishes_per_s']:,.0f} publishes/s, "
                       f"all processed {phase['lag_after_s']:.1f}s after the last publish")
    for s in ("rabbitmq", "mosquitto"):
        if s in r:
            full = r[s]["full"]
            out.append(f"{s} at full speed: {full['publishes_per_s']:,.0f} publishes/s offered, "
                       f"{full['deliveries_per_s']:,.0f} deliveries/s; cores "
                       + ", ".join(f"{k} {v:.2f}" for k, v in full["cores"].items())
                       + (f"; bindings set up in {r[s]['setup_s']:.0f}s" if r[s]['setup_s'] else ""))
    targets = _targets(r)
    if targets:
        heading = ("targets of issue 10 (devices 100k, Delta audit on):"
                   if (r["profile"], r["size"]) == ("devices", "100k")
                   else "the issue's targets, set for devices 100k (for reference only):")
        out += ["", heading] + [f"  {t}" for t in targets]
    return "\n".join(out)


def _delivery_side(sat: dict) -> float:
    """The saturation's deliveries/s at the delivery consumer (NaN in older results)."""
    side = sat.get("delivery_side") or (float("nan"), float("nan"))
    return side[1]


def cpu_per_delivery(sat: dict) -> float:
    """CPU seconds of the router's processes per delivery received while saturated
    (:meth:`benchmarks.e2e.bitroute_run.Phase.router_cpu_per_delivery`, on a results dict)."""
    cpu = sum(v for k, v in (sat.get("cpu_s") or {}).items()
              if k.startswith(("router:", "kstreams:")))
    return cpu / sat["delivered"] if sat.get("delivered") else float("nan")


def _bitroute_lines(name: str, br: dict, n: int) -> list[str]:
    """The detail lines of one bitroute mode: memory and CPU by role, the batches (micro-batch
    mode; realtime mode's batches are its audit query's), the start, the paced phases."""
    sat = br["saturation"]
    realtime = name != "bitroute"
    out = ["", f"{name} memory (peak RSS MB) and CPU (cores, average) while saturated:"]
    for role, v in sat["peak_rss"].items():
        out.append(f"  {role:<28}{_f(v / MB):>8} MB {sat['cores'].get(role, 0):>6.2f} cores"
                   f" (busiest process {sat['max_core'].get(role, 0):.2f})")
    out.append(f"{name} saturated: router {sat['publishes_per_s']:,.0f} publishes/s, "
               f"{sat['deliveries_per_s']:,.0f} deliveries/s ({sat.get('rate_source', 'router')}"
               f" side); delivery side {_f(_delivery_side(sat))} deliveries/s, "
               f"{sat.get('delivered', 0):,} received; router CPU "
               f"{_f(1e6 * cpu_per_delivery(sat), 1)} us per delivery")
    batches = [b for b in sat["batches"] if b["rows"]]
    full = [b for b in batches if b["rows"] >= 0.9 * max(x["rows"] for x in batches)][1:] \
        if batches and not realtime else []
    if full:
        keys = ("catch_up", "route", "audit")
        mean = {k: sum(b.get(k, 0.0) for b in full) / len(full) for k in keys}
        total = sum(b["seconds"] for b in full) / len(full)
        rows_ = sum(b["rows"] for b in full) / len(full)
        out.append(f"{name} per-batch split (mean of {len(full)} full batches of "
                   f"{rows_:,.0f} publishes, {total:.2f}s): "
                   + ", ".join(f"{k} {mean[k]:.2f}s ({100 * mean[k] / total:.0f}%)"
                               for k in keys))
    out.append(f"{name} start with {n:,} subscriptions in the changelog: "
               f"changelog written in {br['changelog_write_s']:.1f}s, router open "
               f"{br['open_s']:.1f}s")
    for key in ("at50", "at90"):
        phase = br[key]
        if realtime:
            out.append(f"{name} at {key[2:]}%: {phase['publishes_per_s']:,.0f} publishes/s, "
                       f"all audited {phase['lag_after_s']:.1f}s after the last publish "
                       f"({len(phase['batches'])} audit batches)")
            continue
        split = _mean_split(phase["batches"])
        out.append(f"{name} at {key[2:]}%: {phase['publishes_per_s']:,.0f} publishes/s, "
                   f"all routed {phase['lag_after_s']:.1f}s after the last publish; "
                   f"{len(phase['batches'])} batches, mean {split}; audit lag at most "
                   f"{audit_lag_bound(phase['batches']):.2f}s")
    return out


def _mean_split(batches: list[dict]) -> str:
    if not batches:
        return "no batch"
    keys = ("seconds", "catch_up", "route", "audit")
    mean = {k: sum(b.get(k, 0.0) for b in batches) / len(batches) for k in keys}
    rows = sum(b["rows"] for b in batches) / len(batches)
    return (f"{rows:,.0f} publishes per batch, {mean['seconds']:.2f}s (catch_up "
            f"{mean['catch_up']:.2f}s, route {mean['route']:.2f}s, audit {mean['audit']:.2f}s)")


def audit_lag_bound(batches: list[dict]) -> float:
    """The longest a delivery waited for its audit row, over ``batches`` (router probes).

    The router appends a batch's audit rows right after Kafka acknowledged its
    deliveries, in the same batch: a delivery acknowledged at the earliest when
    the batch's route stage began is audited when its audit stage ends.
    """
    return max((b.get("route", 0.0) + b.get("audit", 0.0) for b in batches), default=float("nan"))


def _targets(r: dict) -> list[str]:
    out = []
    if "bitroute" in r and "bitroute-realtime" in r:
        m = r["bitroute"]["saturation"]["deliveries_per_s"]
        t = r["bitroute-realtime"]["saturation"]["deliveries_per_s"]
        out.append(f"realtime saturated deliveries/s >= half of micro-batch's: {t:,.0f} vs "
                   f"{m / 2:,.0f} -> {'met' if t >= m / 2 else 'missed'}")
    if "bitroute" not in r:
        return out
    b = r["bitroute"]["saturation"]["deliveries_per_s"]
    if "mosquitto" in r:
        m = r["mosquitto"]["sustained_deliveries"]
        out.append(f"deliveries/s >= Mosquitto: {b:,.0f} vs {m:,.0f} -> "
                   f"{'met' if b >= m else f'missed by {100 * (1 - b / m):.0f}%'}")
    if "kstreams" in r:
        k = r["kstreams"]["saturation"]["deliveries_per_s"]
        out.append(f"deliveries/s ahead of the Kafka Streams peer (issue 22): {b:,.0f} vs {k:,.0f} "
                   f"-> {'met' if b > k else f'missed by {100 * (1 - b / k):.0f}%'}")
    if "rabbitmq" in r:
        q = 3 * r["rabbitmq"]["sustained_deliveries"]
        out.append(f"deliveries/s >= 3x RabbitMQ: {b:,.0f} vs {q:,.0f} -> "
                   f"{'met' if b >= q else f'missed by {100 * (1 - b / q):.0f}%'}")
    for key, bound in (("at50", 0.5), ("at90", 1.0)):
        p99 = r["bitroute"][key]["p99_ms"] / 1000
        if math.isnan(p99):  # the phase was skipped (--smoke)
            continue
        out.append(f"p99 <= {bound:g} s at {key[2:]}% rate: {p99:.2f}s -> "
                   f"{'met' if p99 <= bound else f'missed by {p99 - bound:.2f}s'}")
    lag = audit_lag_bound(r["bitroute"]["at50"]["batches"])
    out.append(f"audit rows within 10 s of their delivery at 50% rate: at most {lag:.2f}s -> "
               f"{'met' if lag <= 10 else f'missed by {lag - 10:.1f}s'}")
    if "first_route" in r:
        s = r["first_route"]["first_route_s"]
        out.append(f"{r['first_route']['subscriptions']:,} subscriptions routed within 60 s: "
                   f"{s:.1f}s -> {'met' if s <= 60 else f'missed by {s - 60:.0f}s'}")
    return out


if __name__ == "__main__":
    sys.exit(main())

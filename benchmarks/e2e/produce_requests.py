"""What the delivery producer's ``linger.ms`` costs the broker (issue 22, direction 1).

    python -m benchmarks.e2e.produce_requests [--lingers 1000/python,1000,5] [--publishes 3500,20000]
                                              [--rounds 2] [--size 100k] [--layout ...]
                                              [--broker NAME:key=value,... ...] [--json]

One embedded broker of its own (its JMX port open on loopback), the devices
workload's delivery topics (1,000 subscribers: one topic of one partition each
in the default layout), and one :class:`DeliveryProducer` per linger setting, all
warmed up. Then ``rounds`` times, each setting in turn (the order rotated every
round), ``route_batch`` on a fresh batch of each size, as a routing task does:
produce every delivery, flush. Per step it records

- the route step's wall time, and its produce and flush phases;
- the broker's CPU seconds (``/proc/<pid>/stat``, every thread, GC included) and,
  over JMX (``BrokerMeters.java``), its Produce requests, records in, and the CPU
  of its network and request-handler threads (the request path: steadier than the
  whole process, whose background work and GC come and go).

``--broker`` compares broker settings, each on a broker of its own in the same
run. Run such a comparison twice, the brokers in both start orders: on the
2-core machine the broker started first used up to 2x the CPU per delivery of the
same settings started second (docs/benchmarks.md).

It prints, per setting and size, the medians per delivery and the ratios
against the first setting, with the load average
beside them: on a shared machine, CPU seconds and request counts per delivery
hold where wall-clock rates do not. A setting ``<linger>/python`` writes the deliveries
as before issue 22's direction 3 (a ``Producer.produce`` call per record,
:mod:`benchmarks.e2e.python_produce`), ``<linger>`` with the kernel's writer,
``<linger>/shards=N`` with N producers instead of ``ProducerSettings.shards``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.e2e import python_produce, workload
from benchmarks.e2e.procstat import cpu_seconds
from benchmarks.e2e.route_task import source_batch
from compiler import Matcher, RoutingIndex, Subscription
from streaming.kafka.broker import EmbeddedBroker, free_port
from streaming.kafka.layout import DeliveryLayout
from streaming.router.delivery import DeliveryProducer, ProducerSettings
from streaming.router.routing import RouteSettings, route_batch

HERE = Path(__file__).resolve().parent


class BrokerMeters:
    """The broker's cumulative counters over JMX, one JVM for the whole run."""

    def __init__(self, port: int) -> None:
        env = {k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"}
        self._proc = subprocess.Popen(["java", str(HERE / "BrokerMeters.java"), str(port)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                      env=env)

    def read(self) -> dict:
        self._proc.stdin.write("\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("BrokerMeters.java ended; see its stderr")
        return json.loads(line)

    def close(self) -> None:
        self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class TimedProducer(DeliveryProducer):
    """The delivery producer, its produce and flush phases timed."""

    produce_s = flush_s = 0.0

    def produce_deliveries(self, columns) -> None:
        t = time.perf_counter()
        super().produce_deliveries(columns)
        self.produce_s += time.perf_counter() - t

    def flush(self):
        t = time.perf_counter()
        try:
            return super().flush()
        finally:
            self.flush_s += time.perf_counter() - t


class TimedPythonProducer(python_produce.PythonProducer):
    """The write before direction 3 (a ``produce`` call per record), its phases timed."""

    produce_s = flush_s = 0.0

    def produce_many(self, *args) -> None:
        t = time.perf_counter()
        super().produce_many(*args)
        self.produce_s += time.perf_counter() - t

    def flush(self) -> None:
        t = time.perf_counter()
        try:
            super().flush()
        finally:
            self.flush_s += time.perf_counter() - t


@dataclass
class Step:
    setting: str
    publishes: int
    deliveries: int
    wall_s: float
    produce_s: float
    flush_s: float
    task_cpu_s: float
    broker_cpu_s: float
    produce_requests: int
    messages_in: int
    network_cpu_s: float
    handler_cpu_s: float
    load: float


@dataclass(frozen=True)
class TunedBroker(EmbeddedBroker):
    """The embedded broker with some of its server properties overridden (direction 2)."""

    overrides: tuple[tuple[str, str], ...] = ()

    def _server_properties(self) -> str:
        return super()._server_properties() + "".join(f"{k}={v}\n" for k, v in self.overrides)


def start_broker(folder: Path, jmx_port: int, overrides: tuple = ()) -> EmbeddedBroker:
    """An embedded broker whose JVM opens JMX on loopback (``JAVA_TOOL_OPTIONS``, only for it)."""
    broker = TunedBroker(folder, port=free_port(), controller_port=free_port(), overrides=overrides)
    saved = os.environ.get("JAVA_TOOL_OPTIONS")
    os.environ["JAVA_TOOL_OPTIONS"] = " ".join([
        f"-Dcom.sun.management.jmxremote.port={jmx_port}",
        f"-Dcom.sun.management.jmxremote.rmi.port={jmx_port}",
        "-Dcom.sun.management.jmxremote.host=127.0.0.1", "-Djava.rmi.server.hostname=127.0.0.1",
        "-Dcom.sun.management.jmxremote.authenticate=false",
        "-Dcom.sun.management.jmxremote.ssl=false"])
    try:
        broker.start()
    finally:
        if saved is None:
            del os.environ["JAVA_TOOL_OPTIONS"]
        else:
            os.environ["JAVA_TOOL_OPTIONS"] = saved
    return broker


def _broker_spec(text: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """``NAME`` or ``NAME:key=value,key=value`` (server properties over the embedded broker's)."""
    name, _, props = text.partition(":")
    return name, tuple(tuple(kv.split("=", 1)) for kv in props.split(",") if kv)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="produce_requests")
    ap.add_argument("--size", choices=sorted(workload.SIZES), default="100k")
    ap.add_argument("--lingers", default="1000/python,1000",
                    help="linger.ms settings, comma-separated, the first the baseline; /python: "
                         "the deliveries written by a produce() call each (before issue 22, "
                         "direction 3) instead of by the kernel's writer; /shards=N: N librdkafka "
                         "producers instead of 8")
    ap.add_argument("--broker", action="append", type=_broker_spec, default=[],
                    help="NAME[:key=value,...]: a broker of its own with these server properties "
                         "(repeat to compare; every linger runs against each); default: one "
                         "embedded broker as bitroute starts it")
    ap.add_argument("--publishes", default="3500,20000",
                    help="publishes per batch, comma-separated (3,500: a batch at the 50%% rate "
                         "of issue 22's run; 20,000: a large one)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup-rounds", type=int, default=1,
                    help="rounds run first and not counted (the broker's JIT, the partitions' segments)")
    ap.add_argument("--layout", choices=("topic-per-subscriber", "shared"),
                    default="topic-per-subscriber")
    ap.add_argument("--json", action="store_true", help="print each step as a JSON line")
    args = ap.parse_args(argv)
    brokers_spec = args.broker or [("default", ())]
    lingers = args.lingers.split(",")
    sizes = [int(v) for v in args.publishes.split(",")]
    settings_list = [(b, linger) for b, _ in brokers_spec for linger in lingers]

    def label(b: str, linger: str) -> str:
        return f"{b} {linger}" if len(brokers_spec) > 1 else f"linger {linger}"

    total = (args.warmup_rounds + args.rounds) * len(settings_list) * sum(sizes)
    w = workload.generate("devices", workload.SIZES[args.size], 1,
                          total + 2000 * len(settings_list))
    index = RoutingIndex({workload.EXCHANGE: "mqtt"})
    for sub_id, subscriber, filt in w.subs:
        index.upsert(Subscription.from_changelog(
            sub_id, workload.changelog_value(workload.EXCHANGE, subscriber, filt)))
    matcher = Matcher(index.snapshot(1, {}))
    shared = "bitroute.deliveries" if args.layout == "shared" else None

    with tempfile.TemporaryDirectory() as folder:
        brokers: dict[str, tuple[EmbeddedBroker, int, BrokerMeters | None]] = {}
        try:
            for name, overrides in brokers_spec:
                jmx_port = free_port()
                broker = start_broker(Path(folder) / name, jmx_port, overrides)
                brokers[name] = (broker, broker.pid(), None)
                _create_topics(broker, w.subscribers, shared)
                brokers[name] = (broker, broker.pid(), BrokerMeters(jmx_port))
            producers = {}
            cursor = 0
            for b, linger in settings_list:
                base = ProducerSettings(brokers[b][0].bootstrap, 1_048_576,
                                        message_timeout_ms=600_000, keyed_partitions=shared is not None)
                kind = TimedPythonProducer if linger.endswith("/python") else TimedProducer
                shards = int(linger.split("/shards=")[1]) if "/shards=" in linger else base.shards
                producer = kind(replace(base, linger_ms=int(linger.split("/")[0]), shards=shards))
                layout = DeliveryLayout("bitroute.deliveries.", shared, 16 if shared else 1)
                settings = RouteSettings(workload.EXCHANGE, layout, "bitroute.rejected",
                                         1, False, producer.settings)
                # Warm-up: the producer learns every topic's metadata, the broker its partitions.
                _route(matcher, producer, source_batch(w.publishes[cursor:cursor + 2000], cursor),
                       settings)
                cursor += 2000
                producers[b, linger] = (producer, settings)
            _print_idle(brokers)
            steps: list[Step] = []
            for r in range(-args.warmup_rounds, args.rounds):
                k = r % len(settings_list)
                for b, linger in settings_list[k:] + settings_list[:k]:
                    producer, settings = producers[b, linger]
                    _, pid, meters = brokers[b]
                    for size in sizes:
                        batch = source_batch(w.publishes[cursor:cursor + size], cursor)
                        cursor += size
                        step = _step(label(b, linger), matcher, producer, batch, settings, pid, meters)
                        if r >= 0:
                            steps.append(step)
                        if args.json:
                            print(json.dumps({"round": r, **step.__dict__}), flush=True)
            _print_idle(brokers)
            for name, overrides in brokers_spec:
                print(f"broker {name}: {dict(overrides) or 'as embedded'}")
            _print_summary(steps, [label(b, linger) for b, linger in settings_list], sizes)
        finally:
            for broker, _, meters in brokers.values():
                if meters is not None:
                    meters.close()
                broker.stop()
    return 0


def _create_topics(broker: EmbeddedBroker, subscribers, shared: str | None) -> None:
    from confluent_kafka.admin import NewTopic

    from streaming import kafka

    admin = kafka.admin(kafka.ClientSettings.of(broker.bootstrap))
    topics = ([NewTopic(shared, 16, 1)] if shared else
              [NewTopic(f"bitroute.deliveries.{s}", 1, 1) for s in subscribers])
    for future in admin.create_topics([*topics, NewTopic("bitroute.rejected", 1, 1)]).values():
        future.result(120)


def _print_idle(brokers: dict) -> None:
    for name, (_, pid, meters) in brokers.items():
        idle = _idle_broker(pid, meters)
        print(f"broker {name} idle: {idle['cpu_per_s']:.3f} cores, {idle['requests_per_s']:.1f} "
              f"requests/s (load {os.getloadavg()[0]:.1f})", flush=True)


def _idle_broker(pid: int, meters: BrokerMeters, seconds: float = 5.0) -> dict:
    before, cpu = meters.read(), cpu_seconds(pid)
    time.sleep(seconds)
    after = meters.read()
    return {"cpu_per_s": (cpu_seconds(pid) - cpu) / seconds,
            "requests_per_s": (after["requests"] - before["requests"]) / seconds}


def _route(matcher: Matcher, producer, batch, settings: RouteSettings):
    if isinstance(producer, python_produce.PythonProducer):
        return python_produce.route_batch_python(matcher, producer, batch, settings)
    return route_batch(matcher, producer, batch, settings)


def _step(setting: str, matcher: Matcher, producer, batch, settings: RouteSettings,
          pid: int, meters: BrokerMeters) -> Step:
    producer.produce_s = producer.flush_s = 0.0
    before = meters.read()
    broker_cpu, task_cpu, wall = cpu_seconds(pid), time.process_time(), time.perf_counter()
    rows = _route(matcher, producer, batch, settings)
    wall, task_cpu = time.perf_counter() - wall, time.process_time() - task_cpu
    broker_cpu = cpu_seconds(pid) - broker_cpu
    after = meters.read()
    deliveries = sum(len(d) for d in rows.column("deliveries").to_pylist())
    return Step(setting, batch.num_rows, deliveries, wall, producer.produce_s, producer.flush_s,
                task_cpu, broker_cpu, after["produce_requests"] - before["produce_requests"],
                after["messages_in"] - before["messages_in"],
                after["cpu_s"].get("network", 0) - before["cpu_s"].get("network", 0),
                after["cpu_s"].get("handler", 0) - before["cpu_s"].get("handler", 0),
                os.getloadavg()[0])


def _print_summary(steps: list[Step], settings: list[str], sizes: list[int]) -> None:
    """Medians per delivery for each (setting, size); ratios against the first setting."""
    print(f"\n{'setting':>20} {'publishes':>9} {'deliv.':>7} {'n':>2} {'broker us/d':>11} "
          f"{'net us/d':>8} {'hdl us/d':>8} {'req/1k d':>8} {'req/s':>6} {'rec/req':>7} {'task us/d':>9} "
          f"{'wall ms':>8} {'flush ms':>8} {'load':>9}")
    for size in sizes:
        base = None
        for setting in settings:
            ss = [s for s in steps if s.setting == setting and s.publishes == size]
            if not ss:
                continue

            def med(f):
                return statistics.median(f(s) for s in ss)

            row = {
                "broker": med(lambda s: s.broker_cpu_s / s.deliveries * 1e6),
                "net": med(lambda s: s.network_cpu_s / s.deliveries * 1e6),
                "hdl": med(lambda s: s.handler_cpu_s / s.deliveries * 1e6),
                "req": med(lambda s: s.produce_requests / s.deliveries * 1e3),
                "task": med(lambda s: s.task_cpu_s / s.deliveries * 1e6),
                "wall": med(lambda s: s.wall_s * 1e3),
                "flush": med(lambda s: s.flush_s * 1e3),
            }
            loads = [s.load for s in ss]
            print(f"{setting:>20} {size:>9,} {ss[0].deliveries:>7,} {len(ss):>2} {row['broker']:>11.2f} "
                  f"{row['net']:>8.2f} {row['hdl']:>8.2f} {row['req']:>8.2f} "
                  f"{med(lambda s: s.produce_requests / s.wall_s):>6,.0f} "
                  f"{med(lambda s: s.messages_in / max(1, s.produce_requests)):>7.1f} "
                  f"{row['task']:>9.2f} {row['wall']:>8.0f} {row['flush']:>8.0f} "
                  f"{min(loads):>4.1f}-{max(loads):<4.1f}")
            if base is None:
                base = row
            else:
                print(f"{'':>12} {'vs ' + settings[0]:>25} {'':>2} "
                      + " ".join(f"{row[k] / base[k]:>{w}.2f}x" if base[k] else f"{'-':>{w + 1}}"
                                 for k, w in (("broker", 10), ("net", 7), ("hdl", 7), ("req", 7)))
                      + f" {'':>6} {'':>7} {row['task'] / base['task']:>8.2f}x"
                      f" {row['wall'] / base['wall']:>7.2f}x {row['flush'] / base['flush']:>7.2f}x")


if __name__ == "__main__":
    raise SystemExit(main())

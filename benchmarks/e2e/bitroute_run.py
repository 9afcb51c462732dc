"""The bitroute side of the benchmark: an embedded Kafka broker of its own on
loopback ports, the router (``bitroute run --json``, :class:`benchmarks.harness.RouterRun`)
in a child process, the changelog loader, the publish
driver and the delivery consumer of :mod:`benchmarks.e2e.kafka_load`.

Phases, all on one router:

1. changelog: the workload's subscriptions are produced to the changelog
   before the router starts; ``open_s`` is the router's start (rebuild from
   the changelog, compile, snapshot) until its query runs.
2. warm-up: a paced trickle, so that Python workers and the JIT are warm.
3. saturation: a backlog of ``backlog`` publishes produced as fast as the
   driver can; the router drains it with full batches. Sustained publishes/s
   (the rate at which consumer lag stops growing) = publishes routed per
   second of wall time over the full batches after the first; deliveries/s
   alike. The delivery consumer confirms the deliveries arrive.
4. latency at 50% and 90% of that rate: paced publishers, the consumer
   records publish-to-delivery latency of the publishes in the window.

:func:`first_route_1m` runs on a fresh broker and router: the router runs on
an empty changelog with a trickle of publishes, 1M subscriptions are written
to the changelog, and a probe publish is sent right after Kafka acked the last
one; by the happens-before guarantee its routing uses all of them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import TopicPartition

from benchmarks import harness
from benchmarks.e2e import kafka_load, procstat
from benchmarks.e2e.drain import arrival_rates
from benchmarks.workload import EXCHANGE, Workload
from schemas.records import EXCHANGE_HEADER
from streaming import kafka
from streaming.config import Config, load, parse_set_flags
from streaming.kafka.broker import EmbeddedBroker
from streaming.kafka.topics import ensure_router_topics


@dataclass
class Env:
    """A broker and a router on loopback, in ``folder``."""

    folder: Path
    user_sets: list[str]
    name: str = "bitroute"  # in the progress log
    config_file: Path | None = None
    """A bitroute configuration whose ``[kafka]`` (bootstrap, ``[kafka.client]``:
    TLS, SASL) names an existing cluster: no broker of its own is started."""
    broker: EmbeddedBroker | harness.ExistingBroker | None = None
    sets: list[str] = field(default_factory=list)
    _config: Config | None = field(default=None, init=False, repr=False)
    _router: harness.ReportedProcess | None = field(default=None, init=False, repr=False)

    @property
    def config(self) -> Config:
        """The router's configuration, once :meth:`start_broker` made it."""
        if self._config is None:
            raise RuntimeError(f"{self.name}: start_broker() first")
        return self._config

    @property
    def router(self) -> harness.ReportedProcess:
        """The router's process, once :meth:`start_router` started it."""
        if self._router is None:
            raise RuntimeError(f"{self.name}: start_router() first")
        return self._router

    @property
    def running(self) -> harness.ReportedProcess | None:
        """The router's process if started (else None)."""
        return self._router

    def start_broker(self) -> None:
        """Start the broker of its own (unless ``config_file`` names a cluster) and
        create the router's topics."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.sets = ["broker.embedded=false"]
        if self.config_file is None:
            self.broker = broker = harness.start_broker(self.folder / "kafka")
            self.sets.append(f"kafka.bootstrap={broker.bootstrap}")
            self.sets += harness.topic_sets()
        self.sets += [
            f"delta.warehouse={self.folder / 'delta'}",
            f"streaming.checkpoint_dir={self.folder / 'checkpoints'}",
            *self.user_sets,
        ]
        # env:NAME secrets of [kafka.client] are read here and, by the children, from
        # the environment they inherit: never written to the command line.
        self._config = load(self.config_file, parse_set_flags(self.sets))
        ensure_router_topics(self._config)

    def bring_up(self, w: Workload, log) -> tuple[float, dict]:
        """Start the broker, write ``w``'s subscriptions to the changelog, start the router:
        (seconds the changelog took to write, the router's ``started`` figures)."""
        self.start_broker()
        log(f"{self.name}: Kafka: {self.describe_cluster()}; settings "
            f"{' '.join(self.user_sets) or '(defaults)'}")
        t0, t1 = kafka_load.load_changelog(self.config.kafka.client_settings,
                                           self.config.kafka.subscriptions_topic, w, EXCHANGE)
        log(f"{self.name}: {w.n:,} subscriptions written to the changelog in {t1 - t0:.1f}s")
        started = self.start_router()
        log(f"{self.name}: running with {started['subscriptions']:,} subscriptions (open "
            f"{started['open_s']:.1f}s, {time.time() - t1:.1f}s after the changelog); "
            f"log {self.router.log_path}")
        return t1 - t0, started

    def describe_cluster(self) -> str:
        kafka = self.config.kafka
        own = "its own broker" if self.broker is not None else "an existing cluster"
        return f"{own} on {kafka.bootstrap} ({kafka.client_settings.describe()})"

    def start_router(self) -> dict:
        self._router = harness.RouterRun(self.sets, self.folder / "router.log",
                                         self.config_file).start()
        return self._router.wait_started()

    def delivery_topics(self, w: Workload) -> list[str]:
        """The topics the workload's deliveries arrive in (one, in the shared layout)."""
        return sorted({self.config.kafka.layout.topic(s) for s in w.subscribers})

    def delivery_partitions(self) -> int:
        return self.config.kafka.layout.partitions

    def roles(self) -> dict:
        r = self.router
        return {
            "router: Python driver": lambda: r.pids()["driver"],
            "router: Spark JVM": lambda: r.pids()["jvm"],
            "router: Python workers": lambda: r.pids()["workers"],
            "Kafka broker": lambda: ([self.broker.pid()] if self.broker is not None
                                     and self.broker.pid() else []),
        }

    def stop(self) -> None:
        try:
            if self._router:
                self._router.stop()
        finally:
            if self.broker:
                self.broker.stop()


def _publish(env: Env, w: Workload, rate: float, duration: float, processes: int):
    return kafka_load.start_publishers(env.config.kafka.client_settings, env.config.kafka.publishes_topic,
                                       EXCHANGE, w, rate, duration, processes)


@dataclass
class Phase:
    publishes_per_s: float
    deliveries_per_s: float
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    max_ms: float = float("nan")
    lag_after_s: float = 0.0  # how long after the last publish the router had routed all
    batches: list[dict] = field(default_factory=list)
    cores: dict[str, float] = field(default_factory=dict)
    max_core: dict[str, float] = field(default_factory=dict)
    peak_rss: dict[str, int] = field(default_factory=dict)
    consumer: dict = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds each role used while sampled (user + system)."""
    delivered: int = 0
    """Deliveries the delivery consumer received in the phase."""
    delivery_side: tuple[float, float] = (float("nan"), float("nan"))
    """(publishes/s, deliveries/s) at the delivery consumer while the backlog drained
    (:func:`benchmarks.e2e.drain.arrival_rates`); saturation only."""
    rate_source: str = "router"
    """Where ``publishes_per_s`` and ``deliveries_per_s`` come from: ``router`` (its
    progress reports) or ``delivery`` (:attr:`delivery_side`)."""

    def router_cpu_per_delivery(self) -> float:
        """CPU seconds of the router's processes (the roles named ``router: ...`` or
        ``kstreams: ...``) per delivery the consumer received while they were sampled."""
        cpu = sum(v for k, v in self.cpu_s.items() if k.startswith(("router:", "kstreams:")))
        return cpu / self.delivered if self.delivered else float("nan")

    @classmethod
    def skipped(cls) -> Phase:
        """A phase not run (``--smoke``): its figures are NaN, printed as ``-``."""
        nan = float("nan")
        return cls(nan, nan, lag_after_s=nan)


def full_batch_rates(batches: list[dict]) -> tuple[float, float]:
    """(publishes/s, deliveries/s) routed over the router's full batches after the first
    (the first also pays the trigger's start): wall time from that batch's end to the last's."""
    full = [b for b in batches if b["rows"] >= 0.9 * max(b["rows"] for b in batches)]
    steady = full[1:] if len(full) > 2 else full
    if len(steady) >= 2:
        span = steady[-1]["end"] - steady[0]["end"]
        rows = sum(b["rows"] for b in steady[1:])
        dels = sum(b["deliveries"] for b in steady[1:])
    else:
        span = sum(b["seconds"] for b in steady)
        rows = sum(b["rows"] for b in steady)
        dels = sum(b["deliveries"] for b in steady)
    span = max(span, 1e-9)
    return rows / span, dels / span


def _saturate(env: Env, w: Workload, backlog: int, publishers: int, consumers: int, log,
              rates=full_batch_rates) -> Phase:
    """Produce ``backlog`` publishes as fast as possible; measure the drain: ``rates`` of
    the router's progress reports (``router.batches``) while it drained, or with ``rates``
    None the delivery side's (:func:`benchmarks.e2e.drain.arrival_rates`), which is
    measured and kept in either case. The processes are sampled from the backlog's first
    publish until the router reported all of it routed."""
    r = env.router
    routed0 = r.routed()
    n_probes0 = len(r.batches)
    # The consumers stop once the router reported the backlog routed (a micro-batch of a
    # loaded router may take longer than any short idle wait), 120 s without a delivery
    # failing that.
    now = time.time()
    stop = kafka_load.stop_event()
    consumer_procs, cout = kafka_load.start_consumers(
        env.config.kafka.client_settings, env.delivery_topics(w), env.delivery_partitions(),
        (now, now), now + 3600, consumers, idle=120, idle_after_first=True, stop=stop)
    sampler = procstat.Sampler({**env.roles(), "load driver": lambda: [
        p.pid for p in procs if p.is_alive() and p.pid is not None], "delivery consumer": lambda: [
        p.pid for p in consumer_procs if p.is_alive() and p.pid is not None]})
    procs, pout, start_at = kafka_load.start_publishers(
        env.config.kafka.client_settings, env.config.kafka.publishes_topic, EXCHANGE,
        _cycle(w, backlog), 0, 3600, publishers, count=backlog)
    time.sleep(max(0.0, start_at - time.time()))
    sampler.start()
    pub = kafka_load.join_publishers(procs, pout, timeout=1800)
    log(f"{env.name}: backlog of {pub['sent']:,} publishes produced in {pub['seconds']:.1f}s "
        f"({pub['sent'] / pub['seconds']:,.0f}/s)")
    ok = r.wait_routed(routed0 + pub["sent"], timeout=1800)
    sampler.stop()
    stop.set()
    if not ok:
        log(f"{env.name}: WARNING: the backlog was not drained in time")
    cons = kafka_load.join_consumers(consumer_procs, cout, timeout=600)
    batches = r.batches[n_probes0:]
    delivery_side = arrival_rates(cons["per_second"], pub["sent"])
    publishes_per_s, deliveries_per_s = rates(batches) if rates else delivery_side
    cons.pop("latencies_ns", None)
    return Phase(publishes_per_s, deliveries_per_s, batches=batches,
                 cores={k: sampler.cores(k) for k in sampler.stats},
                 max_core={k: v.max_core for k, v in sampler.stats.items()},
                 peak_rss={k: v.peak_rss for k, v in sampler.stats.items()},
                 consumer=cons, cpu_s={k: v.cpu_s for k, v in sampler.stats.items()},
                 delivered=cons["received"], delivery_side=delivery_side,
                 rate_source="router" if rates else "delivery")


def _cycle(w: Workload, n: int) -> Workload:
    pubs = (w.publishes * (n // max(1, len(w.publishes)) + 1))[:n]
    return Workload(w.profile, w.n, w.seed, w.subs, pubs, w.description)


def _paced(env: Env, w: Workload, rate: float, warmup: float, measure: float, publishers: int,
           consumers: int, log, lead: float = 10.0, idle: float = 120.0) -> Phase:
    """Publishes at ``rate`` for ``warmup + measure`` seconds from ``lead`` seconds on (the
    consumers assigned, the publishers spawned); latency of the ``measure`` window's, the
    consumers done once the router reported every publish routed (or, failing that, once
    ``idle`` seconds passed without a delivery after the window: a loaded router's batch
    may take longer than a short idle wait)."""
    r = env.router
    routed0 = r.routed()
    n_probes0 = len(r.batches)
    start_at = time.time() + lead
    w0 = start_at + warmup
    w1 = w0 + measure
    stop = kafka_load.stop_event()
    consumer_procs, cout = kafka_load.start_consumers(
        env.config.kafka.client_settings, env.delivery_topics(w), env.delivery_partitions(),
        (w0, w1), w1 + 300, consumers, idle=idle, stop=stop)
    procs, pout, start_at = kafka_load.start_publishers(
        env.config.kafka.client_settings, env.config.kafka.publishes_topic, EXCHANGE, w, rate,
        warmup + measure + 0.5, publishers, start_at=start_at)
    sampler = procstat.Sampler({**env.roles(), "load driver": lambda: [
        p.pid for p in procs if p.is_alive() and p.pid is not None], "delivery consumer": lambda: [
        p.pid for p in consumer_procs if p.is_alive() and p.pid is not None]})
    time.sleep(max(0.0, w0 - time.time()))
    sampler.start()
    time.sleep(max(0.0, w1 - time.time()))
    sampler.stop()
    pub = kafka_load.join_publishers(procs, pout, timeout=300)
    t_last = time.time()
    r.wait_routed(routed0 + pub["sent"], timeout=300)
    lag_after = time.time() - t_last
    stop.set()
    cons = kafka_load.join_consumers(consumer_procs, cout, timeout=400)
    batches = r.batches[n_probes0:]
    return Phase(pub["sent"] / pub["seconds"], cons["window_arrivals"] / measure,
                 cons["p50_ms"], cons["p99_ms"], cons["max_ms"], lag_after, batches,
                 {k: sampler.cores(k) for k in sampler.stats},
                 {k: v.max_core for k, v in sampler.stats.items()},
                 {k: v.peak_rss for k, v in sampler.stats.items()}, cons,
                 {k: v.cpu_s for k, v in sampler.stats.items()}, cons["received"])


@dataclass
class BitrouteResult:
    changelog_write_s: float
    open_s: float
    saturation: Phase
    at50: Phase
    at90: Phase
    sets: list[str]


MODES = {"bitroute": "microbatch", "bitroute-realtime": "realtime"}
"""The e2e systems that are bitroute, and the ``streaming.mode`` each runs."""


def run(folder: Path, w: Workload, user_sets: list[str], backlog: int, warmup: float,
        measure: float, publishers: int, consumers: int, log,
        config_file: Path | None = None, smoke: bool = False,
        system: str = "bitroute") -> BitrouteResult:
    """``system`` (:data:`MODES`) on ``w``. Micro-batch mode's sustained rate is its full
    batches' (the delivery side's kept beside it as a cross-check); realtime mode's batch
    reports are its audit query's, so its sustained rate is the delivery side's."""
    mode = MODES[system]
    env = Env(folder, [f"streaming.mode={mode}", *user_sets], name=system,
              config_file=config_file)
    try:
        write_s, started = env.bring_up(w, log)
        phases = measure_phases(env, w, backlog, warmup, measure, publishers, consumers, log,
                                rates=full_batch_rates if mode == "microbatch" else None,
                                smoke=smoke)
        return BitrouteResult(write_s, started["open_s"], *phases, user_sets)
    finally:
        env.stop()


def measure_phases(env: Env, w: Workload, backlog: int, warmup: float, measure: float,
                   publishers: int, consumers: int, log, rates=full_batch_rates,
                   smoke: bool = False) -> tuple[Phase, Phase, Phase]:
    """A warm-up trickle, then the saturation (a ``backlog`` drained, its ``rates``), then
    paced load at 50% and 90% of that rate: (saturation, at 50%, at 90%). ``smoke``: every
    step of the path once, in seconds: no warm-up trickle, the 90% phase alone (the 50%
    one is :meth:`Phase.skipped`), short leads and idle waits."""
    if not smoke:
        warm = _paced(env, w, 2000, 2, 5, 1, 1, log)
        log(f"{env.name}: warm-up done (p50 {warm.p50_ms:.0f} ms)")
    sat = _saturate(env, w, backlog, publishers, consumers, log, rates)
    log(f"{env.name}: sustained {sat.publishes_per_s:,.0f} publishes/s, "
        f"{sat.deliveries_per_s:,.0f} deliveries/s ({sat.rate_source} side; delivery side "
        f"{sat.delivery_side[1]:,.0f} deliveries/s, {sat.delivered:,} received); router CPU "
        f"{1e6 * sat.router_cpu_per_delivery():.1f} us per delivery; cores "
        + ", ".join(f"{k} {v:.2f}" for k, v in sat.cores.items()))
    paced = [Phase.skipped()] if smoke else []
    for share in (0.9,) if smoke else (0.5, 0.9):
        phase = _paced(env, w, share * sat.publishes_per_s, warmup, measure, publishers,
                       consumers, log, *((5.0, 2.0) if smoke else ()))
        log(f"{env.name}: {share:.0%} -> p50 {phase.p50_ms:.0f} ms p99 {phase.p99_ms:.0f} ms, "
            f"{phase.deliveries_per_s:,.0f} deliveries/s")
        paced.append(phase)
    return sat, paced[0], paced[1]


@dataclass
class FirstRoute:
    subscriptions: int
    write_s: float  # producing the changelog until Kafka acked the last record
    first_route_s: float  # from that ack to the probe's delivery
    catch_up_s: float  # the router's catch-up of that batch (compile + snapshot + audit)
    batch_s: float
    open_s_restart: float | None = None


def first_route(folder: Path, w: Workload, user_sets: list[str], log,
                timeout: float = 900.0) -> FirstRoute:
    """Time from a large changelog being written to the first publish routed with it."""
    env = Env(folder, user_sets)
    try:
        env.start_broker()
        env.start_router()
        bootstrap = env.config.kafka.client_settings
        # A probe that the last subscription of the workload matches.
        sid, subscriber, filt = w.subs[-1]
        probe_key = "/".join("x" if lvl in ("+", "#") else lvl for lvl in filt.split("/"))
        topic = env.config.kafka.layout.topic(subscriber)
        t0, t1 = kafka_load.load_changelog(bootstrap, env.config.kafka.subscriptions_topic, w,
                                           EXCHANGE)
        log(f"bitroute: {w.n:,} subscriptions written to the changelog in {t1 - t0:.1f}s; "
            f"probing with {probe_key!r}")
        producer = kafka.producer(bootstrap, {"linger.ms": 0})
        consumer = kafka.consumer(bootstrap, f"probe-{time.time_ns()}", {"fetch.wait.max.ms": 20})
        deadline = time.time() + timeout
        # Probe every 0.5 s until one is delivered: the first probe routed with
        # the new subscriptions marks the end. The subscriber's topic may not
        # exist yet (the router creates it when it applies the subscription);
        # in the shared layout the subscriber's records are the ones keyed by it.
        wanted_key = env.config.kafka.layout.subscriber_key(subscriber)
        assigned = False
        arrived = None
        next_probe = 0.0
        while time.time() < deadline and arrived is None:
            if time.time() >= next_probe:
                producer.produce(env.config.kafka.publishes_topic, b"probe", probe_key.encode(),
                                 headers=[(EXCHANGE_HEADER, EXCHANGE.encode())])
                producer.flush(10)
                next_probe = time.time() + 0.5
            if not assigned:
                if topic in consumer.list_topics(timeout=10).topics:
                    consumer.assign([TopicPartition(topic, p, 0)
                                     for p in range(env.delivery_partitions())])
                    assigned = True
                else:
                    time.sleep(0.1)
                continue
            m = consumer.poll(0.1)
            if m is not None and m.error() is None and (wanted_key is None or m.key() == wanted_key):
                arrived = time.time()
        consumer.close()
        if arrived is None:
            raise RuntimeError("the probe was not delivered in time")
        batch = next((p for p in env.router.batches if p.get("catch_up", 0) > 1.0), None)
        fr = FirstRoute(w.n, t1 - t0, arrived - t1, batch["catch_up"] if batch else float("nan"),
                        batch["seconds"] if batch else float("nan"))
        log(f"bitroute: first routed publish {fr.first_route_s:.1f}s after the changelog was "
            f"acked (catch-up {fr.catch_up_s:.1f}s, batch {fr.batch_s:.1f}s)")
        # A restart rebuilds from the persisted snapshot plus the changelog after it.
        env.router.stop()
        t = time.time()
        started = env.start_router()
        fr.open_s_restart = started["open_s"]
        log(f"bitroute: restart with {started['subscriptions']:,} subscriptions: query up in "
            f"{time.time() - t:.1f}s (open {started['open_s']:.1f}s)")
        return fr
    finally:
        env.stop()
